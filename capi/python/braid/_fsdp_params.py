"""FullyShardedParameter: the class of a fully sharded model's parameters while Braid's
ShardedAdamW / ShardedSGD hold their shards (released between uses; braid/fsdp.py binds them).
Split off fsdp.py by concept; import it from braid.fsdp."""

import torch

from . import _grad_guard


# Tensor attributes and methods that read no values: allowed on a released parameter.
_METADATA = frozenset([
    "size", "dim", "ndimension", "numel", "nelement", "shape", "dtype", "device", "layout",
    "ndim", "names", "requires_grad", "requires_grad_", "grad", "_grad", "is_leaf", "grad_fn",
    "_grad_fn", "_backward_hooks", "retains_grad", "register_hook", "element_size",
    "is_floating_point", "is_complex", "is_sparse", "is_cuda", "is_quantized", "is_meta",
    "is_mkldnn", "is_nested", "is_shared", "_version", "output_nr", "_cdata", "name",
    "__hash__", "__eq__", "_base", "_is_view", "get_device", "__class__"])


class FullyShardedParameter(torch.nn.Parameter):
    """The class of a FullyShardedDataParallel's parameters (each Parameter keeps its identity:
    only its class changes). While its unit is not entered, a parameter is *released*: it keeps
    its shape, dtype and requires_grad, but its values exist only as Braid's shards on the
    ranks, and any torch call that would read or write them (p + 1, p.data, p.detach(),
    print(p), state_dict(), ...) raises RuntimeError naming the parameter. Metadata (shape,
    dtype, grad, requires_grad, ...) stays readable. Read values inside
    model.summon_full_params()."""

    _braid_released = False
    _braid_name = "?"
    _braid_unit = -1
    _braid_grad_guard = None

    @property
    def grad(self):
        """Always None to autograd (Braid takes each gradient at its hook); to Python code a
        GuardedGrad whose reads raise (braid/_grad_guard.py): torch's clip_grad_norm_ would
        otherwise see no gradient and silently return 0. Zeroing it is a no-op."""
        real = _TENSOR_GRAD.__get__(self)
        if real is not None:  # inside the backward, before this parameter's hook took it
            return real
        if self._braid_grad_guard is None:
            self._braid_grad_guard = _grad_guard.guard(
                _released_data(self.dtype, self.shape, _cuda_index(self)), self._braid_name,
                _sharded, _no_memory)
        return self._braid_grad_guard

    @grad.setter
    def grad(self, value):
        _TENSOR_GRAD.__set__(self, value)

    @grad.deleter
    def grad(self):
        _TENSOR_GRAD.__set__(self, None)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        released = _find_released(args)  # (never `or`: a tensor's truth value is a torch call)
        if released is None and kwargs:
            released = _find_released(kwargs.values())
        if released is not None:
            name = getattr(func, "__name__", None) or repr(func)
            if name in ("__get__", "__set__", "__delete__"):
                prop = getattr(getattr(func, "__self__", None), "__name__", "?")
                allowed = name == "__set__" or prop in _METADATA
                name = "%s (%s)" % (prop, name.strip("_"))
            else:
                allowed = name in _METADATA
            if not allowed:
                raise RuntimeError(
                    "parameter %r is released (fully sharded: its values exist only while its "
                    "unit %d runs forward or backward, or inside model.summon_full_params()); "
                    "torch call %s cannot read it" % (released._braid_name, released._braid_unit,
                                                       name))
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs)

    def __repr__(self):
        if self._braid_released:
            return "FullyShardedParameter(released, name=%r, unit=%d, shape=%s, dtype=%s)" % (
                self._braid_name, self._braid_unit, tuple(self.shape), self.dtype)
        return super().__repr__()


_TENSOR_GRAD = torch._C._TensorBase.grad  # the C-level gradient, under the property above


def _cuda_index(p):
    """None for a host parameter, else its CUDA device index (a metadata read)."""
    d = p.device
    return None if d.type == "cpu" else d.index


def _sharded():
    return "sharded"


def _no_memory():
    return True  # a fully sharded parameter's guarded grad has nothing to zero


def _find_released(values):
    for v in values:
        if type(v) is FullyShardedParameter:  # noqa: E721 (exact class, cheap)
            if v._braid_released:
                return v
        elif isinstance(v, (list, tuple)):
            found = _find_released(v)
            if found is not None:
                return found
    return None


_RELEASED = {}  # (dtype, device) -> one NaN element (the storage released parameters share)


def _released_data(dtype, shape, device=None):
    """What a released parameter's data is: its shape over one shared NaN element (stride 0),
    so even a read that bypasses the Python check (C++ code) sees NaN, never freed memory, and
    any in-place write fails (more than one element refers to a single memory location).
    `device`: None (host) or the CUDA index of a CUDA module's parameters (p.device stays)."""
    key = (dtype, device)
    one = _RELEASED.get(key)
    if one is None:
        where = "cpu" if device is None else torch.device("cuda", device)
        one = _RELEASED.setdefault(key, torch.full((1,), float("nan"), dtype=dtype,
                                                   device=where))
    return one.expand(shape) if len(shape) else one.view(())


def _tensors(value, out):
    """Every tensor inside `value` (tensors, lists, tuples, dicts, namedtuples)."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors(v, out)
    return out
