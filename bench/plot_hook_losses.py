"""Loss curves per communication hook, from bench/train_gpt.py --comm-hook runs, on one plot.

    plot_hook_losses.py --out docs/hooks_loss.png bf16=/tmp/gpt_bf16/losses.csv \\
        powersgd_r4=/tmp/gpt_psgd4/losses.csv ...

Each losses.csv holds the torch DDP run (uncompressed, `ddp_loss`) and the Braid run with the
hook (`braid_loss`); the uncompressed curve is drawn once (the first file's; every run's is
the same computation, and this script refuses files whose uncompressed curves differ). Prints,
per hook, the final loss (mean of the last 10 steps) and its difference from uncompressed.
"""

import argparse
import csv
import sys


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "ddp_loss" not in rows[0] or "braid_loss" not in rows[0]:
        sys.exit("plot_hook_losses: %s is not train_gpt.py's losses.csv" % path)
    return [float(r["ddp_loss"]) for r in rows], [float(r["braid_loss"]) for r in rows]


def tail_mean(v, k=10):
    return sum(v[-k:]) / len(v[-k:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+", metavar="LABEL=losses.csv")
    a = ap.parse_args()
    runs = []
    for spec in a.runs:
        label, _, path = spec.partition("=")
        if not path:
            sys.exit("plot_hook_losses: '%s': expected LABEL=losses.csv" % spec)
        runs.append((label, *read(path)))
    base = runs[0][1]
    for label, ddp, _ in runs[1:]:
        if ddp != base:
            sys.exit("plot_hook_losses: %s: its uncompressed curve differs from %s's" %
                     (label, runs[0][0]))
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(range(len(base)), base, label="uncompressed (torch DDP)", linewidth=2.5, alpha=0.5,
            color="black")
    print("%-20s %10s %10s" % ("hook", "final_loss", "vs_none"))
    b = tail_mean(base)
    print("%-20s %10.4f %9.2f%%" % ("none", b, 0.0))
    for label, _, hooked in runs:
        ax.plot(range(len(hooked)), hooked, label=label, linewidth=1.0)
        f = tail_mean(hooked)
        print("%-20s %10.4f %+9.2f%%" % (label, f, 100 * (f - b) / b))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over ranks)")
    ax.set_title("train_gpt.py per communication hook (Braid DDP + AdamW)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)


if __name__ == "__main__":
    main()
