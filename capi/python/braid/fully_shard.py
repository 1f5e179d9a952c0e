"""braid.fully_shard: FSDP2's per-module API (torch.distributed.fsdp.fully_shard) over Braid's
fully sharded engine (braid/fsdp.py, FullyShardedDataParallel: the one code path below both).

    for layer in net.layers:
        fully_shard(layer, group=g)                 # each call: that module is a unit
    fully_shard(net, group=g)                       # then the root
    opt = torch.optim.AdamW(net.parameters())       # any elementwise optimizer, or ShardedAdamW
    loss_fn(net(x), y).backward(); opt.step(); opt.zero_grad()

Contract (docs/pytorch.md, "fully_shard", says what maps from FSDP2 and what is refused):
  - fully_shard(module) returns `module`, its class changed to FSDP<Class> (also an FSDPModule)
    as FSDP2 does. Nothing is sharded by the call itself: the root is the module whose forward
    (or parameters(), or an FSDPModule method) runs first, and that finalizes every fully_shard
    submodule below it into one engine (FSDP2's lazy init). fully_shard on a module above a
    finalized root raises: shard submodules, then the root, before using any.
  - group: a braid Group (default: braid.default_group()); mesh=(shard_group, replica_group) as
    group.mesh(replicas, shards) returns: hybrid (HSDP), sharded within a replica and averaged
    across them. Every call of one root names the same group or mesh (or none).
  - reshard_after_forward: a bool, the same for every unit (Braid's units share one setting;
    the root's own value is ignored: its parameters stay gathered into the backward, FSDP2's
    heuristic too). Ints (resharding to a smaller world) are refused.
  - mp_policy / offload_policy: braid/_fsdp_policies.py.
  - Braid's own knobs are keywords FSDP2 lacks, on the root call only: prefetch,
    max_live_mb, bucket_cap_mb, first_bucket_cap_mb, find_unused_parameters, timeout_ms,
    timeline_prefix, credit_mb, priorities, broadcast_from_rank0, static_graph (a hook that
    fires twice: braid/_ddp_reuse.py), pool_limit_mb (bounded gradient and gather memory:
    FullyShardedDataParallel), gather_dtype / gather_block (quantized unit gathers:
    braid/_fsdp_quant.py).
  - Host modules on local / mpi / gloo worlds; CUDA modules on nccl worlds (streams, events
    and offload: braid/_fsdp_device.py). One offload setting for the model, as reshard.
"""

import torch

from . import core
from ._fsdp_cast import cast_outputs
from ._fsdp_policies import (CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy,  # noqa: F401
                             check_offload, offloads, reduce_dtype_for)
from .fsdp import FullyShardedDataParallel

_BRAID_KEYS = ("prefetch", "max_live_mb", "bucket_cap_mb", "first_bucket_cap_mb",
               "find_unused_parameters", "timeout_ms", "timeline_prefix", "credit_mb",
               "priorities", "broadcast_from_rank0", "static_graph", "pool_limit_mb",
               "gather_dtype", "gather_block")


class _State:
    """What one fully_shard call recorded; `root` is set at finalization."""

    def __init__(self, group, mesh, reshard, mp, offload, braid):
        self.group, self.mesh, self.reshard = group, mesh, reshard
        self.mp, self.offload, self.braid = mp, offload, braid
        self.root = None          # the root module, once finalized
        self.engine = None        # root only: the FullyShardedDataParallel
        self.in_engine = False    # root only: the engine is running the module
        self.initializing = False
        self.unshard_scope = None  # root only: the summon of unshard()
        self.prefetch = {}        # "forward"/"backward" -> modules (set_modules_to_*_prefetch)


def fully_shard(module, *, group=None, mesh=None, reshard_after_forward=True, mp_policy=None,
                offload_policy=None, **braid_options):
    """Makes `module` a unit of a fully sharded model (see the module docstring)."""
    where = "fully_shard(%s)" % type(module).__name__
    if not isinstance(module, torch.nn.Module):
        raise TypeError("%s: not a torch.nn.Module" % where)
    unknown = sorted(set(braid_options) - set(_BRAID_KEYS))
    if unknown:
        raise TypeError("%s: unexpected keyword %s (FSDP2's: group/mesh, "
                        "reshard_after_forward, mp_policy, offload_policy; Braid's: %s)" %
                        (where, unknown[0], ", ".join(_BRAID_KEYS)))
    if group is not None and mesh is not None:
        raise ValueError("%s: give group or mesh, not both" % where)
    if mesh is not None and (not isinstance(mesh, tuple) or len(mesh) != 2):
        raise ValueError("%s: mesh must be the (shard_group, replica_group) pair of "
                         "group.mesh(replicas, shards)" % where)
    if not isinstance(reshard_after_forward, bool):
        raise ValueError("%s: reshard_after_forward=%r: a bool (resharding to a smaller world "
                         "after forward is not supported)" % (where, reshard_after_forward))
    reduce_dtype_for(mp_policy, {p.dtype for p in module.parameters()} or {torch.float32},
                     where)  # refuses here, naming the field
    check_offload(offload_policy, where)
    old = getattr(module, "_braid_fsdp", None)
    if old is not None:
        raise ValueError("%s: this module was passed to fully_shard already" % where)
    for m in module.modules():
        st = getattr(m, "_braid_fsdp", None)
        if st is not None and st.root is not None:
            raise ValueError(
                "%s: submodule %s was finalized already into a fully sharded model (by its "
                "root's first forward or parameters() call); call fully_shard on submodules, "
                "then on the root, before using any of them" % (where, type(m).__name__))
    module._braid_fsdp = _State(group, mesh, reshard_after_forward, mp_policy, offload_policy,
                                braid_options)
    cls = type(module)
    module.__class__ = type("FSDP" + cls.__name__, (FSDPModule, cls), {})
    return module


class UnshardHandle:
    """What unshard(async_op=True) returns: wait() returns once the parameters are gathered
    (host gathers complete inside unshard(), so it returns at once)."""

    def wait(self):
        return None


class FSDPModule:
    """The mixin of every fully_shard module (FSDP2's FSDPModule)."""

    # -- finalization
    def _braid_root(self):
        """The engine's root module, finalizing with this module as the root if needed."""
        st = self._braid_fsdp
        if st.root is None:
            _finalize(self)
        return st.root

    def _braid_engine(self):
        return self._braid_root()._braid_fsdp.engine

    def __call__(self, *args, **kwargs):
        st = self._braid_fsdp
        if st.root is None and not st.initializing:
            _finalize(self)
        if st.root is not self or st.in_engine:
            return super().__call__(*args, **kwargs)
        st.in_engine = True
        try:
            out = st.engine(*args, **kwargs)
        finally:
            st.in_engine = False
        if st.mp is not None and st.mp.output_dtype is not None:
            out = cast_outputs(out, st.mp.output_dtype)
        return out

    def named_parameters(self, *args, **kwargs):
        st = self._braid_fsdp
        if st.root is None and not st.initializing:
            _finalize(self)  # ShardedAdamW(model.parameters()) finds its engine
        return super().named_parameters(*args, **kwargs)

    # -- FSDP2's methods
    def unshard(self, async_op=False):
        """Root: gathers every parameter and keeps it gathered (full values, for evaluation
        under torch.no_grad() or export) until reshard(); collective, between steps. Units:
        refused (Braid gathers units in its recorded order, prefetching; see
        set_modules_to_forward_prefetch)."""
        engine, st = self._root_only("unshard()")
        if st.unshard_scope is None:
            scope = engine.summon_full_params()
            scope.__enter__()
            st.unshard_scope = scope
        return UnshardHandle() if async_op else None

    def reshard(self):
        """Root: ends unshard(). Units: nothing to do (Braid releases every unit after its
        use, so outside a forward/backward no unit is gathered)."""
        root = self._braid_root()
        st = root._braid_fsdp
        if st.unshard_scope is not None and root is self:
            scope, st.unshard_scope = st.unshard_scope, None
            scope.__exit__(None, None, None)

    def set_requires_gradient_sync(self, requires_gradient_sync, *, recurse=True):
        """Root (recurse=True): False makes the following backwards accumulate without a
        reduction (no_sync); True syncs again (the next synced backward reduces the sum).
        Braid's sync is per backward for the whole model, so units refuse it."""
        engine, _ = self._root_only("set_requires_gradient_sync()", recurse)
        engine._sync = "sync" if requires_gradient_sync else "no_sync"

    def set_requires_all_reduce(self, requires_all_reduce, *, recurse=True):
        """Hybrid root: False reduce-scatters each backward within the replica and all-reduces
        across replicas at the next backward with it True (reduce_scatter_only)."""
        engine, _ = self._root_only("set_requires_all_reduce()", recurse)
        if engine._mode != "hybrid":
            raise ValueError("set_requires_all_reduce() needs a hybrid mesh (fully_shard(..., "
                             "mesh=group.mesh(replicas, shards)))")
        engine._sync = "sync" if requires_all_reduce else "reduce_scatter_only"

    def set_modules_to_forward_prefetch(self, modules):
        """Accepted where it is what Braid does: `modules` are the next len(modules) units
        after this one in module order (Braid prefetches that many units ahead, in the order
        recorded by the first step); before the first forward only. Else ValueError."""
        self._prefetch_list("forward", modules)

    def set_modules_to_backward_prefetch(self, modules):
        """As set_modules_to_forward_prefetch, with the units before this one (backward runs
        the recorded order in reverse)."""
        self._prefetch_list("backward", modules)

    def memory_stats(self):
        """Braid's memory for this rank (FullyShardedDataParallel.memory_stats)."""
        return self._braid_engine().memory_stats()

    def timeline_counters(self, names=("host bytes", "device bytes")):
        """memory_stats() over time, from the timeline file (timeline_prefix=...)."""
        return self._braid_engine().timeline_counters(names)

    def reset_memory_peaks(self):
        self._braid_engine().reset_memory_peaks()

    def summon_full_params(self, writeback=False):
        return self._braid_engine().summon_full_params(writeback)

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        return self._braid_engine().clip_grad_norm_(max_norm, norm_type)

    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False, optimizer=None, clip_grad_norm=None):
        """Uneven inputs (FullyShardedDataParallel.join(), braid/_fsdp_join.py); the root's."""
        engine, _ = self._root_only("join()")
        return engine.join(divide_by_initial_world_size, enable, throw_on_early_termination,
                           optimizer, clip_grad_norm, _caller=self)

    def close(self):
        """Collective: gives the parameters their full values back and frees Braid's stack
        (close a ShardedAdamW / ShardedSGD first)."""
        root = self._braid_root()
        if root is not self:
            raise ValueError("close() the root module")
        self.reshard()
        self._braid_fsdp.engine.close()

    # -- helpers
    def _root_only(self, what, recurse=True):
        root = self._braid_root()
        if root is not self or not recurse:
            raise ValueError("%s on a unit%s: Braid applies it to the whole model; call it on "
                             "the root module with recurse=True" % (
                                 what, "" if recurse else " (recurse=False)"))
        return root._braid_fsdp.engine, root._braid_fsdp

    def _prefetch_list(self, phase, modules):
        st = self._braid_fsdp
        modules = list(modules)
        if st.root is not None:
            raise ValueError("set_modules_to_%s_prefetch() after the model's first use: call it "
                             "before the first forward" % phase)
        for m in modules:
            if getattr(m, "_braid_fsdp", None) is None:
                raise ValueError("set_modules_to_%s_prefetch(): %s is not a fully_shard module"
                                 % (phase, type(m).__name__))
        st.prefetch[phase] = modules  # checked against the unit order at finalization


def _finalize(root):
    """Builds the engine over `root` and the fully_shard submodules below it."""
    st = root._braid_fsdp
    st.initializing = True
    try:
        units = [m for m in torch.nn.Module.modules(root)
                 if m is not root and getattr(m, "_braid_fsdp", None) is not None]
        group, mesh = st.group, st.mesh
        for m in units:
            u = m._braid_fsdp
            if (u.group, u.mesh) != (None, None) and (u.group, u.mesh) != (group, mesh):
                if (group, mesh) == (None, None):
                    group, mesh = u.group, u.mesh
                else:
                    raise ValueError("fully_shard: unit %s names another group or mesh than the "
                                     "root; one model shards over one group or mesh" %
                                     type(m).__name__)
            if u.braid:
                raise ValueError("fully_shard: unit %s got Braid's keyword %s: give Braid's "
                                 "knobs to the root's call" % (type(m).__name__,
                                                               sorted(u.braid)[0]))
        reshards = {m._braid_fsdp.reshard for m in units}
        if len(reshards) > 1:
            raise ValueError("fully_shard: reshard_after_forward differs between units; "
                             "Braid's units share one setting")
        dtypes = {p.dtype for p in torch.nn.Module.parameters(root)} or {torch.float32}
        reduce_dtype = reduce_dtype_for(st.mp, dtypes, "fully_shard(root)")
        for m in units:
            if reduce_dtype_for(m._braid_fsdp.mp, dtypes, "fully_shard") != reduce_dtype:
                raise ValueError("fully_shard: unit %s has another mp_policy.reduce_dtype than "
                                 "the root; Braid reduces a model in one dtype" %
                                 type(m).__name__)
        casts = {_param_cast(m._braid_fsdp.mp, dtypes) for m in units + [root]}
        if len(casts) > 1:
            raise ValueError("fully_shard: mp_policy.param_dtype / cast_forward_inputs differ "
                             "between units; Braid computes a model in one param_dtype")
        param_dtype, cast_inputs = casts.pop()
        if len({offloads(m._braid_fsdp.offload) for m in units + [root]}) > 1:
            raise ValueError("fully_shard: offload_policy differs between units; Braid offloads "
                             "the whole model's optimizer state or none of it")
        options = dict(st.braid)
        options["offload_policy"] = st.offload if offloads(st.offload) else next(
            (m._braid_fsdp.offload for m in units if offloads(m._braid_fsdp.offload)), None)
        options["prefetch"] = _prefetch_depth(root, units, options.get("prefetch", 1))
        if mesh is not None:
            shard, replica = mesh
            options.update(mode="hybrid", replica_group=replica)
        else:
            shard = group if group is not None else core.default_group()
        for m in units + [root]:
            m._braid_fsdp.root = root
        try:
            st.engine = FullyShardedDataParallel(
                root, shard, units=units,
                reshard_after_forward=reshards.pop() if reshards else True,
                reduce_dtype=reduce_dtype, param_dtype=param_dtype,
                cast_forward_inputs=cast_inputs, **options)
        except BaseException:
            for m in units + [root]:
                m._braid_fsdp.root = None
            raise
    finally:
        st.initializing = False


def _param_cast(mp, dtypes):
    """(param_dtype, cast_forward_inputs) of a unit's mp_policy over parameters of `dtypes`
    (None: no cast)."""
    if mp is None or mp.param_dtype is None or set(dtypes) == {mp.param_dtype}:
        return (None, True)
    return (mp.param_dtype, bool(mp.cast_forward_inputs))


def _prefetch_depth(root, units, depth):
    """The prefetch depth that set_modules_to_*_prefetch() calls ask for (each call must list
    the next units in module order), or `depth` when none was made."""
    order = [m for m in torch.nn.Module.modules(root) if m in units]
    asked = set()
    for i, m in enumerate(order):
        for phase, listed in m._braid_fsdp.prefetch.items():
            want = order[i + 1:i + 1 + len(listed)] if phase == "forward" else \
                list(reversed(order[max(0, i - len(listed)):i]))
            if [id(x) for x in listed] != [id(x) for x in want]:
                raise ValueError(
                    "set_modules_to_%s_prefetch() on unit %d lists other modules than the %d "
                    "units %s it in module order: Braid prefetches units in the order of its "
                    "first step, prefetch=k ahead, and cannot prefetch a chosen set" % (
                        phase, i, len(listed), "after" if phase == "forward" else "before"))
            asked.add(len(listed))
    if len(asked) > 1:
        raise ValueError("set_modules_to_*_prefetch() lists differ in length; Braid prefetches "
                         "one depth (prefetch=k) for every unit")
    return asked.pop() if asked else depth
