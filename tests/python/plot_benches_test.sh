#!/usr/bin/env bash
# tools/plot_benches.py on the benches' real --csv output (tiny sizes, local backend, 2 ranks):
# every PNG is written and decodes to a non-blank image, torch_step's CSV format is plotted
# from a file in its format, and input that is not a bench's CSV (or has wrong results) is
# refused naming the file.
#   plot_benches_test.sh <collective_latency> <overlap> <memory>
set -euo pipefail
coll="$1" overlap="$2" memory="$3"
work="${TEST_TMPDIR:-$(mktemp -d)}"
"${coll}" --ranks=2 --maxbytes=4K --iters=2 --warmup=1 --csv > "${work}/coll.csv" 2>/dev/null
"${overlap}" --ranks=2 --iters=1 --warmup=0 --scale=0.02 --blocks=2 --layer_compute_us=200 \
  --csv > "${work}/overlap.csv" 2>/dev/null
"${memory}" --ranks=2 --iters=1 --warmup=0 --scale=0.02 --blocks=2 --layer_compute_us=200 \
  --csv > "${work}/memory.csv" 2>/dev/null
printf 'ranks,model,width,variant,median_ms,min_ms\n2,mlp,2,ddp,10.5,10.1\n2,mlp,2,sharded,9.5,9.0\n' \
  > "${work}/step.csv"
py=tests/python/run_python.sh
"${py}" tools/plot_benches.py --out "${work}/png" --collective local="${work}/coll.csv" \
  --overlap all_reduce="${work}/overlap.csv" --memory "${work}/memory.csv" \
  --torch-step "${work}/step.csv"
"${py}" - "${work}/png" <<'PY'
import sys
import matplotlib
matplotlib.use("Agg")
from matplotlib import image
for name in ("collectives", "overlap", "memory", "torch_step"):
    png = image.imread("%s/bench_%s.png" % (sys.argv[1], name))
    assert png.ndim == 3 and min(png.shape[:2]) > 200, (name, png.shape)
    assert float(png.std()) > 0.01, "bench_%s.png is blank" % name
print("ok: 4 plots")
PY
# Refusals name the file.
if "${py}" tools/plot_benches.py --out "${work}/png" --overlap "${work}/coll.csv" 2> "${work}/err"; then
  echo "a collective CSV was accepted as overlap output" >&2; exit 1
fi
grep -q "coll.csv is not overlap --csv output" "${work}/err" || { cat "${work}/err" >&2; exit 1; }
sed 's/,0$/,3/' "${work}/coll.csv" > "${work}/wrong.csv"
if "${py}" tools/plot_benches.py --out "${work}/png" --collective "${work}/wrong.csv" 2> "${work}/err"; then
  echo "a CSV with wrong results was plotted" >&2; exit 1
fi
grep -q "wrong.csv: allreduce at 8 bytes had 3 wrong elements" "${work}/err" || { cat "${work}/err" >&2; exit 1; }
echo "ok: refusals name the file"
