"""p.grad as torch DDP leaves it, for braid.pytorch's DistributedDataParallel, whose gradients
live in Braid's buckets (p.grad is a tensor over the bucket while it has a value).

    presence = GradPresence(groups, device)
    presence.none.add(pid)        # forward: p.grad was None; bound to its zeroed bucket view
    presence.none.discard(pid)    # backward: autograd wrote a gradient into it
    presence.launch(used, ...)    # synced backward start (find_unused_parameters): collective
    presence.finish(ddp, synced)  # end of backward: p.grad = None where torch leaves None

Contract (torch 1.13's reducer, find_unused_parameters=True or static_graph=True):
  - a parameter no rank used in a synced backward (nor in the no_sync window before it) keeps
    its .grad untouched: None if it was None, else its value (gradient_as_bucket_view=False:
    the exact value, restored from a copy taken at the start of the backward; True: the
    bucket's reduction of it, as torch's view then is the bucket);
  - a parameter some rank used gets the gradient averaged over all ranks (the others
    contribute their .grad as it is: zero if None), so ranks stay identical;
  - the agreement is one all-reduce of a used-map (int32, one element per parameter) over
    the reducer's shard group, launched before Braid's backward begins (the groups are idle
    then: the rank-consistent order holds) and waited for at its end; hybrid: then over the
    replica group. Every rank issues it at the same point of every synced backward;
  - no_sync / reduce_scatter_only backwards: a parameter whose .grad was None and received
    no gradient is None again at the end (torch accumulates nothing into it).
"""

import sys

import torch

from . import core
from ._views import _ready_event


class GradPresence:
    """Which parameters' .grad torch would have None, and the used-map agreement."""

    def __init__(self, groups, device):
        self.none = set()      # ids whose p.grad is None as torch sees it (bound view zeroed)
        self._groups = groups
        self._device = device  # None (host) or the CUDA index of the buckets
        self._events = {}
        self._used = None      # the used-map being all-reduced
        self._work = None
        self._stash = {}       # id -> the value to restore when no rank used it

    def launch(self, unused, grads, widened, keep_values):
        """Collective (the shard group): all-reduces the used-map (0 for the ids in `unused`,
        the parameters this rank did not use in the window). keep_values
        (gradient_as_bucket_view=False): copies of those of their gradients that have a value
        (`grads`: the bucket tensors), restored if no rank used them."""
        where = None if self._device is None else torch.device("cuda", self._device)
        used = [0 if pid in unused else 1 for pid in range(len(grads))]
        self._used = torch.tensor(used, dtype=torch.int32, device=where)
        ready = (None if self._device is None else
                 _ready_event(self._events, 0, self._device))
        self._work = self._groups[0].allreduce(self._used, ready_event=ready)
        self._stash = {pid: grads[pid].clone() for pid in unused
                       if keep_values and pid not in self.none and not widened[pid]}

    @staticmethod
    def release_held(grads, pid, make_view, holders):
        """gradient_as_bucket_view=False, p.grad of `pid` found None at a forward: its old
        tensor grads[pid] may still be held by the caller, whom torch's copy path would leave
        untouched. When anything but Braid's own `holders` lists references it (getrefcount
        counts its argument too), it gets its own copy of its values and the bucket a new
        tensor, make_view(pid), in grads[pid]; returns True then."""
        if sys.getrefcount(grads[pid]) <= holders + 1:
            return False
        old = grads[pid]
        old.set_(old.clone())
        grads[pid] = make_view(pid)
        return True

    def drop(self):
        """A backward abandoned: waits for the used-map all-reduce in flight, if any (so its
        buffer outlives it), and forgets it."""
        work, self._work, self._used, self._stash = self._work, None, None, {}
        if work is not None:
            try:
                work.wait()
            except core.BraidError:
                pass

    def finish(self, params, grads, synced):
        """End of a backward: p.grad of `params` (views `grads`) as torch leaves it."""
        if self._work is None:
            if not synced:  # nothing accumulated into these: None again
                for pid in self.none:
                    params[pid].grad = None
            else:
                self.none.clear()  # every parameter was reduced (or the reducer raised)
            return
        work, self._work = self._work, None
        work.wait()
        for group in self._groups[1:]:  # hybrid: over the replica group too
            group.allreduce(self._used).wait()
        counts, self._used = self._used.tolist(), None
        stash, self._stash = self._stash, {}
        for pid, count in enumerate(counts):
            if count:
                self.none.discard(pid)  # reduced: p.grad is the averaged gradient
            elif pid in self.none:
                params[pid].grad = None
            elif pid in stash:
                grads[pid].copy_(stash[pid])
