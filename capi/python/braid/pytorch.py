"""PyTorch on Braid: DistributedDataParallel over Braid's reducer, and Braid's sharded AdamW.

    world = braid.World("mpi")                       # one process per rank, under mpirun
    model = DistributedDataParallel(net, world.group())          # like torch DDP (all-reduce)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in data:
        loss_fn(model(x), y).backward()              # gradients averaged when backward returns
        opt.step(); opt.zero_grad()

    model = DistributedDataParallel(net, g, mode="reduce_scatter")      # ZeRO-2 style
    opt = ShardedAdamW(model, lr=1e-3)               # Braid steps each shard as it arrives
    for x, y in data:
        loss_fn(model(x), y).backward(); opt.step()  # step(): no-op with overlap (the default)

How it is wired (torch 1.13, CPU):
  - every trainable parameter is registered with the reducer (id = its index in
    module.parameters()); `param.grad` is a tensor over the reducer's bucket storage
    (torch.frombuffer), so autograd accumulates straight into the buckets: no copies;
  - a hook on each parameter's AccumulateGrad node marks it ready; the first hook of a
    backward begins Braid's backward, and an autograd final callback finishes it, so the
    reduction (and, with ShardedAdamW, the step) is complete or under way when backward()
    returns;
  - no_sync(): the forward passes run inside it have their backward accumulate locally;
  - ShardedAdamW: parameter data become views over the optimizer's gathered parameters; a
    forward pre-hook on each module waits for the buckets holding its own parameters, so the
    all-gather of late buckets overlaps the forward of early layers.
Gradient views stay bound: zero_grad() zeroes them in place (set_to_none is ignored), and a
gradient the caller replaced or set to None is copied back (or zeroed) at the next forward.
"""

import contextlib
import ctypes
import functools

import torch

from . import core


def _view(address, count, dtype, shape):
    """A tensor over `count` elements of Braid-owned memory at `address` (no copy). The owner
    (reducer or optimizer) must outlive it: DistributedDataParallel keeps both alive."""
    nbytes = count * torch.tensor([], dtype=dtype).element_size()
    raw = (ctypes.c_char * nbytes).from_address(address)
    return torch.frombuffer(raw, dtype=dtype, count=count).view(shape)


class DistributedDataParallel(torch.nn.Module):
    """Wraps `module`: its gradients are reduced by Braid across `group`.

    mode: "allreduce" (every rank gets every averaged gradient, like torch DDP),
          "reduce_scatter" (each rank gets its averaged shard; use with ShardedAdamW) or
          "hybrid" (reduce-scatter in `group`, all-reduce across `replica_group`; HSDP).
    Parameters and buffers are broadcast from rank 0 at construction, like torch DDP.
    """

    def __init__(self, module, group, mode="allreduce", replica_group=None, bucket_cap_mb=25.0,
                 first_bucket_cap_mb=1.0, find_unused_parameters=False, reduce_dtype=None,
                 broadcast_from_rank0=True, timeout_ms=300000, timeline_prefix=None):
        super().__init__()
        self.module = module
        self._groups = [g for g in (group, replica_group) if g is not None]
        if broadcast_from_rank0:
            self._broadcast_state()
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._params = [p for _, p in named]
        self.reducer = core.Reducer(
            group, [(i, p.numel(), p.dtype, n) for i, (n, p) in enumerate(named)],
            replica=replica_group, mode=mode, bucket_cap_mb=bucket_cap_mb,
            first_bucket_cap_mb=first_bucket_cap_mb, allow_unused=find_unused_parameters,
            reduce_dtype=reduce_dtype, timeout_ms=timeout_ms, timeline_prefix=timeline_prefix)
        self._grads = []
        for pid, p in enumerate(self._params):
            address, count = self.reducer.grad(pid)
            self._grads.append(_view(address, count, p.dtype, p.shape))
        self.reducer.zero_grads()
        for p, view in zip(self._params, self._grads):
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view
        # Keep the AccumulateGrad nodes alive: a node dropped by autograd would lose its hook.
        self._grad_accs = []
        for pid, p in enumerate(self._params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(functools.partial(self._grad_ready, pid))
            self._grad_accs.append(acc)
        self._sync = "sync"          # the sync mode of forwards run now
        self._armed = "sync"         # the sync mode the next backward uses
        self._in_backward = False
        self._stepper = None         # the braid.core.Optimizer of a ShardedAdamW, if any

    def close(self):
        """Gives the gradients their own memory back (clones) and frees the reducer. Close a
        ShardedAdamW on this model first."""
        if self._stepper is not None:
            raise RuntimeError("close the ShardedAdamW of this model first")
        for p in self._params:
            if p.grad is not None:
                p.grad = p.grad.clone()
        self._grads = []
        self.reducer.close()

    def _broadcast_state(self):
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        for g in self._groups:  # hybrid: shard group, then replica group: rank 0's everywhere
            for t in tensors:
                g.broadcast(t.data, root=0).wait()

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():
            self._armed = self._sync
            self._rebind_grads()
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self, mode="no_sync"):
        """Forwards run inside accumulate their gradients locally (mode "no_sync"), or, in
        hybrid mode, reduce-scatter them now and all-reduce at the next synced backward
        (mode "reduce_scatter_only"). The first forward after the block syncs everything."""
        if mode not in ("no_sync", "reduce_scatter_only"):
            raise ValueError("no_sync mode %r: no_sync or reduce_scatter_only" % (mode,))
        previous, self._sync = self._sync, mode
        try:
            yield
        finally:
            self._sync = previous

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place (the views stay bound; set_to_none is ignored). With
        ShardedAdamW, waits for the parameters instead: Braid zeroes each bucket itself after
        stepping it."""
        if self._stepper is not None:
            self._stepper.wait_all_params()
        else:
            self.reducer.zero_grads()

    def _rebind_grads(self):
        for p, view in zip(self._params, self._grads):
            g = p.grad
            if g is None:
                view.zero_()
            elif g.data_ptr() != view.data_ptr():
                view.copy_(g)
            else:
                continue
            p.grad = view

    def _grad_ready(self, pid, *unused):
        if not self._in_backward:
            owner = self._stepper if self._stepper is not None else self.reducer
            owner.begin_backward(self._armed)
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        p, view = self._params[pid], self._grads[pid]
        if p.grad is None or p.grad.data_ptr() != view.data_ptr():
            raise RuntimeError("parameter %d: its .grad was replaced during backward; Braid "
                               "reduces the bucket view bound at forward" % pid)
        self.reducer.mark_ready(pid)

    def _finish_backward(self):
        self._in_backward = False
        owner = self._stepper if self._stepper is not None else self.reducer
        owner.finish_backward()


class ShardedAdamW:
    """Braid's sharded AdamW (torch.optim.AdamW's math, amsgrad off) over a
    DistributedDataParallel in "reduce_scatter" or "hybrid" mode: each rank keeps f32 master
    weights and moments for its shard only, steps each bucket as soon as its reduction
    completes (overlap=True) and all-gathers the updated parameters. Parameters' data become
    views over the gathered values (read them after synchronize(); the model's forward waits
    by itself)."""

    def __init__(self, ddp, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 max_grad_norm=0.0, skip_nonfinite=False, overlap=True, threads=1,
                 timeout_ms=300000):
        if ddp._stepper is not None:
            raise ValueError("this DistributedDataParallel already has a sharded optimizer")
        self.ddp = ddp
        self.optimizer = core.Optimizer(
            ddp.reducer, kind="adamw", lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
            max_grad_norm=max_grad_norm, skip_nonfinite=skip_nonfinite, overlap=overlap,
            threads=threads, timeout_ms=timeout_ms)
        self._overlap = overlap
        self._lr = lr
        params = ddp._params
        for pid, p in enumerate(params):
            self.optimizer.set_param(pid, p.data.contiguous())
        self.optimizer.wait_all_params()
        for pid, p in enumerate(params):
            address, count = self.optimizer.param(pid)
            p.data = _view(address, count, p.dtype, p.shape)
        self._hooks = []
        reducer = ddp.reducer
        index = {id(p): pid for pid, p in enumerate(params)}
        for m in ddp.module.modules():
            buckets = sorted({reducer.param_bucket(index[id(p)])
                              for p in m.parameters(recurse=False) if id(p) in index})
            if buckets:
                self._hooks.append(m.register_forward_pre_hook(
                    functools.partial(self._wait_buckets, buckets)))
        ddp._stepper = self.optimizer

    def _wait_buckets(self, buckets, *unused):
        for b in buckets:
            self.optimizer.wait_params(b)

    @property
    def lr(self):
        return self._lr

    def set_lr(self, lr):
        """Learning rate from the next step on."""
        self.optimizer.set_lr(lr)
        self._lr = lr

    def step(self):
        """overlap=True: nothing to do (each bucket was stepped when its reduction completed).
        overlap=False: steps every bucket of the finished backward and starts the gathers."""
        if not self._overlap:
            self.optimizer.step()

    def zero_grad(self, set_to_none=False):
        """Nothing to do: Braid zeroes each bucket after stepping it."""

    def synchronize(self):
        """Waits until every step and all-gather in flight completed (parameters readable)."""
        self.optimizer.wait_all_params()

    def last_step(self):
        return self.optimizer.last_step()

    def save(self, path):
        """This rank's optimizer state (master weights, moments, step counts) to `path`."""
        self.optimizer.save(path)

    def load(self, path):
        """Collective: restores a state saved by the same plan, world and rank; the parameters
        are re-gathered from it."""
        self.optimizer.load(path)
        self.optimizer.wait_all_params()

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.ddp._stepper is self.optimizer:
            # Detach the parameters from Braid's memory before it is freed.
            self.optimizer.wait_all_params()
            for p in self.ddp._params:
                p.data = p.data.clone()
            self.ddp._stepper = None
        self.optimizer.close()
