"""DistributedDataParallel.register_comm_hook (braid.pytorch): torch's checks, then the hook
resolved to one of Braid's built-in hooks (braid.comm_hooks) and set on the reducer; and the
hook's state in checkpoints (comm_hook_state_dict / load_comm_hook_state_dict).

Checkpoints: the hook state (PowerSGD's error feedback, warm-start Q and step counts; int8's
error feedback) is this rank's, like torch's PowerSGDState that each rank pickles. It lives
beside the model and optimizer state in each rank's checkpoint, as a dict:
    ckpt = {"model": ddp.state_dict(), "optim": opt.state_dict(),
            "comm_hook": ddp.comm_hook_state_dict()}          # per rank: torch.save it
    ddp.register_comm_hook(state, hook)                       # the same hook and options
    ddp.load_comm_hook_state_dict(ckpt["comm_hook"])          # the next steps: bit for bit
ddp.state_dict() keeps torch's layout (a plain module loads it), so the hook state is not in
it. Loading into another world size or rank raises naming both: the state follows each rank's
elements of each bucket and cannot be resharded; skip it (restart_hook=True) and the hook
starts its warm-up again (PowerSGD's start_powerSGD_iter uncompressed steps)."""

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


def comm_hook_state_dict(ddp):
    """This rank's hook state: {"hook", "rank", "world_size", "state" (bytes)}."""
    hook = getattr(ddp, "_comm_hook", None)
    group = ddp.reducer.shard_group
    return {"hook": None if hook is None else hook.name, "rank": group.rank,
            "world_size": group.size,
            "state": ddp.reducer.comm_hook_state() if hook is not None else b""}


def load_comm_hook_state_dict(ddp, state_dict, restart_hook=False):
    """Loads comm_hook_state_dict()'s dict into the hook registered now (same hook and
    options). restart_hook=True: when the world size or rank differs, keep the fresh hook (its
    warm-up starts again) instead of raising."""
    hook = getattr(ddp, "_comm_hook", None)
    name = None if hook is None else hook.name
    if state_dict.get("hook") != name:
        raise ValueError("load_comm_hook_state_dict: the state is of hook %r; this model's hook "
                         "is %r (register_comm_hook with the same hook first)" %
                         (state_dict.get("hook"), name))
    group = ddp.reducer.shard_group
    saved = (state_dict.get("rank"), state_dict.get("world_size"))
    if saved != (group.rank, group.size):
        if restart_hook:
            return
        raise ValueError("load_comm_hook_state_dict: the %r hook state was saved by rank %s of "
                         "%s; this is rank %d of %d. It follows each rank's elements and cannot "
                         "be resharded: pass restart_hook=True to restart the hook's warm-up" %
                         (name, saved[0], saved[1], group.rank, group.size))
    if hook is not None:
        ddp.reducer.load_comm_hook_state(state_dict["state"])
