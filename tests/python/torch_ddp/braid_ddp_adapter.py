"""torch.nn.parallel.DistributedDataParallel's constructor over Braid's wrapper: the class the
runner of torch's own DDP tests (run_torch_ddp_tests.py) puts in torch's place.

    from braid_ddp_adapter import DistributedDataParallel
    torch.nn.parallel.DistributedDataParallel = DistributedDataParallel    # ddp_rank.py
    model = DistributedDataParallel(net, find_unused_parameters=True)       # torch's call

Contract: argument mapping only. The adapter changes no behaviour of Braid's wrapper and adds
no attribute or method torch's DDP has and Braid's lacks: a torch test that needs one fails,
and the runner's table names it. Every torch argument is either passed on with its meaning or,
where the wrapper cannot take it, refused with AdapterUnsupported naming the torch argument
(the runner classifies that as a missing API).

First, as for torch's own class in this harness, device_ids / output_device of a module whose
parameters are all on the CPU become None (cpu_placement.placed_on_cpu: the GPU placement of
torch's GPU tests is kept on the CPU here, and torch refuses device_ids for a CPU module).
Then two wrappers are handled:
  - torch's signature (issue 25 item 2: device_ids, output_device, broadcast_buffers,
    process_group, bucket_cap_mb, find_unused_parameters, gradient_as_bucket_view,
    static_graph; the group optional): every torch argument the wrapper's __init__ names is
    passed on unchanged, and torch's `dim` and `check_reduction` too if it names them. The
    adapter is then only the World: the subclass exists so the tests construct it with
    torch's call and nothing else.
  - the signature before that (module, group, ...): the torch arguments are mapped, as
    LEGACY_MAPPING says, one line per argument.
"""

import functools
import inspect

import torch.distributed as dist

import braid
from braid import pytorch as braid_pytorch
from cpu_placement import placed_on_cpu

# What the adapter does with each torch argument when the wrapper predates torch's signature.
LEGACY_MAPPING = {
    "process_group": "None or a torch group over every rank in rank order -> the Braid world's "
                     "group; any other group refused (Braid's wrapper takes no torch group)",
    "device_ids": "None or [] accepted (after placed_on_cpu); a device list refused",
    "output_device": "None accepted (after placed_on_cpu); a device refused",
    "dim": "0 accepted (torch scatters inputs along it only for GPU modules); other refused",
    "broadcast_buffers": "passed on (same meaning)",
    "bucket_cap_mb": "passed on (same meaning; torch's first bucket is 1 MiB, Braid's default too)",
    "find_unused_parameters": "passed on (Braid reduces unused parameters as zeros)",
    "check_reduction": "dropped (deprecated in torch, which ignores it after a warning)",
    "gradient_as_bucket_view": "dropped: Braid's gradients are always bucket views (True's "
                               "meaning); False cannot be honoured",
    "static_graph": "False dropped; True refused (no static-graph mode)",
}


class AdapterUnsupported(NotImplementedError):
    """A torch DDP argument Braid's wrapper cannot take: the message starts with
    "braid adapter: <argument>" so the runner can name it as the missing API."""

    def __init__(self, argument, detail):
        super().__init__("braid adapter: %s: %s" % (argument, detail))
        self.argument = argument


def torch_signature_landed():
    """True when Braid's wrapper takes torch's arguments itself (process_group, no group)."""
    params = inspect.signature(braid_pytorch.DistributedDataParallel.__init__).parameters
    return "process_group" in params


def _spans_world(process_group, world):
    """A torch group whose ranks are the Braid world's, in the same order (so Braid's world
    group reduces over exactly those ranks)."""
    if process_group is None or process_group is dist.group.WORLD:
        return dist.get_world_size() == world.size
    ranks = dist.get_process_group_ranks(process_group)
    return ranks == list(range(world.size))


@functools.lru_cache(maxsize=None)
def process_world():
    """Braid's World("mpi") of this process, created at the first call (the runner calls it
    before the test, so a failing World is reported as such) and shared by every wrapper."""
    return braid.World("mpi")


@functools.lru_cache(maxsize=None)
def world_group():
    """The world's group, created once (Braid creates a rank's world group only once) and
    shared by every wrapper, as torch's default process group is."""
    return process_world().group()


class DistributedDataParallel(braid_pytorch.DistributedDataParallel):
    """torch.nn.parallel.DistributedDataParallel(module, device_ids=None, ...) over Braid's
    wrapper (module docstring: argument mapping only). A module-level class, so that
    torch.save(ddp) meets Braid's wrapper itself, not a pickling error of the adapter."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=25,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False):
        device_ids, output_device = placed_on_cpu(device_ids, output_device, module)
        torch_args = dict(
            device_ids=device_ids, output_device=output_device, dim=dim,
            broadcast_buffers=broadcast_buffers, process_group=process_group,
            bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters,
            check_reduction=check_reduction, gradient_as_bucket_view=gradient_as_bucket_view,
            static_graph=static_graph)
        accepted = inspect.signature(braid_pytorch.DistributedDataParallel.__init__).parameters
        if torch_signature_landed():
            super().__init__(module, **_direct(torch_args, accepted))
        else:
            super().__init__(module, **_legacy(torch_args, process_world(), world_group()))


def _direct(torch_args, accepted):
    """Wrapper with torch's signature: pass on what it names; dim / check_reduction only at
    their defaults when it does not name them (torch ignores both on CPU modules)."""
    kwargs = {}
    for name, value in torch_args.items():
        if name in accepted:
            kwargs[name] = value
        elif name == "dim" and value != 0:
            raise AdapterUnsupported("dim", "dim=%r (Braid's wrapper has no dim)" % (value,))
        elif name not in ("dim", "check_reduction"):
            raise AdapterUnsupported(name, "Braid's wrapper does not take it")
    return kwargs


def _legacy(a, world, group):
    """Wrapper with the signature (module, group, ...): LEGACY_MAPPING."""
    if not _spans_world(a["process_group"], world):
        raise AdapterUnsupported(
            "process_group", "a torch group %r that is not the whole world in rank order; "
            "Braid's wrapper takes no torch group" % (a["process_group"],))
    if a["device_ids"]:
        raise AdapterUnsupported("device_ids", "device_ids=%r" % (a["device_ids"],))
    if a["output_device"] is not None:
        raise AdapterUnsupported("output_device", "output_device=%r" % (a["output_device"],))
    if a["dim"] != 0:
        raise AdapterUnsupported("dim", "dim=%r" % (a["dim"],))
    if a["static_graph"]:
        raise AdapterUnsupported("static_graph", "static_graph=True")
    return dict(group=group, broadcast_buffers=a["broadcast_buffers"],
                bucket_cap_mb=float(a["bucket_cap_mb"]),
                find_unused_parameters=a["find_unused_parameters"])
