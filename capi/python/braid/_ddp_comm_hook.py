"""DistributedDataParallel.register_comm_hook (braid.pytorch): torch's checks, then the hook
resolved to one of Braid's built-in hooks (braid.comm_hooks) and set on the reducer, or any
other callable run as a Python hook (braid/_python_hook.py); torch's private
_register_builtin_comm_hook, and the "comm_hook" key of _get_ddp_logging_data(); and the
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

from . import _python_hook, comm_hooks

# torch's dist.BuiltinCommHookType names -> Braid's built-in hooks.
_BUILTIN = {"ALLREDUCE": "allreduce", "FP16_COMPRESS": "fp16_compress"}


def register_comm_hook(ddp, state, hook):
    """Sets `hook` on ddp's reducer (collective over its groups); raises as torch does for a
    second registration, and names the hook and the parameter for what Braid cannot run.
    Errors are recorded for _get_ddp_logging_data()'s "error", as torch's logger does."""
    try:
        _register(ddp, state, hook)
    except Exception as e:
        ddp._graph.error = "%s: %s" % (type(e).__name__, e)
        raise
    ddp._comm_hook_name = getattr(hook, "__qualname__", None) or repr(hook)


def register_builtin_comm_hook(ddp, comm_hook_type):
    """torch's private _register_builtin_comm_hook(dist.BuiltinCommHookType.X)."""
    name = getattr(comm_hook_type, "name", None)
    if name not in _BUILTIN:
        raise ValueError("_register_builtin_comm_hook(%r): Braid runs %s" % (
            comm_hook_type, ", ".join("BuiltinCommHookType." + k for k in _BUILTIN)))
    _register(ddp, None, comm_hooks.CommHook(_BUILTIN[name]))
    ddp._comm_hook_name = str(comm_hook_type)


def add_logging(ddp, data):
    """_get_ddp_logging_data()'s "comm_hook": the registered hook's __qualname__ (torch's);
    before one is registered torch leaves the key out, and so does Braid (`data.get` gives
    its default)."""
    name = getattr(ddp, "_comm_hook_name", None)
    if name is None:
        data.absent = data.absent + ("comm_hook",)
    else:
        data["comm_hook"] = name


def _register(ddp, state, hook):
    if getattr(ddp, "_comm_hook", None) is not None:
        raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be "
                           "called once.")  # torch's reducer's message
    own = [g for g in (ddp.process_group, ddp.reducer.shard_group) if g is not None]
    resolved = comm_hooks.resolve(hook, state, own)
    if resolved is None:
        _python_hook.check_model(ddp, hook)
        timeout_ms = ddp._config.get("timeout_ms") or 300000
        ddp._py_comm_hook = _python_hook.PythonCommHook(state, hook, timeout_ms / 1000.0)
        ddp._on_replan.append(ddp._py_comm_hook.replanned)
        ddp._comm_hook = ddp._py_comm_hook
        return
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
    # torch's rebuild policy (rebuild_bucket_order=None) still runs: the built-in hooks count
    # steps hook-wide across a re-plan and drop only bucket-shaped state (error feedback,
    # warm-start Q), as torch's hooks do across torch's rebuild (scheduler/comm_hook.h).


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
