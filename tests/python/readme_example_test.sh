#!/usr/bin/env bash
# The Python examples in README.md ("PyTorch") run under mpirun -np 4, each in a scratch
# directory of its own: the first ```python block (the ported DDP script) must leave a
# checkpoint holding a non-empty optimizer state in torch's layout, the second its per-rank
# optimizer state files.
#   readme_example_test.sh README.md
set -euo pipefail
here="$(pwd)"
work="${TEST_TMPDIR:-$(mktemp -d)}"
block() {  # block N README -> the Nth ```python block
  awk -v want="$1" '/^```python$/ {n++; if (n == want) {inside = 1; next}}
                    inside && /^```$/ {exit} inside' "$2"
}
mkdir -p "${work}/port" "${work}/train"
block 1 "$1" > "${work}/port/train.py"
block 2 "$1" > "${work}/train/train.py"
for f in port train; do
  grep -q ShardedAdamW "${work}/${f}/train.py" || { echo "README: no ${f} example" >&2; exit 1; }
done
export LIBBRAID_SO="$(readlink -f capi/libbraid.so)"
export PYTHONPATH="${here}/capi/python" OMP_NUM_THREADS=1

cd "${work}/port"
"${here}/tests/run_mpi.sh" 4 /usr/bin/python3 train.py
/usr/bin/python3 - <<'PY'
import torch
ckpt = torch.load("ckpt.pt")
state, groups = ckpt["opt"]["state"], ckpt["opt"]["param_groups"]
assert len(state) == 4 and len(groups) == 1, (len(state), groups)
for i, p in enumerate(ckpt["model"].values()):
    assert state[i]["exp_avg"].shape == p.shape, (i, state[i]["exp_avg"].shape, p.shape)
    assert float(state[i]["step"]) == 10.0, state[i]["step"]
print("port example: checkpoint in torch's layout, 4 parameters stepped 10 times")
PY

cd "${work}/train"
"${here}/tests/run_mpi.sh" 4 /usr/bin/python3 train.py
for r in 0 1 2 3; do
  [[ -s "opt.rank${r}" ]] || { echo "opt.rank${r} was not saved" >&2; exit 1; }
done
