#!/usr/bin/env bash
# One command from the benches to PNG plots in docs/: builds the benches, runs each with --csv
# into a scratch directory (kept, and named at the end), then tools/plot_benches.py.
#
#   tools/plot_benches.sh            # quick sizes: a few minutes on 2 cores
#   tools/plot_benches.sh --full     # the benches' own defaults (much longer)
#   OUT=/tmp/plots tools/plot_benches.sh
#
# Series: collective_latency on the local backend (threads) and on mpi (processes), 2 ranks,
# each with its memcpy baseline; overlap in all_reduce and reduce_scatter mode, 2 ranks;
# memory (every mode, 2 and 4 ranks); the PyTorch step (torch DDP vs Braid) at 2 ranks.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
full=0
[[ "${1:-}" == "--full" ]] && full=1
out="${OUT:-docs}"
tools/bazelw build //capi:braid //bench:collective_latency //bench:overlap //bench:memory >&2
csv="$(mktemp -d /tmp/braid-benches.XXXXXX)"
if ((full)); then
  coll=(--ranks=2) over=(--ranks=2) mem=(--ranks=2,4) step=()
else
  coll=(--ranks=2 --maxbytes=16M --compare_rounds=1)
  over=(--ranks=2 --iters=7 --warmup=1)
  mem=(--ranks=2,4 --iters=1 --warmup=1 --scale=0.25)
  step=(--rounds 3 --steps 10)
fi
echo "plot_benches.sh: CSV in ${csv}" >&2
bazel-bin/bench/collective_latency --backend=local "${coll[@]}" --csv > "${csv}/coll_local.csv"
bazel-bin/bench/collective_latency --backend=mpi "${coll[@]}" --csv > "${csv}/coll_mpi.csv"
for mode in all_reduce reduce_scatter; do
  bazel-bin/bench/overlap --mode="${mode}" "${over[@]}" --csv > "${csv}/overlap_${mode}.csv"
done
bazel-bin/bench/memory "${mem[@]}" --csv > "${csv}/memory.csv"
bench/run_torch_step.sh --np 2 "${step[@]}" --csv > "${csv}/torch_step.csv"
/usr/bin/python3 tools/plot_benches.py --out "${out}" \
  --collective local="${csv}/coll_local.csv" --collective mpi="${csv}/coll_mpi.csv" \
  --overlap all_reduce="${csv}/overlap_all_reduce.csv" \
  --overlap reduce_scatter="${csv}/overlap_reduce_scatter.csv" \
  --memory "${csv}/memory.csv" --torch-step "${csv}/torch_step.csv"
