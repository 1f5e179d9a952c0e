"""Local shards: a fully sharded model trained by any elementwise torch optimizer, or by none.

When no ShardedAdamW / ShardedSGD holds a fully sharded model's shards at its first forward,
the model takes a gather-only handle from Braid (core.Optimizer(kind="none"): the units gather,
release and prefetch; nothing steps) and every parameter becomes *this rank's piece* of itself
between uses, as FSDP1's use_orig_params=True and FSDP2's DTensor locals do:

    model = fully_shard(net, group=g)              # or FullyShardedDataParallel(net, g, ...)
    opt = torch.optim.AdamW(model.parameters())    # before or after the first forward
    loss_fn(model(x), y).backward()                # p.grad: this rank's averaged gradient piece
    opt.step()                                     # steps the pieces, in Braid's shard memory
    model(x)                                       # gathers the stepped pieces

Contract:
  - Outside a unit's forward/backward, `p.data` is a view of elements [offset, offset +
    count) of p's flat values inside Braid's parameter shard (count may be 0: a parameter that
    lies in other ranks' shards is empty here), shaped (1, ..., 1, count) so it keeps p's
    number of dimensions (piece_shape): param groups chosen by p.dim() / p.ndim (decay for
    matrices, none for biases and norms) are torch's groups, as with FSDP2's DTensors. Writes
    to it (an optimizer's step, an in-place init) are what the next gather publishes. Inside a
    unit p.data is the gathered full tensor.
  - After a synced backward `p.grad` is this rank's piece of the averaged gradient (a copy, so
    Braid's next backward cannot change it): added to a p.grad left from before (no zero_grad),
    as torch accumulates. Backwards under no_sync / set_requires_gradient_sync(False) leave
    p.grad as it was (the sum is reduced by the next synced backward). An elementwise optimizer
    over the pieces computes exactly the full-model step, piece by piece.
  - Norms over shards are not torch's norm of the full gradient: torch.norm / vector_norm /
    clip_grad_norm_ on a gradient piece raise, naming model.clip_grad_norm_ (the global norm).
    Model state_dict() outside summon_full_params() raises (it would hold pieces).
  - Mixed precision in this mode: the pieces have the parameters' dtype (float32 under a
    param_dtype cast: braid/_fsdp_cast.py; see fully_shard's
    mp_policy for what is refused).
"""

import torch

from . import core
from ._fsdp_params import _TENSOR_GRAD
from ._views import _ready_event, _view

# torch calls that compute a norm: on a gradient piece they would silently give this rank's
# part of the norm, so they raise (torch.nn.utils.clip_grad_norm_ goes through them), as does
# a whole-tensor max (the inf-norm's g.abs().max()).
_NORMS = frozenset(["norm", "vector_norm", "matrix_norm", "_foreach_norm", "dist", "renorm",
                    "renorm_"])
_WHOLE_MAX = frozenset(["max", "amax"])
# Calls whose result stays guarded (clip_grad_norm_ first takes g.detach(), then its norm);
# other results are plain tensors, so an optimizer's state never becomes a ShardGrad.
_KEEP = frozenset(["detach", "view", "reshape", "flatten", "view_as", "abs", "__getitem__"])


def piece_shape(ndim, count):
    """The shape of a `count`-element piece of an `ndim`-dimensional parameter: (1, ..., 1,
    count), so the piece reports the parameter's dim() (a scalar parameter's piece is 0-d when
    this rank holds it; an empty one is (0,), which no step reads)."""
    if ndim == 0:
        return () if count == 1 else (count,)
    return (1,) * (ndim - 1) + (count,)


class ShardGrad(torch.Tensor):
    """The class of p.grad of a fully sharded model trained by a torch optimizer: an ordinary
    tensor (this rank's gradient piece) whose norms raise."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        whole_max = name in _WHOLE_MAX and len(args) == 1 and not kwargs
        if name in _NORMS or whole_max:
            raise RuntimeError(
                "%s over p.grad of a fully sharded model: p.grad is this rank's piece of the "
                "gradient, so this norm would be this rank's part only (torch.nn.utils."
                "clip_grad_norm_ included); call model.clip_grad_norm_(max_norm) (the global "
                "norm over every rank's pieces)" % name)
        out = torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})
        if name in _KEEP and isinstance(out, torch.Tensor) and type(out) is not cls:
            out = out.as_subclass(cls)
        return out


class LocalShards:
    """The gather-only handle of `fsdp` (a FullyShardedDataParallel) and its parameters'
    pieces; the engine calls piece(), stash_grads(), collect_grads(), restore_grads(),
    write_full() and close()."""

    def __init__(self, fsdp, shard_group):
        self.fsdp = fsdp
        self.group = shard_group
        options = {k: v for k, v in fsdp.fsdp_options.items() if k != "offload"}  # no state
        self.opt = core.Optimizer(fsdp.reducer, kind="none", fully_sharded=True,
                                  timeout_ms=fsdp._timeout_ms, **options)
        device = fsdp._device  # a CUDA module's pieces are device views (braid/_fsdp_device.py)
        self.pieces = []  # pid -> (view into the parameter shard, piece_shape; offset)
        try:
            for pid, p in enumerate(fsdp._params):
                address, count, offset = self.opt.param_shard(pid)
                shape = piece_shape(len(fsdp._shapes[pid]), count)
                local = _view(self.opt, address, count, fsdp._dtypes[pid], shape, device)
                local.view(-1).copy_(p.detach().reshape(-1)[offset:offset + count])
                self.pieces.append((local, offset))
        except BaseException:
            self.opt.close()
            raise
        self.stash = [None] * len(fsdp._params)
        self._events = {}  # CUDA: the norm all-reduce's readiness event

    def piece(self, pid):
        return self.pieces[pid][0]

    def write_full(self, pid, full):
        """Full values of parameter `pid` (identical on every rank) -> this rank's piece."""
        local, offset = self.pieces[pid]
        local.view(-1).copy_(full.detach().reshape(-1)[offset:offset + local.numel()])

    def stash_grads(self):
        """At the start of a backward: p.grad (a piece from earlier steps) is set aside, so
        autograd accumulates the full gradient into an empty p.grad for Braid's hook."""
        for pid, p in enumerate(self.fsdp._params):
            self.stash[pid] = _TENSOR_GRAD.__get__(p)
            if self.stash[pid] is not None:
                _TENSOR_GRAD.__set__(p, None)

    def restore_grads(self):
        for pid, p in enumerate(self.fsdp._params):
            _TENSOR_GRAD.__set__(p, self.stash[pid])
            self.stash[pid] = None

    def collect_grads(self):
        """After a synced backward: p.grad = (set-aside p.grad +) this rank's averaged piece."""
        reducer = self.fsdp.reducer
        for pid, p in enumerate(self.fsdp._params):
            address, count, _ = reducer.grad_shard(pid)
            shape = piece_shape(len(self.fsdp._shapes[pid]), count)
            mine = _view(reducer, address, count, self.fsdp._dtypes[pid], shape, self.fsdp._device)
            kept = self.stash[pid]
            self.stash[pid] = None
            if kept is not None and kept.shape == mine.shape:
                kept.add_(mine)
                grad = kept if isinstance(kept, ShardGrad) else kept.as_subclass(ShardGrad)
            else:
                grad = mine.clone().as_subclass(ShardGrad)
            _TENSOR_GRAD.__set__(p, grad)

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """torch's clip_grad_norm_ over the whole model: the norm of every rank's pieces (one
        all-reduce over the shard group), then each piece scaled by max_norm / (norm + 1e-6)
        clamped to 1. Returns the total norm as a 0-dim tensor."""
        norm_type = float(norm_type)
        grads = [_TENSOR_GRAD.__get__(p) for p in self.fsdp._params]
        grads = [g.as_subclass(torch.Tensor) for g in grads if g is not None]
        dtype = grads[0].dtype if grads else torch.float32
        where = "cpu" if self.fsdp._device is None else torch.device("cuda", self.fsdp._device)
        if norm_type == float("inf"):
            local = max([g.abs().max().double() for g in grads if g.numel()] or
                        [torch.zeros((), dtype=torch.float64, device=where)])
            total = local.reshape(1).clone()
            self.group.allreduce(total, op="max", ready_event=self._ready(total)).wait()
            norm = total[0]
        else:
            local = sum([g.double().abs().pow(norm_type).sum() for g in grads] or
                        [torch.zeros((), dtype=torch.float64, device=where)])
            total = local.reshape(1).clone()
            self.group.allreduce(total, ready_event=self._ready(total)).wait()
            norm = total[0].pow(1.0 / norm_type)
        coef = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
        return norm.to(dtype)

    def _ready(self, tensor):
        """CUDA: an event after `tensor`'s writes on the current stream, for Braid's comm
        stream to wait on (its wait() returns once the result is on the device); else None."""
        if not tensor.is_cuda:
            return None
        return _ready_event(self._events, 0, tensor.device.index)

    def close(self):
        self.opt.close()
