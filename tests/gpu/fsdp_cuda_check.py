"""braid.fully_shard on a CUDA module vs torch's own FSDP2 fully_shard on the same GPU (issue 22
item 3). Run by tools/gpu/run.sh from the GPU bundle: one process, one GPU, a 1-rank nccl world
for Braid and a 1-rank nccl process group for torch, the same model, batches and AdamW.

    python3 tests/gpu/fsdp_cuda_check.py                  # on the GPU machine
    python3 tests/gpu/fsdp_cuda_check.py --cpu-self-check # anywhere: the comparison machinery

Rows (each trains STEPS steps from the same initial weights):
  torch            the plain module + torch.optim.AdamW (the reference of every row)
  torch_fsdp2      torch's fully_shard per block and root + torch.optim.AdamW
  braid_sharded    braid fully_shard + ShardedAdamW (Braid's fused CUDA AdamW)
  braid_torchopt   braid fully_shard + torch.optim.AdamW over this rank's pieces
  torch_fsdp2_off  torch's fully_shard with CPUOffloadPolicy (AdamW steps on the CPU)
  braid_off        braid fully_shard with CPUOffloadPolicy + ShardedAdamW (CPU kernel)
  torch_fsdp2_bf16 torch's fully_shard with MixedPrecisionPolicy(param_dtype=bfloat16,
                   reduce_dtype=float32) + torch.optim.AdamW: the reference of the next row
  braid_bf16       braid fully_shard with the same policy + torch.optim.AdamW (its pieces);
                   its units gather in bf16 (cast gathers on the device, raised otherwise)
Columns: max |difference| of losses and parameters against `torch`, median step time
(steps after the first two, device synchronized), peak device memory: torch's
max_memory_allocated plus, for Braid rows, Braid's own device peak (memory_stats(): Braid
allocates its shards and gathered units outside torch's allocator). At one rank every average
is the sum, so a row must match `torch` within torch.allclose(rtol=1e-5, atol=1e-6) (AdamW
kernels may round differently; torch's optimizer over Braid's pieces is expected to be exact,
0 in both columns); braid_off must also use less
device memory than braid_sharded (its optimizer state is in host memory). Exit status 0 only
if every row passed; a row that raises is a FAIL with its traceback, the others still run.
Without CUDA it prints "skipped, no GPU" and exits 0; --cpu-self-check runs the braid rows on
a 1-rank `local` world on the CPU against `torch` and checks that a wrong row is caught.
"""

import os
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.join(HERE, "..", "..", "capi", "python"), os.path.join(HERE, "python")):
    if os.path.isdir(os.path.join(p, "braid")):
        sys.path.insert(0, p)

import torch  # noqa: E402

STEPS = 8
RTOL, ATOL = 1e-5, 1e-6  # torch.allclose's test, on losses and parameters
LR, WD = 1e-3, 0.01
SIZES = {"d": 256, "h": 1024, "blocks": 4}  # --cpu-self-check: a small model


class Block(torch.nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        d, h, blocks = SIZES["d"], SIZES["h"], SIZES["blocks"]
        torch.manual_seed(11)
        self.inp = torch.nn.Linear(64, d)
        self.blocks = torch.nn.ModuleList([Block(d, h) for _ in range(blocks)])
        self.head = torch.nn.Linear(d, 8)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def batches(device):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(32, 64, generator=g).to(device),
             torch.randint(0, 8, (32,), generator=g).to(device)) for _ in range(STEPS)]


def shard_blocks(net, shard, **kw):
    for b in net.blocks:
        shard(b, **kw)
    shard(net, **kw)
    return net


def train(net, opt, data, device, end=None):
    """(losses, step times in s); `end` runs after each step (a sharded optimizer's sync)."""
    losses, times = [], []
    for x, y in data:
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if end is not None:
            end()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


class Row:
    def __init__(self, name, losses, params, times, peak):
        self.name, self.losses, self.params, self.times, self.peak = (
            name, losses, params, times, peak)


def peak_reset(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def torch_peak(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def row_torch(device, data):
    net = Net().to(device)
    peak_reset(device)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
    losses, times = train(net, opt, data, device)
    return Row("torch", losses, [p.detach().cpu() for p in net.parameters()], times,
               torch_peak(device))


def _fsdp2():
    try:
        from torch.distributed.fsdp import (  # torch >= 2.6
            CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard)
    except ImportError:
        from torch.distributed._composable.fsdp import (
            CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard)
    return fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy


def row_torch_fsdp2(device, data, offload, bf16=False):
    fully_shard, cpu_offload, mp = _fsdp2()
    net = Net().to(device)
    peak_reset(device)
    kw = {"offload_policy": cpu_offload()} if offload else {}
    if bf16:
        kw["mp_policy"] = mp(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    shard_blocks(net, fully_shard, **kw)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
    losses, times = train(net, opt, data, device)
    # One rank: the local shard is the whole parameter (full_tensor() would all-gather, which
    # NCCL cannot do for the offloaded host shards).
    params = [p.to_local().detach().cpu().reshape(p.shape) for p in net.parameters()]
    name = "torch_fsdp2_bf16" if bf16 else "torch_fsdp2_off" if offload else "torch_fsdp2"
    return Row(name, losses, params, times, torch_peak(device))


def row_braid(device, data, group, optimizer, offload, name, lr=LR, bf16=False):
    import braid.pytorch as bt
    net = Net().to(device)
    peak_reset(device)
    kw = {"offload_policy": bt.CPUOffloadPolicy()} if offload else {}
    if bf16:
        kw["mp_policy"] = bt.MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                  reduce_dtype=torch.float32)
    shard_blocks(net, bt.fully_shard, group=group, **kw)
    if optimizer == "sharded":
        opt = bt.ShardedAdamW(net.parameters(), lr=lr, weight_decay=WD)
    else:
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=WD)
    if bf16:  # param_dtype's wire: bf16 gathers on the device too (0.11, docs/gpu-results.md)
        from braid import _lib
        wire = net._braid_fsdp.engine.fsdp_options.get("gather_dtype", _lib.GATHER_EXACT)
        if wire != _lib.GATHER_BF16:
            raise AssertionError("%s: gather_dtype %r, not GATHER_BF16" % (name, wire))
    net.reset_memory_peaks()
    losses, times = train(net, opt, data, device,
                          end=opt.synchronize if optimizer == "sharded" else None)
    peak = torch_peak(device) + net.memory_stats()["device"][1]
    with net.summon_full_params():
        params = [p.detach().cpu().clone() for p in net.parameters()]
    if optimizer == "sharded":
        opt.close()
    net.close()
    return Row(name, losses, params, times, peak)


def diff(a, b):
    """(max |a - b|, whether every element is within ATOL + RTOL |b|) over two lists of
    tensors (or floats) of the same shapes."""
    worst, close = 0.0, len(a) == len(b)
    for x, y in zip(a, b):
        x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
        if x.shape != y.shape:
            return float("inf"), False
        if x.numel():
            worst = max(worst, (x - y).abs().max().item())
            close = close and torch.allclose(x, y, rtol=RTOL, atol=ATOL)
    return worst, close


def judge(rows, ref):
    """Prints the table; returns the names of the rows that failed."""
    print("%-16s %12s %12s %11s %14s  %s" % ("row", "loss |diff|", "param |diff|", "step ms",
                                            "peak MiB", "verdict"))
    failed = []
    by_name = {r.name: r for r in rows}
    for r in rows:
        if r.losses is None:
            print("%-16s %12s %12s %11s %14s  FAIL (raised)" % (r.name, "-", "-", "-", "-"))
            failed.append(r.name)
            continue
        (dl, lok), (dp, pok) = diff(r.losses, ref.losses), diff(r.params, ref.params)
        ok = lok and pok
        why = "" if ok else " (differs from torch beyond rtol %g, atol %g)" % (RTOL, ATOL)
        on, off = by_name.get("braid_sharded"), by_name.get("braid_off")
        if r.name == "braid_off" and on is not None and on.losses is not None and r.peak and \
                r.peak >= on.peak:
            ok, why = False, " (peak not below braid_sharded's: state not offloaded?)"
        step = statistics.median(r.times[2:] or r.times) * 1e3
        print("%-16s %12.3g %12.3g %11.2f %14.1f  %s%s" % (
            r.name, dl, dp, step, r.peak / 2**20, "PASS" if ok else "FAIL", why))
        if not ok:
            failed.append(r.name)
    return failed


def guarded(name, fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 (a row that raises is that row's FAIL)
        traceback.print_exc()
        return Row(name, None, None, None, 0)


def gpu_check():
    import braid
    import torch.distributed as dist
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    print("torch %s, %s, braid %s" % (torch.__version__, torch.cuda.get_device_name(device),
                                      braid.version()), flush=True)
    data = batches(device)
    rows = [row_torch(device, data)]
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", init_method="file://" + os.path.join(tmp, "store"),
                                world_size=1, rank=0)
        try:
            rows.append(guarded("torch_fsdp2", row_torch_fsdp2, device, data, False))
            rows.append(guarded("torch_fsdp2_off", row_torch_fsdp2, device, data, True))
            bf16_ref = guarded("torch_fsdp2_bf16", row_torch_fsdp2, device, data, False, True)
        finally:
            dist.destroy_process_group()
    uid = braid.nccl_unique_id()
    with braid.World("nccl", unique_id=uid, world_size=1, rank=0, cuda_device=0) as world:
        g = world.group()
        for name, opt, off in (("braid_sharded", "sharded", False),
                               ("braid_torchopt", "torch", False),
                               ("braid_off", "sharded", True)):
            rows.append(guarded(name, row_braid, device, data, g, opt, off, name))
        bf16_row = guarded("braid_bf16", row_braid, device, data, g, "torch", False,
                           "braid_bf16", LR, True)
    failed = judge(rows, rows[0])
    print("-- bf16 compute (MixedPrecisionPolicy), against torch_fsdp2_bf16:")
    if bf16_ref.losses is None:
        failed.append("torch_fsdp2_bf16")
    else:
        failed += judge([bf16_row], bf16_ref)
    print("fsdp_cuda_check %s%s" % ("FAIL: " if failed else "PASS", ", ".join(failed)))
    return not failed


def cpu_self_check():
    """The braid rows on the CPU (1-rank local world) against `torch`, then a row trained with
    another learning rate, which the comparison must flag."""
    import braid
    SIZES.update(d=16, h=32, blocks=2)
    device = torch.device("cpu")
    data = batches(device)
    ref = row_torch(device, data)
    with braid.World("local", local_ranks=1, read_env=False) as world:
        g = world.group(0)
        rows = [ref] + [guarded(n, row_braid, device, data, g, o, off, n) for n, o, off in (
            ("braid_sharded", "sharded", False), ("braid_torchopt", "torch", False),
            ("braid_off", "sharded", True))]
        ok = not judge(rows, ref)
        print("-- a wrong row (lr x 2) must FAIL:")
        wrong = row_braid(device, data, g, "torch", False, "wrong_lr", lr=2 * LR)
        caught = judge([wrong], ref) == ["wrong_lr"]
    print("fsdp_cuda_check cpu self-check: %s" % ("PASS" if ok and caught else "FAIL"))
    return ok and caught


def main():
    if "--cpu-self-check" in sys.argv[1:]:
        return 0 if cpu_self_check() else 1
    if not torch.cuda.is_available():
        print("fsdp_cuda_check: no CUDA device: skipped, no GPU")
        return 0
    return 0 if gpu_check() else 1


if __name__ == "__main__":
    sys.exit(main())
