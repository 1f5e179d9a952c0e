"""p.grad as torch DDP leaves it, for braid.pytorch's DistributedDataParallel, whose gradients
live in Braid's buckets (p.grad is a tensor over the bucket while it has a value).

    presence = GradPresence(groups, device)
    presence.none.add(pid)        # forward: p.grad was None; bound to its zeroed bucket view
    presence.none.discard(pid)    # backward: autograd wrote a gradient into it
    presence.keep(pids, ...)      # before their reduction: values to restore if unused
    presence.finish(params, grads, synced, unused)  # end of backward: p.grad = None where
                                  # torch leaves None (collective when `unused` is given)

Contract (torch 1.13's reducer, find_unused_parameters=True or static_graph=True):
  - a parameter no rank used in a synced backward (nor in the no_sync window before it) keeps
    its .grad untouched: None if it was None, else its value (gradient_as_bucket_view=False:
    the exact value, restored from a copy taken before its reduction; True: the
    bucket's reduction of it, as torch's view then is the bucket);
  - a parameter some rank used gets the gradient averaged over all ranks (the others
    contribute their .grad as it is: zero if None), so ranks stay identical;
  - "used" is torch's local_used_map: the forward's outputs reach the parameter (torch's
    _DDPSink fires the hook of each, with an undefined gradient where the loss ignores an
    output) and its .grad is defined at the end (it had one, or a gradient arrived in the
    backward or the no_sync window before it): a None .grad that received nothing (an
    output the loss ignores, a custom Function returning None) stays None;
  - the agreement is one all-reduce of a used-map (int32, one element per parameter) over
    the reducer's shard group, issued after Braid's reductions of the backward completed (the
    groups are idle then: the rank-consistent order holds); hybrid: then over the replica
    group. Every rank issues it at the same point of every synced backward;
  - no_sync / reduce_scatter_only backwards: a parameter whose .grad was None and received
    no gradient is None again at the end (torch accumulates nothing into it).
"""

import sys

import torch

from ._ddp_profile import wait_profiled
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
        self.used_map = None   # the last agreed used-map (counts of ranks per parameter)

    def keep(self, pids, grads, widened):
        """gradient_as_bucket_view=False: copies of the gradients of `pids` that have a value
        (`grads`: the bucket tensors), taken before they are reduced, restored if no rank used
        them."""
        for pid in pids:
            if pid not in self.none and not widened[pid] and pid not in self._stash:
                self._stash[pid] = grads[pid].clone()

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
        """A backward abandoned: forgets the copies kept for it."""
        self._stash = {}

    def finish(self, params, grads, synced, unused=None, profile_name=None):
        """End of a backward, after Braid's reductions completed (the groups are idle): p.grad
        of `params` (views `grads`) as torch leaves it. `unused` (a synced backward with
        find_unused_parameters): the ids this rank did not use; collective then (the used-map
        all-reduce over the shard group, then the replica group; each a torch profiler range
        `profile_name` when given, braid/_ddp_profile.py)."""
        if unused is None:
            if not synced:  # nothing accumulated into these: None again
                for pid in self.none:
                    params[pid].grad = None
            else:
                self.none.clear()  # every parameter was reduced (or the reducer raised)
            return
        where = None if self._device is None else torch.device("cuda", self._device)
        used = torch.tensor([0 if pid in unused else 1 for pid in range(len(grads))],
                            dtype=torch.int32, device=where)
        ready = (None if self._device is None else
                 _ready_event(self._events, 0, self._device))
        stash, self._stash = self._stash, {}
        wait_profiled(profile_name, self._groups[0].allreduce(used, ready_event=ready))
        for group in self._groups[1:]:  # hybrid: over the replica group too
            wait_profiled(profile_name, group.allreduce(used))
        self.used_map = used  # torch's reducer._get_local_used_map() (braid/_ddp_introspect.py)
        for pid, count in enumerate(used.tolist()):
            if count:
                self.none.discard(pid)  # reduced: p.grad is the averaged gradient
            elif pid in self.none:
                params[pid].grad = None
            elif pid in stash:
                grads[pid].copy_(stash[pid])
