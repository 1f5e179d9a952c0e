"""Which braid Group a wrapper reduces over, from torch's arguments: group= / process_group=
given as a braid Group, a torch.distributed ProcessGroup, or nothing (the default world).

    group = resolve_group(group, process_group, "DistributedDataParallel")

Contract (torch 1.13's meaning of process_group, mapped onto Braid's default world):
  - neither given: braid.core.default_group() (torch: the default process group);
  - a braid Group (as group=, or as process_group=): that group;
  - a torch ProcessGroup (as process_group=, or as group=): torch.distributed must be
    initialized, the group made by init_process_group / new_group (torch records its global
    ranks then: distributed_c10d.get_process_group_ranks), torch's world as large as Braid's
    default world, and torch's global rank of every process equal to its Braid world rank
    (the default world made after torch.distributed's runs torch's backend and meets through
    torch's rendezvous, braid/_default_world.py; made first, under mpirun, both follow the
    launcher). Then the whole world in rank order is the default
    world's group, and a subgroup is a braid Group split from the default world with the same
    members in the same rank order. Checking this is collective over the default world (one
    small all-gather), and so is the split: for a subgroup, every rank of the world
    constructs its wrapper at the same point, each with the torch group it belongs to (as
    new_subgroups() hands them out). Anything else is a ValueError saying why, raised on
    every rank alike (never a hang on some).
"""

import torch

from . import core
from ._default_world import default_subgroup


def _torch_process_group_type():
    dist = torch.distributed
    return getattr(dist, "ProcessGroup", None) if dist.is_available() else None


def resolve_group(group, process_group, what):
    """The braid Group for the wrapper named `what` (see the module docstring)."""
    if group is not None and process_group is not None:
        raise ValueError("%s: pass group= or process_group=, not both" % what)
    arg, given = ("group", group) if group is not None else ("process_group", process_group)
    if given is None:
        return core.default_group(what)
    if isinstance(given, core.Group):
        return given
    pg_type = _torch_process_group_type()
    if pg_type is not None and isinstance(given, pg_type):
        return _map_torch_group(given, arg, what)
    raise TypeError("%s: %s= takes a braid Group or a torch.distributed ProcessGroup, not %s" %
                    (what, arg, type(given).__name__))


def _members(pg, arg, what):
    """Global ranks of torch group `pg`, in its group-rank order."""
    dist = torch.distributed
    if not dist.is_initialized():
        raise ValueError(
            "%s: %s= is a torch ProcessGroup but torch.distributed is not initialized, so its "
            "ranks cannot be placed in Braid's world; call torch.distributed."
            "init_process_group first, or pass a braid Group" % (what, arg))
    try:
        ranks = dist.distributed_c10d.get_process_group_ranks(pg)
    except KeyError:
        raise ValueError(
            "%s: %s= is a torch ProcessGroup torch.distributed does not know (not made by "
            "init_process_group or new_group), so its global ranks are unknown; make it with "
            "torch.distributed.new_group(ranks), or pass a braid Group" % (what, arg)) from None
    return sorted(ranks, key=lambda g: dist.distributed_c10d.get_group_rank(pg, g))


def _map_torch_group(pg, arg, what):
    dist = torch.distributed
    members = _members(pg, arg, what)
    world = core.default_world()
    size, torch_size = world.size, dist.get_world_size()
    if torch_size != size:  # the same on every rank: every rank raises
        raise ValueError(
            "%s: %s= is a torch group of a torch world of %d ranks, but Braid's default world "
            "(backend %r) has %d: start both from one launcher (or pass a braid Group)" %
            (what, arg, torch_size, world.backend, size))
    world_group = core.default_group(what)
    # One row per Braid rank: its torch global rank, then the torch group rank of each world
    # rank in the group it passed (-1: not a member). Everyone checks the same table.
    row = [-1] * (size + 1)
    row[0] = dist.get_rank()
    for position, rank in enumerate(members):
        if 0 <= rank < size:
            row[rank + 1] = position
    table = _allgather_rows(world_group, row)
    torch_ranks = [r[0] for r in table]
    if torch_ranks != list(range(size)):
        moved = next(k for k, t in enumerate(torch_ranks) if t != k)
        raise ValueError(
            "%s: %s= cannot be mapped: torch.distributed rank %d is Braid world rank %d (the "
            "worlds number their ranks differently); start both from one launcher, or "
            "initialize torch.distributed before Braid's world, whose rendezvous then follows "
            "torch's" % (what, arg, torch_ranks[moved], moved))
    groups = [r[1:] for r in table]
    for k, mine in enumerate(groups):
        for j in range(size):
            if mine[j] >= 0 and groups[j] != mine:
                raise ValueError(
                    "%s: %s= differs across ranks: Braid rank %d passes a torch group of ranks "
                    "%s, rank %d one of ranks %s. A torch subgroup is mirrored by a split of "
                    "Braid's world, collective over all of its ranks: every rank constructs "
                    "its wrapper at the same point, with the torch group it belongs to" %
                    (what, arg, k, _ranks_of(mine), j, _ranks_of(groups[j])))
    if members == list(range(size)):
        return world_group
    key = tuple(tuple(g) for g in groups)
    name = "torch_group[%s]" % ",".join(str(r) for r in members)
    return default_subgroup(key, lambda: world_group.split(min(members), members.index(
        dist.get_rank()), name=name))


def _ranks_of(positions):
    return [rank for _, rank in sorted((p, r) for r, p in enumerate(positions) if p >= 0)]


def _allgather_rows(group, row):
    """Every rank's `row` (ints, one length on every rank), in group rank order."""
    device = None
    if group.device_memory:
        device = torch.device("cuda", torch.cuda.current_device())
    send = torch.tensor(row, dtype=torch.int64, device=device)
    recv = torch.empty(len(row) * group.size, dtype=torch.int64, device=device)
    if device is not None:
        torch.cuda.synchronize(device)  # Braid's stream reads what torch wrote (construction)
    group.allgather(send, recv).wait()
    return recv.view(group.size, len(row)).tolist()
