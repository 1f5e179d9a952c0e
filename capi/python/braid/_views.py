"""Tensors over Braid-owned memory, shared by braid.pytorch and braid.fsdp."""

import contextlib
import ctypes
import weakref

import torch


def _view(owner, address, count, dtype, shape):
    """A tensor over `count` elements of Braid-owned memory at `address` (no copy); it keeps
    `owner` (the core Reducer or Optimizer) alive."""
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    nbytes = count * torch.tensor([], dtype=dtype).element_size()
    raw = (ctypes.c_char * nbytes).from_address(address)
    raw.owner = owner  # the buffer object is what the tensor's storage references
    return torch.frombuffer(raw, dtype=dtype, count=count).view(shape)


def _weak_call(method):
    """A callback calling a bound method only while its object lives (no reference cycle)."""
    ref = weakref.WeakMethod(method)

    def call():
        bound = ref()
        if bound is not None:
            bound()
    return call


@contextlib.contextmanager
def _sync_scope(owner, mode):
    """The no_sync() scope of both wrappers: forwards run inside it use `mode`."""
    if mode not in ("no_sync", "reduce_scatter_only"):
        raise ValueError("no_sync mode %r: no_sync or reduce_scatter_only" % (mode,))
    previous, owner._sync = owner._sync, mode
    try:
        yield
    finally:
        owner._sync = previous


def _broadcast_module(module, groups):
    """Rank 0's parameters and buffers to every rank (hybrid: over the shard group, then the
    replica group, so rank 0's values end up everywhere)."""
    tensors = list(module.parameters()) + list(module.buffers())
    for g in groups:
        for t in tensors:
            g.broadcast(t.data, root=0).wait()


def _broadcast_buffers(module, groups):
    """Rank 0's buffers to every rank, coalesced: one broadcast per dtype and group (a flat
    copy of the buffers, broadcast, copied back), as torch DDP's broadcast_buffers does before
    each forward. Returns the number of buffers synced."""
    by_dtype = {}
    for b in module.buffers():
        by_dtype.setdefault(b.dtype, []).append(b)
    for buffers in by_dtype.values():
        flat = torch.cat([b.detach().reshape(-1) for b in buffers])
        for g in groups:
            g.broadcast(flat, root=0).wait()
        offset = 0
        with torch.no_grad():
            for b in buffers:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()
    return sum(len(v) for v in by_dtype.values())
