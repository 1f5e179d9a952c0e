#!/usr/bin/env bash
# bench/train_gpt.py runs a few steps as 2 ranks under mpirun (a smaller GPT than its
# defaults, to stay well under a minute on 2 cores), then its outputs are checked here, apart
# from the script: the CSV has a finite loss for every step and both runs, each run's last
# losses are clearly below its first, the two runs agree, and the PNG decodes to a non-blank
# image.
#   train_gpt_test.sh [train_gpt.py flags, e.g. --tie-embeddings]
set -euo pipefail
out="${TEST_TMPDIR:-$(mktemp -d)}/train_gpt_out"
steps=20
tests/run_mpi.sh 2 tests/python/run_python.sh bench/train_gpt.py --steps "${steps}" \
  --width 32 --heads 2 --context 32 --batch 8 --eval-batches 1 --out "${out}" "$@"
exec tests/python/run_python.sh - "${out}" "${steps}" <<'PY'
import csv, math, sys
import matplotlib
matplotlib.use("Agg")
from matplotlib import image

out, steps = sys.argv[1], int(sys.argv[2])
with open(out + "/losses.csv") as f:
    rows = list(csv.DictReader(f))
assert [int(r["step"]) for r in rows] == list(range(steps)), "steps in losses.csv: %s" % (
    [r["step"] for r in rows],)
for run in ("ddp_loss", "braid_loss"):
    losses = [float(r[run]) for r in rows]
    assert all(math.isfinite(v) for v in losses), "%s: non-finite loss in %s" % (run, losses)
    tail = sum(losses[-3:]) / 3
    assert tail < losses[0] - 0.3, "%s: did not learn (step 0 %.4f, last 3 mean %.4f)" % (
        run, losses[0], tail)
    print("%s: step 0 %.4f, last 3 mean %.4f" % (run, losses[0], tail))
gap = max(abs(float(r["ddp_loss"]) - float(r["braid_loss"])) for r in rows)
assert gap < 1e-3, "torch DDP and Braid differ by %g in some step's loss" % gap
lrs = [float(r["lr"]) for r in rows]
assert lrs[-1] < 0.5 * max(lrs), "the schedule did not decay the lr: %s" % lrs
png = image.imread(out + "/loss_curve.png")
assert png.ndim == 3 and png.shape[0] > 200 and png.shape[1] > 200, png.shape
assert float(png.std()) > 0.01, "the plot is blank"
print("ok: %d steps, largest loss gap %.3g, plot %dx%d" % (steps, gap, png.shape[1],
                                                         png.shape[0]))
PY
