"""Turns the benches' --csv output into PNG plots (matplotlib, Agg).

    tools/plot_benches.sh                 # runs the benches with --csv, then this, into docs/
    /usr/bin/python3 tools/plot_benches.py --out docs \\
        --collective local=local.csv --collective mpi=mpi.csv \\
        --overlap all_reduce=ar.csv --overlap reduce_scatter=rs.csv \\
        --memory memory.csv --torch-step torch_step.csv

Inputs (each optional; LABEL=FILE names a series, e.g. the backend or reduce mode it ran with):
  --collective  bench/collective_latency --csv: op,bytes,count,dtype,time_us,algbw_gbps,
                busbw_gbps,wrong          -> bench_collectives.png: busbw vs size, one panel
                per collective, one line per LABEL, the same run's "memcpy" row dashed
  --overlap     bench/overlap --csv: ranks,mode,step_ms,compute_ms,comm_ms,exposed_frac
                                          -> bench_overlap.png: step time per mode and ranks
  --memory      bench/memory --csv: ranks,mode,params,peak_host_bytes,peak_device_bytes,
                model_state_bytes,largest_unit_bytes,step_ms
                                          -> bench_memory.png: peak host MB and step time
  --torch-step  bench/torch_step_bench.py --csv: ranks,model,width,variant,median_ms,min_ms
                                          -> bench_torch_step.png: step time per variant
A file whose header is not the one above is refused naming the file and the columns wanted;
rows with #wrong > 0 are refused too (a wrong result is no benchmark).
"""

import argparse
import csv
import os
import sys

COLUMNS = {
    "collective": "op,bytes,count,dtype,time_us,algbw_gbps,busbw_gbps,wrong",
    "overlap": "ranks,mode,step_ms,compute_ms,comm_ms,exposed_frac",
    "memory": "ranks,mode,params,peak_host_bytes,peak_device_bytes,model_state_bytes,"
              "largest_unit_bytes,step_ms",
    "torch_step": "ranks,model,width,variant,median_ms,min_ms",
}


def read(kind, path):
    """The rows of a bench CSV as dicts; SystemExit naming the file when it is not one."""
    try:
        with open(path, newline="") as f:
            lines = [line for line in f if line.strip() and not line.startswith("#")]
    except OSError as e:
        sys.exit("plot_benches: %s: %s" % (path, e.strerror))
    want = COLUMNS[kind]
    # memory prints its table before the CSV unless --csv: start at the CSV header.
    starts = [i for i, line in enumerate(lines) if line.strip() == want]
    if not starts:
        sys.exit("plot_benches: %s is not %s --csv output (no header line %r)" %
                 (path, kind, want))
    rows = list(csv.DictReader(lines[starts[0]:]))
    if not rows:
        sys.exit("plot_benches: %s has a header but no rows" % path)
    if kind == "collective":
        wrong = [r for r in rows if int(r["wrong"]) != 0]
        if wrong:
            sys.exit("plot_benches: %s: %s at %s bytes had %s wrong elements" %
                     (path, wrong[0]["op"], wrong[0]["bytes"], wrong[0]["wrong"]))
    return rows


def labeled(specs, kind):
    out = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep:
            label, path = os.path.splitext(os.path.basename(spec))[0], spec
        out.append((label, read(kind, path)))
    return out


def human_bytes(n, _=None):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%g %s" % (n, unit)
        n /= 1024.0
    return str(n)


def plot_collectives(plt, series, path):
    ops = []
    for _, rows in series:
        for r in rows:
            if r["op"] not in ops and r["op"] in ("allreduce", "reduce_scatter", "allgather",
                                                  "broadcast"):
                ops.append(r["op"])
    fig, axes = plt.subplots(1, len(ops), figsize=(4.2 * len(ops), 4), sharey=True,
                             squeeze=False)
    from matplotlib.ticker import FuncFormatter
    for ax, op in zip(axes[0], ops):
        for i, (label, rows) in enumerate(series):
            color = "C%d" % i
            pts = [(int(r["bytes"]), float(r["busbw_gbps"])) for r in rows if r["op"] == op]
            pts = [(b, bw) for b, bw in pts if bw > 0]
            if pts:
                ax.plot(*zip(*pts), marker=".", color=color, label=label)
            for r in rows:
                if r["op"] == "memcpy":
                    ax.axhline(float(r["busbw_gbps"]), color=color, linestyle="--",
                               linewidth=1, label="%s memcpy" % label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(human_bytes))
        ax.tick_params(axis="x", labelrotation=45)
        ax.set_title(op)
        ax.set_xlabel("size (nccl-tests bytes)")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("busbw (GB/s)")
    axes[0][-1].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def grouped_bars(ax, groups, bars, value, ylabel):
    """Bars of value(group, bar) (None: no bar), one cluster per group."""
    width = 0.8 / max(1, len(bars))
    for j, bar in enumerate(bars):
        xs, ys = [], []
        for i, group in enumerate(groups):
            v = value(group, bar)
            if v is not None:
                xs.append(i + (j - (len(bars) - 1) / 2) * width)
                ys.append(v)
        ax.bar(xs, ys, width=width, label=bar)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")


def plot_overlap(plt, series, path):
    groups, modes, values = [], [], {}
    for label, rows in series:
        for r in rows:
            group = "%s\n%s ranks" % (label, r["ranks"])
            groups += [group] if group not in groups else []
            modes += [r["mode"]] if r["mode"] not in modes else []
            values[group, r["mode"]] = float(r["step_ms"])
    fig, ax = plt.subplots(figsize=(max(7, 2.2 * len(groups)), 4))
    grouped_bars(ax, groups, modes, lambda g, m: values.get((g, m)), "step time (ms, median)")
    ax.set_title("overlap: step time per mode (overlapped = compute_only\nwould be perfect "
                 "overlap; lower is better)", fontsize="medium")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_memory(plt, series, path):
    groups, modes, peak, step = [], [], {}, {}
    for label, rows in series:
        for r in rows:
            group = ("%s, " % label if len(series) > 1 else "") + "%s ranks" % r["ranks"]
            groups += [group] if group not in groups else []
            modes += [r["mode"]] if r["mode"] not in modes else []
            peak[group, r["mode"]] = int(r["peak_host_bytes"]) / 1e6
            step[group, r["mode"]] = float(r["step_ms"])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7, 2.5 * len(groups)), 6),
                                      sharex=True)
    grouped_bars(top, groups, modes, lambda g, m: peak.get((g, m)), "peak host MB per rank")
    grouped_bars(bottom, groups, modes, lambda g, m: step.get((g, m)), "step time (ms)")
    top.set_title("memory: peak per rank and step time, by mode", fontsize="medium")
    top.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_torch_step(plt, series, path):
    groups, variants, med = [], [], {}
    for label, rows in series:
        for r in rows:
            group = "%s%s x%s, %s ranks" % ("%s: " % label if len(series) > 1 else "",
                                           r["model"], r["width"], r["ranks"])
            groups += [group] if group not in groups else []
            variants += [r["variant"]] if r["variant"] not in variants else []
            med[group, r["variant"]] = float(r["median_ms"])
    fig, ax = plt.subplots(figsize=(max(7, 2.5 * len(groups)), 4))
    grouped_bars(ax, groups, variants, lambda g, v: med.get((g, v)), "step time (ms, median)")
    ax.set_title("PyTorch training step: torch DDP vs Braid", fontsize="medium")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collective", action="append", default=[], metavar="LABEL=FILE")
    parser.add_argument("--overlap", action="append", default=[], metavar="LABEL=FILE")
    parser.add_argument("--memory", action="append", default=[], metavar="LABEL=FILE")
    parser.add_argument("--torch-step", action="append", default=[], metavar="LABEL=FILE")
    parser.add_argument("--out", default="docs")
    args = parser.parse_args()
    jobs = [("collective", args.collective, "bench_collectives.png", plot_collectives),
            ("overlap", args.overlap, "bench_overlap.png", plot_overlap),
            ("memory", args.memory, "bench_memory.png", plot_memory),
            ("torch_step", args.torch_step, "bench_torch_step.png", plot_torch_step)]
    if not any(specs for _, specs, _, _ in jobs):
        parser.error("no input: give at least one of --collective, --overlap, --memory, "
                     "--torch-step")
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    os.makedirs(args.out, exist_ok=True)
    for kind, specs, name, plot in jobs:
        if specs:
            path = os.path.join(args.out, name)
            plot(plt, labeled(specs, kind), path)
            print("plot_benches: wrote %s" % path)


if __name__ == "__main__":
    main()
