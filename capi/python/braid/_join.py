"""DistributedDataParallel.join(): torch 1.13's uneven-inputs context manager
(model.join(divide_by_initial_world_size=True, enable=True, throw_on_early_termination=False))
over braid.h's braid_join_* (docs/design/join.md).

    with model.join():
        for x, y in my_uneven_batches:       # ranks may run out at different steps
            loss(model(x), y).backward(); opt.step(); opt.zero_grad()

Inside the context each forward of the wrapper takes part in one agreement (how many ranks
still have data, which backward follows); a rank whose loop ended shadows the others' steps at
__exit__ (buffer broadcasts, bucket reductions with zero gradients; with ShardedAdamW its shard
steps and gathers) until every rank has joined, then the model's state is broadcast from the
last rank to join, as torch's _sync_final_model. An exception inside the block leaves the
join at once (locally), as torch propagates it. Refused (RuntimeError naming it): the used-map
agreement of find_unused_parameters / static_graph without a sharded optimizer, and a pending
rebuild_bucket_order=True / autotune (collectives a joined rank would have to shadow too;
torch's default rebuild, rebuild_bucket_order=None, runs at __enter__ when due, and is dropped
when no synced backward preceded it: the buckets keep their order); fully
sharded models cannot join yet (braid.h's UNIMPLEMENTED).
"""

import collections
import ctypes

import torch

from . import _lib
from ._handles import SYNC_MODES
from ._views import _broadcast_tensors

_MODE_NAMES = {code: name for name, code in SYNC_MODES.items()}

try:  # torch's record of a joinable's join settings (DDP's _join_config), read by torch's tests
    from torch.distributed.algorithms.join import _JoinConfig
except ImportError:  # a torch without it: the same fields
    _JoinConfig = collections.namedtuple(
        "_JoinConfig", ["enable", "throw_on_early_termination", "is_first_joinable"])


def disabled_config():
    """torch's _JoinConfig outside any join (DDP's initial _join_config)."""
    return _JoinConfig(enable=False, throw_on_early_termination=False, is_first_joinable=False)


class DDPJoin:
    """The context manager DistributedDataParallel.join() returns."""

    def __init__(self, ddp, divide_by_initial_world_size=True, enable=True,
                 throw_on_early_termination=False):
        self._ddp, self._enable = ddp, bool(enable)
        self._divide = bool(divide_by_initial_world_size)
        self._throw = bool(throw_on_early_termination)
        # As torch's Join() sets it on its joinables (and leaves it after the block).
        ddp._join_config = _JoinConfig(enable=self._enable,
                                       throw_on_early_termination=self._throw,
                                       is_first_joinable=True)

    def _handle(self):
        return self._ddp.reducer.handle

    def __enter__(self):
        if not self._enable:
            return self
        ddp = self._ddp
        if ddp._join is not None:
            raise RuntimeError("join(): this model is already inside a join context")
        if ddp._find_unused and ddp._stepper is None:
            raise RuntimeError("join() with find_unused_parameters=True or static_graph=True is "
                               "not supported yet (a joined rank cannot shadow the used-map "
                               "agreement); wrap without them, or use ShardedAdamW")
        if ddp._rebuild_due and ddp._rebuild_by_policy:
            ddp._rebuild_if_due()  # collective: every rank enters join() at the same point
        elif ddp._rebuild and ddp._rebuild_by_policy:
            # torch's default rebuild, before any synced backward: a rank that joins early
            # could not shadow its broadcast, so the buckets keep their order, on every rank.
            ddp._rebuild = False
        if ddp._rebuild or ddp._rebuild_due or ddp._autotune:
            raise RuntimeError("join() while rebuild_bucket_order / autotune has not settled: "
                               "run a synced step first (their re-plans are collectives a "
                               "joined rank does not shadow)")
        opts = _lib.init_options(_lib.JoinOptions, "braid_join_options_init")
        opts.divide_by_initial_world_size = int(self._divide)
        opts.throw_on_early_termination = int(self._throw)
        _lib.call("braid_join_begin", self._handle(), ctypes.byref(opts))
        ddp._join = self
        return self

    def _agree(self, has_data, mode):
        active, agreed = ctypes.c_int(), ctypes.c_int()
        _lib.call("braid_join_agree", self._handle(), int(has_data), SYNC_MODES[mode],
                  ctypes.byref(active), ctypes.byref(agreed))
        return active.value, _MODE_NAMES[agreed.value]

    def _world_rank(self):
        groups = self._ddp._groups
        return groups[0].rank + (groups[1].rank * groups[0].size if len(groups) > 1 else 0)

    def _roots(self, root):
        """Each group's root for world rank `root` (hybrid: shard rank, then replica rank)."""
        groups = self._ddp._groups
        return [root % groups[0].size] + ([root // groups[0].size] if len(groups) > 1 else [])

    def _common_rank(self, candidate):
        """torch's _find_common_rank: the largest world rank among the candidates (max over
        the shard group, then the replica group)."""
        t = torch.tensor([self._world_rank() if candidate else -1], dtype=torch.int64)
        for g in self._ddp._groups:
            g.allreduce(t, op="max").wait()
        return int(t.item())

    def before_forward(self, mode):
        """An active rank's forward: the step's agreement (mode: the backward that follows,
        "no_sync" for one without grad)."""
        self._agree(True, mode)

    def sync_buffers(self, active):
        """The buffer broadcast of a forward under the join: from the largest active rank (torch
        syncs from the authoritative rank of the ranks with data), shadowed by joined ranks."""
        ddp = self._ddp
        buffers = list(ddp.module.buffers())
        if not buffers:
            return
        root = self._common_rank(active)
        _broadcast_tensors(buffers, ddp._groups, ddp._device, self._roots(root))

    def __exit__(self, exc_type, exc, tb):
        if not self._enable:
            return None
        ddp = self._ddp
        ddp._join = None
        if exc_type is not None:
            try:
                _lib.call("braid_join_abort", self._handle())
            except _lib.BraidError:
                pass
            return None  # propagate, as torch
        last, saved = True, None
        while True:
            active, mode = self._agree(False, "sync")
            if active == 0:
                break
            if last and ddp._stepper is None:
                saved = [g.clone() for g in ddp._grads]  # torch leaves a joined p.grad as is
            last = False
            if ddp.broadcast_buffers and ddp._sync_buffers_next:
                self.sync_buffers(False)
            ddp._sync_buffers_next = mode == "sync"  # torch's require_forward_param_sync
            _lib.call("braid_join_shadow", self._handle())
        root = ctypes.c_int()
        _lib.call("braid_join_end", self._handle(), int(last), ctypes.byref(root))
        if saved is not None:
            with torch.no_grad():
                for g, s in zip(ddp._grads, saved):
                    g.copy_(s)
        self._sync_final_model(root.value)
        return None

    def _sync_final_model(self, root):
        """torch's _sync_final_model: the module's state from the authoritative rank. With
        ShardedAdamW every rank stepped and gathered every shard, so only the buffers."""
        ddp = self._ddp
        ddp._authoritative_rank = root  # torch's attribute (its tests read it)
        if ddp._stepper is not None:
            ddp._stepper.wait_all_params()
            tensors = list(ddp.module.buffers())
        else:
            tensors = list(ddp.module.state_dict().values())
        if tensors:
            _broadcast_tensors(tensors, ddp._groups, ddp._device, self._roots(root))
