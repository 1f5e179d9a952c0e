"""FullyShardedDataParallel.join() (and fully_shard's): uneven inputs for a fully sharded
model, with torch DDP join()'s arguments and meaning (docs/design/join.md, "Fully sharded").

    opt = ShardedAdamW(model.parameters(), lr=1e-3)        # or a torch optimizer: optimizer=opt
    with model.join():
        for x, y in my_uneven_batches:          # ranks may run out at different steps
            loss(model(x), y).backward(); opt.step()

A joined rank holds a shard of every parameter, so it cannot just stop: each forward of an
active rank first takes part in the step's agreement (braid_join_agree, before any unit is
gathered), and a rank whose loop ended shadows every step the others still run by running
*the same model* on a duplicate of its own last input, with every gradient mark replaced by
zeros: the same unit gathers in the same order (forward, backward re-gathers, prefetch), the
same bucket reduce-scatters, with a contribution of exactly zero. Then it steps its shard as an
active rank does (ShardedAdamW: its step(), with its norm all-reduce when clipping; a torch
optimizer over the local pieces: clip_grad_norm_ when asked, step() and zero_grad()), so its
shard is what the contributing ranks make it. Divide: the initial world size (default) or the
contributors (braid_join_agree sets the reduce-scatter's factor each step). At the end the
buffers are broadcast from the last rank to join (torch's _sync_final_model; the parameters are
sharded and already right on every rank).

Refused (RuntimeError naming it): find_unused_parameters (the joined rank would report its
duplicate forward's use), local pieces without optimizer=, and, inside the join, a forward
without grad or under no_sync (raised before the agreement: the others then fail at their
deadline if a rank already joined); a rank that joins before any forward inside the join has
no input to replay.
"""

import ctypes

import torch

from . import _lib
from ._handles import SYNC_MODES
from ._join import _JoinConfig
from ._fsdp_params import _tensors
from ._views import _broadcast_tensors


class FSDPJoin:
    """The context manager FullyShardedDataParallel.join() returns. `caller`: what runs the
    model's forward (the wrapper, or fully_shard's root module)."""

    def __init__(self, fsdp, caller, divide_by_initial_world_size=True, enable=True,
                 throw_on_early_termination=False, optimizer=None, clip_grad_norm=None):
        self._fsdp, self._caller, self._enable = fsdp, caller, bool(enable)
        self._divide = bool(divide_by_initial_world_size)
        self._throw = bool(throw_on_early_termination)
        self._optimizer = optimizer
        if clip_grad_norm is not None and not isinstance(clip_grad_norm, tuple):
            clip_grad_norm = (float(clip_grad_norm), 2.0)
        self.clip = clip_grad_norm
        self._last = None       # (args, kwargs) of this rank's last forward inside the join
        self.shadowing = False  # a joined rank's replayed step: marks are zeros
        fsdp._join_config = _JoinConfig(enable=self._enable,
                                        throw_on_early_termination=self._throw,
                                        is_first_joinable=True)

    def _handle(self):
        return self._fsdp.reducer.handle

    def __enter__(self):
        if not self._enable:
            return self
        fsdp = self._fsdp
        if fsdp._join is not None:
            raise RuntimeError("join(): this model is already inside a join context")
        if fsdp._find_unused:
            raise RuntimeError("join() of a fully sharded model with find_unused_parameters=True "
                               "is not supported (a joined rank would report its replayed "
                               "forward's parameters as used); wrap without it")
        if fsdp._local is not None and self._optimizer is None:
            raise RuntimeError("join() of a fully sharded model trained by a torch optimizer: "
                               "pass it, model.join(optimizer=opt), so a joined rank steps its "
                               "pieces (or use ShardedAdamW / ShardedSGD)")
        if fsdp._in_backward or fsdp._entered:
            raise RuntimeError("join() inside a forward or backward")
        opts = _lib.init_options(_lib.JoinOptions, "braid_join_options_init")
        opts.divide_by_initial_world_size = int(self._divide)
        opts.throw_on_early_termination = int(self._throw)
        _lib.call("braid_join_begin", self._handle(), ctypes.byref(opts))
        fsdp._join = self
        return self

    def _agree(self, has_data):
        active, agreed = ctypes.c_int(), ctypes.c_int()
        _lib.call("braid_join_agree", self._handle(), int(has_data), SYNC_MODES["sync"],
                  ctypes.byref(active), ctypes.byref(agreed))
        return active.value

    def before_forward(self, args, kwargs):
        """An active rank's forward, after its previous step ended and before any gather: the
        step's agreement. Only synced training forwards are agreed (see the module docstring)."""
        if self.shadowing:
            return
        fsdp = self._fsdp
        if not torch.is_grad_enabled() or fsdp._sync != "sync":
            raise RuntimeError(
                "inside join() of a fully sharded model every forward is a synced training step "
                "(this one is %s): run evaluation and no_sync windows outside the join" %
                ("under no_sync" if torch.is_grad_enabled() else "without grad"))
        self._agree(True)
        self._last = (args, kwargs)

    def check_clip(self):
        """model.clip_grad_norm_ inside the join (local pieces: an all-reduce a joined rank must
        shadow): allowed only when the join was told the norm (clip_grad_norm=)."""
        if self.clip is None and self._fsdp._local is not None:
            raise RuntimeError("model.clip_grad_norm_ inside model.join(): pass clip_grad_norm="
                               "max_norm (or (max_norm, norm_type)) to join() so that joined "
                               "ranks shadow the norm's all-reduce")

    def __exit__(self, exc_type, exc, tb):
        if not self._enable:
            return None
        fsdp = self._fsdp
        if exc_type is not None:
            fsdp._join = None
            self._abort()
            return None  # propagate, as torch
        last = True
        try:
            while True:
                if fsdp._opt is not None:
                    fsdp._end_step()  # where an active rank's next forward ends its step
                if self._agree(False) == 0:
                    break
                last = False
                self._shadow()
        except BaseException:
            self._abort()
            raise
        finally:
            fsdp._join = None
        root = ctypes.c_int()
        _lib.call("braid_join_end", self._handle(), int(last), ctypes.byref(root))
        fsdp._authoritative_rank = root.value
        buffers = list(fsdp.module.buffers())
        if buffers:  # torch's _sync_final_model, for what is not sharded
            groups = fsdp._groups
            roots = [root.value % groups[0].size] + (
                [root.value // groups[0].size] if len(groups) > 1 else [])
            _broadcast_tensors(buffers, groups, fsdp._device, roots)
        return None

    def _abort(self):
        try:
            _lib.call("braid_join_abort", self._handle())
        except _lib.BraidError:
            pass

    def _shadow(self):
        """One step of the active ranks, replayed with zero gradients, then this rank's step."""
        fsdp = self._fsdp
        if self._last is None:
            raise RuntimeError(
                "join(): this rank ran out of data before its first forward inside the join; a "
                "fully sharded model's joined rank replays its last input (give every rank at "
                "least one batch inside the join)")
        args, kwargs = self._last
        local_opt = self._optimizer if fsdp._local is not None else None
        if local_opt is not None:
            local_opt.zero_grad(set_to_none=True)  # p.grad: this step's reduced piece only
        self.shadowing = True
        try:
            with torch.enable_grad():
                out = self._caller(*args, **kwargs)
                outs = [t for t in _tensors(out, []) if t.requires_grad]
                if outs:
                    torch.autograd.backward(outs, [torch.zeros_like(t) for t in outs])
        finally:
            self.shadowing = False
        if local_opt is not None:
            if self.clip is not None:
                fsdp.clip_grad_norm_(*self.clip)
            local_opt.step()
            local_opt.zero_grad(set_to_none=True)
            return
        sharded = fsdp._sharded_optimizer() if fsdp._sharded_optimizer is not None else None
        if sharded is not None:
            if self.clip is not None:
                fsdp.clip_grad_norm_(*self.clip)
            sharded.step()  # overlap: ends the step; overlap=False: steps the shards now
