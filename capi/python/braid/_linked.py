"""One sharded optimizer over several wrapped models: ShardedAdamW.linked / ShardedSGD.linked.

A MoE model reduces its dense parameters over the data-parallel group and each expert's over
its expert-data-parallel group; tensor-parallel shards are reduced over the data-parallel
group of their tensor-parallel rank. Each part is its own DistributedDataParallel (one group
each); one optimizer steps them all and clips them by ONE global gradient norm, as
Megatron-LM's optimizer does:

    dense = DistributedDataParallel(net.trunk, world, mode="reduce_scatter")
    experts = DistributedDataParallel(net.experts, expert_dp, mode="reduce_scatter")
    opt = ShardedAdamW.linked(net.parameters(), lr=3e-4, max_grad_norm=1.0)
    loss.backward(); norm = opt.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()

Why a classmethod and not ShardedAdamW(params) itself: ShardedAdamW(params) keeps meaning "the
parameters of one wrapped model" (its errors point here); .linked takes the same torch params
(parameters or group dicts, the groups' options kept) spanning several wrappers.

Contract:
  - params: as torch.optim's, of DistributedDataParallel wrappers in "reduce_scatter" or
    "hybrid" mode or FullyShardedDataParallel wrappers (a fully sharded dense trunk and
    fully sharded experts; each keeps its own units), each covered entirely; one
    ShardedAdamW / ShardedSGD per wrapper (in the order its first parameter appears: the same
    model gives the same order on every rank), `optimizers` lists them. overlap must stay on.
  - The norm: every element once (a hybrid wrapper's replica 0; wrappers in `tp_replicated`,
    whose parameters are identical on every rank of `tensor_parallel_group` and reduced
    without it, on its rank 0), summed over `span` (a braid Group or torch ProcessGroup of
    every rank; default: the largest of the wrappers' groups, which must then be every rank;
    required when a wrapper is hybrid). Distinct experts and distinct tensor-parallel shards
    add up. max_grad_norm / skip_nonfinite / track_grad_norm decide once for all.
  - Every wrapper takes part in every synced step (its forward and backward run each step):
    a wrapper left out leaves the others' next step waiting for its norm until timeout_ms.
  - step, zero_grad, clip_grad_norm_, grad_norm, synchronize, close: on every wrapper's
    optimizer (norms are the one global norm). param_groups: every optimizer's groups (the
    same dicts), so torch's lr schedulers work. state_dict() = {"linked": [each optimizer's
    state_dict()]} (collective, in order), which load_state_dict takes back.
"""

import torch

from . import _owners, core
from ._torch_groups import resolve_group

__all__ = ["LinkedShardedOptimizer"]


def _split(who, params):
    """[(wrapper, its group dicts)] in order of first appearance."""
    if isinstance(params, torch.Tensor):
        raise TypeError("%s.linked(params): params should be an iterable of parameters or of "
                        "dicts (torch.optim's argument), got a single tensor" % who)
    groups = list(params)
    if groups and not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    order, parts = [], {}
    for g, group in enumerate(_owners._normalized(x) for x in groups):
        for k, p in enumerate(group["params"]):
            w = _owners.owner(p)
            if w is None:
                raise ValueError("%s.linked(params): param_groups[%d]['params'][%d] (shape %s) "
                                 "is not wrapped by Braid; wrap each part of the model first" %
                                 (who, g, k, tuple(p.shape)))
            if id(w) not in parts:
                order.append(w)
                parts[id(w)] = {}
            dicts = parts[id(w)]
            if g not in dicts:
                dicts[g] = dict(group, params=[])
            dicts[g]["params"].append(p)
    if not order:
        raise ValueError("%s.linked(params): params is empty" % who)
    return [(w, list(parts[id(w)].values())) for w in order]


class LinkedShardedOptimizer(torch.optim.Optimizer):
    """The optimizers of several wrappers with one global norm (module docstring)."""

    def __init__(self, cls, params, kwargs, span, tensor_parallel_group, tp_replicated):
        who = cls.__name__
        if "params" in kwargs or "model" in kwargs:
            raise TypeError("%s.linked(params, ...): pass the parameters once" % who)
        if not kwargs.get("overlap", True):
            raise ValueError("%s.linked: overlap=False is not supported (each wrapper's step "
                             "waits for the others' norms during the backward)" % who)
        parts = _split(who, params)
        wrappers = [w for w, _ in parts]
        replicated = {id(w) for w in tp_replicated}
        span = self._span(who, wrappers, span)
        tp = None
        if tensor_parallel_group is not None:
            tp = resolve_group(tensor_parallel_group, None, who + ".linked tensor_parallel_group")
        subs = []
        for w, groups in parts:
            sub = cls.__new__(cls)
            sub._linker = self
            cls.__init__(sub, w, params=groups, **kwargs)
            subs.append(sub)
        for sub in subs:
            if not sub._fully_sharded:
                sub.ddp._rebuild_if_due()  # collective, before the optimizers exist (as alone)
        cores = core.Optimizer.create_linked(
            [s.ddp.reducer for s in subs],
            [dict(lr=lr, overlap=True, param_groups=group_of, **options,
                  **(dict(fully_sharded=True, **s.ddp.fsdp_options) if s._fully_sharded else {}))
             for s, (lr, group_of, options) in ((s, s._deferred) for s in subs)],
            span, tp, [id(w) in replicated for w in wrappers])
        for sub, c in zip(subs, cores):
            lr, group_of, options = sub._deferred
            sub._attach(lr, group_of, options, c)
        self.optimizers = subs
        self._growing = True
        torch.optim.Optimizer.__init__(self, [p for s in subs for p in s.ddp._params],
                                       dict(subs[0].defaults))
        self._growing = False
        self.param_groups = [g for s in subs for g in s.param_groups]

    @staticmethod
    def _span(who, wrappers, span):
        if span is not None:
            return resolve_group(span, None, who + ".linked span")
        if any(len(w._groups) > 1 for w in wrappers):
            raise ValueError("%s.linked: a hybrid wrapper's groups do not span the job; pass "
                             "span= (the group of every rank, e.g. the world)" % who)
        return max((w._groups[0] for w in wrappers), key=lambda g: g.size)

    def add_param_group(self, param_group):
        if getattr(self, "_growing", False):  # torch.optim.Optimizer.__init__
            return super().add_param_group(param_group)
        raise NotImplementedError("%s: param groups are fixed at construction" %
                                  type(self).__name__)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for s in self.optimizers:
            s.step()
        return loss

    def zero_grad(self, set_to_none=False):
        for s in self.optimizers:
            s.zero_grad(set_to_none)

    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False):
        norms = [s.clip_grad_norm_(max_norm, norm_type, error_if_nonfinite)
                 for s in self.optimizers]
        return norms[0]  # one global norm: the same on every optimizer

    def grad_norm(self):
        return self.optimizers[0].grad_norm()

    def synchronize(self):
        for s in self.optimizers:
            s.synchronize()

    def last_step(self):
        return self.optimizers[0].last_step()

    def state_dict(self):
        return {"linked": [s.state_dict() for s in self.optimizers]}

    def load_state_dict(self, state_dict):
        states = state_dict.get("linked") if isinstance(state_dict, dict) else None
        if states is None or len(states) != len(self.optimizers):
            raise ValueError("%s.load_state_dict: expected {'linked': [%d state dicts]} from "
                             "state_dict()" % (type(self).__name__, len(self.optimizers)))
        for s, sd in zip(self.optimizers, states):
            s.load_state_dict(sd)

    def close(self):
        for s in self.optimizers:
            s.close()
