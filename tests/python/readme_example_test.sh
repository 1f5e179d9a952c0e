#!/usr/bin/env bash
# The Python example in README.md ("Embedding Braid") runs under mpirun -np 4 (in a scratch
# directory: it writes its optimizer state files there).
#   readme_example_test.sh README.md
set -euo pipefail
here="$(pwd)"
work="${TEST_TMPDIR:-$(mktemp -d)}"
awk '/^```python$/ {inside = 1; next} inside && /^```$/ {exit} inside' "$1" > "${work}/train.py"
grep -q ShardedAdamW "${work}/train.py" || { echo "no Python example found" >&2; exit 1; }
export LIBBRAID_SO="$(readlink -f capi/libbraid.so)"
export PYTHONPATH="${here}/capi/python" OMP_NUM_THREADS=1
cd "${work}"
"${here}/tests/run_mpi.sh" 4 /usr/bin/python3 train.py
for r in 0 1 2 3; do
  [[ -s "opt.rank${r}" ]] || { echo "opt.rank${r} was not saved" >&2; exit 1; }
done
