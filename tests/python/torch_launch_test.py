"""braid.World() beside torch.distributed on a plain environment launch (tests/gloo/run_ranks.sh
sets MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK as torchrun would), in
either order:

    torch-first  init_process_group("gloo") (env://, rank 0 binds MASTER_PORT), then
                 braid.World(): Braid meets through torch's store, never MASTER_PORT
    braid-first  braid.World() (rank 0 holds MASTER_PORT only while it runs), then
                 init_process_group("gloo") binds MASTER_PORT

Then, side by side: a torch DDP step and a Braid DDP step of the same model on the same
per-rank data give bit-identical gradients (2 ranks: an average of two is exact), a second
Braid world made through torch's store works too (its own keys), and a world_size that
contradicts torch's is refused by name.

    tests/gloo/run_ranks.sh 2 tests/python/run_python.sh tests/python/torch_launch_test.py \\
        torch-first
"""
import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist

import braid
import braid.pytorch

TIMEOUT_MS = 60000


def init_torch():
    dist.init_process_group("gloo", timeout=datetime.timedelta(milliseconds=TIMEOUT_MS))


def check_world(world, rank, size):
    assert world.backend == "gloo", world.backend
    assert world.size == size, (world.size, size)
    assert world.local_ranks == [rank], world.local_ranks


def ddp_step_matches_torch(group, rank, size):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ref = copy.deepcopy(net)
    torch_ddp = torch.nn.parallel.DistributedDataParallel(ref)
    braid_ddp = braid.pytorch.DistributedDataParallel(net, group)
    torch.manual_seed(1)
    x, y = torch.randn(8 * size, 16), torch.randn(8 * size, 4)
    x, y = x[8 * rank:8 * (rank + 1)], y[8 * rank:8 * (rank + 1)]
    torch.nn.functional.mse_loss(torch_ddp(x), y).backward()
    torch.nn.functional.mse_loss(braid_ddp(x), y).backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        assert p.grad is not None and q.grad is not None, name
        assert torch.equal(p.grad, q.grad), (name, (p.grad - q.grad).abs().max().item())
    # The gradients really are averages over both ranks: rank 0 alone differs.
    local = copy.deepcopy(ref)
    for p in local.parameters():
        p.grad = None
    torch.nn.functional.mse_loss(local(x), y).backward()
    assert any(not torch.equal(p.grad, q.grad) for p, q in zip(local.parameters(),
                                                                ref.parameters()))


def main():
    order = sys.argv[1]
    assert order in ("torch-first", "braid-first"), order
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if order == "torch-first":
        init_torch()
        world = braid.World(timeout_ms=TIMEOUT_MS)
    else:
        world = braid.World(timeout_ms=TIMEOUT_MS)
        assert not dist.is_initialized()
        init_torch()
    if world.backend == "nccl":
        print("a GPU and NCCL are present: the rule chose nccl; CPU DDP comparison skipped")
        return 0
    check_world(world, rank, size)
    group = world.group()
    ddp_step_matches_torch(group, rank, size)

    # A second world, now through torch's store (either order): its own keys, its own store.
    second = braid.World(timeout_ms=TIMEOUT_MS)
    check_world(second, rank, size)
    g2 = second.group()
    t = torch.full((5,), float(rank + 1))
    g2.allreduce(t).wait(TIMEOUT_MS)
    assert torch.equal(t, torch.full((5,), float(size * (size + 1) // 2))), t

    try:
        braid.World(world_size=size + 1, rank=rank, timeout_ms=TIMEOUT_MS)
        raise AssertionError("a world_size contradicting torch's was accepted")
    except ValueError as e:
        assert "world_size=%d" % (size + 1) in str(e) and "torch.distributed" in str(e), e

    dist.barrier()  # torch's collectives still work beside Braid's
    g2.barrier().wait(TIMEOUT_MS)
    group.barrier().wait(TIMEOUT_MS)  # everyone done before rank 0's stores go away
    second.close()
    world.close()
    dist.destroy_process_group()
    print("torch_launch_test (%s): rank %d of %d passed" % (order, rank, size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
