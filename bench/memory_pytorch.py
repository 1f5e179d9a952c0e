"""memory_pytorch: the braid.pytorch rows of //bench:memory: a real torch module (GPT-like:
token embedding, blocks of MLP + LayerNorm, a head) trained with ShardedAdamW, under
braid.pytorch.fully_shard (each block, then the root) and under ZeRO-2
(DistributedDataParallel(mode="reduce_scatter")), ranks as threads of a `local` world. It
prints the CSV columns of bench/memory.cc, so its rows go beside the C++ rows:

    tools/bazelw run //bench:memory_pytorch -- [--ranks 2,4] [--blocks 4] [--dim 128]

  ranks,mode,params,peak_host_bytes,peak_device_bytes,model_state_bytes,largest_unit_bytes,step_ms

peak_*: model.memory_stats()'s peak over the timed steps (Braid's buffers: gathered and
sharded parameters, gradient storage and shards, optimizer state; not torch's own activations
and module tensors), the largest over ranks; model_state_bytes: 20 bytes per parameter (f32
parameter, gradient, master, m, v); largest_unit_bytes: the embedding's f32 bytes; step_ms: the
median over --iters of the slowest rank's forward + backward + step (compute runs for real on
the shared cores here, unlike the C++ rows' sleeping compute). After the timed steps every
rank compares its parameters with rank 0's (bench fails otherwise: the replicas must agree).
"""

import argparse
import statistics
import sys
import threading
import time

import torch

import braid
from braid import pytorch as bt


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Gpt(torch.nn.Module):
    def __init__(self, vocab, d, blocks):
        super().__init__()
        torch.manual_seed(0)
        self.wte = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList([Block(d) for _ in range(blocks)])
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.wte(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _batch(rank, step, args):
    g = torch.Generator().manual_seed(1000 * rank + step)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    return tokens, torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)


def _run(ranks, mode, args):
    world = braid.World("local", local_ranks=ranks, timeout_ms=600000, read_env=False)
    groups = [world.group(r) for r in range(ranks)]
    times = [[0.0] * ranks for _ in range(args.iters)]
    peaks, params, errors = [0] * ranks, [None] * ranks, []
    barrier = threading.Barrier(ranks)

    def body(r):
        try:
            g = groups[r]
            net = Gpt(args.vocab, args.dim, args.blocks)
            if mode == "pytorch_fully_shard":
                for b in net.blocks:
                    bt.fully_shard(b, group=g)
                model = bt.fully_shard(net, group=g)
            else:
                model = bt.DistributedDataParallel(net, g, mode="reduce_scatter")
            opt = bt.ShardedAdamW(model.parameters(), lr=1e-3)
            # memory_stats / reset_memory_peaks: the fully_shard root's, DDP's reducer's
            mem = model if mode == "pytorch_fully_shard" else model.reducer
            for it in range(args.warmup + args.iters):
                if it == args.warmup:
                    opt.synchronize()
                    mem.reset_memory_peaks()
                barrier.wait()
                start = time.perf_counter()
                x, y = _batch(r, it, args)
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
                opt.step()
                opt.zero_grad()
                opt.synchronize()
                if it >= args.warmup:
                    times[it - args.warmup][r] = time.perf_counter() - start
            peaks[r] = mem.memory_stats()["host"][1]
            if mode == "pytorch_fully_shard":
                with model.summon_full_params():
                    params[r] = [p.detach().clone() for p in model.parameters()]
            else:
                params[r] = [p.detach().clone() for p in model.parameters()]
            opt.close()
            model.close()
        except BaseException as e:  # noqa: B902 (re-raised below)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for g in groups:
        g.close()
    world.close()
    for r in range(1, ranks):
        for a, b in zip(params[0], params[r]):
            if not torch.equal(a, b):
                raise SystemExit("memory_pytorch: %s rank %d's parameters differ from rank 0's"
                                 % (mode, r))
    n = sum(p.numel() for p in params[0])
    step_ms = statistics.median(max(t) for t in times) * 1000
    return (ranks, mode, n, max(peaks), 0, 20 * n, 4 * args.vocab * args.dim, step_ms)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2", help="rank counts, e.g. 2,4")
    ap.add_argument("--modes", default="pytorch_zero2,pytorch_fully_shard")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args(argv)
    print("ranks,mode,params,peak_host_bytes,peak_device_bytes,model_state_bytes,"
          "largest_unit_bytes,step_ms")
    for ranks in [int(v) for v in args.ranks.split(",")]:
        for mode in args.modes.split(","):
            if mode not in ("pytorch_zero2", "pytorch_fully_shard"):
                raise SystemExit("--modes: pytorch_zero2 or pytorch_fully_shard, got %r" % mode)
            row = _run(ranks, mode, args)
            print("%d,%s,%d,%d,%d,%d,%d,%.1f" % row, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
