"""DistributedDataParallel's backward side (braid.pytorch), a mixin of that class: the
AccumulateGrad hooks that mark each parameter ready (_grad_ready, once per gradient; the first
of a synced backward begins it on the reducer or the sharded optimizer and marks the unused
parameters early), the end-of-backward callback (_finish_backward: unhooked parameters, the
used-map agreement, a Python comm hook's reduction, torch's None gradients), and the path that
abandons a backward which cannot complete (_abandon_backward: gradients zeroed, the reducer
reset, an error naming why).

    class DistributedDataParallel(BackwardHooks, torch.nn.Module, ...):  # pytorch.py

It reads and writes the wrapper's state set up in its constructor and forward
(docs/design/pytorch.md); nothing here is public.
"""

from . import _buffer_hook, _python_hook, core
from ._ddp_graph import graph_grad
from ._ddp_reuse import mark_again
from ._used_map import declare_unused, marks_hook
from ._views import _ready_event


class BackwardHooks:
    """The backward half of DistributedDataParallel (see the module docstring)."""

    def _zero_unused(self):
        """Before a synced backward begins, with ShardedAdamW / ShardedSGD: the gradients of
        the parameters the forward did not use become zero, unless a no_sync window
        accumulated into them (that sum stays). Without one, torch's meaning: they are reduced
        as they are (zero if p.grad was None), so nothing to do."""
        if self._stepper is None:
            return
        for pid in self._unused:
            if pid not in self._accumulated:
                # The stepper zeroes a bucket after stepping it: wait for that first.
                self._stepper.wait_params(self.reducer.param_bucket(pid))
                self._grads[pid].zero_()

    def _agrees_on_use(self):
        """A synced backward with find_unused_parameters / static_graph and no sharded
        optimizer ends with the used-map agreement (braid/_ddp_grads.py)."""
        return self._find_unused and self._stepper is None and self._armed == "sync"

    def _keep_values(self, pids):
        """Before `pids` are reduced: gradient_as_bucket_view=False keeps copies of their
        values, restored if no rank uses them."""
        if self._agrees_on_use() and not self.gradient_as_bucket_view:
            self._presence.keep([pid for pid in pids if pid not in self._accumulated],
                                self._grads, self._widened)

    def _mark_unhooked(self):
        """End of a synced backward that agrees on use: the parameters reachable from the
        outputs whose hook did not fire (an output the loss ignores; torch's _DDPSink fires
        their hooks with undefined gradients) are reduced as they are, as torch marks them
        with their .grad (zero if None)."""
        for pid in range(len(self._params)):
            if pid not in self._hooked and pid not in self._early:
                self._mark(pid)

    def _mark_unused(self):
        """Start of a synced backward: the parameters the forward did not use are marked ready
        now, so the buckets after them launch as soon as their own gradients are in, not at
        the end of the backward."""
        for pid in self._unused:
            self._mark(pid)
            self._early.add(pid)

    def _mark(self, pid):
        """Marks parameter `pid` ready; CUDA: with an event recorded on the current stream
        after its gradient's last write, which Braid's comm stream waits on (no host wait)."""
        event = None if self._device is None else _ready_event(self._events, pid, self._device)
        self.reducer.mark_ready(pid, event)
        if self._ranges.recording:
            self._ranges.marked(pid)

    def _abandon_backward(self, why):
        """Ends a backward that cannot complete and raises: the reducer is reset, this
        backward's gradients are discarded (zeroed), the next forward starts afresh. Peers
        that completed the backward may have launched reductions this rank did not: a
        failed backward on one rank generally needs all ranks to restart."""
        self._in_backward = False
        if self._armed == "sync":
            self._graph.abandoned([pid for pid in range(len(self._params))
                                   if pid not in self._hooked])
        self._accumulated = set()
        self._bind_all()
        self._presence.drop()
        self._presence.none.clear()  # every p.grad is a zeroed tensor now
        try:
            self._owner().finish_backward()
            detail = ""
        except core.BraidError as e:
            detail = ": " + str(e)
        self._fires.finish(self._armed != "no_sync")  # the reducer counted these marks too
        self._ranges.end()
        if self._stepper is not None:
            self._stepper.wait_all_params()  # then no step touches the buckets
            for view in self._grads:
                view.zero_()
        else:
            self._zero_views()
        raise RuntimeError("%s; Braid ended it and zeroed the gradients%s" % (why, detail))

    def _grad_ready(self, pid, grad_inputs=(), grad_outputs=(None,)):
        # grad_outputs[0]: the gradient AccumulateGrad received; None (undefined: a custom
        # Function returned None) accumulates nothing and is no use (torch's local_used_map).
        got = bool(grad_outputs) and grad_outputs[0] is not None
        try:
            if not self._in_backward:
                # With a sharded optimizer the reducer takes the unreached parameters (it zeroes
                # them and agrees on use); without one they are marked as they are, as before.
                declaring = self._declares and self._stepper is not None
                early = self._armed == "sync" and self._unused and not declaring
                if early:
                    self._zero_unused()
                self._keep_values(self._unused if early else [])
                self._owner().begin_backward(_python_hook.reducer_sync(self, self._armed))
                declared = declare_unused(self.reducer, self._declares, self._armed,
                                          self._unused if declaring else [])
                if self._armed != "no_sync" and self._py_comm_hook is None:
                    # torch profiler ranges of Braid's collectives (braid/_ddp_profile.py)
                    self._ranges.begin(len(self._params))
                self._in_backward = True
                self._finish.queue()  # unless an output's hook queued it
                self._early, self._hooked = set(declared), set()
                self._fires.begin()
                if early:
                    self._mark_unused()
            self._bind_grad(pid)  # an undefined gradient reached it: no tensor hook ran
            p, view = self._params[pid], self._grads[pid]
            if self._armed == "sync":
                self._graph.check_hooked(pid)  # static_graph: a graph that changed
            if pid in self._early:
                raise RuntimeError(
                    "parameter %r received a gradient, but the forward's outputs do not reach "
                    "it, so it was reduced as unused at the start of the backward "
                    "(find_unused_parameters=True: compute every use of a parameter inside "
                    "forward, reachable from its outputs)" % self._names[pid])
            if self._widened[pid]:
                if p.grad is not None:
                    view.add_(p.grad)  # main_grad: widened exactly, summed in f32
                    p.grad = None
                elif got:
                    raise RuntimeError("parameter %r: no gradient at its AccumulateGrad hook"
                                       % self._names[pid])
            elif p.grad is not None and p.grad.requires_grad:
                graph_grad(self, pid, p, view)  # backward(create_graph=True)
            elif p.grad is None or p.grad.data_ptr() != view.data_ptr():
                raise RuntimeError("parameter %d: its .grad was replaced during backward; "
                                   "Braid reduces the bucket view bound at forward" % pid)
            if ((pid not in self._hooked or mark_again(self, pid))  # braid/_ddp_reuse.py
                    and marks_hook(self, got)):  # no gradient: unused here (_used_map.py)
                self._mark(pid)
                self._fires.fired(pid)
            self._hooked.add(pid)
            if got:
                self._presence.none.discard(pid)  # it has a gradient now
                if self._armed == "no_sync":
                    self._accumulated.add(pid)
        except Exception as e:
            if not self._in_backward:
                self._presence.drop()
                raise  # begin_backward itself failed: nothing to end
            # torch runs no queued callback after a hook raised: end the backward here.
            self._abandon_backward(str(e))

    def _finish_backward(self):
        if not self._in_backward:
            return  # an output's hook queued it and no parameter's hook ran (or it ended)
        self._in_backward = False
        self._bind_all()  # then _presence.finish sets None where torch leaves None
        unused = None
        if self._agrees_on_use():
            # torch's local_used_map: a parameter is used where its hook fired (torch fires
            # every hook the outputs reach) and its .grad is defined then.
            unused = ({pid for pid in self._unused if pid not in self._accumulated}
                      | self._presence.none)
        if self._armed == "sync":
            self._graph.end_of_backward([pid for pid in range(len(self._params))
                                         if pid not in self._hooked], self._find_unused)
        if self._agrees_on_use() or (self._armed == "sync" and not self._allow_unused):
            try:  # every bucket completes; the graph check raises at the next forward
                self._mark_unhooked()
            except Exception as e:
                self._abandon_backward(str(e))
        if self._armed != "no_sync":
            self._accumulated = set()
        try:
            self._owner().finish_backward()
            _python_hook.after_finish(self, self._armed)  # a Python comm hook reduces now
            _buffer_hook.wait(self)
        except Exception:
            self._presence.drop()
            raise
        finally:
            self._ranges.end()
        self._fires.finish(self._armed != "no_sync")
        # (the used-map agreement is an all-reduce too, as torch's local_used_map)
        self._presence.finish(self._params, self._grads, self._armed == "sync", unused,
                              self._ranges.backend + ":all_reduce")
        if self._armed == "sync":
            self._rebuild_due = self._rebuild
            self._stepped = True
