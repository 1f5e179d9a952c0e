#!/usr/bin/env bash
# Launches bench/train_gpt.py as the ranks of mpirun (shared memory only, like the tests):
# a small GPT trained as torch DDP and as Braid sharded, loss curves in ./train_gpt_out.
#
#   tools/bazelw run //bench:train_gpt -- [--np N] [train_gpt.py flags: --steps 600 ...]
set -euo pipefail
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  echo "usage: $(basename "$0") [--np N (default 2)] [train_gpt.py flags]"
  echo "  A small GPT trained as torch DDP and as Braid sharded, 2 ranks under mpirun by default."
  echo
  exec tests/python/run_python.sh bench/train_gpt.py --help  # its flags, printed once (no mpirun)
fi
np=2
if [[ "${1:-}" == "--np" ]]; then
  np="$2"
  shift 2
fi
exec mpirun --allow-run-as-root --oversubscribe \
  --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo \
  -np "${np}" tests/python/run_python.sh bench/train_gpt.py "$@"
