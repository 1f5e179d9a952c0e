#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root, with .gpu_bundle/ carried
# (tools/gpu/bundle.sh): runs every GPU test and bench in the bundle and writes to $OUT
# (else ./gpu-out): summary.txt (one line per check), tests.log, benches.log, machine.txt.
# Each check has its own time limit, so one hang cannot eat the call's 10 minutes.
#   run(command="tools/gpu/run.sh", carry=[".gpu_bundle"])
#   run(command="tools/gpu/run.sh --quick", carry=[".gpu_bundle"])   # smaller bench sizes
#   run(command="tools/gpu/run.sh --torch-only", carry=[".gpu_bundle"])  # the PyTorch checks only
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bundle="$root/.gpu_bundle"
out="${OUT:-$root/gpu-out}"
mkdir -p "$out"
quick=0 torch_only=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --torch-only) torch_only=1 ;;  # braid.pytorch vs torch (DDP, FSDP2): about a minute
    *) echo "run.sh: unknown argument $arg (--quick, --torch-only)" >&2; exit 2 ;;
  esac
done
[[ -d "$bundle/bin" ]] || { echo "run.sh: no $bundle (run tools/gpu/bundle.sh here first)" >&2; exit 2; }

# NCCL: the machine's own (BRAID_NCCL_DIR, the CUDA toolkit's, or the one pip installed for
# PyTorch).
nccl_dir="${BRAID_NCCL_DIR:-}"
if [[ -z "$nccl_dir" ]]; then
  for d in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu \
           "$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)"; do
    if [[ -n "$d" && -e "$d/libnccl.so.2" ]]; then nccl_dir="$d"; break; fi
  done
fi
export LD_LIBRARY_PATH="$bundle/lib:${nccl_dir:+$nccl_dir:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export BRAID_NCCL_LIBRARY="${nccl_dir:+$nccl_dir/}libnccl.so.2"

summary="$out/summary.txt"
{
  echo "# $(cat "$bundle/MANIFEST" | head -1)"
  echo "# NCCL from: ${nccl_dir:-not found}"
} > "$summary"
{
  nvidia-smi 2>&1 || echo "nvidia-smi failed"
  echo; uname -a; ldd --version 2>&1 | head -1
  echo "NCCL dir: ${nccl_dir:-none}"; ls -la "${nccl_dir:-/nonexistent}"/libnccl* 2>&1
} > "$out/machine.txt"

# check NAME LIMIT_S LOG COMMAND...: runs it, appends its output to LOG, one line to summary.
check() {
  local name="$1" limit="$2" log="$3"; shift 3
  local t0=$SECONDS tmp
  tmp="$(mktemp)"
  timeout --kill-after=10 "$limit" "$@" > "$tmp" 2>&1
  local rc=$?
  local verdict=PASS
  ((rc == 124 || rc == 137)) && verdict="TIMEOUT(${limit}s)"
  ((rc != 0 && rc != 124 && rc != 137)) && verdict="FAIL(rc=$rc)"
  # GoogleTest's tallies, and a bench's "skipped" line, so a run that skipped is not a pass.
  local tally
  tally="$(grep -hoE '^\[ +(PASSED|SKIPPED|FAILED) +\] [0-9]+ tests?|no CUDA device: skipped|skipped, no GPU|^[a-z_0-9]+ +(PASS|FAIL)' "$tmp" | tr -s ' ' | tr '\n' ' ')"
  { echo "=== $name: $*"; cat "$tmp"; echo "=== $name: $verdict in $((SECONDS - t0)) s"; } >> "$log"
  rm -f "$tmp"
  printf '%-44s %-14s %4ss  %s\n' "$name" "$verdict" "$((SECONDS - t0))" "$tally" >> "$summary"
  [[ $verdict == PASS ]] || failures=$((failures + 1))
}
failures=0

# braid.pytorch on CUDA modules vs torch on the same GPU(s), with the machine's CUDA torch
# (the first python3 on the path that imports torch and numpy). First: quick, and what a short
# device budget should reach before the C++ tests and benches.
py=python3
for c in python3 /usr/bin/python3 /usr/local/bin/python3; do
  # numpy too: torch parses the __cuda_array_interface__ of Braid's device views with it
  if command -v "$c" > /dev/null && "$c" -c "import torch, numpy" 2> /dev/null; then py="$c"; break; fi
done
check "torch_cuda_check (braid.pytorch)"        240 "$out/tests.log" \
  env PYTHONPATH="$bundle/python" "$py" "$bundle/python/torch_cuda_check.py"
# braid.fully_shard vs torch's FSDP2 fully_shard, with and without CPUOffloadPolicy: a table
# (differences, step time, peak memory) in tests.log, one PASS/FAIL line per row.
check "fsdp_cuda_check (fully_shard vs FSDP2)"  180 "$out/tests.log" \
  env PYTHONPATH="$bundle/python" "$py" "$bundle/python/fsdp_cuda_check.py"

if [[ $torch_only == 0 ]]; then
  for t in "$bundle"/bin/tests_*; do
    check "$(basename "$t")" 120 "$out/tests.log" "$t" --gtest_color=no
  done

  b="$bundle/bin"
  max=1G; n=""; [[ $quick == 1 ]] && { max=64M; n="--n=10000000"; }
  check "collective_latency nccl f32 sum"          150 "$out/benches.log" "$b/bench__collective_latency" --backend=nccl --maxbytes=$max
  check "collective_latency nccl bf16 avg"         100 "$out/benches.log" "$b/bench__collective_latency" --backend=nccl --maxbytes=256M --dtype=bf16 --redop=avg --ops=allreduce,reduce_scatter
  check "collective_latency nccl f32 premul inplace" 100 "$out/benches.log" "$b/bench__collective_latency" --backend=nccl --maxbytes=256M --redop=premul_sum --inplace --ops=allreduce,reduce_scatter,allgather
  check "collective_latency nccl nonblocking"      100 "$out/benches.log" env BRAID_NCCL_BLOCKING=0 "$b/bench__collective_latency" --backend=nccl --maxbytes=64M
  check "adamw_cuda_bench"                          120 "$out/benches.log" "$b/bench__adamw_cuda_bench" $n
  check "bucket_kernels_cuda_bench"                 120 "$out/benches.log" "$b/bench__bucket_kernels_cuda_bench" $n
fi
cat "$summary"
# The device tool's rc says whether everything passed (the summary says what did not).
((failures == 0)) || { echo "run.sh: $failures check(s) did not pass" >&2; exit 1; }
