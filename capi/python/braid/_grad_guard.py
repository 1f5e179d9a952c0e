"""Guarded gradients: p.grad where Braid's gradient is not the one torch would have there.

Under DistributedDataParallel(mode="reduce_scatter" / "hybrid") each rank reduces only its
shard of each gradient bucket, and with ShardedAdamW the bucket is stepped and zeroed during
the backward; under FullyShardedDataParallel the gradient exists only as a reduced shard
inside Braid's optimizer. torch code reading p.grad there (torch.nn.utils.clip_grad_norm_,
p.grad.norm() for logging, a torch optimizer's step) would silently compute with a wrong
value. So p.grad is a GuardedGrad: a tensor over the same memory (autograd still accumulates
into it in place: that is C++, which never calls __torch_function__), whose every Python-level
read raises RuntimeError naming the idiom, the parameter and what to do instead:

    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    # RuntimeError: torch.nn.utils.clip_grad_norm_ reads p.grad of parameter '0.weight', ...
    #   ShardedAdamW(..., max_grad_norm=1.0) clips exactly and opt.clip_grad_norm_(1.0) ...

Contract:
  - Allowed (no values read): metadata (shape, dtype, device, data_ptr, grad_fn, ...),
    requires_grad_(), and zeroing (zero_, torch's zero_grad): the owner's before_zero()
    runs first (waits for steps still reading the bucket, or returns True to make it a
    no-op for a guard with no memory of its own).
  - Everything else raises; the message is built by describe(kind, name, idiom) from the
    owner's why() ("unreduced", "stepped" or "sharded") at the time of the read.
  - Braid's own code never reads a guard: it keeps plain views of the same memory.
"""

import sys
import weakref

import torch

# Tensor attributes and methods that read no values.
_METADATA = frozenset([
    "size", "dim", "ndimension", "numel", "nelement", "shape", "dtype", "device", "layout",
    "ndim", "names", "requires_grad", "requires_grad_", "is_leaf", "grad_fn", "_grad_fn",
    "_backward_hooks", "retains_grad", "element_size", "is_floating_point", "is_complex",
    "is_cuda", "is_meta", "is_quantized", "_version", "output_nr", "_cdata", "name",
    "__hash__", "__class__", "data_ptr", "get_device", "stride", "storage_offset",
    "is_contiguous", "_is_view", "_base"])
# is_sparse is left out on purpose: torch.optim's step reads it before touching any value,
# so a torch optimizer over guarded gradients stops there, having changed nothing.
_ZEROING = frozenset(["zero_", "_foreach_zero_"])


class GuardedGrad(torch.Tensor):
    """p.grad of a parameter whose gradient torch code must not read (module docstring)."""

    _braid_name = "?"
    _braid_why = None          # callable -> "unreduced" / "stepped" / "sharded"
    _braid_before_zero = None  # callable -> True when zeroing is a no-op

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        guard = _find(args)
        if guard is None and kwargs:
            guard = _find(kwargs.values())
        if guard is not None:
            name = _func_name(func)
            if name in _ZEROING:
                return _zero(func, types, args, kwargs)
            if name not in _METADATA:
                why = guard._braid_why() if guard._braid_why is not None else "unreduced"
                raise RuntimeError(describe(why or "unreduced", guard._braid_name,
                                            _idiom(name)))
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs)

    def __repr__(self):
        return "GuardedGrad(parameter %r, shape=%s, dtype=%s: not readable, see braid's " \
               "_grad_guard)" % (self._braid_name, tuple(self.shape), self.dtype)


def guard(view, name, why, before_zero):
    """A GuardedGrad over the memory of `view` (a plain tensor Braid keeps for itself)."""
    g = view.as_subclass(GuardedGrad)
    g._braid_name, g._braid_why, g._braid_before_zero = name, why, before_zero
    return g


def weak(method, default):
    """A callable returning `method()` while its object lives, else `default` (a guard must
    not keep its wrapper alive)."""
    ref = weakref.WeakMethod(method)

    def call():
        bound = ref()
        return bound() if bound is not None else default
    return call


def _find(values):
    for v in values:
        if type(v) is GuardedGrad:  # noqa: E721 (exact class, cheap)
            return v
        if isinstance(v, (list, tuple)):
            found = _find(v)
            if found is not None:
                return found
    return None


def _func_name(func):
    name = getattr(func, "__name__", None) or repr(func)
    if name in ("__get__", "__set__", "__delete__"):
        return getattr(getattr(func, "__self__", None), "__name__", name)
    return name


def _zero(func, types, args, kwargs):
    """zero_ / _foreach_zero_: each guard's owner first (a guard whose before_zero says so is
    skipped: it has no memory of its own), then the zeroing itself."""
    tensors = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
    keep = []
    for t in tensors:
        if type(t) is GuardedGrad and t._braid_before_zero is not None:  # noqa: E721
            if t._braid_before_zero():
                continue
        keep.append(t)
    if isinstance(args[0], (list, tuple)):
        if keep:
            torch._C._disabled_torch_function_impl(func, types, (keep,) + tuple(args[1:]), kwargs)
        return None
    if keep:
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs)
    return args[0]


def _idiom(name):
    """What the user's code was doing when it read a guard: the torch entry point on the
    stack (clip_grad_norm_, a torch.optim optimizer's step), else the torch call itself."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm") and \
                "torch" in code.co_filename:
            return "torch.nn.utils.%s" % code.co_name
        if "/torch/optim/" in code.co_filename.replace("\\", "/"):
            opt = frame.f_locals.get("self")
            if isinstance(opt, torch.optim.Optimizer):
                return "%s.%s()" % (type(opt).__name__, code.co_name)
        frame = frame.f_back
    return "p.grad (torch call %s)" % name


def describe(why, name, idiom):
    """The error for reading the guarded p.grad of parameter `name` in `idiom`."""
    if why == "sharded":
        return (
            "%s reads p.grad of parameter %r, which is fully sharded: its gradient exists only "
            "as this rank's reduced shard inside Braid's optimizer, so p.grad has no values "
            "(torch.nn.utils.clip_grad_norm_ would see no gradient and return 0). Clip with "
            "ShardedAdamW(..., max_grad_norm=...) and model.clip_grad_norm_(max_norm) (or "
            "opt.clip_grad_norm_); log the norm with opt.grad_norm() (track_grad_norm=True "
            "computes it every step)" % (idiom, name))
    if why == "stepped":
        return (
            "%s reads p.grad of parameter %r, but ShardedAdamW / ShardedSGD reduce only each "
            "rank's shard of it and step and zero it during the backward, so p.grad is not "
            "torch's averaged gradient. Clip with ShardedAdamW(..., max_grad_norm=...) and "
            "opt.clip_grad_norm_(max_norm) (returns the global norm); log the norm with "
            "opt.grad_norm() (track_grad_norm=True computes it every step)" % (idiom, name))
    return (
        "%s reads p.grad of parameter %r, which holds this rank's unreduced gradient: "
        "DistributedDataParallel(mode='reduce_scatter' / 'hybrid') reduces only each rank's "
        "shard (reducer.shard(bucket)). Step it with ShardedAdamW(model.parameters()) / "
        "ShardedSGD, or wrap the model with mode='allreduce' to use a torch optimizer" %
        (idiom, name))
