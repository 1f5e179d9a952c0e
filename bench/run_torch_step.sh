#!/usr/bin/env bash
# Launches bench/torch_step_bench.py as the ranks of mpirun (shared memory only, like the tests).
#
#   tools/bazelw run //bench:torch_step -- [--np N] [bench flags: --model transformer ...]
set -euo pipefail
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  echo "usage: $(basename "$0") [--np N (default 2)] [torch_step_bench.py flags]"
  echo "  The PyTorch training step, Braid vs torch DDP (gloo), 2 ranks under mpirun by default."
  echo
  exec tests/python/run_python.sh bench/torch_step_bench.py --help  # its flags, printed once (no mpirun)
fi
np=2
if [[ "${1:-}" == "--np" ]]; then
  np="$2"
  shift 2
fi
exec mpirun --allow-run-as-root --oversubscribe \
  --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo \
  -np "${np}" tests/python/run_python.sh bench/torch_step_bench.py "$@"
