"""The reducer's used-map agreement (braid.h's agree_unused; scheduler/used_map.h) as the torch
wrappers use it: with find_unused_parameters (or static_graph) in a sharded mode, every synced
backward agrees across ranks which parameters some rank used, and Braid's sharded optimizer
skips the others as torch's optimizer skips a parameter whose .grad is None (its moments, step
count and weight decay untouched), stepping the rest with the average (zeros from the ranks
that did not use them).

    reducer = core.Reducer(..., **agreement_options(find_unused, DDP_AGREEMENT, static_graph))
    declared = declare_unused(reducer, agrees, armed, unused)   # right after begin_backward
    if marks_hook(ddp, got): ddp._mark(pid)                     # in the AccumulateGrad hook

Contract:
  - DistributedDataParallel (reduce_scatter / hybrid): "declared_at_finish", the parameters the
    forward's outputs do not reach (found at forward's end, as torch's find_unused_parameters
    does) are declared at the backward's start, on every rank in every backward that is not
    no_sync (an empty list too), so their buckets need not wait for the end; a declared
    parameter that then receives a gradient raises. The agreement itself runs after the
    backward's buckets, on what this rank marked, as torch DDP all-reduces its local_used_map
    once every bucket is ready: a parameter the outputs reach but that receives no gradient
    (an output the loss ignores: its hook never fires; a custom Function returning None: its
    hook fires with an undefined gradient, and marks_hook leaves it unmarked) is unused on
    this rank, as in torch; the reducer zero-fills it at the end (a no_sync window's sum
    stays, and counts as used, as torch's local_used_map accumulated over no_sync).
    The price: ShardedAdamW steps no bucket before the backward ends (the map is final only
    then); the reductions still overlap the backward.
  - static_graph: the first synced backward agrees on the marks, then that map is kept (as
    torch's first static iteration); a hook with an undefined gradient is left unmarked in
    every backward alike, so the counted marks (braid/_ddp_reuse.py) stay the same.
  - FullyShardedDataParallel / fully_shard: "at_finish", the parameters this rank marked (those
    that received a gradient in the backward or its no_sync window) agreed after the backward.
"""

# How DistributedDataParallel's reducer agrees in the sharded modes (braid.h's
# BRAID_UNUSED_DECLARED_AT_FINISH).
DDP_AGREEMENT = "declared_at_finish"


def agreement_options(enabled, how, static_graph):
    """Reducer keyword arguments: the agreement `how` ("declared_at_finish" / "at_finish" /
    "declared") if enabled."""
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


def marks_hook(ddp, got):
    """In `ddp`'s AccumulateGrad hook: False when the hook got no gradient (`got` False: an
    undefined one, as a custom Function returning None sends) and the reducer agrees on marks
    for a sharded optimizer: left unmarked, it is zero-filled at the backward's end and unused
    on this rank. True otherwise (all-reduce mode agrees in braid/_ddp_grads.py from .grad)."""
    agrees_on_marks = ddp._declares and ddp._stepper is not None
    return got or not agrees_on_marks
