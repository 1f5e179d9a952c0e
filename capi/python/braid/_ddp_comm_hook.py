"""DistributedDataParallel.register_comm_hook (braid.pytorch): torch's checks, then the hook
resolved to one of Braid's built-in hooks (braid.comm_hooks) and set on the reducer, or any
other callable run as a Python hook (braid/_python_hook.py); torch's private
_register_builtin_comm_hook, and the "comm_hook" key of _get_ddp_logging_data()."""

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
