"""The arguments of braid.pytorch's DistributedDataParallel, read as torch 1.13 DDP reads its
own, before anything is built.

    a = read_arguments(module, args)   # args: the constructor's arguments by name
    a.group, a.groups, a.named, a.device, a.device_ids, a.output_device, a.config, ...

Contract:
  - the older signature (module, group, mode=...) keeps working: a braid Group as the second
    positional argument (torch's device_ids) is the group, and a mode name as the third
    (torch's output_device) is the mode;
  - check_reduction=True warns as torch does (deprecated) and changes nothing;
  - the group: braid/_torch_groups.py (group= / process_group= / the default world's);
    replica_group: a braid Group or None;
  - a module without a parameter requiring grad: torch's RuntimeError; a module already
    wrapped: braid/_ddp_verify.py; device_ids / output_device: braid/_ddp_devices.py; CUDA
    parameters need a group on an nccl world, CPU ones a host world (ValueError naming a
    parameter);
  - bad values are refused by their Python names (bucket_cap_mb, first_bucket_cap_mb,
    timeout_ms, mode, replica_group, reduce_dtype, timeline_prefix), never by braid.h's
    fields;
  - `config`: every argument but the module and the groups, as given (after the older
    signature's translation): what pickling keeps to build the wrapper again.
  Nothing here is collective except mapping a torch ProcessGroup (one all-gather over the
  default world).
"""

import types
import warnings

from . import _ddp_ignore, core
from ._ddp_devices import check_devices
from ._ddp_verify import check_not_wrapped
from ._torch_groups import resolve_group
from ._torch_rendezvous import initialized_torch_distributed
from ._views import _device_of

WHAT = "DistributedDataParallel"
_GROUP_ARGS = ("group", "process_group", "replica_group")


def read_arguments(module, args):
    """A namespace of the checked arguments (see the module docstring). `args`: the
    constructor's keyword values by name, module excluded."""
    args = dict(args)
    if isinstance(args["device_ids"], core.Group):
        if args["group"] is not None:
            raise ValueError("%s: a braid Group passed twice (second argument and group=)" %
                             WHAT)
        args["group"], args["device_ids"] = args["device_ids"], None
        if isinstance(args["output_device"], str) and args["mode"] == "allreduce":
            args["mode"], args["output_device"] = args["output_device"], None
    if args["check_reduction"]:
        warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module is "
                      "deprecated. Please avoid using it.")
    _check_values(args)
    a = types.SimpleNamespace(config={k: v for k, v in args.items() if k not in _GROUP_ARGS})
    given = args["process_group"] if args["process_group"] is not None else args["group"]
    a.group = resolve_group(args["group"], args["process_group"], WHAT)
    # torch's attribute: the group given, else torch's default group where torch.distributed
    # is initialized (torch utilities such as _sync_module_states take it), else Braid's.
    a.process_group = given if given is not None else _torch_default_group() or a.group
    replica = args["replica_group"]
    if replica is not None and not isinstance(replica, core.Group):
        raise TypeError("%s: replica_group= takes a braid Group, not %s" %
                        (WHAT, type(replica).__name__))
    a.groups = [g for g in (a.group, replica) if g is not None]
    a.ignored = _ddp_ignore.ignored(module)  # torch's parameters_to_ignore
    a.named = [(n, p) for n, p in _ddp_ignore.named_parameters(module, a.ignored)
               if p.requires_grad]
    if not a.named:
        raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have "
                           "any parameter that requires a gradient.")
    check_not_wrapped(module, a.named, WHAT)
    a.device = _device_of(a.named, WHAT)
    a.device_ids, a.output_device = check_devices(args["device_ids"], args["output_device"],
                                                  a.device, WHAT)
    first, group = a.named[0][0], a.group
    if a.device is not None and not group.device_memory:
        raise ValueError(
            "%s: parameter %r is on cuda:%d but group %r is on a %r world, whose collectives "
            "read host memory; CUDA modules need World('nccl') (one rank per process and "
            "GPU)" % (WHAT, first, a.device, group.name, group._world.backend))
    if a.device is None and group.device_memory:
        raise ValueError(
            "%s: parameter %r is a CPU tensor but group %r is on an nccl world, whose "
            "collectives read device memory; move the module to its GPU (module.cuda()) or "
            "use a host backend" % (WHAT, first, group.name))
    return a


def _positive(args, name):
    value = args[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError("%s: %s=%r: a size in MiB > 0" % (WHAT, name, value))


def _check_values(args):
    """ValueError / TypeError naming the argument, before braid.h sees a value."""
    _positive(args, "bucket_cap_mb")
    _positive(args, "first_bucket_cap_mb")
    timeout = args["timeout_ms"]
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise ValueError("%s: timeout_ms=%r: milliseconds, an int >= 0 (0: the world's "
                         "default)" % (WHAT, timeout))
    mode = args["mode"]
    if mode not in core.MODES:
        raise ValueError("%s: mode=%r: one of %s" % (WHAT, mode, ", ".join(core.MODES)))
    if (mode == "hybrid") != (args["replica_group"] is not None):
        raise ValueError(
            "%s: mode='hybrid' needs replica_group= (the replica group of Group.mesh), and "
            "replica_group= needs mode='hybrid'; got mode=%r, replica_group=%r" %
            (WHAT, mode, args["replica_group"]))
    if args["reduce_dtype"] is not None:
        try:
            core.dtype_code(args["reduce_dtype"])
        except ValueError as e:
            raise ValueError("%s: reduce_dtype=%r: %s" % (WHAT, args["reduce_dtype"], e)) from None
    prefix = args["timeline_prefix"]
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError("%s: timeline_prefix=%r: a path prefix (str) or None" % (WHAT, prefix))


def _torch_default_group():
    """torch's default ProcessGroup when torch.distributed is initialized (never imports it)."""
    dist = initialized_torch_distributed()
    return dist.distributed_c10d._get_default_group() if dist is not None else None


def rebuild_policy(mode, find_unused_parameters, static_graph):
    """rebuild_bucket_order=None (the default): torch 1.13 DDP's policy (reducer.cpp's
    should_rebuild_buckets), one rebuild in the first synced backward's readiness order when
    `static_graph or not find_unused_parameters`; in "allreduce" mode only (torch's DDP: the
    sharded modes have no torch counterpart, and their optimizers re-plan on their own)."""
    return mode == "allreduce" and (bool(static_graph) or not find_unused_parameters)
