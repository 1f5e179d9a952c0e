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
FullyShardedDataParallel / fully_shard take the same static_graph=True (a keyword torch's FSDP
lacks): marks counted as above, each a copy (the first) or an add of the gradient into the
reducer's storage; without it a second fire is refused (fired_twice_fully_sharded).
Fires tells a ShardedAdamW's recompute check (braid/_recompute.py) when a parameter's last
mark of this backward was made: never while its count is being learned (its bucket launches at
the end of the backward), else once its hook fired as often as in the backward that counted it
(once each without static_graph).
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
    raise RuntimeError(
        "parameter %r: its gradient hook fired twice in one backward (reused across a "
        "reentrant torch.utils.checkpoint region and outside it, or used outside forward); "
        "Braid would reduce it before its last contribution: %s" % (ddp._names[pid], why))


class Fires:
    """How many times each parameter was marked in this backward, and the counts the reducer
    learned (see the module docstring); `counted`: the reducer counts marks (static_graph)."""

    def __init__(self, counted):
        self._counted = counted
        self._learned = {}  # pid -> its marks per backward, once the reducer counted them
        self._now = {}

    def begin(self):
        self._now = {}

    def fired(self, pid):
        self._now[pid] = self._now.get(pid, 0) + 1

    def finish(self, launching):
        """The reducer's finish_backward ran (also for an abandoned backward); `launching`:
        synced or reduce_scatter_only. As the reducer (ReducerMarks::Settle), a parameter's
        count is learned in the first such backward that marks it."""
        if launching and self._counted:
            for pid, n in self._now.items():
                self._learned.setdefault(pid, n)

    def complete(self, pid):
        """Parameter pid had its last mark of this backward (its bucket may have launched)."""
        if not self._counted:
            return pid in self._now
        want = self._learned.get(pid)
        if want is None:
            return False  # being counted: its bucket launches at the end of the backward
        return self._now.get(pid, 0) >= want


def fired_twice_fully_sharded(name):
    """The error of FullyShardedDataParallel / fully_shard when the hook of parameter `name`
    fires a second time in one backward."""
    return RuntimeError(
        "parameter %r: its gradient hook fired twice in one backward (used inside a reentrant "
        "torch.utils.checkpoint region and outside it); Braid would reduce it before its last "
        "contribution: pass static_graph=True to FullyShardedDataParallel / fully_shard if the "
        "graph is the same every iteration, or use torch.utils.checkpoint(..., "
        "use_reentrant=False) (autograd then sums both uses before the hook)" % name)
