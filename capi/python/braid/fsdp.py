"""braid.fsdp: FullyShardedDataParallel (ZeRO-3 / FSDP) over Braid's units; documented in
docs/design/pytorch.md, "Fully sharded" (import it from there: braid.pytorch re-exports it)."""

import contextlib
import functools

import torch

from . import _owners, core
from ._ddp_reuse import reuse_marks
from ._fsdp_backward import ROOT, UnitBackward  # the hooks and end of a backward
from ._fsdp_cast import param_cast
from ._fsdp_device import DeviceUnits, HostUnits, device_placement
from ._fsdp_join import FSDPJoin
from ._fsdp_local import LocalShards
from ._fsdp_policies import check_offload, offloads
from ._fsdp_quant import gather_options
from ._fsdp_tied import TiedUnits, tied_owners
from ._fsdp_params import (  # noqa: F401 (FullyShardedParameter: braid.fsdp's too)
    _TENSOR_GRAD, FullyShardedParameter, _released_data, _tensors)
from ._join import disabled_config
from ._used_map import agreement_options
from ._views import _broadcast_module, _sync_scope, _view


class FullyShardedDataParallel(UnitBackward, torch.nn.Module, _owners.Wrapper):
    """Fully sharded data parallel (ZeRO-3 / FSDP) over Braid: between uses every parameter
    exists only as this rank's shard; each *unit* (a submodule, e.g. one transformer block)
    is all-gathered just before its forward and its backward and released after, with
    prefetch. braid.fully_shard (fully_shard.py, FSDP2's form) builds one of these at its
    root; this class is that engine, also usable directly. Train with ShardedAdamW /
    ShardedSGD created before the first forward (the fast path: Braid holds the shards and
    steps them during the backward), or with any elementwise torch optimizer, or none (eval):
    without a sharded optimizer at the first forward every parameter becomes this rank's
    piece of itself between uses (braid/_fsdp_local.py).

    units: submodules of `module`, each a unit (nested units are allowed: a parameter belongs
           to the innermost unit holding it); or auto_wrap_policy: a callable
           policy(submodule) -> bool, or a tuple/set of module classes, choosing the units
           among module.modules() (the wrapped module itself excluded). Parameters in no unit
           form the root unit, gathered from the start of the forward to the end of the
           backward. Neither: one unit, the root (ZeRO-3 without per-layer release).
    mode: "reduce_scatter" (shards over `group`) or "hybrid" (HSDP: shards over `group`,
          replicated across `replica_group`; no_sync("reduce_scatter_only") then
          reduce-scatters every micro-batch and all-reduces at the synced one).
    reshard_after_forward: True (default) release each unit after its forward and gather it
          again for its backward; False keep it until its backward (more memory, less
          communication). prefetch: units gathered ahead (default 1). max_live_mb: limit on
          gathered-but-not-released parameter memory (default 2 x the largest unit).
    bucket_cap_mb / first_bucket_cap_mb: the gradient buckets (a bucket never mixes units).
    find_unused_parameters: parameters without a gradient in a backward are reduced as zeros
          (else finish of the backward raises naming them), and the ranks agree after the
          backward which ones some rank used: ShardedAdamW skips the others as torch does
          (braid/_used_map.py). Divergence must stay inside units every rank enters. Parameters with
          requires_grad=False are not sharded (kept whole on every rank, like buffers).
    static_graph: a keyword torch's FSDP lacks, with torch DDP's meaning (the graph is the
          same every step): each parameter's gradient hooks are counted in the first synced
          backward (whose reductions all launch at its end) and it is reduced after its last one
          from then on, so a parameter used inside a reentrant torch.utils.checkpoint region and
          outside it (its hook fires twice) works when its unit stays gathered through the
          backward (the root unit; braid/_ddp_reuse.py). Without it a second fire is an error.
    param_dtype: None, or bfloat16 / float16 over float32 parameters: units compute with
          param_dtype copies, gradients are reduced and stepped in float32; with
          cast_forward_inputs the root's and units' floating inputs are cast (_fsdp_cast.py).
    Parameters and buffers are broadcast from rank 0 at construction, like torch DDP.
    credit_mb, priorities: communication scheduling (braid.core.Reducer; off by default): the
          gradient reduce-scatters in partitions of at most credit_mb MiB, and with
          priorities=True the unit gathers go ahead of partitions not yet issued.
    CUDA modules on World("nccl") groups, and offload_policy: braid/_fsdp_device.py.
    pool_limit_mb: a keyword FSDP2 lacks (FSDP1's limit_all_gathers bounds the same memory):
          the most MiB of full-size gradient buckets and gathered units this rank holds at
          once (0: no limit); past it a gradient hand-over waits for a launched reduce-scatter
          to give its storage back, and a prefetch waits for room (braid.h pool_limit_bytes).
    gather_dtype, gather_block: quantized unit gathers (ZeRO++'s qwZ; exact master weights),
          or bfloat16 / float16 ones; None gathers in param_dtype when one is set (FSDP2's
          wire; host and CUDA modules), else float32: braid/_fsdp_quant.py.
    """

    def __init__(self, module, group, units=None, auto_wrap_policy=None, mode="reduce_scatter",
                 replica_group=None, reshard_after_forward=True, prefetch=1, max_live_mb=None,
                 bucket_cap_mb=25.0, first_bucket_cap_mb=1.0, find_unused_parameters=False,
                 reduce_dtype=None, broadcast_from_rank0=True, timeout_ms=300000,
                 timeline_prefix=None, credit_mb=0.0, priorities=False, static_graph=False,
                 offload_policy=None, param_dtype=None, cast_forward_inputs=True,
                 gather_dtype=None, gather_block=4096, pool_limit_mb=0.0):
        super().__init__()
        if mode not in ("reduce_scatter", "hybrid"):
            raise ValueError("FullyShardedDataParallel mode %r: reduce_scatter or hybrid (use "
                             "DistributedDataParallel for all-reduce)" % (mode,))
        gather_options(gather_dtype, gather_block, "FullyShardedDataParallel")  # checked early
        self.module = module
        self._groups = [g for g in (group, replica_group) if g is not None]
        self._find_unused = bool(find_unused_parameters)
        self._timeout_ms = timeout_ms
        self._timeline_prefix = timeline_prefix
        self._local = None  # LocalShards: no sharded optimizer at the first forward
        self._device = device_placement(
            list(module.named_parameters()) + list(module.named_buffers()), self._groups,
            "FullyShardedDataParallel")  # None: a host module
        check_offload(offload_policy, "FullyShardedDataParallel")  # (a no-op on the host)
        if broadcast_from_rank0:
            _broadcast_module(self.module, self._groups)
        unit_modules = self._choose_units(module, units, auto_wrap_policy)
        names = {id(m): n for n, m in module.named_modules()}
        # Parameter -> innermost unit holding it (units numbered 1.. in module order).
        depth = {id(m): names[id(m)].count(".") + (names[id(m)] != "") for m in unit_modules}
        owner = {}
        for unit, m in sorted(enumerate(unit_modules, 1), key=lambda e: depth[id(e[1])]):
            for p in m.parameters():
                prev = owner.get(id(p))
                if prev is None or self._nested(unit_modules[prev - 1], m):
                    owner[id(p)] = unit  # else tied across units: resolved below
        owner, borrows = tied_owners(module, unit_modules, owner)  # braid/_fsdp_tied.py
        self._tied = TiedUnits(self, borrows) if borrows else None
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._params = [p for _, p in named]
        self._names = [n for n, _ in named]
        self._shapes = [p.shape for _, p in named]  # full shapes (pieces: (1, .., 1, count))
        self._dtypes = [p.dtype for _, p in named]  # registered (master) dtypes
        self._cast = param_cast(param_dtype, self._dtypes, cast_forward_inputs,
                                "FullyShardedDataParallel")  # braid/_fsdp_cast.py
        # A param_dtype gathers in param_dtype, host and CUDA modules alike (_fsdp_quant.py).
        gather = gather_options(gather_dtype, gather_block, "FullyShardedDataParallel",
                                param_dtype if self._cast.active else None)
        self._unit_of = [owner.get(id(p), ROOT) for p in self._params]
        self.unit_modules = unit_modules
        self.unit_names = ["<root>"] + [names[id(m)] for m in unit_modules]
        self.reducer = core.Reducer(
            group, [(i, p.numel(), p.dtype, n) for i, (n, p) in enumerate(named)],
            replica=replica_group, mode=mode, bucket_cap_mb=bucket_cap_mb,
            first_bucket_cap_mb=first_bucket_cap_mb, allow_unused=find_unused_parameters,
            reduce_dtype=reduce_dtype, timeout_ms=timeout_ms, timeline_prefix=timeline_prefix,
            param_units=self._unit_of, shard_gradients=True, credit_mb=credit_mb,
            priorities=priorities, param_marks=reuse_marks(len(named), static_graph),
            device=self._device, pool_limit_mb=pool_limit_mb,
            **agreement_options(find_unused_parameters, "at_finish", False))
        # The reducer agrees on use after each backward: the optimizer skips parameters no
        # rank used (braid/_used_map.py).
        self._agrees_unused = bool(find_unused_parameters)
        self._mode = mode
        self._marks_counted = bool(static_graph)  # a hook may fire twice (_ddp_reuse.py)
        nunits = len(unit_modules) + 1
        self._unit_params = [[] for _ in range(nunits)]
        for pid, u in enumerate(self._unit_of):
            self._unit_params[u].append(pid)
        self._has_buckets = [bool(self._unit_params[u]) and bool(self.reducer.unit_buckets(u))
                             for u in range(nunits)]
        # Units entered: those with buckets, and those borrowing a tied parameter's unit.
        self._active = [self._has_buckets[u] or u in borrows for u in range(nunits)]
        self.fsdp_options = dict(reshard_after_forward=bool(reshard_after_forward),
                                 prefetch=prefetch,
                                 max_live_bytes=int((max_live_mb or 0) * 1024 * 1024))
        self._cuda = HostUnits() if self._device is None else DeviceUnits(
            self._device, self.reducer, offloads(offload_policy))  # braid/_fsdp_device.py
        self.fsdp_options.update(self._cuda.optimizer_options())
        self.fsdp_options.update(gather)
        for p in module.parameters():
            if p.grad is not None:
                p.grad = None  # gradients live in Braid's buckets and shards from now on
        # Keep the AccumulateGrad nodes alive: a node dropped by autograd would lose its hook.
        self._grad_accs, self._hooks = [], []
        for pid, p in enumerate(self._params):
            with torch.enable_grad():  # (built lazily, maybe under no_grad)
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(acc.register_hook(functools.partial(self._grad_ready, pid)))
            self._grad_accs.append(acc)
        for unit, m in enumerate(unit_modules, 1):
            if self._active[unit]:
                self._hooks.append(m.register_forward_pre_hook(
                    functools.partial(self._unit_pre_forward, unit)))
                self._hooks.append(m.register_forward_hook(
                    functools.partial(self._unit_post_forward, unit)))
        self._opt = None              # the core.Optimizer of the ShardedAdamW / ShardedSGD
        self._sharded_optimizer = None  # a weakref to that ShardedAdamW / ShardedSGD
        self._views = [None] * len(self._params)  # bound views (base tensors), None: released
        self._by_address = {}         # address of a bound view -> parameter id
        self._entered = {}            # unit -> phase ("forward" / "backward") it is entered in
        self._root_kept = False       # the root unit stays entered from forward to backward
        self._kept = []               # units kept gathered after their forward (no reshard)
        self._unmarked = {}           # unit -> parameter ids not marked in this backward
        self._sync = "sync"
        self._armed = "sync"
        self._in_backward = False
        self._step_due = False        # units were used since the last end_step
        self._summoned = False
        self._writeback = False
        self._join = None             # the open join() context (braid/_fsdp_join.py), if any
        self._join_config = disabled_config()
        _owners.claim(self, module)  # ShardedAdamW(model.parameters()) finds this wrapper
        # Local pieces from the start, so a torch optimizer built now (Adagrad makes its state
        # in its constructor) sees them; a ShardedAdamW / ShardedSGD drops them (_drop_local).
        self._attach_local()

    # -- construction helpers
    @staticmethod
    def _choose_units(module, units, policy):
        if units is not None and policy is not None:
            raise ValueError("give units or auto_wrap_policy, not both")
        if policy is not None:
            if isinstance(policy, (tuple, list, set, frozenset, type)):
                classes = tuple(policy) if not isinstance(policy, type) else (policy,)
                policy = lambda m: isinstance(m, classes)  # noqa: E731
            units = [m for m in module.modules() if m is not module and policy(m)]
        units = list(units or [])
        inside = {id(m) for m in module.modules()}
        for m in units:
            if m is module:
                raise ValueError("the wrapped module itself is the root unit: list submodules")
            if id(m) not in inside:
                raise ValueError("unit %s is not a submodule of the wrapped module" %
                                 type(m).__name__)
        if len({id(m) for m in units}) != len(units):
            raise ValueError("a module is listed twice in units")
        order = {id(m): i for i, m in enumerate(module.modules())}
        return sorted(units, key=lambda m: order[id(m)])  # module order: the same on every rank

    @staticmethod
    def _nested(outer, inner):
        return any(m is inner for m in outer.modules())

    def _attach(self, optimizer):
        """Called by ShardedAdamW / ShardedSGD once `optimizer` holds every parameter."""
        self._opt = optimizer
        for pid, p in enumerate(self._params):
            p.__class__ = FullyShardedParameter
            p._braid_name, p._braid_unit = self._names[pid], self._unit_of[pid]
            self._release(pid)

    def _detach(self, values=None):
        """The optimizer goes: unhook, and give the parameters `values` (full tensors) or leave
        them released (no tensor keeps pointing at Braid's memory)."""
        for pid in range(len(self._params)):
            if self._views[pid] is not None:
                self._release(pid)
        if values is not None:
            for p, v in zip(self._params, values):
                p._braid_released = False
                p.data = v
                p.__class__ = torch.nn.Parameter
        self._opt = self._sharded_optimizer = None
        self._entered, self._root_kept, self._in_backward = {}, False, False
        self._kept = []

    # -- views
    def _bind(self, pid, compute=True):
        address, count = self._opt.param(pid)
        p = self._params[pid]
        view = _view(self._opt, address, count, self._dtypes[pid], self._shapes[pid],
                     self._device)
        if compute:  # a unit entered: its param_dtype copy (braid/_fsdp_cast.py)
            view = self._cast.compute(pid, view)
            address = view.data_ptr()
        old = self._views[pid]
        if old is not None and old.data_ptr() != address:  # bound again: a new copy
            self._by_address.pop(old.data_ptr(), None)
        self._views[pid] = view
        self._by_address[address] = pid
        p.data = view
        p._braid_released = False
        if compute:
            self._cast.track(pid, p, functools.partial(self._grad_ready, pid))

    def _release(self, pid):
        p = self._params[pid]
        view = self._views[pid]
        if view is not None:
            self._by_address.pop(view.data_ptr(), None)
            self._views[pid] = None
        if self._local is not None:
            p.data = self._local.piece(pid)  # this rank's piece (_fsdp_local.py)
            return
        p._braid_released = False  # lets the setter through
        p.data = _released_data(self._dtypes[pid], p.shape, self._device)
        p._braid_released = True

    def _pack(self, t):
        """saved_tensors_hooks: a tensor saved for backward that views a gathered parameter is
        kept as (parameter, size, stride, offset) and rebuilt from the parameter's view of the
        time (its unit is gathered again, possibly elsewhere, for the backward)."""
        if self._by_address:
            try:
                address = t.storage().data_ptr()
            except Exception:  # pylint: disable=broad-except (no storage: not a parameter)
                return t
            pid = self._by_address.get(address)
            if pid is not None:
                return (_SavedParam, pid, tuple(t.shape), t.stride(), t.storage_offset())
        return t

    def _unpack(self, packed):
        if type(packed) is not tuple or not packed or packed[0] is not _SavedParam:
            return packed
        _, pid, size, stride, offset = packed
        view = self._views[pid]
        if view is None:
            raise RuntimeError(
                "backward needs parameter %r (unit %d, %s) but that unit is not gathered now: "
                "a unit's parameters are readable in backward from the first gradient of its "
                "forward outputs until all its parameters' gradients are marked" %
                (self._names[pid], self._unit_of[pid], self.unit_names[self._unit_of[pid]]))
        return torch.as_strided(view.detach(), size, stride, offset)

    # -- units
    def _enter(self, unit, phase):
        if self._tied is not None:
            return self._tied.enter(unit, phase)  # and the units it borrows
        self._enter_unit(unit, phase)

    def _exit(self, unit, phase):
        if self._tied is not None:
            return self._tied.exit(unit, phase)  # and what it borrowed, unless still held
        self._exit_unit(unit, phase)

    def _enter_unit(self, unit, phase):
        self._cuda.order_gathers()
        if self._has_buckets[unit]:  # (a unit only borrowing has none)
            self._opt.unit_enter(unit, phase)
        self._entered[unit] = phase
        self._step_due = True
        for pid in self._unit_params[unit]:
            self._bind(pid)

    def _exit_unit(self, unit, phase):
        self._cuda.order_gathers()  # the unit's readers, before its memory is reused
        for pid in self._unit_params[unit]:
            self._release(pid)
        del self._entered[unit]
        if self._has_buckets[unit]:
            self._opt.unit_exit(unit, phase)
        if phase == "forward" and not self.fsdp_options["reshard_after_forward"]:
            self._kept.append(unit)  # gathered until its backward (or _drain)
        elif phase == "backward" and unit in self._kept:
            self._kept.remove(unit)

    def _check_ready(self):
        if self._opt is None:
            self._attach_local()

    def _attach_local(self):
        """No sharded optimizer: a gather-only handle, parameters become local pieces."""
        self._local = LocalShards(self, self._groups[0])
        self._opt = self._local.opt
        for pid in range(len(self._params)):
            self._release(pid)
        for m in [self.module] + list(self.unit_modules):
            self._hooks.append(m._register_state_dict_hook(self._state_dict_guard))

    def _drop_local(self):
        """Collective (a ShardedAdamW / ShardedSGD is being built): the parameters get their
        full values back and the gather-only handle goes, so the optimizer can hold the
        shards. A torch optimizer's state over the pieces is not carried over."""
        if self._in_backward or self._summoned:
            raise RuntimeError("a sharded optimizer is built inside a backward or "
                               "summon_full_params()")
        with self.summon_full_params():
            values = [p.detach().clone() for p in self._params]
        local, self._local = self._local, None
        for p in self._params:
            _TENSOR_GRAD.__set__(p, None)  # pieces' gradients: not the full shape
        self._detach(values)
        self._cuda.settle()  # the clones read Braid's memory, which close() frees
        local.close()

    def _state_dict_guard(self, module, *unused):
        if self._local is not None and not self._summoned:
            raise RuntimeError(
                "state_dict() of a fully sharded model holds this rank's pieces of the "
                "parameters: call it inside model.summon_full_params() (full values)")

    def forward(self, *args, **kwargs):
        self._check_ready()
        if self._summoned:
            if torch.is_grad_enabled():
                raise RuntimeError("inside summon_full_params() the model is for evaluation "
                                   "and export: run it under torch.no_grad()")
            return self.module(*args, **kwargs)
        if self._in_backward:
            self._abandon_backward("the previous backward did not finish (an exception in "
                                   "backward or in a hook)")
        self._end_step()
        if self._join is not None:  # the step's agreement, before any gather (_fsdp_join.py)
            self._join.before_forward(args, kwargs)
        grad = torch.is_grad_enabled()
        args, kwargs = self._cast.inputs(args, kwargs)
        self._armed = self._sync
        if self._active[ROOT]:
            self._enter(ROOT, "forward")
        try:
            if grad:
                with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                    out = self.module(*args, **kwargs)
            else:
                out = self.module(*args, **kwargs)
        except BaseException:
            self._exit_all("forward")
            raise
        needs_grad = [t for t in _tensors(out, []) if t.requires_grad] if grad else []
        if needs_grad:
            for t in needs_grad:
                t.register_hook(self._root_pre_backward)
            self._root_kept = self._active[ROOT]
        else:
            if self._active[ROOT]:
                self._exit(ROOT, "forward")
            if not self.fsdp_options["reshard_after_forward"]:
                self._drain()  # no backward will release the kept units
        return out

    def _exit_all(self, phase):
        """Exits every unit entered in `phase`, innermost (highest) first."""
        if self._tied is not None:
            return self._tied.exit_all(phase)
        for unit in sorted((u for u, ph in self._entered.items() if ph == phase), reverse=True):
            self._exit(unit, phase)

    def _unit_pre_forward(self, unit, module, inputs):
        if self._opt is None or self._summoned:
            return
        if self._in_backward:
            # Activation checkpointing's recompute, as FSDP2: a unit entered for its backward
            # (its outputs' hook) stays gathered through it; one whose forward ran under
            # no_grad (reentrant checkpoint around it) is gathered for its backward now.
            if unit not in self._entered:
                self._enter(unit, "backward")
            return self._cast.inputs(inputs, {})[0]
        self._enter(unit, "forward")
        return self._cast.inputs(inputs, {})[0]

    def _unit_post_forward(self, unit, module, inputs, output):
        if self._opt is None or self._summoned:
            return
        if self._in_backward:
            return  # a recompute: the unit exits once its parameters' gradients are marked
        if torch.is_grad_enabled():
            for t in _tensors(output, []):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._unit_pre_backward, unit))
        self._exit(unit, "forward")

    def _end_step(self):
        """end_step once the step's units are done (at the next forward, the optimizer's
        step(), summon_full_params(), save/load): collective at the same point on every
        rank, which these are."""
        if not self._step_due or self._in_backward:
            return
        self._drain()
        self._step_due = False
        self._opt.end_step()

    def _drain(self):
        """A forward with no backward (under torch.no_grad(), outputs not requiring grad, or
        a backward never run) leaves units gathered: the root kept for its backward, and with
        reshard_after_forward off every unit. Each is entered and exited for backward (it is
        gathered, so this launches nothing), which releases it."""
        if self._root_kept:
            self._root_kept = False
            if self.fsdp_options["reshard_after_forward"]:
                # Its forward ends here: entering it in backward would start the backward's
                # schedule, whose first prefetch no backward would release.
                self._exit(ROOT, "forward")
            else:
                self._enter(ROOT, "backward")
                self._exit(ROOT, "backward")
        for unit in reversed(self._kept):
            self._enter(unit, "backward")
            self._exit(unit, "backward")
        self._kept = []

    # -- user API
    def no_sync(self, mode="no_sync"):
        """Forwards run inside accumulate their gradients without a reduction (mode
        "no_sync": full-size gradient buckets are kept for the window, FSDP's cost), or, in
        hybrid mode, reduce-scatter them now into the kept shard and all-reduce at the next
        synced backward (mode "reduce_scatter_only"). The first forward after the block
        syncs everything."""
        return _sync_scope(self, mode)

    @contextlib.contextmanager
    def summon_full_params(self, writeback=False):
        """Collective (every rank at the same point, outside forward/backward): every
        parameter holds its full values inside the block (evaluation under torch.no_grad(),
        state_dict(), export). writeback=True: values written to the parameters in the block
        become the new master weights (optimizer.set_param) when it ends; otherwise writes
        are lost at the next gather."""
        self._check_ready()
        if self._in_backward or self._entered:
            raise RuntimeError("summon_full_params() inside a forward or backward")
        if self._summoned:
            raise RuntimeError("summon_full_params() is already active")
        self._end_step()
        self._cuda.order_gathers()
        self._opt.summon_params(True)
        self._summoned = True
        try:
            for pid in range(len(self._params)):
                self._bind(pid, compute=False)  # the master values, as FSDP2's full_tensor()
            yield self
            if writeback:
                for pid, p in enumerate(self._params):
                    if self._local is not None:
                        self._local.write_full(pid, p)
                    else:  # host values (a device optimizer copies them in)
                        self._opt.set_param(pid, p.detach().cpu().contiguous())
        finally:
            for pid in range(len(self._params)):
                if self._views[pid] is not None:
                    self._release(pid)
            self._summoned = False
            self._cuda.order_gathers()  # the block's reads, before the buffers go back
            self._opt.summon_params(False)

    def _gathered_values(self):
        """Collective: copies of every parameter's full values, gathered by the sharded
        optimizer (its close() gives them back to the parameters)."""
        self._end_step()
        self._cuda.order_gathers()
        self._opt.summon_params(True)
        try:
            values = []
            for pid, p in enumerate(self._params):
                address, count = self._opt.param(pid)
                values.append(_view(self._opt, address, count, self._dtypes[pid],
                                    self._shapes[pid], self._device).clone())
        finally:
            self._cuda.order_gathers()  # the copies, before the buffers go back
            self._opt.summon_params(False)
        self._cuda.settle()  # the optimizer's close() frees what the copies read
        return values

    def memory_stats(self):
        """Bytes Braid allocated for this rank (gradient buckets and shards, gathered and
        sharded parameters, optimizer state, staging), current and peak, host and device:
        core.Reducer.memory_stats(). With timeline_prefix every change is also a sample on the
        "memory" counter row of the timeline file "<timeline_prefix>.rank<world rank>.json"."""
        return self.reducer.memory_stats()

    def timeline_counters(self, names=("host bytes", "device bytes")):
        """memory_stats()'s totals over time: [(ts_us, name, bytes)] from the timeline file
        (needs timeline_prefix; braid/_timeline.py)."""
        return self.reducer.timeline_counters(names)

    def reset_memory_peaks(self):
        self.reducer.reset_memory_peaks()

    def zero_grad(self, set_to_none=True):
        """With a sharded optimizer nothing to do: gradients live in Braid's buckets and
        shards (param.grad is None). Local pieces: torch's zero_grad of the pieces' grads."""
        if self._local is not None:
            super().zero_grad(set_to_none)

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """torch FSDP's idiom: the sharded optimizer's clip_grad_norm_ (braid/_norms.py): the
        step's true global gradient norm, clipped to max_norm inside the step (configure
        max_grad_norm=max_norm on the optimizer)."""
        if self._join is not None:
            self._join.check_clip()
        if self._local is not None:
            return self._local.clip_grad_norm_(max_norm, norm_type)
        opt = self._sharded_optimizer() if self._sharded_optimizer is not None else None
        if opt is None:
            raise RuntimeError("FullyShardedDataParallel.clip_grad_norm_: create ShardedAdamW("
                               "model.parameters(), max_grad_norm=...) first (it clips inside "
                               "its step)")
        return opt.clip_grad_norm_(max_norm, norm_type)

    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False, optimizer=None, clip_grad_norm=None,
             _caller=None):
        """Uneven inputs (torch DDP join()'s arguments and meaning; torch's FSDP has none):
        ranks may leave the loop at different steps; those that did replay the others' steps
        with zero gradients (braid/_fsdp_join.py). Braid's keywords: optimizer, the torch
        optimizer over the local pieces (needed then: a joined rank steps it; ShardedAdamW /
        ShardedSGD are found); clip_grad_norm, max_norm or (max_norm, norm_type) when the loop
        calls model.clip_grad_norm_ (a joined rank shadows it)."""
        return FSDPJoin(self, _caller or self, divide_by_initial_world_size, enable,
                        throw_on_early_termination, optimizer, clip_grad_norm)

    def close(self):
        """Unhooks the module and frees the reducer. Close the ShardedAdamW / ShardedSGD first
        (its close() gives the parameters their full values back). Without one (local pieces):
        collective, the parameters get their full values back."""
        if self._local is not None:
            self._drop_local()
        if self._opt is not None:
            raise RuntimeError("close the sharded optimizer of this model first")
        for h in self._hooks:
            h.remove()
        self._hooks, self._grad_accs = [], []
        _owners.release(self, self.module)
        self._cuda.settle()
        self.reducer.close()


class _SavedParamType:
    def __repr__(self):
        return "<saved fully sharded parameter>"


_SavedParam = _SavedParamType()
