"""FullyShardedDataParallel's backward side (braid.fsdp), a mixin of that class: the root's
and each unit's pre-backward hooks (the first begins the backward on the optimizer and queues
its end), the AccumulateGrad hooks that hand each gradient to Braid and exit a unit once its
last parameter was marked (_grad_ready), the end-of-backward callback (_finish_backward) and
the path that abandons a backward which cannot complete (_abandon_backward: every unit
released, the optimizer's backward finished, an error naming why).

    class FullyShardedDataParallel(UnitBackward, torch.nn.Module, ...):  # fsdp.py

It reads and writes the wrapper's state set up in its constructor and forward
(docs/design/pytorch.md, "Fully sharded"); nothing here is public.
"""

import torch

from . import core
from ._ddp_reuse import fired_twice_fully_sharded
from ._fsdp_params import _TENSOR_GRAD

ROOT = 0  # the root unit: the wrapped module's parameters that no unit holds


class UnitBackward:
    """The backward half of FullyShardedDataParallel (see the module docstring)."""

    def _begin_backward(self):
        if self._in_backward:
            return
        self._opt.begin_backward(self._armed)
        self._in_backward = True
        if self._local is not None:
            self._cuda.check_local()
            self._local.stash_grads()
        self._unmarked = {u: set(pids) for u, pids in enumerate(self._unit_params) if pids}
        torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        if self._root_kept:
            # The root unit is still gathered from its forward (entered, never exited there):
            # entering it for backward now, out of the reverse order, is allowed for a gathered
            # unit, and its exit at the end of the backward ends its forward use too.
            self._root_kept = False
            self._enter(ROOT, "backward")

    def _root_pre_backward(self, grad):
        try:
            self._begin_backward()
        except Exception as e:  # pylint: disable=broad-except
            self._abandon_backward(str(e))

    def _unit_pre_backward(self, unit, grad):
        try:
            self._begin_backward()
            if unit not in self._entered:
                self._enter(unit, "backward")
        except Exception as e:  # pylint: disable=broad-except
            self._abandon_backward(str(e))

    def _grad_ready(self, pid, *unused):
        try:
            self._begin_backward()
            unit = self._unit_of[pid]
            pending = self._unmarked[unit]
            if pid not in pending:  # its hook fired again (reentrant checkpoint: _ddp_reuse.py)
                if not self._marks_counted:
                    raise fired_twice_fully_sharded(self._names[pid])
            elif unit not in self._entered:  # no gradient reached its outputs' hooks first
                self._enter(unit, "backward")
            p = self._params[pid]
            g = _TENSOR_GRAD.__get__(p)  # not the property: its guard is for users
            if g is None:
                raise RuntimeError("parameter %r: no gradient at its AccumulateGrad hook" %
                                   self._names[pid])
            if self._join is not None and self._join.shadowing:
                g = torch.zeros_like(g)  # a joined rank's replayed step contributes zeros
            self._cuda.mark_grad(self.reducer, pid, self._cast.grad(pid, g.detach()).contiguous())
            p.grad = None  # Braid copied it: the full-size gradient is freed now
            pending.discard(pid)
            if not pending and unit != ROOT:
                self._exit(unit, "backward")
        except Exception as e:  # pylint: disable=broad-except
            # torch runs no queued callback after a hook raised: end the backward here.
            self._abandon_backward(str(e))

    def _finish_backward(self):
        self._in_backward = False
        # Units with unmarked (unused) parameters, and the root, end their backward here.
        self._exit_all("backward")
        self._opt.finish_backward()
        if self._local is not None:
            if self._armed == "sync":
                self._local.collect_grads()
                self._cuda.reads_done()  # the copies above, before Braid's next writes
            else:
                self._local.restore_grads()

    def _abandon_backward(self, why):
        """Ends a backward that cannot complete and raises (see DistributedDataParallel)."""
        self._in_backward = False
        detail = ""
        try:
            self._exit_all("backward")
            self._exit_all("forward")
            self._root_kept = False
            self._kept = []
            self._opt.finish_backward()
        except core.BraidError as e:
            detail = ": " + str(e)
        if self._local is not None:
            self._local.restore_grads()
        raise RuntimeError("%s; Braid ended the backward%s" % (why, detail))
