"""Which parameters a sharded optimizer steps, in which groups: the checks behind
ShardedAdamW(params, ...) / ShardedSGD(params, ...) (braid/optim.py's contract, "The wrapper"
and "param_groups").

    class _ShardedOptimizer(ParamGroups, ..., torch.optim.Optimizer):
        def __init__(self, model, params, ...):
            ddp, params = self._resolve(model, params)   # the wrapper, torch's params argument
            ...
            group_of = self._check_groups()               # group index per registered param
            self._check_unused()                          # find_unused_parameters refused

Contract: every error is a ValueError / TypeError / NotImplementedError naming the Python
argument (params, param_groups[g], add_param_group, find_unused_parameters) and saying what to
change. The host class provides ddp (the wrapper), _names (registered parameters' names),
param_groups, _growing (True while torch.optim.Optimizer.__init__ adds the groups) and
_check_options(g, group); subclasses may override _zero_grad_is_skip / _zero_step_effect.
"""

import torch

from . import _owners


def _is_wrapper(obj):
    """A Braid DistributedDataParallel / FullyShardedDataParallel (braid.pytorch imports the
    optimizers, so its DistributedDataParallel is recognized by what it has)."""
    return isinstance(obj, torch.nn.Module) and hasattr(obj, "reducer") and hasattr(obj, "_params")


class ParamGroups:
    """Mixin of _ShardedOptimizer (module docstring)."""

    @classmethod
    def _resolve(cls, model, params):
        """(the wrapper, the params argument for torch.optim.Optimizer or None for all)."""
        who = cls.__name__
        if _is_wrapper(model):
            if params is None:
                return model, None
            wrapper, groups = _owners.resolve(who, params, expected=model)
            if wrapper is not model:
                raise ValueError("%s(model, params=...): params belong to another %s than "
                                 "model" % (who, type(wrapper).__name__))
            return model, groups
        if model is not None and params is not None:
            raise TypeError("%s: pass the parameters once, as %s(params, lr=...) or "
                            "%s(model, params=...)" % (who, who, who))
        params = model if params is None else params
        if params is None:
            raise TypeError("%s() missing its params argument: %s(model.parameters(), "
                            "lr=...)" % (who, who))
        if isinstance(params, torch.nn.Module):
            raise TypeError(
                "%s(params): got a %s module that Braid does not wrap; wrap it (model = "
                "DistributedDataParallel(net, mode='reduce_scatter')) and pass "
                "model.parameters()" % (who, type(params).__name__))
        return _owners.resolve(who, params)

    @staticmethod
    def _param_names(ddp):
        names = {id(p): n for n, p in ddp.module.named_parameters()}
        return [names.get(id(p), "parameter %d" % i) for i, p in enumerate(ddp._params)]

    def add_param_group(self, param_group):
        if not self._growing:
            raise NotImplementedError(
                "%s.add_param_group(param_group): parameter groups are fixed at construction "
                "(Braid lays out every parameter's master weights and state by its group "
                "when the optimizer is built); pass every group to %s(params=[{...}, ...])" %
                (type(self).__name__, type(self).__name__))
        super().add_param_group(param_group)

    def _check_groups(self):
        """Group index of each registered parameter (registration order); ValueError naming
        parameters that are not the model's trainable ones or not in any group. Frozen
        parameters of the wrapped module (requires_grad=False when it was wrapped) may be in
        a group: Braid never steps them, as torch never steps a parameter without .grad."""
        index = {id(p): pid for pid, p in enumerate(self.ddp._params)}
        group_of = [None] * len(self.ddp._params)
        for g, group in enumerate(self.param_groups):
            self._check_options(g, group)
            for k, p in enumerate(group["params"]):
                pid = index.get(id(p))
                if pid is None:
                    if _owners.owner(p) is self.ddp and not p.requires_grad:
                        continue  # frozen
                    raise ValueError(
                        "param_groups[%d]['params'][%d] (shape %s) is not a trainable "
                        "parameter of the wrapped module%s" % (
                            g, k, tuple(p.shape), " (requires_grad was set after wrapping: "
                            "set it before)" if _owners.owner(p) is self.ddp else ""))
                group_of[pid] = g
        missing = [self._names[pid] for pid, g in enumerate(group_of) if g is None]
        if missing:
            raise ValueError("parameters in no param group: %s (Braid steps every trainable "
                             "parameter of the model: put them in a group, e.g. one with "
                             "weight_decay=0, or freeze them with requires_grad_(False) before "
                             "wrapping)" % ", ".join(repr(n) for n in missing))
        return group_of

    def _check_unused(self):
        """Refuses a wrapper that lets parameters go without a gradient (find_unused_parameters
        =True): Braid would step them with a zero gradient where torch.optim skips them;
        unless that is exactly a skip (SGD without momentum and weight decay)."""
        if not getattr(self.ddp, "_find_unused", False):
            return
        if getattr(self.ddp, "_agrees_unused", False):
            return  # the reducer agrees on use: parameters no rank used are skipped
        for g, group in enumerate(self.param_groups):
            if not self._zero_grad_is_skip(group):
                raise ValueError(
                    "%s over %s(find_unused_parameters=True): a parameter without a gradient "
                    "would be stepped with a zero gradient (%s), where torch.optim skips it; "
                    "use every parameter in forward and pass find_unused_parameters=False, "
                    "freeze unused parameters (requires_grad_(False)) before wrapping, or use "
                    "mode='allreduce' with a torch optimizer" % (
                        type(self).__name__, type(self.ddp).__name__,
                        self._zero_step_effect(g, group)))

    def _zero_grad_is_skip(self, group):
        """Subclasses: True when a step with a zero gradient leaves `group`'s parameters and
        state exactly as a skipped step would."""
        return False

    def _zero_step_effect(self, g, group):
        return "weight decay and moment updates"
