"""hooks_torch: torch DDP's own communication hooks on the model and link of bench/hooks_hosts.

The baseline hooks_hosts's rows are measured against (issue 20, item 3): torch 1.13 DDP over
torch's gloo process group, one DDP instance per hook (their state survives steps), rows
interleaved per iteration, on the same GPT-2-like parameter shapes (bench/overlap_model.cc,
scaled counts, every matrix viewed as hooks_hosts's Rows views it) and DDP's bucket cap scaled
alike. Rows: none (torch's allreduce), fp16_compress_hook, powerSGD_hook r=1 and r=4 (torch
1.13 refuses bf16_compress_hook without CUDA and NCCL) (start_powerSGD_iter=2, torch's minimum with
error feedback; the warm-up covers it).

Known to fail: torch 1.13's powerSGD_hook issues its P all-reduce from inside a future callback
and waits there; over gloo at --scale=0.0625 every rank hangs from the step compression starts
(several buckets), and with one bucket the callback's all-reduce races the main thread's
collectives (gloo: "op.preamble.length <= op.nbytes"). --hooks=none,fp16 runs the rest.

step_ms: the slowest rank's loss.backward() of a loss whose gradient is a fixed tensor per
parameter (the backward's compute is one multiply per element; the rest is DDP's reduction),
median over iterations. link_MB: bytes host 0's `--link` interface sent plus received per step.

  tools/hosts/mpirun.sh -p braid -np 4 -x MASTER_ADDR=10.77.0.1 -x GLOO_SOCKET_IFNAME=eth0 \\
      /usr/bin/python3 bench/hooks_torch.py --link=eth0 --iters=5 --warmup=2
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP


def gpt2_like(blocks, scale):
    """(name, count) as bench/overlap_model.cc's Gpt2LikeModel (llround of count * scale)."""
    d, vocab, context = 768, 50257, 1024
    full = [("wte", vocab * d), ("wpe", context * d)]
    for k in range(blocks):
        h = f"h.{k}."
        full += [(h + "ln_1.weight", d), (h + "ln_1.bias", d),
                 (h + "attn.c_attn.weight", d * 3 * d), (h + "attn.c_attn.bias", 3 * d),
                 (h + "attn.c_proj.weight", d * d), (h + "attn.c_proj.bias", d),
                 (h + "ln_2.weight", d), (h + "ln_2.bias", d),
                 (h + "mlp.c_fc.weight", d * 4 * d), (h + "mlp.c_fc.bias", 4 * d),
                 (h + "mlp.c_proj.weight", 4 * d * d), (h + "mlp.c_proj.bias", d)]
    full += [("ln_f.weight", d), ("ln_f.bias", d)]
    return [(n, max(1, int(math.floor(c * scale + 0.5)))) for n, c in full]


def nearest_divisor(c, target):
    best = 1
    r = 1
    while r * r <= c:
        if c % r == 0:
            for v in (r, c // r):
                if abs(v - target) < abs(best - target) or (
                        abs(v - target) == abs(best - target) and v < best):
                    best = v
        r += 1
    return best


def shapes(params, scale):
    """hooks_hosts's Rows: matrices as (rows, count / rows), vectors 1-D."""
    d = max(1.0, 768 * math.sqrt(scale))
    out = []
    for name, c in params:
        matrix = name.endswith("weight") and "ln_" not in name
        embedding = name in ("wte", "wpe")
        r = nearest_divisor(c, c / d if embedding else d)
        out.append((r, c // r) if (matrix or embedding) and 1 < r < c else (c,))
    return out


class Flat(torch.nn.Module):
    def __init__(self, shps):
        super().__init__()
        self.ps = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s)) for s in shps)

    def forward(self, coefs):
        return sum((p * c).sum() for p, c in zip(self.ps, coefs))


def link_bytes(dev):
    try:
        return sum(int(open(f"/sys/class/net/{dev}/statistics/{w}").read())
                   for w in ("tx_bytes", "rx_bytes"))
    except OSError:
        return -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=0.0625)
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--link", default="")
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--hooks", default="none,fp16,powersgd_r1,powersgd_r4",
                    help="rows to run, comma-separated")
    a = ap.parse_args()
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{a.port}",
                            rank=rank, world_size=world)
    params = gpt2_like(a.blocks, a.scale)
    shps = shapes(params, a.scale)
    cap_mb = 25 * a.scale
    # torch 1.13 refuses bf16_compress_hook without CUDA 11 and NCCL 2.10: no bf16 row.
    rows = [("none", None, None), ("fp16", default_hooks.fp16_compress_hook, None)]
    for r in (1, 4):
        rows.append((f"powersgd_r{r}", psgd.powerSGD_hook,
                     lambda r=r: psgd.PowerSGDState(process_group=None,
                                                    matrix_approximation_rank=r,
                                                    start_powerSGD_iter=2)))
    wanted = a.hooks.split(",")
    rows = [r for r in rows if r[0] in wanted]
    models = []
    for name, hook, state in rows:
        m = DDP(Flat(shps), bucket_cap_mb=cap_mb)
        if hook is not None:
            m.register_comm_hook(state() if state else None, hook)
        models.append((name, m))
    if rank == 0:
        n = sum(c for _, c in params)
        print(f"[hooks_torch] {world} ranks, {n * 4 / 1e6:.1f} MB of f32 gradients, "
              f"torch {torch.__version__}", file=sys.stderr)
    times = {name: [] for name, _ in models}
    link = {name: 0 for name, _ in models}
    failed = {}
    on_bed = rank == 0 and a.link and link_bytes(a.link) >= 0
    for it in range(a.warmup + a.iters):
        g = torch.Generator().manual_seed(it)
        coefs = [torch.rand(s, generator=g) * 2 - 1 + 0.01 * rank for s in shps]
        for name, m in models:
            if name in failed:
                continue
            dist.barrier()
            b0 = link_bytes(a.link) if on_bed else 0
            loss = m(coefs)
            t0 = time.perf_counter()
            try:
                loss.backward()
            except RuntimeError as e:  # e.g. a dtype torch's gloo does not reduce
                failed[name] = str(e).splitlines()[0]
                continue
            ms = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float64)
            dist.barrier()
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)
            if it >= a.warmup:
                times[name].append(ms.item())
                if on_bed:
                    link[name] += link_bytes(a.link) - b0
    if rank == 0:
        print(f"{'hook':<13} {'step_ms':>10} {'vs_none':>8} {'link_MB':>10}")
        none = statistics.median(times["none"])
        for name, _ in models:
            if name in failed:
                print(f"{name:<13} failed: {failed[name]}")
                continue
            med = statistics.median(times[name])
            mb = f"{link[name] / 1e6 / a.iters:.4g}" if on_bed else "-"
            print(f"{name:<13} {med:10.1f} {none / med:7.2f}x {mb:>10}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
