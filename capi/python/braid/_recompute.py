"""Activation checkpointing (torch.utils.checkpoint) under Braid's wrappers: a checkpointed
region's forward runs again inside the backward (reentrant: in a nested backward of its own).

    finish = FinishOnce(self._finish_backward)   # DistributedDataParallel
    finish.watch(out)                            # forward: the outputs' gradient hooks
    finish.queue()                               # the first gradient hook, as before
    if recompute_may_skip_wait(ddp, pids_of_bucket):   # ZeRO-2's per-module wait
        return

Contract:
  - FinishOnce queues the end-of-backward callback once per backward, in the graph task that
    reaches the wrapper's outputs: the outermost backward. Queued from a hook that fires in
    a reentrant checkpoint's nested backward, torch would run it when that nested backward
    ends, before the rest of the outer one (torch DDP's _DDPSink queues from its outputs too).
  - recompute_may_skip_wait: a module's forward inside a synced ZeRO-2 backward (a
    recompute) reads the values the step's forward read as long as its buckets were not
    stepped yet; a bucket is stepped only after every parameter in it had its last mark (a
    hook firing twice under static_graph: braid/_ddp_reuse.py's Fires), so such a
    bucket is the only one that may hold new values, and a recompute reading it raises
    naming the parameters (never a silently stepped value); the backward is ended.
FullyShardedDataParallel keeps a unit gathered through its recompute (fsdp.py), as FSDP2.
"""

import torch

from ._fsdp_params import _tensors


class FinishOnce:
    """The end-of-backward callback of a wrapper, queued once per backward (see above)."""

    def __init__(self, callback):
        self._callback = callback
        self.queued = False

    def watch(self, out):
        """Forward with grad: a hook on each output tensor requiring grad queues the callback
        when the backward reaches it."""
        self.queued = False  # an abandoned backward's flag goes with its forward
        for t in _tensors(out, []):
            if t.requires_grad:
                t.register_hook(self._reached)

    def _reached(self, grad):
        self.queue()

    def queue(self):
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._run)

    def _run(self):
        self.queued = False
        self._callback()


def recompute_may_skip_wait(ddp, bucket_pids):
    """A module's forward pre-hook of a ShardedAdamW over a reduce_scatter / hybrid
    DistributedDataParallel, for one of its buckets (`bucket_pids`: the parameter ids in it).
    False: wait for the bucket's parameters as usual (not inside a synced backward). True:
    inside one (a checkpointed region's recompute) and the bucket was not stepped yet, so its
    parameters hold the values the forward read: no wait (the optimizer would refuse it).
    Raises if every parameter of the bucket had its last mark in this backward already (the
    backward is ended first, its gradients zeroed, as for a failing gradient hook)."""
    if not ddp._in_backward or ddp._armed != "sync":
        return False
    # Complete: reduced as unused at the start, or marked for the last time in this backward
    # (a parameter whose hook fires twice, inside a reentrant region and outside it, is not
    # complete after the first: braid/_ddp_reuse.py's Fires).
    if all(pid in ddp._early or ddp._fires.complete(pid) for pid in bucket_pids):
        # Ends Braid's backward (as a failing gradient hook does) and raises.
        ddp._abandon_backward(
            "a forward inside the backward (activation checkpointing's recompute) reads %s, "
            "whose gradients were all reduced in this backward already, so the sharded "
            "optimizer may have stepped them: a recomputed region must not use a parameter "
            "whose gradient is complete before the recompute (e.g. one used both inside and "
            "outside the checkpointed region%s)" % (
                ", ".join(repr(ddp._names[p]) for p in bucket_pids),
                "" if ddp._marks_counted else
                ": pass static_graph=True to DistributedDataParallel, whose reducer then "
                "waits for such a parameter's second gradient"))
    return True
