#!/usr/bin/env bash
# bench/train_gpt.py runs a few steps as 2 ranks under mpirun (a smaller GPT than its
# defaults, to stay well under a minute on 2 cores), then its outputs are checked here, apart
# from the script: the CSV has a finite loss for every step and both runs, each run's last
# losses are clearly below its first, the two runs agree, and the PNG decodes to a non-blank
# image. Then two short runs of the recipe flags: tied embeddings with reentrant activation
# checkpointing (fully sharded), and with non-reentrant checkpointing (ZeRO-2), each agreeing
# with torch DDP running the same recipe; and the MoE variant (--moe 2 --expert-parallel 2:
# each rank its own experts, one global-norm clip by ShardedAdamW.linked) against two nested
# torch DDPs with the norm summed by hand: the losses and every step's global norm agree, and
# the clip was active.
#   train_gpt_test.sh
set -euo pipefail
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
small=(--width 32 --heads 2 --context 32 --batch 8 --eval-batches 1)
run() {  # run OUT STEPS [train_gpt flags...]
  local out="$1" steps="$2"
  shift 2
  tests/run_mpi.sh 2 tests/python/run_python.sh bench/train_gpt.py --steps "${steps}" \
    "${small[@]}" --out "${out}" "$@"
}
check() {  # check OUT STEPS LEARN(0/1) [MAX_NORM]: the CSV (with LEARN the learning and the
  # PNG; with MAX_NORM each step's global gradient norm, both runs', above MAX_NORM)
  tests/python/run_python.sh - "$@" <<'PY'
import csv, math, sys

out, steps, learn = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
max_norm = float(sys.argv[4]) if len(sys.argv) > 4 else None
with open(out + "/losses.csv") as f:
    rows = list(csv.DictReader(f))
assert [int(r["step"]) for r in rows] == list(range(steps)), "steps in losses.csv: %s" % (
    [r["step"] for r in rows],)
for run in ("ddp_loss", "braid_loss"):
    losses = [float(r[run]) for r in rows]
    assert all(math.isfinite(v) for v in losses), "%s: non-finite loss in %s" % (run, losses)
    tail = sum(losses[-3:]) / 3
    if learn:
        assert tail < losses[0] - 0.3, "%s: did not learn (step 0 %.4f, last 3 mean %.4f)" % (
            run, losses[0], tail)
    print("%s: step 0 %.4f, last 3 mean %.4f" % (run, losses[0], tail))
# The runs do the same arithmetic up to the order of sums (2 ranks: none) and the AdamW
# kernels' rounding: a few f32 ulps of the loss, not a different recipe.
gap = max(abs(float(r["ddp_loss"]) - float(r["braid_loss"])) for r in rows)
assert gap < 1e-5, "torch DDP and Braid differ by %g in some step's loss" % gap
if max_norm is not None:  # one global norm: the same sum up to the order of its terms
    norms = [(float(r["ddp_norm"]), float(r["braid_norm"])) for r in rows]
    assert all(abs(a - b) <= 1e-5 * a for a, b in norms), "global norms differ: %s" % norms
    assert min(a for a, _ in norms) > max_norm, "the clip was not active: %s" % norms
    print("global norms (torch, braid): %s" % norms)
if learn:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import image
    lrs = [float(r["lr"]) for r in rows]
    assert lrs[-1] < 0.5 * max(lrs), "the schedule did not decay the lr: %s" % lrs
    png = image.imread(out + "/loss_curve.png")
    assert png.ndim == 3 and png.shape[0] > 200 and png.shape[1] > 200, png.shape
    assert float(png.std()) > 0.01, "the plot is blank"
    print("ok: %d steps, largest loss gap %.3g, plot %dx%d" % (steps, gap, png.shape[1],
                                                             png.shape[0]))
else:
    print("ok: %d steps, largest loss gap %.3g" % (steps, gap))
PY
}

run "${tmp}/plain" 20
check "${tmp}/plain" 20 1
run "${tmp}/tied_reentrant" 5 --tied-embeddings --checkpoint reentrant
check "${tmp}/tied_reentrant" 5 0
run "${tmp}/tied_nonreentrant" 5 --tied-embeddings --checkpoint nonreentrant --braid zero2
check "${tmp}/tied_nonreentrant" 5 0
run "${tmp}/moe" 4 --moe 2 --expert-parallel 2 --max-grad-norm 0.1
check "${tmp}/moe" 4 0 0.1
