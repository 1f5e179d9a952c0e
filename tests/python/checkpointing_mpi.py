"""Activation checkpointing under mpirun -np 2 (Braid's "mpi" world, one process per rank)
against torch's own DistributedDataParallel (gloo; static_graph=True with reentrant
checkpoints) in the same process, the model and data of checkpointing_test.py with reentrant
and non-reentrant checkpoints: Braid's DistributedDataParallel (static_graph=True with
reentrant) + torch AdamW equal to torch bit for bit after every step, ZeRO-2 (reduce_scatter +
ShardedAdamW) to the kernels' rounding, and fully_shard units + torch AdamW on the pieces to
1e-6."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import braid
from braid import pytorch as bt
import train_compare  # init_gloo
from checkpointing_test import STEPS, Net, _adamw, _data


def _run(model, opt, net, rank):
    """STEPS steps; the parameters after each."""
    after = []
    for step in range(STEPS):
        x, y = _data(rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        after.append([p.detach().clone() for p in net.parameters()])
    return after


def _run_gathered(net, opt, rank):
    """_run for a fully_shard model: the full parameters after each step."""
    after = []
    for step in range(STEPS):
        x, y = _data(rank, step)
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad()
        with net.summon_full_params():
            after.append([p.detach().clone() for p in net.parameters()])
    return after


def _compare(group, rank, reentrant):
    """Failures of Braid DDP (bit for bit), ZeRO-2 and fully_shard (1e-6) against torch DDP."""
    ref_net = Net(reentrant)
    want = _run(TorchDDP(ref_net, static_graph=reentrant), _adamw(ref_net.parameters()),
                ref_net, rank)
    net = Net(reentrant)
    ddp = bt.DistributedDataParallel(net, group=group, static_graph=reentrant)
    got_ddp = _run(ddp, _adamw(net.parameters()), net, rank)
    ddp.close()
    net = Net(reentrant)
    zero2 = bt.DistributedDataParallel(net, group=group, mode="reduce_scatter",
                                       bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-4)
    opt = bt.ShardedAdamW(zero2, lr=0.01, weight_decay=0.1)
    got_zero2 = _run(zero2, opt, net, rank)
    opt.close()
    zero2.close()
    net = Net(reentrant)  # fully_shard units (each block; the root) + torch AdamW on the pieces
    for block in net.blocks:
        bt.fully_shard(block, group=group)
    bt.fully_shard(net, group=group)
    got_units = _run_gathered(net, _adamw(net.parameters()), rank)
    net.close()

    failures = []
    kind = "reentrant" if reentrant else "non-reentrant"
    names = [n for n, _ in ref_net.named_parameters()]
    for step, (w, a, z, u) in enumerate(zip(want, got_ddp, got_zero2, got_units)):
        for name, wp, ap, zp, up in zip(names, w, a, z, u):
            if not torch.allclose(wp, up, rtol=0, atol=1e-6):
                failures.append("%s fully_shard step %d %s: %g" % (kind, step, name,
                                                                   (wp - up).abs().max()))
            if not torch.equal(wp, ap):
                failures.append("%s DDP step %d %s: %g" % (kind, step, name,
                                                           (wp - ap).abs().max()))
            if not torch.allclose(wp, zp, rtol=0, atol=1e-6):
                failures.append("%s ZeRO-2 step %d %s: %g" % (kind, step, name,
                                                              (wp - zp).abs().max()))
    return failures


def main():
    torch.set_num_threads(1)
    world = braid.World("mpi")
    group = world.group()
    rank = group.rank
    train_compare.init_gloo(group, rank, group.size)

    failures = []
    for reentrant in (True, False):  # static_graph with reentrant checkpoints, as torch
        failures += _compare(group, rank, reentrant)
    dist.destroy_process_group()
    group.close()
    world.close()
    if failures:
        print("rank %d: checkpointing differs from torch DDP:\n  %s" % (
            rank, "\n  ".join(failures)))
        sys.exit(1)
    print("rank %d: reentrant and non-reentrant checkpointing under DDP, ZeRO-2 and fully_shard "
          "equal torch DDP" % rank)


if __name__ == "__main__":
    main()
