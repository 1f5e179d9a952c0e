"""The reducer's used-map agreement (braid.h's agree_unused; scheduler/used_map.h) as the torch
wrappers use it: with find_unused_parameters (or static_graph) in a sharded mode, every synced
backward agrees across ranks which parameters some rank used, and Braid's sharded optimizer
skips the others as torch's optimizer skips a parameter whose .grad is None (its moments, step
count and weight decay untouched), stepping the rest with the average (zeros from the ranks
that did not use them).

    reducer = core.Reducer(..., **agreement_options(find_unused, "declared", static_graph))
    declared = declare_unused(reducer, agrees, armed, unused)   # right after begin_backward

Contract:
  - DistributedDataParallel (reduce_scatter / hybrid): "declared", the parameters the forward's
    outputs do not reach (found at forward's end, as torch's find_unused_parameters does) are
    declared at the backward's start, on every rank in every backward that is not no_sync (an
    empty list too): the agreement is the backward's first collective and overlaps it, as torch
    DDP's used-map all-reduce does. A declared parameter that then receives a gradient raises.
  - FullyShardedDataParallel / fully_shard: "at_finish", the parameters this rank marked (those
    that received a gradient in the backward or its no_sync window) agreed after the backward.
  - A parameter the outputs reach but that receives no gradient counts as used (zero gradient),
    where torch counts it unused only if its .grad stays None.
"""


def agreement_options(enabled, how, static_graph):
    """Reducer keyword arguments: the agreement `how` ("declared" / "at_finish") if enabled."""
    if not enabled:
        return {}
    return {"agree_unused": how, "static_graph": bool(static_graph)}


def declare_unused(reducer, agrees, armed, unused):
    """Right after begin_backward(armed): declares `unused` (ids) when the reducer agrees and
    the backward reduces (not no_sync). Returns the ids declared (empty otherwise)."""
    if not agrees or armed == "no_sync":
        return []
    reducer.declare_unused(unused)
    return list(unused)
