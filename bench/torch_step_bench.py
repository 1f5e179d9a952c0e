"""Per-step time of the PyTorch training loop: Braid vs torch DDP (gloo), same machine, same run.

Every rank of `mpirun -np N` (bench/run_torch_step.sh launches it) trains the same model on
its own batches with each variant in turn, round-robin (so drift hits all alike):
  ddp       torch DistributedDataParallel (gloo) + torch.optim.AdamW       (the baseline)
  braid     braid.pytorch.DistributedDataParallel (all-reduce) + torch.optim.AdamW
  sharded   braid DDP, reduce-scatter mode + braid.pytorch.ShardedAdamW (steps each shard as
            its reduction completes, all-gathers while the next forward waits per module)
  autotuned braid DDP (all-reduce) with autotune=True + torch.optim.AdamW: tuned before the
            rounds (its tuning steps are untimed; their count is printed), then timed as the
            others; compare it with `braid`, the same stack on the default caps
  priority  braid DDP (all-reduce) + torch.optim.AdamW with communication scheduling:
            credit_mb=--credit_mb (buckets reduced in partitions of that size, one in flight);
            compare it with `braid`, the same stack unscheduled
  sharded_priority  `sharded` with credit_mb=--credit_mb and priorities=True (ShardedAdamW's
            parameter all-gathers ahead of reduction partitions not yet issued); compare it
            with `sharded`
  sharded_autotuned  `sharded` with autotune=True: ShardedAdamW's state follows every re-plan
            of the trials (tuned before the rounds, untimed, as `autotuned`); compare it with
            `sharded`
  fsdp      braid.pytorch.FullyShardedDataParallel (a unit per Linear / encoder layer,
            prefetch 1) + ShardedAdamW
  fsdp_priority  `fsdp` with credit_mb=--credit_mb and priorities=True (the unit gathers
            ahead of reduce-scatter partitions not yet issued); compare it with `fsdp`
Each round times --steps steps after --warmup; the figure is the median over rounds of the
per-step time, the slowest rank's; ratios are against ddp measured in the same rounds.
--csv prints only ranks,model,width,variant,median_ms,min_ms (tools/plot_benches.py plots it).
"""

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

import braid
from braid import pytorch as bt

import train_compare  # the gloo bootstrap
import train_models


VARIANTS = ("ddp", "braid", "sharded", "autotuned", "priority", "sharded_priority",
            "sharded_autotuned", "fsdp", "fsdp_priority")


def build(variant, kind, width, group, lr, credit_mb):
    model = train_models.make_model(kind, width)
    if variant == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        return wrapped, torch.optim.AdamW(wrapped.parameters(), lr=lr), None
    if variant in ("braid", "autotuned", "priority"):
        wrapped = bt.DistributedDataParallel(model, group, autotune=variant == "autotuned",
                                             credit_mb=credit_mb if variant == "priority" else 0)
        return wrapped, torch.optim.AdamW(wrapped.parameters(), lr=lr), None
    sched = ({"credit_mb": credit_mb, "priorities": True}
             if variant in ("sharded_priority", "fsdp_priority") else {})
    if variant.startswith("fsdp"):
        units = {torch.nn.Linear} if kind == "mlp" else {torch.nn.TransformerEncoderLayer}
        wrapped = bt.FullyShardedDataParallel(model, group, auto_wrap_policy=units, **sched)
    else:
        wrapped = bt.DistributedDataParallel(model, group, mode="reduce_scatter",
                                             autotune=variant == "sharded_autotuned", **sched)
    opt = bt.ShardedAdamW(wrapped, lr=lr)
    return wrapped, opt, opt


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n")[0])
    parser.add_argument("--model", default="mlp", choices=["mlp", "transformer"])
    parser.add_argument("--width", type=int, default=2, help="model width multiplier")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default="ddp,braid,sharded",
                        help="comma-separated, among " + ", ".join(VARIANTS))
    parser.add_argument("--credit_mb", type=float, default=1.0,
                        help="the priority variants' partition size and credit (MiB)")
    parser.add_argument("--csv", action="store_true",
                        help="print only ranks,model,width,variant,median_ms,min_ms rows")
    args = parser.parse_args()
    torch.set_num_threads(1)

    world = braid.World("mpi")
    group = world.group()
    rank, size = group.rank, group.size
    train_compare.init_gloo(group, rank, size)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error("unknown variant(s) %s: among %s" % (", ".join(unknown), ", ".join(VARIANTS)))
    stacks = {v: build(v, args.model, args.width, group, 1e-4, args.credit_mb) for v in variants}
    times = {v: [] for v in variants}
    step = 0
    tuning_steps = {}
    for v in variants:  # settle the tuners first (50-90 steps each), untimed
        if not v.endswith("autotuned"):
            continue
        model, opt, _ = stacks[v]
        tuning_steps[v] = 0
        while model._autotune and tuning_steps[v] < 200:
            train_models.train(args.model, model, opt, rank, 1, first_step=tuning_steps[v])
            tuning_steps[v] += 1
        step = max(step, tuning_steps[v])
    for _ in range(args.rounds):
        for v in variants:
            model, opt, sharded = stacks[v]
            train_models.train(args.model, model, opt, rank, args.warmup,
                               first_step=step + args.steps)
            if sharded is not None:
                sharded.synchronize()
            group.barrier().wait()
            start = time.perf_counter()
            train_models.train(args.model, model, opt, rank, args.steps, first_step=step)
            if sharded is not None:
                sharded.synchronize()
            elapsed = torch.tensor([(time.perf_counter() - start) / args.steps])
            group.allreduce(elapsed, op="max").wait()
            times[v].append(elapsed.item())
        step += args.steps + args.warmup  # warm-up on batches the timed steps do not use
    if rank == 0 and args.csv:
        print("ranks,model,width,variant,median_ms,min_ms")
        for v in variants:
            print("%d,%s,%d,%s,%.3f,%.3f" % (size, args.model, args.width, v,
                                             statistics.median(times[v]) * 1e3,
                                             min(times[v]) * 1e3))
        sys.stdout.flush()
    elif rank == 0:
        nparams = sum(p.numel() for p in stacks[variants[0]][0].parameters())
        base = statistics.median(times[variants[0]])
        print("torch_step_bench: %s width %d (%d params, f32), %d ranks, %d steps x %d rounds, "
              "batch %d per rank" % (args.model, args.width, nparams, size, args.steps,
                                      args.rounds, 16))
        for v, n in tuning_steps.items():
            print("%s: settled after %d untimed steps%s" % (
                v, n, "" if not stacks[v][0]._autotune else " (NOT settled)"))
        print("%-16s %12s %12s %10s" % ("variant", "median ms", "min ms", "vs " + variants[0]))
        for v in variants:
            med = statistics.median(times[v])
            print("%-16s %12.2f %12.2f %9.2fx" % (v, med * 1e3, min(times[v]) * 1e3, base / med))
        sys.stdout.flush()
    for v in variants:
        model, opt, sharded = stacks[v]
        if sharded is not None:
            sharded.close()
        if v != "ddp":
            model.close()
    dist.destroy_process_group()
    group.close()
    world.close()


if __name__ == "__main__":
    main()
