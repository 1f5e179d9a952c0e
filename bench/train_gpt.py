"""A small GPT trained on a real text, as torch DDP and as Braid sharded, on the same plot.

    tools/bazelw run //bench:train_gpt                     # 2 ranks under mpirun, 2 x 300 steps
    tools/bazelw run //bench:train_gpt -- --steps 600 --layers 4 --braid zero2 --out /tmp/gpt
    tools/bazelw run //bench:train_gpt -- --tied-embeddings --checkpoint reentrant
    tools/bazelw run //bench:train_gpt -- --moe 2 --expert-parallel 2 --max-grad-norm 1

Each rank (a process of mpirun) trains the same character-level GPT (pre-norm transformer
blocks, causal self-attention) from the same initial weights twice, on the same batches:
  ddp    torch.nn.parallel.DistributedDataParallel (gloo) + torch.optim.AdamW
  braid  braid.pytorch.FullyShardedDataParallel (one unit per block; --braid zero2:
         DistributedDataParallel in reduce_scatter mode) + braid.pytorch.ShardedAdamW
(--tied-embeddings: the head shares the token embedding's weight, as GPT-2; --checkpoint
reentrant / nonreentrant: every block under torch.utils.checkpoint, torch DDP then with
static_graph=True for reentrant, as torch requires; --moe EXPERTS: each block's MLP becomes
top-1 routed experts reduced over an expert-data-parallel group, bench/train_gpt_moe.py;
--max-grad-norm: one global-norm clip; --comm-hook HOOK: the Braid run is all-reduce DDP with
that communication hook and torch's AdamW, the torch run its uncompressed reference), both with
two param groups (weight
decay on matrices and embeddings, none on biases and LayerNorms) and the same warm-up +
cosine schedule (torch.optim.lr_scheduler.LambdaLR). The text is the GNU GPL version 3 as
Debian ships it (base-files: /usr/share/common-licenses/GPL-3; --text names another file); its
last tenth is held out for the validation loss. Rank 0 shows a tqdm progress bar per run and
writes to --out (default ./train_gpt_out in the directory `bazel run` was started from):
  losses.csv      step, lr, the two runs' training loss (mean over ranks)
  loss_curve.png  both curves on one plot, and their difference below it
Both runs do the same arithmetic up to the order of floating-point sums (gloo's vs Braid's)
and fused multiply-adds, so the curves lie on top of each other; the lower panel shows how
far apart they are (docs/train_gpt_loss.png: 300 steps, loss 4.45 -> 2.15, the runs never
more than one f32 ulp of the loss apart). Time: a few hundred ms per step and run on 2 shared
CPU cores (8 minutes for the default 2 x 300 steps on a machine also running two builds);
--steps, --width, --layers, --batch scale it.
"""

import argparse
import csv
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.utils.checkpoint

import braid
from braid import pytorch as bt

import train_compare  # the gloo bootstrap (tests/python, on run_python.sh's PYTHONPATH)

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"


class Block(torch.nn.Module):
    """Pre-norm transformer block: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, d, heads, context):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        # A plain attribute, not a buffer: constant, and neither gloo nor Braid moves bools.
        self.causal = torch.tril(torch.ones(context, context)).bool()

    def attend(self, x):
        """x plus the causal self-attention of ln1(x) (the block's first half)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(~self.causal[:t, :t], float("-inf")).softmax(dim=-1)
        return x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = self.attend(x)
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    """tied: the output head shares the token embedding's weight (GPT-2's weight tying).
    checkpoint: "reentrant" / "nonreentrant" recompute each block's activations in the
    backward (torch.utils.checkpoint with use_reentrant True / False), "none" keeps them."""

    def __init__(self, vocab, d, layers, heads, context, tied=False, checkpoint="none"):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, d)
        self.positions = torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads, context) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        if tied:  # GPT-2's init of the shared matrix (N(0, 1) would start at a loss of ~24)
            torch.nn.init.normal_(self.tokens.weight, std=0.02)
            self.head.weight = self.tokens.weight
        self.checkpoint = checkpoint

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block in self.blocks:
            if self.checkpoint == "none" or not torch.is_grad_enabled():  # (evaluation)
                x = block(x)
            else:
                x = torch.utils.checkpoint.checkpoint(
                    block, x, use_reentrant=self.checkpoint == "reentrant")
        return self.head(self.ln(x))


def load_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        sys.exit("train_gpt: cannot read the training text %s (%s); pass --text FILE" %
                 (path, e.strerror))
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    cut = len(data) * 9 // 10
    return chars, data[:cut], data[cut:]


def batch(data, context, size, seed):
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - context - 1, (size,), generator=g)
    x = torch.stack([data[s:s + context] for s in starts])
    y = torch.stack([data[s + 1:s + context + 1] for s in starts])
    return x, y


def param_groups(net, weight_decay):
    decay = [p for p in net.parameters() if p.dim() >= 2]
    other = [p for p in net.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": other, "weight_decay": 0.0}]


def schedule(args):
    warm = max(1, args.steps // 10)

    def factor(step):  # linear warm-up, then cosine down to a tenth
        if step < warm:
            return (step + 1) / warm
        t = (step - warm) / max(1, args.steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
    return factor


def make_net(args, vocab):
    torch.manual_seed(args.seed)
    return GPT(vocab, args.width, args.layers, args.heads, args.context,
               tied=args.tied_embeddings, checkpoint=args.checkpoint)


def train(name, args, model, opt, data, rank, size, clip=None, norms=None):
    """The step losses of this rank, and seconds per step. clip(): after each backward, its
    result (the global gradient norm) appended to norms."""
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(args))
    losses, lrs = [], []
    steps = range(args.steps)
    if rank == 0:
        from tqdm import tqdm
        steps = tqdm(steps, desc=name, unit="step", file=sys.stderr, dynamic_ncols=True,
                     mininterval=0.5)
    start = time.perf_counter()
    for step in steps:
        x, y = batch(data, args.context, args.batch, (args.seed * 100003 + step) * size + rank)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        loss.backward()
        if clip is not None:
            norms.append(float(clip()))
        opt.step()
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
        opt.zero_grad()
        losses.append(float(loss))
        if rank == 0:
            steps.set_postfix(loss="%.3f" % losses[-1], lr="%.2g" % lrs[-1])
    return losses, lrs, (time.perf_counter() - start) / args.steps


@torch.no_grad()
def validation_loss(args, model, data, rank, size):
    total = 0.0
    for i in range(args.eval_batches):
        x, y = batch(data, args.context, args.batch, 10**9 + i * size + rank)
        logits = model(x)
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                         y.reshape(-1)))
    return total / args.eval_batches


def run_ddp(args, vocab, train_data, val_data, rank, size):
    net = make_net(args, vocab)
    # torch DDP supports reentrant checkpointing with static_graph=True only.
    model = torch.nn.parallel.DistributedDataParallel(
        net, static_graph=args.checkpoint == "reentrant")
    opt = torch.optim.AdamW(param_groups(net, args.weight_decay), lr=args.lr)
    clip = None
    if args.max_grad_norm > 0:
        def clip():
            return torch.nn.utils.clip_grad_norm_(net.parameters(), args.max_grad_norm)
    norms = []
    losses, lrs, per_step = train("torch DDP", args, model, opt, train_data, rank, size, clip,
                                  norms)
    return losses, lrs, per_step, validation_loss(args, model, val_data, rank, size), norms


def comm_hook(args):
    """--comm-hook as a braid.comm_hooks hook."""
    from braid import comm_hooks
    return {"bf16": comm_hooks.bf16_compress, "fp16": comm_hooks.fp16_compress,
            "int8": comm_hooks.int8,
            "powersgd": lambda: comm_hooks.powersgd(
                args.powersgd_rank, start_powerSGD_iter=args.powersgd_start_iter)
            }[args.comm_hook]()


def run_braid_hooked(args, vocab, group, train_data, val_data, rank, size):
    """--comm-hook: Braid's all-reduce DDP with the hook + torch's AdamW, the same optimizer
    arithmetic as the torch DDP run, which is the uncompressed reference."""
    net = make_net(args, vocab)
    model = bt.DistributedDataParallel(net, group, bucket_cap_mb=args.bucket_cap_mb)
    model.register_comm_hook(None, comm_hook(args))
    opt = torch.optim.AdamW(param_groups(net, args.weight_decay), lr=args.lr)
    name = "Braid DDP + " + args.comm_hook
    losses, lrs, per_step = train(name, args, model, opt, train_data, rank, size)
    val = validation_loss(args, model, val_data, rank, size)
    model.close()
    return losses, lrs, per_step, val, []


def run_braid(args, vocab, group, train_data, val_data, rank, size):
    if args.comm_hook != "none":
        return run_braid_hooked(args, vocab, group, train_data, val_data, rank, size)
    net = make_net(args, vocab)
    # Before wrapping: FullyShardedDataParallel makes each parameter a 1-D piece of itself until
    # a sharded optimizer holds it, so p.dim() no longer tells matrices from vectors.
    groups = param_groups(net, args.weight_decay)
    if args.braid == "fsdp":
        model = bt.FullyShardedDataParallel(net, group, auto_wrap_policy={Block},
                                            bucket_cap_mb=args.bucket_cap_mb)
    else:
        model = bt.DistributedDataParallel(net, group, mode="reduce_scatter",
                                           bucket_cap_mb=args.bucket_cap_mb)
    opt = bt.ShardedAdamW(model, lr=args.lr, params=groups, max_grad_norm=args.max_grad_norm)
    clip = None
    if args.max_grad_norm > 0:
        def clip():  # the step's global norm, clipped inside the step (max_grad_norm)
            return opt.clip_grad_norm_(args.max_grad_norm)
    name = "Braid " + ("FSDP" if args.braid == "fsdp" else "ZeRO-2")
    norms = []
    losses, lrs, per_step = train(name, args, model, opt, train_data, rank, size, clip, norms)
    val = validation_loss(args, model, val_data, rank, size)
    opt.close()
    model.close()
    return losses, lrs, per_step, val, norms


def mean_over_ranks(group, values):
    t = torch.tensor(values, dtype=torch.float64)
    group.allreduce(t, op="avg").wait()
    return t.tolist()


def write_outputs(args, lrs, ddp, braid_losses, labels, out, norms=((), ())):
    """losses.csv (with --max-grad-norm also each run's global gradient norm per step, the
    same on every rank) and loss_curve.png."""
    os.makedirs(out, exist_ok=True)
    csv_path, png_path = os.path.join(out, "losses.csv"), os.path.join(out, "loss_curve.png")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "lr", "ddp_loss", "braid_loss"] +
                   (["ddp_norm", "braid_norm"] if norms[0] else []))
        for step, row in enumerate(zip(lrs, ddp, braid_losses)):
            row += (norms[0][step], norms[1][step]) if norms[0] else ()
            w.writerow([step] + ["%.9g" % v for v in row])
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    steps = range(len(ddp))
    top.plot(steps, ddp, label=labels[0], linewidth=2.5, alpha=0.6)
    top.plot(steps, braid_losses, label=labels[1], linewidth=1.0, linestyle="--")
    top.set_ylabel("training loss (mean over ranks)")
    top.set_title("char-level GPT on %s, %d ranks" % (os.path.basename(args.text), args.np))
    top.legend()
    top.grid(alpha=0.3)
    gap = [abs(a - b) for a, b in zip(ddp, braid_losses)]
    bottom.plot(steps, [max(g, 1e-12) for g in gap], color="gray")
    bottom.set_yscale("log")
    bottom.set_ylabel("|difference|\n(0 drawn at 1e-12)")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return csv_path, png_path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank and step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--braid", choices=("fsdp", "zero2"), default=None,
                        help="Braid's run: fsdp (the default) or zero2 (the only one with --moe)")
    parser.add_argument("--bucket-cap-mb", type=float, default=0.25)
    parser.add_argument("--tied-embeddings", "--tie-embeddings", action="store_true",
                        help="the output head shares the token embedding's weight")
    parser.add_argument("--checkpoint", choices=("none", "reentrant", "nonreentrant"),
                        default="none", help="activation checkpointing of every block")
    parser.add_argument("--moe", type=int, default=0, metavar="EXPERTS",
                        help="each block's MLP: EXPERTS top-1 routed experts per rank")
    parser.add_argument("--expert-parallel", type=int, default=1, metavar="EP",
                        help="with --moe: EP ranks hold different experts")
    parser.add_argument("--max-grad-norm", type=float, default=0.0,
                        help="clip by the global gradient norm (0: no clipping)")
    parser.add_argument("--comm-hook", choices=("none", "bf16", "fp16", "int8", "powersgd"),
                        default="none", help="the Braid run: all-reduce DDP with this "
                        "communication hook and torch's AdamW (the torch DDP run: uncompressed)")
    parser.add_argument("--powersgd-rank", type=int, default=4,
                        help="--comm-hook powersgd: matrix_approximation_rank")
    parser.add_argument("--powersgd-start-iter", type=int, default=0,
                        help="--comm-hook powersgd: start_powerSGD_iter (steps uncompressed)")
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(
        os.environ.get("BUILD_WORKING_DIRECTORY", "."), "train_gpt_out"))
    args = parser.parse_args()
    if args.comm_hook != "none" and (args.moe or args.checkpoint != "none"):
        parser.error("--comm-hook runs without --moe and --checkpoint")
    if args.moe:  # ShardedAdamW.linked covers DistributedDataParallel wrappers only
        if args.braid == "fsdp" or args.checkpoint != "none":
            parser.error("--moe runs Braid as --braid zero2 without --checkpoint")
        import train_gpt_moe as moe
    args.braid = args.braid or ("zero2" if args.moe else "fsdp")
    run_torch, run_ours = (moe.run_ddp, moe.run_braid) if args.moe else (run_ddp, run_braid)
    torch.set_num_threads(1)

    world = braid.World("mpi")
    group = world.group()
    rank, size = group.rank, group.size
    args.np = size
    train_compare.init_gloo(group, rank, size)
    chars, train_data, val_data = load_text(args.text)
    if rank == 0:
        n = (moe.parameter_count(args, len(chars)) if args.moe else
             sum(p.numel() for p in make_net(args, len(chars)).parameters()))
        print("train_gpt: %s (%d characters, vocabulary %d), GPT %d layers x %d wide (%d "
              "parameters%s%s), %d ranks x %d sequences of %d, %d steps%s" % (
                  args.text, len(train_data) + len(val_data), len(chars), args.layers,
                  args.width, n, ", tied embeddings" if args.tied_embeddings else "",
                  ", %d x %d experts per block" % (args.expert_parallel, args.moe)
                  if args.moe else "", size,
                  args.batch, args.context, args.steps,
                  "" if args.checkpoint == "none" else
                  ", %s activation checkpointing" % args.checkpoint), flush=True)
    ddp_losses, lrs, ddp_step, ddp_val, ddp_norms = run_torch(args, len(chars), train_data,
                                                              val_data, rank, size)
    braid_losses, braid_lrs, braid_step, braid_val, braid_norms = run_ours(
        args, len(chars), group, train_data, val_data, rank, size)
    if lrs != braid_lrs:
        sys.exit("train_gpt: the two runs' learning rates differ")
    ddp_mean = mean_over_ranks(group, ddp_losses + [ddp_val])
    braid_mean = mean_over_ranks(group, braid_losses + [braid_val])
    if rank == 0:
        labels = ("torch DDP + AdamW", "Braid %s + ShardedAdamW" %
                  ("FSDP" if args.braid == "fsdp" else "ZeRO-2"))
        if args.comm_hook != "none":
            labels = ("torch DDP + AdamW (uncompressed)", "Braid DDP + AdamW, %s hook%s" % (
                args.comm_hook,
                " r=%d" % args.powersgd_rank if args.comm_hook == "powersgd" else ""))
        if args.moe:
            labels = ("torch DDP x 2 + AdamW", "Braid ZeRO-2 x 2 + .linked")
        csv_path, png_path = write_outputs(args, lrs, ddp_mean[:-1], braid_mean[:-1], labels,
                                           args.out, (ddp_norms, braid_norms))
        gap = max(abs(a - b) for a, b in zip(ddp_mean, braid_mean))
        for label, mean, per_step in ((labels[0], ddp_mean, ddp_step),
                                      (labels[1], braid_mean, braid_step)):
            print("  %-28s loss %.4f -> %.4f, validation %.4f, %.1f ms/step" % (
                label, mean[0], mean[-2], mean[-1], per_step * 1e3))
        print("  largest loss difference between the runs: %.3g" % gap)
        print("  wrote %s and %s" % (csv_path, png_path), flush=True)
    dist.destroy_process_group()
    group.close()
    world.close()


if __name__ == "__main__":
    main()
