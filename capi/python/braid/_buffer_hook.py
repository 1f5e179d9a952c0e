"""torch 1.13 DDP's private buffer communication hook on braid.pytorch's
DistributedDataParallel: _register_buffer_comm_hook(state, hook, location) and
_default_broadcast_coalesced(bufs), with torch's meaning.

    def hook(state, named_buffers):            # {name: buffer}, re-read each time
        return [dist.all_reduce(b, async_op=True).get_future() for b in named_buffers.values()]
    model._register_buffer_comm_hook(model, hook, _BufferCommHookLocation.POST_FORWARD)

Contract (torch's _sync_buffers / _sync_module_buffers): the hook replaces the broadcast of
rank 0's buffers and runs where torch would broadcast them (a forward with grad after a synced
one, the first forward, broadcast_buffers=True and buffers to sync), before the module's
forward (PRE_FORWARD) or after it (POST_FORWARD, torch's default); futures it returns are
waited for at the end of the next backward (a failure raises, naming the hook). Not inside
join() (refused by name: Braid's join broadcasts from an agreed rank itself).
"""

import torch

from . import _ddp_ignore
from ._views import _broadcast_tensors


class BufferHook:
    def __init__(self, state, hook, location):
        self.state, self.hook, self.location = state, hook, location
        self.name = getattr(hook, "__qualname__", None) or type(hook).__name__
        self.futures = []


def register(ddp, state, hook, location=None):
    """torch's _register_buffer_comm_hook (location: a _BufferCommHookLocation)."""
    if not callable(hook):
        raise TypeError("_register_buffer_comm_hook: the hook must be callable")
    name = getattr(location, "name", "POST_FORWARD") if location is not None else "POST_FORWARD"
    if name not in ("PRE_FORWARD", "POST_FORWARD"):
        raise ValueError("_register_buffer_comm_hook: comm_hook_location=%r: PRE_FORWARD or "
                         "POST_FORWARD" % (location,))
    ddp._buffer_hook = BufferHook(state, hook, "pre" if name == "PRE_FORWARD" else "post")


def location(ddp):
    """"pre" / "post" where a buffer hook is registered, else None (Braid's broadcast)."""
    hook = getattr(ddp, "_buffer_hook", None)
    return None if hook is None else hook.location


def run(ddp):
    """The hook, where torch would sync the buffers (see the contract)."""
    hook = ddp._buffer_hook
    named = dict(_ddp_ignore.named_buffers(ddp.module, ddp._ignored))
    if not (ddp.broadcast_buffers and ddp._sync_buffers_next and named):
        return
    if ddp._join is not None:
        raise RuntimeError("_register_buffer_comm_hook(%s): not inside join(); Braid's join() "
                           "syncs the buffers itself" % hook.name)
    with torch.no_grad():
        futs = hook.hook(hook.state, named)
    if futs is not None:
        hook.futures.extend(futs)


def wait(ddp):
    """End of a backward: waits for the futures the buffer hook returned."""
    hook = getattr(ddp, "_buffer_hook", None)
    if hook is None or not hook.futures:
        return
    futs, hook.futures = hook.futures, []
    for fut in futs:
        try:
            fut.wait()
        except Exception as e:
            raise RuntimeError("_register_buffer_comm_hook: a future of the buffer hook %s "
                               "failed: %s: %s" % (hook.name, type(e).__name__, e)) from e


def default_broadcast_coalesced(ddp, bufs=None, bucket_size=None, authoritative_rank=0):
    """torch's _default_broadcast_coalesced: `bufs` (default: the module's buffers) from
    `authoritative_rank` of the model's group (coalesced per dtype; bucket_size unused)."""
    if bufs is None:
        bufs = [b for _, b in _ddp_ignore.named_buffers(ddp.module, ddp._ignored)]
    bufs = list(bufs)
    if not bufs:
        return
    if authoritative_rank != 0 and len(ddp._groups) > 1:
        raise ValueError("_default_broadcast_coalesced(authoritative_rank=%r): rank 0 only in "
                         "mode='hybrid'" % (authoritative_rank,))
    _broadcast_tensors(bufs, ddp._groups, ddp._device, [authoritative_rank] * len(ddp._groups))
