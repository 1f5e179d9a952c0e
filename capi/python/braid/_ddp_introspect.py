"""torch 1.13 DDP's private introspection on braid.pytorch.DistributedDataParallel, with
torch's meaning where Braid has the same fact, and a clear refusal where it has not:

    model.reducer._get_local_used_map()   # the last agreed used-map: int32, ranks per param
    model.reducer._ddp_graph_static()     # the unused set never changed (find_unused only)
    model._build_params_for_reducer()     # (the parameters Braid reduces, expect_sparse)
    model._build_debug_param_to_name_mapping(params)   # {index: name} (debug level not OFF)
    model._get_ddp_logging_data()["has_rebuilt_buckets"]   # Braid's bucket rebuild ran
    model.logger                          # AttributeError: torch's C++ dist.Logger

Contract: the used-map is the one braid/_ddp_grads.py all-reduces at the end of each synced
backward (find_unused_parameters / static_graph, mode="allreduce" with a torch optimizer),
a count per parameter of the ranks that used it, as torch's after its all-reduce; elsewhere it
raises, naming what keeps one. has_rebuilt_buckets is Braid's fact: 1 once its one-time rebuild
ran, which by default (rebuild_bucket_order=None) follows torch's policy (after the first
synced backward when find_unused_parameters=False or static_graph=True, mode="allreduce").
"""

import weakref

import torch


def attach(ddp):
    """Gives ddp.reducer torch's _get_local_used_map (a weak reference back to `ddp`)."""
    ref = weakref.ref(ddp)
    ddp.reducer._get_local_used_map = lambda: local_used_map(ref())
    ddp.reducer._ddp_graph_static = lambda: getattr(ref(), "_graph_static", True)


def note_unused(ddp, synced):
    """find_unused_parameters=True (not static_graph), a forward with grad that syncs: torch's
    ddp_graph_static turns False for good once this rank's set of unused parameters differs
    from the first such forward's."""
    if not synced:
        return
    first = getattr(ddp, "_first_unused", None)
    if first is None:
        ddp._first_unused = frozenset(ddp._unused)
    elif first != frozenset(ddp._unused):
        ddp._graph_static = False


def local_used_map(ddp):
    used = getattr(ddp._presence, "used_map", None) if ddp is not None else None
    if used is None:
        raise RuntimeError(
            "reducer._get_local_used_map(): Braid agrees on a used-map at the end of each "
            "synced backward with find_unused_parameters=True or static_graph=True, "
            "mode='allreduce' and a torch optimizer; none was agreed on this model yet")
    return used


def logging_keys(ddp):
    return {"has_rebuilt_buckets": int(getattr(ddp, "_has_rebuilt_buckets", False))}


def build_params_for_reducer(ddp):
    """torch's (parameters, expect_sparse_gradient): the parameters Braid reduces, in its
    registration order; Braid has no sparse gradients (all False)."""
    return list(ddp._params), [False] * len(ddp._params)


def build_debug_param_to_name_mapping(ddp, parameters):
    """torch's mapping {index in `parameters`: fully qualified name}, {} when torch's debug
    level is OFF; ValueError (torch's messages) when `parameters` and the module's trainable
    parameters Braid reduces differ."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    if dist.get_debug_level() == dist.DebugLevel.OFF:
        return {}
    index = {p: i for i, p in enumerate(parameters)}
    reduced = {id(p) for p in ddp._params}
    mapping = {}
    for name, p in ddp.module.named_parameters():
        if id(p) not in reduced:
            continue  # ignored, or not requiring grad: not reduced, as in torch
        if p not in index:
            raise ValueError("Param with name %s found in module parameters, but not DDP "
                             "parameters. This indicates a bug in DDP, please report an issue "
                             "to PyTorch." % name)
        mapping[index[p]] = name
    if len(set(parameters)) != len(mapping):
        raise ValueError("Expected param to name mapping to cover all parameters, but got "
                         "conflicting lengths: %d vs %d. This indicates a bug in DDP, please "
                         "report an issue to PyTorch." % (len(set(parameters)), len(mapping)))
    return mapping


def module_getattr(ddp, name):
    """torch.nn.Module's __getattr__, with `logger` refused by name."""
    if name == "logger":
        raise AttributeError(
            "'DistributedDataParallel' object has no attribute 'logger': torch's C++ "
            "dist.Logger belongs to torch's own reducer, which Braid's wrapper does not have; "
            "read _get_ddp_logging_data() (the keys Braid keeps) instead")
    return torch.nn.Module.__getattr__(ddp, name)
