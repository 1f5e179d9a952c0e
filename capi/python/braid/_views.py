"""Tensors over Braid-owned memory, shared by braid.pytorch and braid.fsdp."""

import contextlib
import ctypes
import weakref

import torch


def _view(owner, address, count, dtype, shape, device=None):
    """A tensor over `count` elements of Braid-owned memory at `address` (no copy); it keeps
    `owner` (the core Reducer or Optimizer) alive. `device`: None for host memory, else the
    CUDA device index the address belongs to (a device reducer's or optimizer's memory)."""
    if device is not None:
        return _cuda_view(owner, address, count, dtype, shape, device)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    nbytes = count * torch.tensor([], dtype=dtype).element_size()
    raw = (ctypes.c_char * nbytes).from_address(address)
    raw.owner = owner  # the buffer object is what the tensor's storage references
    return torch.frombuffer(raw, dtype=dtype, count=count).view(shape)


class _CudaMemory:
    """Braid-owned device memory as a __cuda_array_interface__ (version 2: no stream, so torch
    adds no synchronization) of raw bytes; torch.as_tensor keeps this object, and through it
    `owner`, alive for as long as the tensor's storage lives."""

    def __init__(self, owner, address, nbytes):
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 2}


def _cuda_view(owner, address, count, dtype, shape, device):
    """The device form of _view: bytes viewed as `dtype` (bf16 too, which the array interface
    cannot name), on CUDA device `device`."""
    where = torch.device("cuda", device)
    if count == 0:
        return torch.empty(shape, dtype=dtype, device=where)
    nbytes = count * torch.tensor([], dtype=dtype).element_size()
    try:
        raw = torch.as_tensor(_CudaMemory(owner, address, nbytes), device=where)
    except RuntimeError as e:  # torch reads __cuda_array_interface__'s typestr through numpy
        if "umpy" not in str(e):
            raise
        raise RuntimeError("viewing Braid's device memory as a CUDA tensor needs numpy "
                           "(torch parses __cuda_array_interface__ with it): %s" % e) from e
    return raw.view(dtype).view(shape)


def _device_of(params, what):
    """None when every tensor of `params` ((name, tensor) pairs) is on the CPU, else the one
    CUDA device index they share; ValueError naming a parameter on another device, or one on
    the CPU next to one on a GPU."""
    devices = {}
    for name, p in params:
        devices.setdefault(p.device, name)
    if not devices or set(devices) == {torch.device("cpu")}:
        return None
    for d, name in devices.items():
        if d.type not in ("cuda", "cpu"):
            raise ValueError("%s: parameter %r is on %s; Braid takes CPU or CUDA tensors" %
                             (what, name, d))
    if len(devices) > 1:
        names = ", ".join("%r on %s" % (n, d) for d, n in sorted(devices.items(), key=str))
        raise ValueError("%s: parameters on several devices (%s); every parameter must be on "
                         "one device (one rank per process and GPU)" % (what, names))
    d = next(iter(devices))
    return d.index if d.index is not None else torch.cuda.current_device()


def _ready_event(events, key, device):
    """Records the torch.cuda.Event kept in events[key] (created at first use; re-recorded each
    time: Braid has enqueued its wait on the previous record by then) on `device`'s current
    stream, and returns its cudaEvent_t as an int for Braid's device_event arguments."""
    ev = events.get(key)
    if ev is None:
        ev = events[key] = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(device))
    return ev.cuda_event


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


def _broadcast_module(module, groups, ignore=()):
    """Rank 0's parameters and buffers to every rank (hybrid: over the shard group, then the
    replica group, so rank 0's values end up everywhere), but those named in `ignore`."""
    tensors = [t for named in (module.named_parameters(), module.named_buffers())
               for n, t in named if n not in ignore]
    if any(t.is_cuda for t in tensors):
        # Construction only: Braid's streams read what torch wrote, on the tensors' device.
        torch.cuda.synchronize(next(t.device for t in tensors if t.is_cuda))
    for g in groups:
        for t in tensors:
            g.broadcast(t.data, root=0).wait()


def _broadcast_buffers(module, groups, device=None, roots=None, ignore=()):
    """Rank 0's buffers to every rank, coalesced: one broadcast per dtype and group (a flat
    copy of the buffers, broadcast, copied back), as torch DDP's broadcast_buffers does before
    each forward. Returns the number of buffers synced. `device` (CUDA buffers on an nccl
    world): the broadcast waits for the flat copy through an event recorded after it on the
    current stream; wait() returns once the broadcast completed on the device, so the copies
    back, queued on the current stream, read its result. `roots`: the root in each group
    (default 0 in each: world rank 0; braid/_join.py passes another rank's). Buffers named in
    `ignore` are left out."""
    return _broadcast_tensors([b for n, b in module.named_buffers() if n not in ignore],
                              groups, device, roots)


def _broadcast_tensors(tensors, groups, device=None, roots=None):
    """_broadcast_buffers of any tensors (one broadcast per dtype and group)."""
    roots = roots or [0] * len(groups)
    by_dtype = {}
    for b in tensors:
        by_dtype.setdefault(b.dtype, []).append(b)
    events = {}
    for buffers in by_dtype.values():
        flat = torch.cat([b.detach().reshape(-1) for b in buffers])
        for k, (g, root) in enumerate(zip(groups, roots)):
            ready = _ready_event(events, k, device) if device is not None else None
            g.broadcast(flat, root=root, ready_event=ready).wait()
        offset = 0
        with torch.no_grad():
            for b in buffers:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()
    return sum(len(v) for v in by_dtype.values())
