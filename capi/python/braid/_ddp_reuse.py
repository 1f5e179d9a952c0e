"""Reused parameters in braid.pytorch's DistributedDataParallel (and ShardedAdamW over it): a
parameter whose AccumulateGrad hook fires more than once in one backward, as one used both
inside and outside a reentrant torch.utils.checkpoint region (the region's nested backward
fires it first). A tied parameter (GPT-2's embedding shared with its LM head) is not one:
module.parameters() yields it once and autograd sums both uses before its one hook.

    ddp = DistributedDataParallel(model, static_graph=True)   # hooks may fire twice

Contract, torch DDP's: under static_graph=True the reducer counts each parameter's marks in
the first synced backward (its launches wait for the end of that backward, as torch's first
static-graph iteration) and reduces each parameter after its last mark from then on
(scheduler/reducer_marks.h); a later backward with more or fewer marks is an error naming the
parameter. Without it a second fire in a synced backward raises, naming the parameter and the
fix, as torch's "Expected to mark a variable ready only once"; in a no_sync backward nothing is
reduced, so the second fire just accumulates (torch's hooks are idle there too).
"""

COUNTED = 0  # braid.h's BRAID_MARKS_COUNTED


def reuse_marks(n, static_graph):
    """The reducer's param_marks for n parameters: counted under static_graph, else None (one
    mark each)."""
    return [COUNTED] * n if static_graph else None


def mark_again(ddp, pid):
    """The hook of `pid` fired again in this backward: True to mark it again (its marks are
    counted), False to skip the mark (no_sync: the gradient accumulated in its view already);
    raises otherwise."""
    if ddp._armed == "no_sync":
        return False
    if ddp._marks_counted:
        return True
    why = ("static_graph=True was set by _set_static_graph() after construction, which "
           "Braid's reducer cannot apply to marks: pass static_graph=True to "
           "DistributedDataParallel instead" if ddp.static_graph else
           "pass static_graph=True (as torch DDP requires) if the graph is the same every "
           "iteration")
    if ddp._stepper is not None:
        why += ("; a ShardedAdamW over the model refuses static_graph (it implies "
                "find_unused_parameters): use mode='allreduce' with a torch optimizer, or keep "
                "the checkpointed region's parameters out of the rest of forward")
    raise RuntimeError(
        "parameter %r: its gradient hook fired twice in one backward (reused across a "
        "reentrant torch.utils.checkpoint region and outside it, or used outside forward); "
        "Braid would reduce it before its last contribution: %s" % (ddp._names[pid], why))
