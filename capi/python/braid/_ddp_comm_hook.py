"""DistributedDataParallel.register_comm_hook (braid.pytorch): torch's checks, then the hook
resolved to one of Braid's built-in hooks (braid.comm_hooks) and set on the reducer."""

import torch

from . import comm_hooks


def register_comm_hook(ddp, state, hook):
    """Sets `hook` on ddp's reducer (collective over its groups); raises as torch does for a
    second registration, and names the hook and the parameter for what Braid cannot run."""
    if getattr(ddp, "_comm_hook", None) is not None:
        raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be "
                           "called once.")  # torch's reducer's message
    own = [g for g in (ddp.process_group, ddp.reducer.shard_group) if g is not None]
    resolved = comm_hooks.resolve(hook, state, own)
    if resolved.replica_only and ddp._mode != "hybrid":
        raise ValueError("register_comm_hook(%r): replica_only needs mode='hybrid' (this model "
                         "is mode=%r)" % (resolved, ddp._mode))
    dtypes = {"int8": (torch.float32,), "powersgd": (torch.float32,),
              "allreduce": None}.get(resolved.name, (torch.float32, torch.float64))
    for name, p, widened in zip(ddp._names, ddp._params, ddp._widened):
        if dtypes is not None and not widened and p.dtype not in dtypes:
            raise ValueError("register_comm_hook(%s): parameter %r is %s; this hook compresses "
                             "%s gradients only" % (resolved.name, name, p.dtype,
                                                    "/".join(str(d) for d in dtypes)))
    params = dict(resolved.params)
    if resolved.name == "powersgd":  # torch's matrix view: shape[0] rows
        params["param_rows"] = [p.shape[0] if p.dim() > 0 else 1 for p in ddp._params]
    ddp.reducer.set_comm_hook(resolved.name, resolved.replica_only, **params)
    ddp._comm_hook = resolved
