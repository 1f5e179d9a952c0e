"""The process-wide default world: what braid.pytorch uses when no group is given, as torch's
default process group (init_process_group) is what torch DDP uses without process_group=.

    model = braid.pytorch.DistributedDataParallel(net)   # group: braid.core.default_group()
    world = braid.core.default_world()                   # the same World, made on first use

Contract:
  - default_world() makes the World on its first call and returns that same World on every
    later call, from any thread, for the rest of the process (closed at interpreter exit, or
    by close()). Once it is closed, the next call makes a new one. Which backend:
      * BRAID_BACKEND set: World() (that backend; BRAID_* variables apply);
      * else torch.distributed initialized, its default group on "gloo", "nccl" or "mpi":
        World(<that backend>), so DistributedDataParallel(net) without a group reduces on the
        library torch's DDP would use (and its profiler ranges carry torch's backend name);
        gloo and nccl meet through torch's rendezvous (braid/_torch_rendezvous.py: rank 0's
        host is MASTER_ADDR or the host of torch's TCPStore);
      * else World() (the launcher decides, braid.h's rule: mpirun -> mpi, torchrun / srun
        -> nccl or gloo, none -> local).
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

import os
import threading

from . import _torch_rendezvous
from ._world import World

# torch.distributed's backend names Braid has a backend of the same name for.
_TORCH_BACKENDS = ("gloo", "nccl", "mpi")


def _backend_like_torch():
    """The backend of torch's default process group when torch.distributed is initialized,
    Braid has that backend and BRAID_BACKEND does not name another; else None (World()'s
    own rule)."""
    if os.environ.get("BRAID_BACKEND"):
        return None
    dist = _torch_rendezvous.initialized_torch_distributed()
    if dist is None:
        return None
    backend = str(dist.get_backend())
    return backend if backend in _TORCH_BACKENDS else None


def _make_world():
    backend = _backend_like_torch()
    try:
        return World(backend)
    except ValueError as e:
        if backend is None:
            raise
        raise ValueError(
            "Braid's default world runs the backend of torch's default process group (%r) "
            "and meets through torch.distributed: %s (or set BRAID_BACKEND to choose Braid's "
            "backend, or pass group= a braid Group)" % (backend, e)) from e


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
                self._world, self._group, self._subgroups = _make_world(), None, {}
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
