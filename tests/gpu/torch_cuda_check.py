"""braid.pytorch with CUDA modules, end to end on a GPU machine, against torch on the same GPUs
(issue 15 item 2). Run by tools/gpu/run.sh from the GPU bundle; prints "skipped, no GPU" and
exits 0 where torch sees no CUDA device (the CPU machines: Debian's torch is CPU-only).

    python3 tests/gpu/torch_cuda_check.py              # 1 rank, and 2 if two GPUs are visible

One rank (world size 1 on nccl, a unique id made in-process), every check against plain torch
on the same GPU with the same batches:
  ddp_allreduce    DistributedDataParallel + torch.optim.AdamW, a no_sync window included:
                   parameters bit for bit (the average over one rank is the sum);
  main_grad        a bf16 model with main_grad=True: p.main_grad == the f32 sum of the bf16
                   gradients of two microbatches, bit for bit;
  find_unused      an unused branch: its .grad stays None (as torch DDP), the others bit for
                   bit; with device_ids=[0] (CPU inputs moved to the GPU by forward, as torch);
  zero_grad        DistributedDataParallel.zero_grad() zeroes the device views;
  sharded_adamw    reduce_scatter + ShardedAdamW vs torch.optim.AdamW (Braid's fused CUDA
                   AdamW: same math, compared within 1e-6 relative, the max difference printed);
  errors           a CUDA module on a World("local") group: ValueError naming the parameter.
Two ranks (two processes, one GPU each; only with two visible GPUs): Braid DDP vs torch's
DistributedDataParallel (nccl), bit for bit (sum then divide by 2 == divide then sum).
Exit status 0 only if every check passed; each prints one PASS/FAIL line.
"""

import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.join(HERE, "..", "..", "capi", "python"), os.path.join(HERE, "python")):
    if os.path.isdir(os.path.join(p, "braid")):
        sys.path.insert(0, p)

import torch  # noqa: E402

import braid  # noqa: E402
import braid.pytorch as bt  # noqa: E402

STEPS = 4


class WithUnusedHead(torch.nn.Module):
    """`body` plus a head that forward never calls (find_unused_parameters' case)."""

    def __init__(self, body):
        super().__init__()
        self.body = body
        self.unused_head = torch.nn.Linear(256, 8)

    def forward(self, x):
        return self.body(x)


def make_model(seed=7, dtype=torch.float32, unused=False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
              torch.nn.GELU(), torch.nn.Linear(256, 8)]
    model = torch.nn.Sequential(*layers)
    if unused:
        model = WithUnusedHead(model)
    return model.to(device="cuda", dtype=dtype)


def batch(rank, step, micro, dtype=torch.float32):
    g = torch.Generator().manual_seed(rank * 7919 + step * 31 + micro)
    x = torch.randn(32, 64, generator=g)
    y = torch.randint(0, 8, (32,), generator=g)
    return x.to("cuda", dtype), y.to("cuda")


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x).float(), y)


def same(a, b):
    return a.shape == b.shape and torch.equal(a, b)


def report(name, ok, detail=""):
    print("%-16s %s %s" % (name, "PASS" if ok else "FAIL", detail), flush=True)
    return ok


def train(model, opt, rank, wrapped=None):
    """STEPS steps; step 1 accumulates two microbatches (the first under no_sync)."""
    for step in range(STEPS):
        micros = 2 if step == 1 else 1
        for m in range(micros):
            x, y = batch(rank, step, m)
            last = m == micros - 1
            if wrapped is not None and not last:
                with wrapped.no_sync():
                    loss_of(model, x, y).backward()
            else:
                loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()


def check_ddp_allreduce(group):
    ref = make_model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    train(ref, ref_opt, 0)
    net = make_model()
    model = bt.DistributedDataParallel(net, group)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, opt, 0, wrapped=model)
    torch.cuda.synchronize()
    bad = [n for (n, a), b in zip(net.named_parameters(), ref.parameters()) if not same(a, b)]
    grad_on_device = all(p.grad is None or p.grad.is_cuda for p in net.parameters())
    model.close()
    return report("ddp_allreduce", not bad and grad_on_device,
                  "mismatch: %s" % bad if bad else "")


def check_main_grad(group):
    ref = make_model(dtype=torch.bfloat16)
    for m in range(2):
        x, y = batch(0, 0, m, torch.bfloat16)
        loss_of(ref, x, y).backward()
        for p in ref.parameters():  # f32 sum of each microbatch's bf16 gradient
            p.acc = p.grad.float() if m == 0 else p.acc + p.grad.float()
            p.grad = None
    net = make_model(dtype=torch.bfloat16)
    model = bt.DistributedDataParallel(net, group, main_grad=True)
    for m in range(2):
        x, y = batch(0, 0, m, torch.bfloat16)
        if m == 0:
            with model.no_sync():
                loss_of(model, x, y).backward()
        else:
            loss_of(model, x, y).backward()
    torch.cuda.synchronize()
    bad = [n for (n, a), b in zip(net.named_parameters(), ref.parameters())
           if not same(a.main_grad, b.acc)]
    model.close()
    return report("main_grad", not bad, "mismatch: %s" % bad if bad else "")


def check_find_unused(group):
    ref = make_model(unused=True)
    x, y = batch(0, 0, 0)
    loss_of(ref, x, y).backward()
    net = make_model(unused=True)
    model = bt.DistributedDataParallel(net, [0], group=group, find_unused_parameters=True)
    loss_of(model, x.cpu(), y).backward()  # device_ids=[0]: forward moves x to cuda:0
    torch.cuda.synchronize()
    bad = []
    for (n, a), b in zip(net.named_parameters(), ref.parameters()):
        if n.startswith("unused_head") and a.grad is not None:  # no rank used it: None
            bad.append(n)
        elif not n.startswith("unused_head") and not same(a.grad, b.grad):
            bad.append(n)
    model.zero_grad()
    torch.cuda.synchronize()
    nonzero = [n for n, p in net.named_parameters()
               if p.grad is not None and bool(p.grad.abs().sum() != 0)]
    model.close()
    ok1 = report("find_unused", not bad, "mismatch: %s" % bad if bad else "")
    ok2 = report("zero_grad", not nonzero, "not zeroed: %s" % nonzero if nonzero else "")
    return ok1 and ok2


def check_sharded_adamw(group):
    ref = make_model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    train(ref, ref_opt, 0)
    net = make_model()
    model = bt.DistributedDataParallel(net, group, mode="reduce_scatter")
    opt = bt.ShardedAdamW(model, lr=1e-3, weight_decay=0.01)
    train(model, opt, 0, wrapped=model)
    opt.synchronize()
    torch.cuda.synchronize()
    worst = 0.0
    for a, b in zip(net.parameters(), ref.parameters()):
        worst = max(worst, float(((a - b).abs() / b.abs().clamp_min(1e-3)).max()))
    on_device = all(p.is_cuda for p in net.parameters())
    opt.close()
    model.close()
    return report("sharded_adamw", worst <= 1e-6 and on_device,
                  "max relative difference %.3g vs torch.optim.AdamW" % worst)


def check_errors():
    with braid.World("local", local_ranks=1) as world:
        try:
            bt.DistributedDataParallel(make_model(), world.group(0))
        except ValueError as e:
            return report("errors", "'0.weight'" in str(e) and "nccl" in str(e), str(e)[:120])
    return report("errors", False, "no error for a CUDA module on a local world")


def one_rank():
    torch.cuda.set_device(0)
    uid = braid.nccl_unique_id()
    with braid.World("nccl", unique_id=uid, world_size=1, rank=0, cuda_device=0) as world:
        group = world.group()
        results = [guarded(check, group) for check in
                   (check_ddp_allreduce, check_main_grad, check_find_unused, check_sharded_adamw)]
    results.append(guarded(check_errors))
    return all(results)


def guarded(check, *args):
    """Runs one check; an exception is that check's FAIL line (with its traceback), so the
    other checks still run and report."""
    try:
        return check(*args)
    except Exception as e:  # noqa: BLE001 (any failure of the check is its result)
        import traceback
        traceback.print_exc()
        return report(check.__name__[len("check_"):], False, "raised %s: %s" %
                      (type(e).__name__, str(e)[:200]))


def two_rank_worker(rank, tmp):
    """One of two processes: Braid DDP and torch DDP side by side, same batches."""
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    id_path = os.path.join(tmp, "braid_uid")
    if rank == 0:
        with open(id_path + ".part", "wb") as f:
            f.write(braid.nccl_unique_id())
        os.rename(id_path + ".part", id_path)
    dist.init_process_group("nccl", init_method="file://" + os.path.join(tmp, "torch_store"),
                            world_size=2, rank=rank)
    deadline = time.monotonic() + 60  # torch 2.x's init is no barrier: wait for rank 0's file
    while not os.path.exists(id_path):
        if time.monotonic() > deadline:
            return report("ddp_2ranks_r%d" % rank, False, "rank 0 wrote no unique id in 60 s")
        time.sleep(0.05)
    with open(id_path, "rb") as f:
        uid = f.read()
    ref = torch.nn.parallel.DistributedDataParallel(make_model(), device_ids=[rank])
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    train(ref, ref_opt, rank, wrapped=ref)
    with braid.World("nccl", unique_id=uid, world_size=2, rank=rank, cuda_device=rank) as world:
        net = make_model()
        model = bt.DistributedDataParallel(net, world.group())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        train(model, opt, rank, wrapped=model)
        torch.cuda.synchronize()
        bad = [n for (n, a), b in zip(net.named_parameters(), ref.module.parameters())
               if not same(a, b)]
        model.close()
    dist.destroy_process_group()
    return report("ddp_2ranks_r%d" % rank, not bad,
                  "vs torch DDP, mismatch: %s" % bad if bad else "vs torch DDP")


def two_ranks():
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), tmp])
                 for r in range(2)]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=200))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                codes.append("timed out (killed)")
    return report("ddp_2ranks", codes == [0, 0], "exit codes %s" % codes)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(0 if two_rank_worker(int(sys.argv[2]), sys.argv[3]) else 1)
    if not torch.cuda.is_available():
        print("torch_cuda_check: no CUDA device: skipped, no GPU")
        return 0
    print("torch %s, %d GPU(s), braid %s" % (torch.__version__, torch.cuda.device_count(),
                                             braid.version()), flush=True)
    ok = one_rank()
    if torch.cuda.device_count() >= 2:
        ok = two_ranks() and ok
    else:
        print("ddp_2ranks       not run: one GPU (NCCL takes one rank per GPU)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
