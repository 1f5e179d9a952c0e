"""Custom Python communication hooks for braid.pytorch.DistributedDataParallel, with torch
DDP's meaning (torch 1.13's register_comm_hook with a Python callable):

    def hook(state, bucket):                      # bucket: a GradBucket (below)
        fut = dist.all_reduce(bucket.buffer().div_(2), group=state, async_op=True)
        return fut.get_future().then(lambda f: f.value()[0])
    model.register_comm_hook(torch_group, hook)   # any callable Braid does not run itself

Contract:
  - the reducer reduces nothing itself then: every backward runs it as a no_sync backward
    (the gradients stay local in Braid's buckets); at the end of each synced backward the
    hook is called once per bucket, in bucket index order on every rank (the rank-consistent
    order of the collectives it issues), all buckets' hooks before the first wait, as torch
    launches them before it finalizes; then each future is waited for (the wrapper's
    timeout_ms as deadline) and its value, a tensor (or a list whose first item is one) of
    the bucket's element count, is copied into the bucket's gradients: the hook's result is
    the reduced gradient, with no division by Braid (torch's hooks divide themselves);
  - no_sync backwards run no hook (the next synced one passes the accumulated sum), as torch;
  - GradBucket: torch's dist.GradBucket methods index(), buffer() (one flat tensor of the
    bucket's gradients, the parameters in registration order), gradients() (views of
    buffer() shaped as the parameters), parameters(), is_last(), set_buffer(tensor);
  - errors name the hook and the bucket (a raise, a non-Future, a failed or late future, a
    result of the wrong size); the buckets from the failing one on are left with this rank's
    local, unreduced gradients, which the message says: nothing is reported reduced that was
    not;
  - allreduce mode with a torch optimizer only (ShardedAdamW / ShardedSGD, reduce_scatter /
    hybrid and join() are refused by name).
"""

import time

import torch


class GradBucket:
    """torch's dist.GradBucket for one of Braid's buckets (see the module docstring)."""

    def __init__(self, index, num_buckets, params, grads):
        self._index, self._last = index, index == num_buckets - 1
        self._params = params
        self._buffer = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.empty(0)
        self._shapes = [g.shape for g in grads]

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def buffer(self):
        return self._buffer

    def set_buffer(self, buffer):
        self._buffer = buffer

    def parameters(self):
        return list(self._params)

    def gradients(self):
        out, offset = [], 0
        for shape in self._shapes:
            n = shape.numel()
            out.append(self._buffer[offset:offset + n].view(shape))
            offset += n
        return out


def hook_name(hook):
    return getattr(hook, "__qualname__", None) or type(hook).__name__


class PythonCommHook:
    """The registered hook of one wrapper: `run(ddp)` at the end of a synced backward."""

    def __init__(self, state, hook, timeout_s):
        self.state, self.hook, self.timeout_s = state, hook, timeout_s
        self.name = hook_name(hook)
        self._buckets = None  # [[pid, ...] per bucket], cached until the buckets are re-planned

    def replanned(self):
        self._buckets = None

    def buckets(self, reducer, count):
        if self._buckets is None:
            per = [[] for _ in range(reducer.num_buckets)]
            for pid in range(count):
                per[reducer.param_bucket(pid)].append(pid)
            self._buckets = per
        return self._buckets

    def run(self, ddp):
        """Calls the hook on every bucket of `ddp` and writes each result into its bucket."""
        buckets = self.buckets(ddp.reducer, len(ddp._params))
        launched = []
        for index, pids in enumerate(buckets):
            bucket = GradBucket(index, len(buckets), [ddp._params[p] for p in pids],
                                [ddp._grads[p] for p in pids])
            try:
                fut = self.hook(self.state, bucket)
            except Exception as e:
                raise self._error(index, len(buckets), "raised %s: %s" % (type(e).__name__, e))
            if not isinstance(fut, torch._C.Future):  # torch.futures.Future, or then()'s
                raise self._error(index, len(buckets), "returned %s, not a "
                                  "torch.futures.Future" % type(fut).__name__)
            launched.append((index, pids, fut))
        deadline = time.monotonic() + self.timeout_s
        for index, pids, fut in launched:
            value = self._wait(fut, deadline, index, len(buckets))
            grads = [ddp._grads[p] for p in pids]
            total = sum(g.numel() for g in grads)
            if not isinstance(value, torch.Tensor) or value.numel() != total:
                raise self._error(index, len(buckets), "its future's value is %s; expected a "
                                  "tensor of the bucket's %d elements (or a list whose first "
                                  "item is one)" % (_describe(value), total))
            flat, offset = value.reshape(-1), 0
            with torch.no_grad():
                for g in grads:
                    g.copy_(flat[offset:offset + g.numel()].view(g.shape))
                    offset += g.numel()

    def _wait(self, fut, deadline, index, count):
        pause = 5e-5
        while not fut.done():
            if time.monotonic() > deadline:
                raise self._error(index, count, "its future did not complete within %g s "
                                  "(timeout_ms)" % self.timeout_s)
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        try:
            value = fut.value()
        except Exception as e:
            raise self._error(index, count, "its future failed: %s: %s" % (type(e).__name__, e))
        if isinstance(value, (list, tuple)) and value:
            value = value[0]  # torch's parseHookResult: a list of one tensor
        return value

    def _error(self, index, count, what):
        return RuntimeError(
            "register_comm_hook: the Python hook %s on bucket %d of %d %s; buckets %d to %d "
            "hold this rank's local, unreduced gradients" % (self.name, index, count, what,
                                                             index, count - 1))


def _describe(value):
    if isinstance(value, torch.Tensor):
        return "a tensor of %d elements" % value.numel()
    return "a %s" % type(value).__name__


def check_model(ddp, hook):
    """Refuses (ValueError naming the hook) what a Python hook cannot serve."""
    why = None
    if ddp._mode != "allreduce":
        why = "mode=%r (a Python hook sees whole buckets: mode='allreduce' only)" % ddp._mode
    elif ddp._stepper is not None:
        why = "a ShardedAdamW / ShardedSGD steps this model (use a torch optimizer)"
    elif ddp._join is not None:
        why = "inside join()"
    if why is not None:
        raise ValueError("register_comm_hook(%s): Braid runs a Python hook with mode="
                         "'allreduce' and a torch optimizer, outside join(); here: %s"
                         % (hook_name(hook), why))


def reducer_sync(ddp, armed):
    """The sync mode braid's reducer runs a backward armed `armed` in: no_sync under a Python
    hook (the hook reduces at the end), else `armed`. Refuses a sharded optimizer added
    after the hook."""
    hook = getattr(ddp, "_py_comm_hook", None)
    if hook is None:
        return armed
    if ddp._stepper is not None:
        raise RuntimeError("register_comm_hook(%s): a ShardedAdamW / ShardedSGD was created on "
                           "this model after the Python hook; Braid runs Python hooks with "
                           "torch optimizers only" % hook.name)
    return "no_sync"


def after_finish(ddp, armed):
    """End of a backward, after the reducer's finish: a synced one runs the Python hook."""
    hook = getattr(ddp, "_py_comm_hook", None)
    if hook is not None and armed == "sync":
        hook.run(ddp)


def refuse_join(ddp):
    """join() under a Python hook: refused (the joined ranks' shadow reductions are Braid's
    collectives, which the active ranks' hook would not match)."""
    hook = getattr(ddp, "_py_comm_hook", None)
    if hook is not None:
        raise ValueError("join(): this model reduces with the Python comm hook %s; Braid's "
                         "join() shadows Braid's own reductions only (register no hook, or one "
                         "of braid.comm_hooks' built-ins)" % hook.name)
