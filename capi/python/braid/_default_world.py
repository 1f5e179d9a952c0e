"""The process-wide default world: what braid.pytorch uses when no group is given, as torch's
default process group (init_process_group) is what torch DDP uses without process_group=.

    model = braid.pytorch.DistributedDataParallel(net)   # group: braid.core.default_group()
    world = braid.core.default_world()                   # the same World, made on first use

Contract:
  - default_world() makes World() (no arguments: the backend follows the launcher, braid.h's
    rule: mpirun -> mpi, torchrun / srun -> nccl or gloo, none -> local; BRAID_* variables
    apply) on its first call and returns that same World on every later call, from any
    thread, for the rest of the process (closed at interpreter exit, or by close()). Once
    it is closed, the next call makes a new one.
  - default_group() is that world's group for this process's rank, also made once. A world
    hosting several ranks in this process (the local backend with BRAID_LOCAL_RANKS > 1) has
    no one group for the process: ValueError, pass group= (the rank's own Group).
  - A World you create yourself is never the default: pass its groups explicitly.
  - subgroup(members, ...) caches the groups braid.pytorch splits from the default world to
    mirror a torch subgroup (see braid/_torch_groups.py), so mapping the same torch group
    again reuses them.

The state lives in one locked object (_DEFAULT below), like the registry of backends: the one
place Braid keeps process-wide state, as torch keeps its default group.
"""

import threading

from ._world import World


class _ProcessDefault:
    """The default World, its group, and the subgroups split from it; every method is safe
    from any thread (one lock)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._world = None
        self._group = None
        self._subgroups = {}

    def world(self):
        with self._lock:
            if self._world is None or self._world.closed:
                self._world, self._group, self._subgroups = World(), None, {}
            return self._world

    def group(self, what):
        with self._lock:
            world = self.world()
            if self._group is None or self._group.closed:
                ranks = world.local_ranks
                if len(ranks) != 1:
                    raise ValueError(
                        "%s: no group given, and Braid's default world (backend %r) hosts "
                        "ranks %s in this process (e.g. BRAID_LOCAL_RANKS): there is no one "
                        "default group; pass group= (each rank's own braid Group)" %
                        (what, world.backend, ranks))
                self._group = world.group()
            return self._group

    def is_group(self, group):
        with self._lock:
            return group is not None and group is self._group

    def subgroup(self, key, make):
        """The group cached under `key` (identical on every rank), else make() (collective
        over the default world: every rank misses or hits together)."""
        with self._lock:
            group = self._subgroups.get(key)
            if group is None or group.closed:
                group = self._subgroups[key] = make()
            return group


_DEFAULT = _ProcessDefault()


def default_world():
    """The process-wide default World (made by World() on first use; see the module
    docstring)."""
    return _DEFAULT.world()


def default_group(what="default_group()"):
    """The default world's group for this process's one rank; ValueError (naming `what`,
    the caller) when the world hosts several ranks in this process: pass group=."""
    return _DEFAULT.group(what)


def is_default_group(group):
    """True when `group` is the default world's group (made already)."""
    return _DEFAULT.is_group(group)


def default_subgroup(key, make):
    return _DEFAULT.subgroup(key, make)
