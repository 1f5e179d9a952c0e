"""PyTorch on Braid: DistributedDataParallel over Braid's reducer, Braid's sharded AdamW, and
fully sharded data parallel (FullyShardedDataParallel, ZeRO-3 / FSDP).

    model = DistributedDataParallel(net)             # torch DDP's signature; the group:
                                                     # braid.core.default_group() (launcher)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in data:
        loss_fn(model(x), y).backward()              # gradients averaged when backward returns
        opt.step(); opt.zero_grad()

    model = DistributedDataParallel(net, g, mode="reduce_scatter")      # ZeRO-2 style
    opt = ShardedAdamW(model.parameters(), lr=1e-3)  # Braid steps each shard as it arrives
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)  # a torch Optimizer
    for x, y in data:
        loss_fn(model(x), y).backward(); opt.step()  # overlap: stepped during the backward
        sched.step()                                 # param_groups read as the next step arms
    sd = opt.state_dict()                            # collective: torch's layout, whole
    if g.rank == 0: torch.save(sd, "opt.pt")         # loads into any world size, or torch's

    model = FullyShardedDataParallel(net, g, auto_wrap_policy={TransformerEncoderLayer})
    opt = ShardedAdamW(model, lr=1e-3)               # holds the shards: create it before forward
    for x, y in data:
        loss_fn(model(x), y).backward(); opt.step()  # each unit gathered only while it runs
    with model.summon_full_params():                 # collective: full values, e.g. to export
        torch.save(net.state_dict(), "model.pt")

CPU modules run on host backends (local, mpi, gloo). CUDA modules (DistributedDataParallel
and ShardedAdamW / ShardedSGD; FullyShardedDataParallel is CPU-only so far) need a
World("nccl"), one rank per process and GPU, every parameter on that GPU:

    torch.cuda.set_device(local_rank)               # the GPU of this process
    world = braid.World("nccl", cuda_device=local_rank)  # torchrun / srun / mpirun bootstrap
    model = DistributedDataParallel(Net().cuda(), world.group())
(the world's cuda_device and the parameters' GPU must be the same one: Braid does not check it.)

How it is wired (CUDA modules, gradients in the buckets, bucket order, main_grad,
autotuning, buffers, unused parameters, fully sharded units and their limits):
docs/design/pytorch.md.
"""

import functools
import time

import torch

from . import _ddp_pickle, _grad_guard, _join, _owners, core
from ._ddp_args import WHAT, read_arguments, rebuild_policy
from ._ddp_backward import BackwardHooks  # the hooks and end of a backward
from ._ddp_devices import to_device
from ._ddp_graph import GraphCheck, unreached
from ._ddp_profile import CollectiveRanges, profiled
from ._ddp_reuse import Fires, reuse_marks
from ._ddp_grads import GradPresence
from ._ddp_comm_hook import comm_hook_state_dict as _comm_hook_state_dict
from ._ddp_comm_hook import load_comm_hook_state_dict as _load_comm_hook_state_dict
from ._ddp_comm_hook import register_comm_hook as _register_comm_hook
from . import _buffer_hook, _ddp_comm_hook, _ddp_ignore, _ddp_introspect, _python_hook
from ._ddp_verify import verify_same_model
from ._used_map import DDP_AGREEMENT, agreement_options
from ._recompute import FinishOnce
from ._views import _broadcast_buffers, _broadcast_module, _sync_scope, _view, _weak_call
from .fsdp import FullyShardedDataParallel, FullyShardedParameter  # noqa: F401
from .fully_shard import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy,  # noqa: F401
                          OffloadPolicy, UnshardHandle, fully_shard)
from .optim import ShardedAdamW, ShardedSGD  # noqa: F401 (re-exported)

__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy",
           "CPUOffloadPolicy", "UnshardHandle",
           "DistributedDataParallel", "FullyShardedDataParallel", "FullyShardedParameter",
           "ShardedAdamW", "ShardedSGD"]


class DistributedDataParallel(BackwardHooks, torch.nn.Module, _owners.Wrapper):
    """Wraps `module`: its gradients are reduced by Braid across the group. torch 1.13 DDP's
    signature and meaning, then Braid's own keywords (keyword-only):

        DistributedDataParallel(net)                                 # default world's group
        DistributedDataParallel(net, process_group=torch_group)      # a torch ProcessGroup
        DistributedDataParallel(net, group=g, mode="reduce_scatter")  # a braid Group
        DistributedDataParallel(net, g, mode="reduce_scatter")       # (older form, kept)

    torch's arguments (braid/_ddp_args.py reads them):
    device_ids, output_device: None for CPU modules, as torch requires; for CUDA modules None
      or the parameters' device (forward then moves its tensor arguments there, as torch).
    dim: unused (as torch for single-device modules). bucket_cap_mb: default 25, as torch.
    broadcast_buffers (default True): rank 0's buffers (BatchNorm statistics) are broadcast
      before the first forward and each forward that follows a synced forward with grad
      (torch's rule: not after one under no_sync() or torch.no_grad()). False: never again.
    process_group: None (with group=None: braid.core.default_group(), as torch's default
      process group), a torch ProcessGroup whose ranks map onto that world
      (braid/_torch_groups.py), or a braid Group.
    find_unused_parameters / static_graph: parameters a forward's outputs do not reach are
      marked ready at the start of the backward; one no rank used keeps its .grad (None stays
      None), as torch (docs/design/pytorch.md, "Buffers"); "used" as torch's local_used_map
      (braid/_ddp_grads.py: reached, and its .grad defined after the backward, so an output
      the loss ignores leaves a None .grad None). False for both: a parameter that got no
      gradient is reduced as it is, and the next forward with grad raises torch's error
      ("Expected to have finished reduction in the prior iteration ..."), as does every
      later one: wrap the module again (braid/_ddp_graph.py has the state and recovery).
      static_graph=True: no search (as torch 1.13; reentrant checkpointing needs it): the
      first synced backward records the unused ones, marked at the start of later ones, and
      a graph that changes is refused, as torch (torch's private _set_static_graph() before
      the first forward does the same).
      In "reduce_scatter" / "hybrid" mode the unreached parameters are declared to the
      reducer, whose used-map agreement lets ShardedAdamW / ShardedSGD skip what no rank
      used (braid/_used_map.py).
    backward(create_graph=True): reduced; p.grad is the reduced gradient without a graph.
    check_reduction: deprecated in torch; ignored (with torch's warning).
    gradient_as_bucket_view: gradients always live in Braid's buckets; docs/design/pytorch.md,
      "Gradients in the buckets", for what False (torch's default) protects.
    The model is checked to be the same on every rank (braid/_ddp_verify.py) and broadcast
    from rank 0 at construction; an already wrapped module is refused. Pickling
    (torch.save(ddp), copy.deepcopy) works as torch DDP's, over the default group only.

    Braid's keywords: group (a braid Group, or a torch ProcessGroup; not with process_group);
    mode: "allreduce" (like torch DDP), "reduce_scatter" (each rank gets its averaged shard;
    use with ShardedAdamW) or "hybrid" (reduce-scatter in `group`, all-reduce across
    `replica_group`; HSDP); rebuild_bucket_order (None: torch's policy, one rebuild after the
    first synced backward when static_graph or not find_unused_parameters, mode="allreduce"),
    main_grad, autotune (docs/design/pytorch.md);
    credit_mb, priorities (communication scheduling, braid.core.Reducer; same results bit for
    bit); first_bucket_cap_mb, reduce_dtype, timeout_ms, timeline_prefix (braid.core.Reducer);
    broadcast_from_rank0=False skips the construction broadcast.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=25,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False, *, group=None,
                 mode="allreduce", replica_group=None, first_bucket_cap_mb=1.0,
                 reduce_dtype=None, broadcast_from_rank0=True, timeout_ms=300000,
                 timeline_prefix=None, rebuild_bucket_order=None, main_grad=False,
                 autotune=False, credit_mb=0.0, priorities=False):
        args = {k: v for k, v in locals().items() if k not in ("self", "module", "__class__")}
        super().__init__()
        a = read_arguments(module, args)
        self.module, self._groups, self._config = module, a.groups, a.config
        self._device, self.device_ids, self.output_device = (a.device, a.device_ids,
                                                             a.output_device)
        self.process_group, self.dim = a.process_group, dim
        self.broadcast_bucket_size = int(250 * 1024 * 1024)  # torch's attribute and value
        self._ignored = a.ignored  # torch's parameters_to_ignore (braid/_ddp_ignore.py)
        self.parameters_to_ignore = sorted(a.ignored)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.static_graph = bool(static_graph)
        group, mode, named = a.group, a.config["mode"], a.named
        verify_same_model(module, self._groups, WHAT, a.ignored)  # collective: before any
        # broadcast
        self._events = {}  # parameter id -> its torch.cuda.Event (CUDA modules)
        if broadcast_from_rank0:
            _broadcast_module(self.module, self._groups, a.ignored)
        self.broadcast_buffers = broadcast_buffers
        self._sync_buffers_next = True  # torch's require_forward_param_sync starts True
        self._has_buffers = any(n not in a.ignored for n, _ in module.named_buffers())
        self._params = [p for _, p in named]
        self._main_grad = bool(main_grad)
        self._allow_unused = self.find_unused_parameters or self.static_graph
        # main_grad: half parameters get f32 buckets, filled by their AccumulateGrad hooks.
        self._widened = [self._main_grad and p.dtype in (torch.bfloat16, torch.float16)
                         for p in self._params]
        self.reducer = core.Reducer(
            group, [(i, p.numel(), torch.float32 if w else p.dtype, n)
                    for i, ((n, p), w) in enumerate(zip(named, self._widened))],
            replica=replica_group, mode=mode, bucket_cap_mb=bucket_cap_mb,
            first_bucket_cap_mb=first_bucket_cap_mb,
            allow_unused=self._allow_unused,
            reduce_dtype=reduce_dtype, timeout_ms=timeout_ms, timeline_prefix=timeline_prefix,
            device=self._device, credit_mb=credit_mb, priorities=priorities,
            param_marks=reuse_marks(len(named), self.static_graph),
            **agreement_options(self._allow_unused and mode != "allreduce", DDP_AGREEMENT,
                                self.static_graph))
        # Sharded modes: the reducer agrees on use (declared at each backward's start), so a
        # sharded optimizer skips parameters no rank used (braid/_used_map.py).
        self._declares = self._agrees_unused = self._allow_unused and mode != "allreduce"
        self._marks_counted = self.static_graph  # a hook may fire twice (braid/_ddp_reuse.py)
        self._fires = Fires(self._marks_counted)  # marks per backward (braid/_recompute.py)
        self._mode = mode
        self._names = [n for n, _ in named]
        self._graph = GraphCheck(self._names, static_graph, group.rank)
        self._ranges = CollectiveRanges(self.reducer, group._world.backend, mode, timeout_ms)
        self._grads = self._bucket_views()
        self._exposed = self._expose(self._grads)
        self.reducer.zero_grads()
        for p, view, exposed, widened in zip(self._params, self._grads, self._exposed,
                                             self._widened):
            if p.grad is not None:  # else None, as torch: bound at the first forward
                view.copy_(p.grad)
                p.grad = None if widened else exposed
            if self._main_grad:
                p.main_grad = exposed
        self._presence = GradPresence(self._groups, self._device)
        # A rebuild is still to come; None: torch's policy (rebuild_policy below).
        self._rebuild_by_policy = rebuild_bucket_order is None
        self._rebuild = (rebuild_policy(mode, self.find_unused_parameters, self.static_graph)
                         if rebuild_bucket_order is None else bool(rebuild_bucket_order))
        self._rebuild_due = False                   # a synced backward recorded the order
        self._autotune = bool(autotune)             # still tuning
        self._step_start = None                     # perf_counter() at the last step boundary
        self._stepped = True                        # a synced backward since then
        # Keep the AccumulateGrad nodes alive: a node dropped by autograd would lose its hook.
        self._grad_accs, self._hooks = [], []
        for pid, p in enumerate(self._params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(acc.register_hook(functools.partial(self._grad_ready, pid)))
            self._grad_accs.append(acc)
            if p.requires_grad:  # runs before AccumulateGrad: binds a None p.grad lazily
                self._hooks.append(p.register_hook(functools.partial(self._bind_grad, pid)))
        self._sync = "sync"          # the sync mode of forwards run now
        self._armed = "sync"         # the sync mode the next backward uses
        self._in_backward = False
        # The end-of-backward callback, queued in the outermost backward (_recompute.py).
        self._finish = FinishOnce(self._finish_backward)
        self._find_unused = self.find_unused_parameters or self.static_graph
        self._unused = []            # ids the last forward's outputs do not reach
        self._early = set()          # ids marked unused at the start of this backward
        self._hooked = set()         # ids whose AccumulateGrad hook fired in this backward
        self._unbound = set()        # ids whose None p.grad is bound to its view when needed
        self._accumulated = set()    # ids marked in a no_sync backward of this window
        self._warned_graph = False   # create_graph=True warned once (graph_grad)
        self._stepper = None         # the braid.core.Optimizer of a ShardedAdamW, if any
        self._on_replan = []         # called after a re-plan (ShardedAdamW rebinds its views)
        self._join = None            # the open join() context (braid/_join.py), if any
        self._py_comm_hook = None    # a Python comm hook (braid/_python_hook.py), if any
        self._join_config = _join.disabled_config()  # torch's attribute, set by join()
        self.reducer.before_close.append(_weak_call(self._detach_grads))
        _ddp_introspect.attach(self)  # torch's private reducer._get_local_used_map()
        _owners.claim(self, module)  # last: ShardedAdamW(model.parameters()) finds it; a
        # failed construction claims nothing (a second wrapper is refused: _ddp_verify.py)

    def _bucket_views(self):
        """A tensor over each parameter's gradient in the reducer's buckets (its registered
        dtype: f32 for main_grad's half parameters)."""
        return [self._bucket_view(pid) for pid in range(len(self._params))]

    def _bucket_view(self, pid):
        """Parameter `pid`'s gradient in the buckets, as a plain tensor sharing the bucket's
        storage (not an autograd view of it, so p.grad.detach_() works, as on torch's own
        gradients)."""
        p, widened = self._params[pid], self._widened[pid]
        address, count = self.reducer.grad(pid)
        dtype = torch.float32 if widened else p.dtype
        view = _view(self.reducer, address, count, dtype, p.shape, self._device)
        plain = torch.empty(0, dtype=dtype, device=view.device)
        return plain.set_(view.storage(), view.storage_offset(), view.size(), view.stride())

    def _expose(self, views):
        """What p.grad (and main_grad) are bound to: the views themselves in all-reduce mode
        (torch's averaged gradients); in reduce_scatter / hybrid mode GuardedGrads over them
        (braid/_grad_guard.py: reading them raises, as they hold this rank's unreduced or
        already stepped gradients). Braid's own code uses the plain views."""
        if self._mode == "allreduce":
            return list(views)
        why = _grad_guard.weak(self._grad_state, "unreduced")
        before_zero = _grad_guard.weak(self._before_grad_zero, False)
        return [_grad_guard.guard(v, n, why, before_zero) for v, n in zip(views, self._names)]

    def _grad_state(self):
        return "stepped" if self._stepper is not None else "unreduced"

    def _before_grad_zero(self):
        """A guarded gradient is zeroed by torch code (net.zero_grad()): first wait for the
        steps still reading the buckets (Braid zeroes them after stepping anyway)."""
        if self._stepper is not None:
            self._stepper.wait_all_params()
        return False

    def _rebuild_if_due(self):
        """The bucket rebuild (collective): at a forward with grad, or when ShardedAdamW is
        built, once the first synced backward recorded the readiness order. Rebinds p.grad and
        main_grad of every parameter still bound to its old view."""
        if not self._rebuild_due:
            return
        self._rebuild = self._rebuild_due = False
        self._sync_stream()
        # The rebuild frees the old buckets: every view Braid handed out (p.grad, main_grad, a
        # tensor the caller kept from them) first gets its own copy of its values.
        bound = [view.data_ptr() for view in self._grads]
        with torch.no_grad():
            for view in self._grads:
                view.set_(view.clone())
        # Its communication: world rank 0's order broadcast (then the plan check's all-gather),
        # torch's rebuild broadcast and range name.
        with profiled(self._ranges.backend + ":broadcast"):
            rebuilt = self.reducer.rebuild_buckets()
        self._has_rebuilt_buckets = rebuilt  # torch's logging key (braid/_ddp_introspect.py)
        self._refresh_views(bound)  # (over the same buckets when nothing was rebuilt)

    def _autotune_step(self):
        """autotune: at each step boundary (a forward with grad after a synced backward), the
        last step's time goes to braid_reducer_autotune (collective: every rank passes here at
        the same point); a re-plan rebinds the views, as the rebuild does."""
        if not (self._autotune and self._stepped):
            return
        now = time.perf_counter()
        last, self._step_start, self._stepped = self._step_start, now, False
        if last is None:
            return
        self._sync_stream()
        replanned, done = self.reducer.autotune(now - last)
        if replanned:
            self._refresh_views()
        if done:
            self._autotune = False

    def _sync_stream(self):
        """CUDA: before a re-plan (rebuild, autotune), whose bucket copies run on Braid's comm
        stream, the writes torch still has queued on the current stream (zero_grad, clipping)
        must have landed: one stream synchronize, at a re-plan only (never on the hot path)."""
        if self._device is not None:
            torch.cuda.current_stream(self._device).synchronize()

    def _refresh_views(self, bound=None):
        """After a re-plan: new views over the new buckets; p.grad (and main_grad) of every
        parameter still bound to its old view is rebound (the values moved with it). `bound`:
        the old views' data pointers, when the views were given copies before the re-plan."""
        old, self._grads = self._grads, self._bucket_views()
        self._exposed = self._expose(self._grads)
        bound = bound or [view.data_ptr() for view in old]
        for p, before, exposed, widened in zip(self._params, bound, self._exposed,
                                               self._widened):
            if not widened and p.grad is not None and p.grad.data_ptr() == before:
                p.grad = exposed
            if self._main_grad:
                p.main_grad = exposed
        for callback in list(self._on_replan):
            callback()

    def close(self):
        """Unhooks the module, gives the gradients their own memory (copies) and frees the
        reducer: `module` is a plain torch module again. Close a ShardedAdamW on this model
        first."""
        if self._stepper is not None:
            raise RuntimeError("close the ShardedAdamW of this model first")
        _owners.release(self, self.module)
        self.reducer.close()  # runs _detach_grads first

    # Pickling (torch.save(ddp), pickle, copy.deepcopy): as torch DDP's (braid/_ddp_pickle.py).
    __getstate__ = _ddp_pickle.getstate

    def __setstate__(self, state):
        module, config = _ddp_pickle.init_args(state)
        DistributedDataParallel.__init__(self, module, **config)

    def _replaceable_by(self, module):
        """braid/_owners.py: wrapping this module again closes this wrapper, unless a
        ShardedAdamW / ShardedSGD holds it."""
        return self._stepper is None and self.module is module and not self.reducer.closed

    def _detach_grads(self):
        """Before the reducer's memory goes (whoever closes it): unhook, copy gradients."""
        for h in self._hooks:
            h.remove()
        self._hooks, self._grad_accs = [], []
        for p, view, widened in zip(self._params, self._grads, self._widened):
            if p.grad is not None and p.grad.data_ptr() == view.data_ptr():
                p.grad = view.clone()  # (a plain tensor: the module is torch's again)
            if self._main_grad:
                p.main_grad = view.clone()
        self._grads = self._exposed = []


    def forward(self, *args, **kwargs):
        if self._in_backward:
            self._abandon_backward("the previous backward did not finish (an exception in "
                                   "backward or in a hook)")
        if torch.is_grad_enabled():
            self._graph.before_forward()  # torch's moment for the unused-parameter error
        if self._join is not None:  # the step's agreement (uneven inputs, braid/_join.py)
            self._join.before_forward(self._sync if torch.is_grad_enabled() else "no_sync")
        buffer_hook = _buffer_hook.location(self)  # torch's private buffer hook, if any
        if buffer_hook == "pre":
            _buffer_hook.run(self)
        elif (self.broadcast_buffers and self._sync_buffers_next and buffer_hook is None and
              self._has_buffers):  # torch's will_sync_module_buffers()
            with profiled(self._ranges.backend + ":broadcast"):
                if self._join is not None:
                    self._join.sync_buffers(True)
                else:
                    _broadcast_buffers(self.module, self._groups, self._device,
                                       ignore=self._ignored)
        synced = torch.is_grad_enabled() and self._sync == "sync"
        if torch.is_grad_enabled():
            self._armed = self._sync
            self._rebuild_if_due()
            if self._sync == "sync":
                self._autotune_step()
            self._rebind_grads()
        if self.device_ids:  # torch: inputs go to the module's device first
            args, kwargs = to_device((args, kwargs), self.device_ids[0])
        out = self.module(*args, **kwargs)
        if buffer_hook == "post":
            _buffer_hook.run(self)
        if torch.is_grad_enabled():
            self._finish.watch(out)  # activation checkpointing: _recompute.py
        self._sync_buffers_next = synced  # torch DDP's require_forward_param_sync
        static = self._graph.static_unused()  # static_graph: no search, as torch
        if static is not None and torch.is_grad_enabled():
            self._unused = static
        elif self._find_unused and torch.is_grad_enabled():
            with profiled("search_unused_parameters"):  # torch's range name
                self._unused = unreached(out, self._params, self._grad_accs)
            _ddp_introspect.note_unused(self, synced)  # torch's reducer._ddp_graph_static()
        else:
            self._unused = []
        return out

    def _zero_views(self):
        """Zeroes every gradient view. Host: Braid's zero_grads. CUDA: torch zeroes the views
        on the current stream, ordered before the next backward's writes and after the reads
        queued before it, with no host wait (Braid's work on them completed in
        finish_backward; Braid's own zero_grads would run on its comm stream and make the host
        wait)."""
        if self._device is None:
            self.reducer.zero_grads()
        elif self._grads:
            torch._foreach_zero_(self._grads)

    def _owner(self):
        return self._stepper if self._stepper is not None else self.reducer

    def no_sync(self, mode="no_sync"):
        """Forwards run inside accumulate their gradients locally (mode "no_sync"), or, in
        hybrid mode, reduce-scatter them now and all-reduce at the next synced backward
        (mode "reduce_scatter_only"). The first forward after the block syncs everything."""
        return _sync_scope(self, mode)

    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False):
        """torch DDP's uneven-inputs context manager, with its arguments and meanings
        (braid/_join.py): ranks may leave the loop at different steps; those that did shadow
        the others' steps until all did; ShardedAdamW's shard steps included."""
        _python_hook.refuse_join(self)
        _ddp_ignore.refuse_join(self)
        return _join.DDPJoin(self, divide_by_initial_world_size, enable,
                             throw_on_early_termination)

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place, or with set_to_none=True makes every p.grad None
        (torch's meaning; bound again, zeroed, at the next forward; main_grad is zeroed). With
        ShardedAdamW, waits for the parameters instead: Braid zeroes each bucket itself after
        stepping it."""
        if self._stepper is not None:
            self._stepper.wait_all_params()
            return
        if set_to_none:
            for p, widened in zip(self._params, self._widened):
                if not widened:
                    p.grad = None
            if not self._main_grad:
                return
        self._zero_views()

    def _rebind_grads(self):
        for p, widened in zip(self._params, self._widened):
            if widened and p.grad is not None:  # its hook adds this backward's gradient only
                p.grad = None
        stale = [pid for pid, (p, view, widened) in
                 enumerate(zip(self._params, self._grads, self._widened))
                 if not widened and (p.grad is None or p.grad.data_ptr() != view.data_ptr())]
        if stale and self._stepper is not None:
            self._stepper.wait_all_params()  # the stepper may still be zeroing those buckets
        for pid in stale:
            p = self._params[pid]
            if p.grad is None:
                if self._mode == "allreduce" and not (self.gradient_as_bucket_view or
                                                      self._main_grad):
                    # self._grads and self._exposed hold the same tensor in this mode.
                    if self._presence.release_held(self._grads, pid, self._bucket_view, 2):
                        self._exposed[pid] = self._grads[pid]
                self._grads[pid].zero_()
                self._presence.none.add(pid)  # None as torch sees it, until a gradient lands
                self._unbound.add(pid)  # p.grad stays None until a gradient reaches it
            else:
                self._grads[pid].copy_(p.grad)
                self._presence.none.discard(pid)  # the caller gave it a value
                p.grad = self._exposed[pid]

    def _bind_grad(self, pid, grad=None):
        """p.grad found None at a forward is bound to its zeroed view only when a gradient
        reaches it (the parameter's tensor hook, before AccumulateGrad adds into p.grad) or
        at the end of a backward: a backward that never reaches the module's parameters
        (torch.func's functional_call with other tensors) leaves it None, as torch."""
        if pid in self._unbound:
            self._unbound.discard(pid)
            if self._params[pid].grad is None:
                self._params[pid].grad = self._exposed[pid]

    def _bind_all(self):
        for pid in list(self._unbound):
            self._bind_grad(pid)

    def register_comm_hook(self, state, hook):
        """torch's: how each bucket is reduced (braid.comm_hooks says which hooks Braid runs).
        Once, on every rank alike, outside a backward."""
        _register_comm_hook(self, state, hook)

    def comm_hook_state_dict(self):
        """Braid's: this rank's comm hook state for its checkpoint (braid/_ddp_comm_hook.py)."""
        return _comm_hook_state_dict(self)

    def load_comm_hook_state_dict(self, state_dict, restart_hook=False):
        """Braid's: loads comm_hook_state_dict() into the same hook (braid/_ddp_comm_hook.py)."""
        _load_comm_hook_state_dict(self, state_dict, restart_hook)
    # torch's private introspection (braid/_ddp_introspect.py).
    _build_params_for_reducer = _ddp_introspect.build_params_for_reducer
    _build_debug_param_to_name_mapping = _ddp_introspect.build_debug_param_to_name_mapping
    __getattr__ = _ddp_introspect.module_getattr  # `logger` refused by name
    _register_buffer_comm_hook = _buffer_hook.register  # braid/_buffer_hook.py
    _default_broadcast_coalesced = _buffer_hook.default_broadcast_coalesced
    _set_params_and_buffers_to_ignore_for_model = staticmethod(_ddp_ignore.set_for_model)

    def _build_replicated_tensor_module(self):
        """torch 1.13's private ReplicatedTensor module (off by default there): nothing."""

    def _register_builtin_comm_hook(self, comm_hook_type):
        """torch's private: dist.BuiltinCommHookType.ALLREDUCE / FP16_COMPRESS."""
        _ddp_comm_hook.register_builtin_comm_hook(self, comm_hook_type)

    def _set_static_graph(self):
        """torch 1.13's private DistributedDataParallel._set_static_graph(): static_graph=True
        after construction, before the first forward with grad (torch's rule)."""
        self._graph.set_static_graph()  # refused after the first forward with grad
        self.static_graph = self._find_unused = True
        if self._rebuild_by_policy:  # torch's should_rebuild_buckets() turns true with it
            self._rebuild = rebuild_policy(self._mode, self.find_unused_parameters, True)

    def _get_ddp_logging_data(self):
        """torch 1.13's private logging data, the keys Braid fills (braid/_ddp_graph.py)."""
        data = self._graph.logging_data()
        data.update(_ddp_introspect.logging_keys(self))
        _ddp_comm_hook.add_logging(self, data)
        if self._join_config.is_first_joinable:  # join() was called (torch's logger records it)
            data["join_uneven_inputs"] = 1
        return data
