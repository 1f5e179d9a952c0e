"""torch DDP's idioms that need one process per rank, under mpirun -np 2: Braid's default world
("mpi", from the launcher) next to torch.distributed initialized over gloo, torch's DDP run
beside braid.pytorch's in the same process, gradients compared bit for bit:

  - DistributedDataParallel(net) with no group: braid.core.default_group(), as torch's
    default process group;
  - process_group= torch's world (dist.group.WORLD, new_group([0, 1])) -> the default world's
    group; a torch subgroup (new_group([r]) on each rank r) -> a Braid group split with the same
    members, cached for the next wrapper; ranks passing different groups, and a ProcessGroup
    torch.distributed does not know, are ValueErrors on every rank (no hang);
  - torch.save / torch.load of the wrapper over the default group, as torch's;
  - parameter shapes that differ across ranks: a ValueError naming the parameter on both
    ranks (it was a segfault in MPI_Ibcast).
"""

import io
import sys

import torch
import torch.distributed as dist

import braid
from braid import pytorch as bt
import train_compare  # init_gloo


class Net(torch.nn.Module):
    def __init__(self, out=2):
        super().__init__()
        torch.manual_seed(7)
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, out)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _step(model, net, rank, step=0):
    g = torch.Generator().manual_seed(10 * rank + step)
    x, y = torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in net.parameters()]


def _torch_grads(rank, **kwargs):
    net = Net()
    return _step(torch.nn.parallel.DistributedDataParallel(net, **kwargs), net, rank)


def _braid_grads(rank, **kwargs):
    net = Net()
    model = bt.DistributedDataParallel(net, **kwargs)
    grads = _step(model, net, rank)
    group = model._groups[0]
    model.close()
    return grads, group


def _same(got, want, what):
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), "%s: gradient %d differs from torch DDP's: %s vs %s" % (
            what, k, g, w)


def _raises(error, text, fn):
    try:
        fn()
    except error as e:
        assert text in str(e), "%r not in %r" % (text, str(e))
        return str(e)
    raise AssertionError("no %s raised (wanted one saying %r)" % (error.__name__, text))


def main(rank, size, world_group):
    # No group: the default world's, as torch's default process group.
    grads, group = _braid_grads(rank)
    assert group is braid.default_group()
    _same(grads, _torch_grads(rank), "no group")

    # torch's whole world, however spelled: the default world's group.
    for name, pg in (("group.WORLD", dist.group.WORLD), ("new_group([0, 1])",
                                                         dist.new_group(list(range(size))))):
        grads, group = _braid_grads(rank, process_group=pg)
        assert group is world_group, name
        _same(grads, _torch_grads(rank, process_group=pg), name)

    # A torch subgroup per rank: a Braid split with the same members (here: the rank alone).
    subgroups = [dist.new_group([r]) for r in range(size)]  # every rank makes every group
    mine = subgroups[rank]
    grads, group = _braid_grads(rank, process_group=mine)
    assert (group.size, group.rank) == (1, 0), (group.size, group.rank)
    _same(grads, _torch_grads(rank, process_group=mine), "subgroup")
    again, group2 = _braid_grads(rank, group=mine)  # torch group as group=: same mapping
    assert group2 is group, "the split is cached"
    _same(again, grads, "subgroup again")

    # Ranks that pass different groups: refused on every rank.
    differing = dist.group.WORLD if rank == 0 else mine
    _raises(ValueError, "differs across ranks", lambda: _braid_grads(rank,
                                                                     process_group=differing))
    # A ProcessGroup torch.distributed has no record of: its global ranks are unknown.
    store = dist.PrefixStore("unregistered", dist.distributed_c10d._get_default_store())
    loose = dist.ProcessGroupGloo(store, rank, size)
    _raises(ValueError, "does not know", lambda: _braid_grads(rank, process_group=loose))

    # torch.save / torch.load over the default group, as torch DDP's.
    loaded = []
    for make in (lambda n: torch.nn.parallel.DistributedDataParallel(n),
                 lambda n: bt.DistributedDataParallel(n)):
        net = Net()
        model = make(net)
        _step(model, net, rank)
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        copy = torch.load(buf)
        loaded.append(_step(copy, copy.module, rank, step=1))
        if isinstance(copy, bt.DistributedDataParallel):
            copy.close()
            model.close()
    _same(loaded[1], loaded[0], "after torch.load")

    # Parameter shapes that differ across ranks: named on every rank, before any broadcast.
    message = _raises(ValueError, "parameter 'b.weight' has shape",
                      lambda: bt.DistributedDataParallel(Net(out=2 + rank)))
    assert "on rank %d" % (1 - rank) in message, message
    # (No torch reference here: torch 1.13 raises on rank 1 only, and rank 0 goes on into
    # its construction broadcast and hangs.)
    print("torch_idioms_ddp_mpi: rank %d of %d passed" % (rank, size), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    world = braid.default_world()
    assert world.backend == "mpi", world.backend
    world_group = braid.default_group()
    train_compare.init_gloo(world_group, world_group.rank, world_group.size)
    try:
        main(world_group.rank, world_group.size, world_group)
    except BaseException as e:  # the other rank stops waiting at once
        world_group.abort_job("rank %d: %r" % (world_group.rank, e))
        raise
    sys.exit(0)
