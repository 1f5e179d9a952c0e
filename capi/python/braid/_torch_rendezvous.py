"""Braid's world meeting through an initialized torch.distributed: its rank, its world size and
its default store, instead of the launcher's variables and a second port.

braid.World() (no backend, "gloo" or "nccl") uses this by itself when torch.distributed is
initialized, in either launch order's first half:

    torch.distributed.init_process_group("gloo")   # env:// on MASTER_ADDR:MASTER_PORT
    world = braid.World()                          # rank and size from torch; no MASTER_PORT

How (braid.h's explicit rendezvous, braid_world_options_t 0.10): this process is
dist.get_rank() of dist.get_world_size(); Braid's rank 0 serves its store on a port the OS
picks (or store_port=) on the master host, publishes "host:port" through torch's default store
(torch.distributed.distributed_c10d._get_default_store(), torch 1.13) and the other ranks read
it there. The keys live under "braid/world<N>/", N counting this rank's Braid worlds made this
way (counted in torch's store itself, so several worlds, one after another, never read each
other's address). The master host is master_addr=, else MASTER_ADDR, else the host of torch's
TCPStore; none of these (torch initialized from a file://) is an error naming master_addr=.

Contract: the callbacks run only inside braid_world_create, on the calling thread (ctypes
takes the GIL back for them); an exception in one is kept in `error` (the caller raises it as
the cause of Braid's error) and reported to Braid as a failure code, never swallowed.
"""

import ctypes
import datetime
import os
import sys

from . import _lib


def initialized_torch_distributed():
    """torch.distributed when this process imported it and its default group exists; else
    None. Never imports torch itself."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not hasattr(dist, "is_initialized") or not dist.is_available():
        return None
    return dist if dist.is_initialized() else None


def _tcp_host(store):
    """The host of the TCPStore under `store`'s PrefixStores, or None."""
    while store is not None:
        host = getattr(store, "host", None)
        if host:
            return host
        store = getattr(store, "underlying_store", None)
    return None


class TorchRendezvous:
    """The explicit rendezvous of one braid_world_create call, over torch.distributed."""

    def __init__(self, dist, master_addr=None, world_size=0, rank=0):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if world_size and (world_size, rank) != (self.world_size, self.rank):
            raise ValueError(
                "braid.World(world_size=%d, rank=%d): torch.distributed is initialized as rank "
                "%d of %d, and Braid's world meets through it; leave world_size and rank out"
                % (world_size, rank, self.rank, self.world_size))
        self._store = dist.distributed_c10d._get_default_store()
        self.master_addr = master_addr or os.environ.get("MASTER_ADDR") or _tcp_host(
            self._store)
        if not self.master_addr and self.world_size > 1:
            raise ValueError(
                "braid.World(): torch.distributed is initialized without MASTER_ADDR and not "
                "over a TCPStore, so Braid does not know rank 0's host: pass "
                "braid.World(master_addr=<rank 0's address, reachable from every rank>)")
        self.error = None
        count = self._store.add("braid/worlds_of_rank/%d" % self.rank, 1)
        self._prefix = "braid/world%d/" % count
        # ctypes thunks: kept alive by this object for as long as the C call runs.
        self._publish = _lib.RENDEZVOUS_PUBLISH_FN(self._on_publish)
        self._lookup = _lib.RENDEZVOUS_LOOKUP_FN(self._on_lookup)

    def fill(self, opts):
        """Writes the explicit rendezvous into a braid_world_options_t."""
        opts.world_size, opts.rank = self.world_size, self.rank
        opts.master_addr = self.master_addr.encode() if self.master_addr else None
        opts.rendezvous_publish = self._publish
        opts.rendezvous_lookup = self._lookup

    def _on_publish(self, key, value, _data):
        try:
            self._store.set(self._prefix + key.decode(), value)
            return _lib.OK
        except BaseException as e:  # pylint: disable=broad-except  (kept, raised by World)
            self.error = e
            return _lib.INTERNAL

    def _on_lookup(self, key, timeout_ms, value, capacity, _data):
        try:
            name = self._prefix + key.decode()
            self._store.wait([name], datetime.timedelta(milliseconds=timeout_ms))
            got = self._store.get(name)
            if len(got) + 1 > capacity:
                raise ValueError("torch's store holds %d bytes under %r; Braid takes at most %d"
                                 % (len(got), name, capacity - 1))
            ctypes.memmove(value, got + b"\0", len(got) + 1)
            return _lib.OK
        except BaseException as e:  # pylint: disable=broad-except  (kept, raised by World)
            self.error = e
            return _lib.TIMEOUT if "timeout" in str(e).lower() else _lib.INTERNAL
