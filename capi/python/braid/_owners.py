"""Which Braid wrapper owns a parameter: how ShardedAdamW(model.parameters()) finds its model.

A wrapper (DistributedDataParallel, FullyShardedDataParallel) claims every parameter of its
module at construction: each gets a weak reference to the wrapper as `p._braid_wrapper` (a
tensor attribute, so no registry outlives the objects; a collected or closed wrapper frees
its parameters). A sharded optimizer then resolves torch's `params` argument (parameters, or
parameter-group dicts) to that one wrapper:

    model = DistributedDataParallel(net, mode="reduce_scatter")   # claims net's parameters
    opt = ShardedAdamW(net.parameters(), lr=1e-3)                  # wrapper_of(...) is model

Contract: resolve() returns (wrapper, param_groups as a list) or raises ValueError naming the
`params` argument and saying what to change (parameters no Braid wrapper owns, parameters of
two wrappers, an empty list).
"""

import weakref

import torch

_ATTR = "_braid_wrapper"


class Wrapper:
    """Base of Braid's module wrappers (DistributedDataParallel, FullyShardedDataParallel):
    how braid/_ddp_verify.py recognizes them without importing the modules defining them."""

    def _replaceable_by(self, module):
        """Whether a new wrapper over `module` may close this one (torch's idiom of
        wrapping the same module again); never, unless the wrapper says so."""
        return False


def claim(wrapper, module):
    """Marks every parameter of `module` (trainable or not) as owned by `wrapper`."""
    ref = weakref.ref(wrapper)
    for p in module.parameters():
        setattr(p, _ATTR, ref)


def release(wrapper, module):
    """Undoes claim() for the parameters `wrapper` still owns (at the wrapper's close())."""
    for p in module.parameters():
        ref = getattr(p, _ATTR, None)
        if ref is not None and ref() is wrapper:
            delattr(p, _ATTR)


def owner(p):
    """The live wrapper owning parameter `p`, or None."""
    ref = getattr(p, _ATTR, None)
    return ref() if ref is not None else None


def _normalized(group):
    """A copy of a group dict whose "params" is a list (torch takes a tensor, a list or any
    iterable there; a generator can be read once only)."""
    group = dict(group)
    params = group.get("params")
    group["params"] = [params] if isinstance(params, torch.Tensor) else list(params or [])
    return group


def _flat(groups):
    for g, group in enumerate(groups):
        for k, p in enumerate(group["params"]):
            yield g, k, p


def _where(g, k, p):
    return "param_groups[%d]['params'][%d] (shape %s)" % (g, k, tuple(p.shape))


def resolve(who, params, expected=None):
    """(wrapper, groups): `params` as torch.optim takes it (an iterable of parameters or of
    group dicts) and the one Braid wrapper owning those parameters. `who` names the optimizer
    class in errors. With `expected` (the wrapper the caller named), parameters no wrapper
    owns are let through for the caller's own check; another wrapper's are refused."""
    if isinstance(params, torch.Tensor):
        raise TypeError("%s(params): params should be an iterable of parameters or of dicts "
                        "(torch.optim's argument), got a single tensor" % who)
    groups = list(params)
    if not groups:
        raise ValueError("%s(params): params is an empty list (pass model.parameters() of a "
                         "model wrapped by Braid)" % who)
    groups = ([_normalized(g) for g in groups] if isinstance(groups[0], dict) else
              [{"params": groups}])
    found = None  # (wrapper, where its first parameter was)
    for g, k, p in _flat(groups):
        if not isinstance(p, torch.Tensor):
            raise TypeError("%s(params): %s is a %s, not a parameter" % (
                who, "param_groups[%d]['params'][%d]" % (g, k), type(p).__name__))
        w = owner(p)
        if w is None and expected is not None:
            continue
        if w is None:
            raise ValueError(
                "%s(params): %s is not wrapped by Braid; wrap the model first, e.g. model = "
                "DistributedDataParallel(net, mode='reduce_scatter') or "
                "FullyShardedDataParallel(net), then pass model.parameters()" % (
                    who, _where(g, k, p)))
        if found is None:
            found = (w, _where(g, k, p))
        elif w is not found[0]:
            raise ValueError(
                "%s(params): %s belongs to a %s and %s to another %s; one sharded optimizer "
                "steps one wrapped model: create one optimizer per model (or %s.linked(params) "
                "for one optimizer and one gradient norm over several)" % (
                    who, found[1], type(found[0]).__name__, _where(g, k, p),
                    type(w).__name__, who))
    return (found[0] if found is not None else expected), groups
