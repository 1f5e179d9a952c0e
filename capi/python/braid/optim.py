"""braid.optim: ShardedAdamW and ShardedSGD, Braid's sharded optimizer as torch.optim.Optimizer
subclasses (re-exported by braid.pytorch), taking torch's arguments.

    model = DistributedDataParallel(net, group, mode="reduce_scatter")  # or FSDP (fsdp.py)
    decay = [p for n, p in net.named_parameters() if not n.endswith("bias")]
    other = [p for n, p in net.named_parameters() if n.endswith("bias")]
    opt = ShardedAdamW([{"params": decay, "weight_decay": 0.1},
                        {"params": other, "weight_decay": 0.0}], lr=3e-4, max_grad_norm=1.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for x, y in data:
        loss_fn(model(x), y).backward()   # overlap (default): each bucket stepped as it arrives
        norm = opt.clip_grad_norm_(1.0)   # the step's global norm (clipped inside the step)
        opt.step()                        # returns once the parameters hold the stepped values
        sched.step()                      # the next backward's step uses the new lr
        opt.zero_grad()
    sd = opt.state_dict()                 # collective: the whole state, torch's layout
    if rank == 0:
        torch.save({"opt": sd, "sched": sched.state_dict()}, "ckpt.pt")

Contract:
  - The wrapper: ShardedAdamW(params, lr=...) takes torch's params (parameters or group
    dicts) of a model wrapped by DistributedDataParallel(mode="reduce_scatter" / "hybrid")
    or FullyShardedDataParallel, and finds the wrapper through them (braid/_owners.py);
    ShardedAdamW(model) (every trainable parameter) and ShardedAdamW(model, params=[...])
    work too. Errors name the argument and what to change: parameters no Braid wrapper owns,
    of two wrappers, of an all-reduce DistributedDataParallel (use torch.optim there).
  - find_unused_parameters=True (divergent control flow, braid/_used_map.py): the ranks agree
    each step which parameters some rank used; the others are not stepped (moments, weight
    decay and their own step count untouched, as torch skips a None .grad), the rest get the
    average with zeros from the ranks that skipped them. state_dict() then carries each
    parameter's own 'step'; sharded_state_dict() (one count per bucket) raises after a skip.
  - param_groups: Braid steps every trainable parameter, so the groups must cover each
    exactly once (ValueError naming the missing or foreign ones); frozen parameters
    (requires_grad=False when wrapped) may be listed and are never stepped. Per-group keys:
    AdamW lr, betas, eps, weight_decay (amsgrad and maximize must stay False); SGD lr,
    momentum, weight_decay, nesterov (dampening 0, maximize False). Groups are fixed at
    construction (add_param_group raises, naming it); max_grad_norm, skip_nonfinite,
    track_grad_norm, overlap and threads are optimizer-wide.
  - When hyper-parameters are read: at the moment a step is armed. With overlap=True (the
    default) that is the start of each synced backward (Braid steps buckets during it); with
    overlap=False, step(). The usual loop (backward, step, scheduler.step) therefore gives
    exactly torch's schedule: torch.optim.lr_scheduler.* work unchanged. A change made after a
    backward started, before its step() call, applies from the next step.
  - step(closure=None): with a closure, calls it (grad enabled; it must run forward and
    backward once) and returns its loss. With overlap=True the update happens inside that
    backward; step() ends the step (fully sharded: end_step; overlap=False: steps every
    bucket and starts the gathers) and, for DistributedDataParallel, returns once every
    parameter holds its stepped value (so reading parameters, model.state_dict() or
    torch.save after it see the step). Each synced backward is one step: closures evaluated
    several times per step (LBFGS) are not supported.
  - p.grad (braid/_grad_guard.py): Braid's gradients are shards, stepped and zeroed during the
    backward, so p.grad is a guard whose reads raise naming the idiom (clip_grad_norm_,
    p.grad.norm(), a torch optimizer's step) and the fix; zeroing it is allowed.
  - Gradient norms (braid/_norms.py): clip_grad_norm_(max_norm) with max_norm equal to the
    max_grad_norm given at construction returns the step's global norm (clipping is exact,
    inside the step); grad_norm() the last step's norm for logging (with max_grad_norm,
    skip_nonfinite or track_grad_norm=True).
  - Parameters written in place (model.load_state_dict(pretrained), torch.nn.init.*,
    p.data.copy_) after the optimizer exists become the master weights at the next forward
    (braid/_written.py; ZeRO-2), as torch's optimizer steps from the written values; write
    the same values on every rank. With overlap=True a write between the forward and step()
    raises at step() (the step already ran). Fully sharded parameters are written inside
    model.summon_full_params(writeback=True).
  - zero_grad(set_to_none=False): Braid zeroes each bucket right after stepping it, so there
    is nothing to zero. set_to_none=True gives DDP's meaning (DDP with gradient_as_bucket_view):
    every p.grad becomes None and is bound again to its (zeroed) bucket view at the next
    forward; no memory is freed (the buckets are Braid's), and that forward first waits for
    every parameter (it loses its gather overlap). FullyShardedDataParallel: p.grad is a
    guard (its reads raise); nothing to do.
  - Checkpoints (braid/optim_state.py has the contracts): state_dict() is collective and
    gives the whole state in torch.optim.AdamW's / SGD's layout on every rank;
    consolidate_state_dict(to=0) keeps it on one rank (ZeroRedundancyOptimizer's idiom);
    load_state_dict(sd) (collective) takes such a dict from a Braid run of any world size or
    from torch's own optimizer, each rank taking its shard. sharded_state_dict() /
    load_sharded_state_dict() are the fast per-rank form for the same world and plan.
"""

import functools
import weakref

import torch

from . import core
from ._lib import BraidError
from ._norms import GradNorms
from ._param_groups import ParamGroups
from ._recompute import recompute_may_skip_wait
from ._views import _view, _weak_call
from ._written import AdoptsWrites, WriteTracker
from .fsdp import FullyShardedDataParallel
from .optim_state import CheckpointMixin

__all__ = ["ShardedAdamW", "ShardedSGD"]

class _ShardedOptimizer(CheckpointMixin, ParamGroups, AdoptsWrites, GradNorms,
                        torch.optim.Optimizer):
    """Braid's sharded optimizer over a DistributedDataParallel in "reduce_scatter" or "hybrid"
    mode, or a FullyShardedDataParallel: each rank keeps f32 master weights and state for its
    shard only, steps each bucket as soon as its reduction completes (overlap=True) and
    all-gathers the updated parameters. Parameters' data become views over the gathered values
    (step() returns once they hold the stepped values). The module docstring says how the
    wrapper is found, when param_groups are read, and what step / zero_grad / state_dict mean;
    braid/_norms.py has clip_grad_norm_ and grad_norm."""

    _KIND = None

    def __init__(self, model, params, defaults, overlap, options):
        who = type(self).__name__
        ddp, params = self._resolve(model, params)
        self._fully_sharded = isinstance(ddp, FullyShardedDataParallel)
        if not self._fully_sharded and ddp._mode == "allreduce":
            raise ValueError(
                "%s steps each rank's shard of a reduce-scatter, but these parameters are "
                "wrapped by DistributedDataParallel(mode='allreduce'): wrap the model with "
                "DistributedDataParallel(net, mode='reduce_scatter') or use torch.optim.%s with "
                "an all-reduce model" % (who, "AdamW" if self._KIND == "adamw" else "SGD"))
        taken = ddp._opt if self._fully_sharded else ddp._stepper
        if self._fully_sharded and ddp._local is not None:
            ddp._drop_local()  # collective: the local pieces go, Braid's optimizer holds shards
            taken = None
        if taken is not None:
            raise ValueError("this %s already has a sharded optimizer" % type(ddp).__name__)
        self.ddp, self._overlap = ddp, overlap
        self._max_grad_norm = float(options["max_grad_norm"])
        self._skip_nonfinite = bool(options["skip_nonfinite"])
        self._track_grad_norm = bool(options["track_grad_norm"])
        self._stepped_early = False  # overlap=False: clip_grad_norm_ ran this step already
        self._writes = None          # ZeRO-2: the parameters' version counters (_written.py)
        self._names = self._param_names(ddp)
        self._growing = True
        super().__init__(list(ddp._params) if params is None else params, defaults)
        self._growing = False
        group_of = self._check_groups()
        self._check_unused()
        self._pushed = {}  # group index -> the hyper tuple Braid has
        first = self.param_groups[0]
        # Every group, also one with no trainable parameter (empty, or frozen ones only: torch
        # allows both), has hyper-parameters in Braid: _push_hyper sends each group's.
        options = dict(options, num_groups=len(self.param_groups))
        if getattr(self, "_linker", None) is not None:
            self._deferred = (first["lr"], group_of, options)  # braid/_linked.py attaches
            return
        self._attach(first["lr"], group_of, options)

    @classmethod
    def linked(cls, params, span=None, tensor_parallel_group=None, tp_replicated=(), **kwargs):
        """One optimizer over the parameters of several DistributedDataParallel wrappers (a
        MoE model's dense and expert parts, tensor-parallel shards) with one global gradient
        norm: braid/_linked.py."""
        from ._linked import LinkedShardedOptimizer
        return LinkedShardedOptimizer(cls, params, kwargs, span, tensor_parallel_group,
                                      tp_replicated)

    def _attach(self, lr, group_of, options, core_optimizer=None):
        ddp, overlap = self.ddp, self._overlap
        if self._fully_sharded:
            self._init_fully_sharded(ddp, overlap, lr, group_of, options, core_optimizer)
        else:
            self._init_zero2(ddp, overlap, lr, group_of, options, core_optimizer)
        self.optimizer.before_arm.append(_weak_call(self._push_hyper))
        # Also at each forward, so a bad value raises there, before any gradient is
        # accumulated (the push when the step is armed then only sends later changes), and
        # parameters written since the last check become the master weights (ZeRO-2).
        self._forward_check = ddp.register_forward_pre_hook(self._check_at_forward)

    # ---- construction ----------------------------------------------------------------------
    def _init_zero2(self, ddp, overlap, lr, group_of, options, core_optimizer=None):
        if ddp._main_grad:
            raise ValueError(
                "%s over DistributedDataParallel(main_grad=True): the sharded optimizer needs "
                "buckets of the parameters' dtype (it keeps f32 master weights; pass "
                "reduce_dtype=torch.float32 to reduce half gradients in f32)" % type(self).__name__)
        if (ddp._autotune or ddp._rebuild) and ddp._device is not None:
            raise ValueError(
                "%s over a CUDA DistributedDataParallel(%s=True): the optimizer's state does not "
                "follow a re-plan of device buckets yet; pass %s=False" % (
                    type(self).__name__, "autotune" if ddp._autotune else "rebuild_bucket_order",
                    "autotune" if ddp._autotune else "rebuild_bucket_order"))
        ddp._rebuild_if_due()  # collective: every rank builds its optimizer at the same point
        self.optimizer = core_optimizer or core.Optimizer(ddp.reducer, lr=lr, overlap=overlap,
                                                          param_groups=group_of, **options)
        params = ddp._params
        for pid, p in enumerate(params):
            # Host values, also for a device optimizer (braid_optimizer_set_param copies them in).
            self.optimizer.set_param(pid, p.data.detach().cpu().contiguous())
        self.optimizer.wait_all_params()
        self._hooks = []
        self._writes = WriteTracker(params)
        self._bind_views()
        self.optimizer.before_close.append(_weak_call(self._detach_params))
        ddp._stepper = self.optimizer
        # A re-plan of the buckets (rebuild_bucket_order, autotune) carries the state over and
        # moves the parameters to a new gatherer (braid_reducer_rebuild_buckets, 0.9).
        self._replan_callback = _weak_call(self._bind_views)
        ddp._on_replan.append(self._replan_callback)

    def _bind_views(self):
        """p.data of every parameter as a view over the gathered values (after a re-plan: the
        new ones; the values are the same), and one forward pre-hook per module waiting for
        its own buckets."""
        ddp, params = self.ddp, self.ddp._params
        self.optimizer.wait_all_params()
        for pid, p in enumerate(params):
            address, count = self.optimizer.param(pid)
            p.data = _view(self.optimizer, address, count, p.dtype, p.shape, ddp._device)
        self._writes.record()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        index = {id(p): pid for pid, p in enumerate(params)}
        self._bucket_pids = {}  # bucket -> its parameter ids (_recompute.py)
        for pid in range(len(params)):
            self._bucket_pids.setdefault(ddp.reducer.param_bucket(pid), []).append(pid)
        for m in ddp.module.modules():
            buckets = sorted({ddp.reducer.param_bucket(index[id(p)])
                              for p in m.parameters(recurse=False) if id(p) in index})
            if buckets:
                self._hooks.append(m.register_forward_pre_hook(
                    functools.partial(self._wait_buckets, buckets)))

    def _wait_buckets(self, buckets, *unused):
        for b in buckets:
            # A recompute inside the backward (activation checkpointing) reads the values the
            # forward read while its bucket is not stepped: no wait (_recompute.py).
            if self._overlap and recompute_may_skip_wait(self.ddp, self._bucket_pids[b]):
                continue
            self.optimizer.wait_params(b)

    def _init_fully_sharded(self, fsdp, overlap, lr, group_of, options, core_optimizer=None):
        """The core optimizer is fully sharded (core_optimizer: one braid/_linked.py built so);
        it takes every parameter's initial values, which the model then releases (only shards
        remain)."""
        self.optimizer = core_optimizer or core.Optimizer(
            fsdp.reducer, lr=lr, overlap=overlap, fully_sharded=True, param_groups=group_of,
            **fsdp.fsdp_options, **options)
        try:
            for pid, p in enumerate(fsdp._params):  # host values (device: copied in)
                self.optimizer.set_param(pid, p.detach().cpu().contiguous())
        except BaseException:
            self.optimizer.close()
            raise
        self._hooks, self._give_back = [], None
        fsdp._attach(self.optimizer)
        fsdp._sharded_optimizer = weakref.ref(self)  # its clip_grad_norm_ is ours
        self.optimizer.before_close.append(_weak_call(self._detach_params))

    # ---- hyper-parameters ------------------------------------------------------------------
    def _check_options(self, g, group):
        """Subclasses: ValueError naming the group for an option Braid does not implement."""

    def _hyper(self, group):
        """set_hyper keyword arguments of one param group."""
        raise NotImplementedError

    def _push_hyper(self):
        """Runs right before Braid arms a step: every group's current values go to Braid."""
        for g, group in enumerate(self.param_groups):
            self._check_options(g, group)
            if getattr(self.ddp, "_find_unused", False) and not self._zero_grad_is_skip(group):
                self._check_unused()  # a group changed since construction: raises
            hyper = self._hyper(group)
            key = tuple(sorted(hyper.items()))
            if self._pushed.get(g) == key:
                continue
            try:
                self.optimizer.set_hyper(g, **hyper)
            except BraidError as e:
                raise ValueError("param_groups[%d]: %s" % (g, e.message)) from None
            self._pushed[g] = key

    def _check_at_forward(self, *unused):
        self._adopt_writes()
        if torch.is_grad_enabled():
            self._push_hyper()

    @property
    def lr(self):
        """The first group's learning rate."""
        return self.param_groups[0]["lr"]

    def set_lr(self, lr):
        """Every group's learning rate from the next step on (as setting group["lr"])."""
        for group in self.param_groups:
            group["lr"] = lr

    # ---- the step --------------------------------------------------------------------------
    def step(self, closure=None):
        """Ends the step (see the module docstring): with `closure`, calls it first (grad
        enabled) and returns its loss. overlap=True: the buckets were stepped during the
        backward. overlap=False: steps every bucket of the finished backward now (with the
        param_groups' current values) and starts the gathers. DistributedDataParallel: returns
        once every parameter holds its stepped value. FullyShardedDataParallel: ends the
        step's units (else the next forward does)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Already stepped: during the backward (overlap), or by clip_grad_norm_ (overlap=False).
        stepped, self._stepped_early = self._overlap or self._stepped_early, False
        if not stepped:
            self._step_now()
        elif self._fully_sharded:
            self.ddp._end_step()
        if not self._fully_sharded:
            # torch's meaning: the parameters hold the stepped values when step() returns (the
            # next forward's first layers are in the last bucket stepped, so it would wait for
            # that bucket's gather anyway).
            self.optimizer.wait_all_params()
            if stepped:
                self._refuse_late_writes()
        return loss

    def _step_now(self):
        """overlap=False: the step of the finished backward, from the parameters as written
        (adopted first, as torch steps from them)."""
        if self._fully_sharded:
            self.ddp._end_step()
        self._adopt_writes()
        self.optimizer.step()

    def zero_grad(self, set_to_none=False):
        """Braid zeroes each bucket after stepping it: nothing to do. set_to_none=True: every
        p.grad becomes None, bound again to its zeroed bucket view at the next forward (which
        then waits for every parameter first). Fully sharded: p.grad is always None."""
        if set_to_none and not self._fully_sharded:
            for p in self.ddp._params:
                p.grad = None

    def synchronize(self):
        """Waits until every step and all-gather in flight completed (parameters readable;
        with FullyShardedDataParallel: inside model.summon_full_params())."""
        if self._fully_sharded:
            self.ddp._end_step()
        self.optimizer.wait_all_params()
        self._adopt_writes()

    def last_step(self):
        return self.optimizer.last_step()

    # ---- closing ---------------------------------------------------------------------------
    def _detach_params(self):
        """Before the optimizer's memory goes (whoever closes it): unhook the forwards, give
        the parameters copies of their values."""
        self._forward_check.remove()
        if self._fully_sharded:
            # The values gathered by close(), or none: released parameters stay released
            # (they never point at Braid's memory).
            values, self._give_back = self._give_back, None
            self.ddp._detach(values)
            return
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._replan_callback in self.ddp._on_replan:
            self.ddp._on_replan.remove(self._replan_callback)
        try:
            self.optimizer.wait_all_params()
        finally:
            self._writes.close()  # plain torch.nn.Parameters again
            for p in self.ddp._params:
                p.data = p.data.clone()
            if self.ddp._stepper is self.optimizer:
                self.ddp._stepper = None

    def close(self):
        """Unhooks the model's forwards, gives the parameters their own memory (copies) and
        frees the optimizer; the model keeps training with a torch optimizer after this.
        FullyShardedDataParallel: collective (it gathers every parameter to give it back).
        An optimizer closed otherwise (World.close(), garbage collection) leaves a fully
        sharded model's parameters released."""
        if self._fully_sharded and not self.optimizer.closed:
            self._give_back = self.ddp._gathered_values()
        self.optimizer.close()  # runs _detach_params first


class ShardedAdamW(_ShardedOptimizer):
    """Sharded AdamW: torch.optim.AdamW's math (decoupled weight decay, amsgrad off), plus
    optional exact global-norm clipping (max_grad_norm) and skipping non-finite steps.
    Per-group lr, betas, eps, weight_decay (params=[{...}, ...], as torch)."""

    _KIND = "adamw"

    def __init__(self, model=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 max_grad_norm=0.0, skip_nonfinite=False, overlap=True, threads=1,
                 timeout_ms=300000, params=None, track_grad_norm=False, amsgrad=False,
                 maximize=False, foreach=None, capturable=False):
        del foreach, capturable  # torch's implementation choices: Braid has its own kernels
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize)
        super().__init__(model, params, defaults, overlap, dict(
            kind="adamw", betas=betas, eps=eps, weight_decay=weight_decay,
            max_grad_norm=max_grad_norm, skip_nonfinite=skip_nonfinite, threads=threads,
            timeout_ms=timeout_ms, track_grad_norm=track_grad_norm))

    def _check_options(self, g, group):
        for key in ("amsgrad", "maximize"):
            if group.get(key):
                raise ValueError("param_groups[%d]: %s=True is not implemented by Braid's "
                                 "AdamW" % (g, key))

    def _hyper(self, group):
        beta1, beta2 = group["betas"]
        return dict(lr=group["lr"], betas=(beta1, beta2), eps=group["eps"],
                    weight_decay=group["weight_decay"])


class ShardedSGD(_ShardedOptimizer):
    """Sharded SGD: torch.optim.SGD's math (dampening 0) with momentum and nesterov.
    Per-group lr, momentum, weight_decay, nesterov (params=[{...}, ...], as torch)."""

    _KIND = "sgd"

    def __init__(self, model=None, lr=None, momentum=0.0, nesterov=False, weight_decay=0.0,
                 max_grad_norm=0.0, skip_nonfinite=False, overlap=True, threads=1,
                 timeout_ms=300000, params=None, track_grad_norm=False, dampening=0,
                 maximize=False, foreach=None):
        del foreach  # torch's implementation choice: Braid has its own kernels
        if lr is None:
            raise TypeError("ShardedSGD: lr is required (as torch.optim.SGD's)")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        super().__init__(model, params, defaults, overlap, dict(
            kind="sgd", momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
            max_grad_norm=max_grad_norm, skip_nonfinite=skip_nonfinite, threads=threads,
            timeout_ms=timeout_ms, track_grad_norm=track_grad_norm))

    def _check_options(self, g, group):
        if group.get("dampening", 0) != 0:
            raise ValueError("param_groups[%d]: dampening=%r; Braid's SGD has dampening 0" %
                             (g, group["dampening"]))
        if group.get("maximize"):
            raise ValueError("param_groups[%d]: maximize=True is not implemented by Braid's "
                             "SGD" % g)

    def _hyper(self, group):
        return dict(lr=group["lr"], momentum=group["momentum"],
                    weight_decay=group["weight_decay"], nesterov=bool(group["nesterov"]))

    def _zero_grad_is_skip(self, group):
        return group["momentum"] == 0 and group["weight_decay"] == 0

    def _zero_step_effect(self, g, group):
        return ("param_groups[%d] has momentum=%g, weight_decay=%g, which would still move "
                "its weights" % (g, group["momentum"], group["weight_decay"]))
