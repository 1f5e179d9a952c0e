#!/usr/bin/env bash
# Builds Braid's GPU checks here and packs them into .gpu_bundle/ (git-ignored) together with
# the shared libraries they load that a bare GPU machine lacks (Abseil, spdlog, fmt, GoogleTest,
# Open MPI's libraries, Bazel's per-target libraries, libstdc++), so they run on a machine
# without Bazel, Debian's packages or a network. glibc, the CUDA driver and NCCL stay the
# machine's (NCCL 2.28.9 is 218 MB here; tools/gpu/run.sh finds one there).
#
#   tools/gpu/bundle.sh          # here: builds, then fills .gpu_bundle/ (~20-40 MB)
#   then, with the device tool:  run(command="tools/gpu/run.sh", carry=[".gpu_bundle"])
#
# What it packs: every test tagged "gpu", //tests/gpu:cuda_smoke_test, the GPU benches, and
# the PyTorch checks (tests/gpu/torch_cuda_check.py, fsdp_cuda_check.py: braid.fully_shard vs
# torch's FSDP2; with libbraid.so and the braid package in
# python/; it runs on the GPU machine's own CUDA build of torch).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bundle="$root/.gpu_bundle"
limit_mb=60  # the device tool carries at most 64 MiB

mapfile -t tests < <(tools/bazelw query --noshow_progress 'attr(tags, "gpu", tests(//...))' 2>/dev/null)
if ((${#tests[@]} == 0)); then
  echo "bundle: bazel query found no test tagged gpu (did the query fail?)" >&2
  exit 1
fi
targets=("${tests[@]}" //tests/gpu:cuda_smoke_test //bench:collective_latency
         //bench:adamw_cuda_bench //bench:bucket_kernels_cuda_bench)
tools/bazelw build "$@" "${targets[@]}" //capi:libbraid.so //capi:libbraid-mpi.so \
  //capi:libbraid-gloo.so

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
# Loaded from the GPU machine itself: glibc's libraries, the driver, NCCL.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|librt\.so|libdl\.so|libresolv\.so|libcuda\.so|libnccl\.so)'
for t in "${targets[@]}"; do
  pkg="${t#//}"; pkg="${pkg%%:*}"; name="${t##*:}"
  exe="bazel-bin/$pkg/$name"
  [[ -x "$exe" ]] || { echo "bundle: $exe was not built" >&2; exit 1; }
  cp "$exe" "$bundle/bin/${pkg//\//_}__$name"
  while read -r lib path; do
    [[ "$lib" =~ $skip ]] && continue
    [[ -n "$path" && -f "$path" && ! -e "$bundle/lib/$lib" ]] && cp -L "$path" "$bundle/lib/$lib"
  done < <(ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
# The PyTorch check: the package next to libbraid.so (braid/_lib.py looks there first).
mkdir -p "$bundle/python"
cp -r capi/python/braid "$bundle/python/braid"
rm -rf "$bundle/python/braid/__pycache__"
cp -L bazel-bin/capi/libbraid.so "$bundle/python/braid/libbraid.so"
# The backends libbraid.so loads on first use (World("mpi"), World("gloo")), beside it; their
# system libraries (libmpi, libgloo) come from the GPU machine where it has them.
cp -L bazel-bin/capi/libbraid-mpi.so bazel-bin/capi/libbraid-gloo.so "$bundle/python/braid/"
cp tests/gpu/torch_cuda_check.py tests/gpu/fsdp_cuda_check.py "$bundle/python/"
while read -r lib path; do
  [[ "$lib" =~ $skip ]] && continue
  [[ -n "$path" && -f "$path" && ! -e "$bundle/lib/$lib" ]] && cp -L "$path" "$bundle/lib/$lib"
done < <(ldd bazel-bin/capi/libbraid.so | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
chmod -R u+w "$bundle"
{
  echo "built from $(git rev-parse HEAD)$(git diff --quiet || echo ' + local changes') on $(date -u +%FT%TZ)"
  printf '%s\n' "${targets[@]}"
} > "$bundle/MANIFEST"
size_mb=$(du -sm "$bundle" | cut -f1)
echo "bundle: $bundle: ${#targets[@]} binaries, $(ls "$bundle/lib" | wc -l) libraries, ${size_mb} MB"
if ((size_mb > limit_mb)); then
  echo "bundle: over ${limit_mb} MB: the device tool carries at most 64 MiB" >&2
  exit 1
fi
