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

Host memory only: the modules' parameters and gradients must be CPU tensors, on a host
backend (local, mpi). A World("nccl") with Reducer(device=...) is usable from braid.core with
raw device addresses, but these wrappers do not take CUDA tensors.

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

Memory: each view keeps the Braid object owning its memory alive, and whoever closes that
object (close(), World.close(), interpreter exit) first gives the tensors copies of their
values, so no tensor ever points at freed memory.

Differences from torch DDP: buffers (BatchNorm statistics) are broadcast at construction only
(torch re-broadcasts them every forward by default); parameters no rank used are reduced as
zeros with find_unused_parameters=True (torch leaves their .grad None); reentrant activation
checkpointing is not supported (its inner backward would finish Braid's backward early).
With ShardedAdamW the parameters are Braid's gathered copy: write initial values before
creating it (later writes to p.data are overwritten by the next gather).
"""

import contextlib
import ctypes
import functools
import warnings
import weakref

import torch

from . import core


def _view(owner, address, count, dtype, shape):
    """A tensor over `count` elements of Braid-owned memory at `address` (no copy); it keeps
    `owner` (the core Reducer or Optimizer) alive."""
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    nbytes = count * torch.tensor([], dtype=dtype).element_size()
    raw = (ctypes.c_char * nbytes).from_address(address)
    raw.owner = owner  # the buffer object is what the tensor's storage references
    return torch.frombuffer(raw, dtype=dtype, count=count).view(shape)


def _weak_call(method):
    """A callback calling a bound method only while its object lives (no reference cycle)."""
    ref = weakref.WeakMethod(method)

    def call():
        bound = ref()
        if bound is not None:
            bound()
    return call


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
        self._mode = mode
        self._grads = []
        for pid, p in enumerate(self._params):
            address, count = self.reducer.grad(pid)
            self._grads.append(_view(self.reducer, address, count, p.dtype, p.shape))
        self.reducer.zero_grads()
        for p, view in zip(self._params, self._grads):
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view
        # Keep the AccumulateGrad nodes alive: a node dropped by autograd would lose its hook.
        self._grad_accs, self._hooks = [], []
        for pid, p in enumerate(self._params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(acc.register_hook(functools.partial(self._grad_ready, pid)))
            self._grad_accs.append(acc)
        self._sync = "sync"          # the sync mode of forwards run now
        self._armed = "sync"         # the sync mode the next backward uses
        self._in_backward = False
        self._stepper = None         # the braid.core.Optimizer of a ShardedAdamW, if any
        self._warned_unreduced = False
        self.reducer.before_close.append(_weak_call(self._detach_grads))

    def close(self):
        """Unhooks the module, gives the gradients their own memory (copies) and frees the
        reducer: `module` is a plain torch module again. Close a ShardedAdamW on this model
        first."""
        if self._stepper is not None:
            raise RuntimeError("close the ShardedAdamW of this model first")
        self.reducer.close()  # runs _detach_grads first

    def _detach_grads(self):
        """Before the reducer's memory goes (whoever closes it): unhook, copy gradients."""
        for h in self._hooks:
            h.remove()
        self._hooks, self._grad_accs = [], []
        for p, view in zip(self._params, self._grads):
            if p.grad is not None and p.grad.data_ptr() == view.data_ptr():
                p.grad = p.grad.clone()
        self._grads = []

    def _broadcast_state(self):
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        for g in self._groups:  # hybrid: shard group, then replica group: rank 0's everywhere
            for t in tensors:
                g.broadcast(t.data, root=0).wait()

    def forward(self, *args, **kwargs):
        if self._in_backward:
            self._abandon_backward("the previous backward did not finish (an exception in "
                                   "backward or in a hook)")
        if torch.is_grad_enabled():
            self._armed = self._sync
            self._rebind_grads()
        return self.module(*args, **kwargs)

    def _owner(self):
        return self._stepper if self._stepper is not None else self.reducer

    def _abandon_backward(self, why):
        """Ends a backward that cannot complete and raises: the reducer is reset, this
        backward's gradients are discarded (zeroed), the next forward starts afresh. Peers
        that completed the backward may have launched reductions this rank did not: a
        failed backward on one rank generally needs all ranks to restart."""
        self._in_backward = False
        try:
            self._owner().finish_backward()
            detail = ""
        except core.BraidError as e:
            detail = ": " + str(e)
        if self._stepper is not None:
            self._stepper.wait_all_params()  # then no step touches the buckets
            for view in self._grads:
                view.zero_()
        else:
            self.reducer.zero_grads()
        raise RuntimeError("%s; Braid ended it and zeroed the gradients%s" % (why, detail))

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
        stale = [(p, view) for p, view in zip(self._params, self._grads)
                 if p.grad is None or p.grad.data_ptr() != view.data_ptr()]
        if stale and self._stepper is not None:
            self._stepper.wait_all_params()  # the stepper may still be zeroing those buckets
        for p, view in stale:
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)
            p.grad = view

    def _grad_ready(self, pid, *unused):
        if not self._in_backward:
            self._owner().begin_backward(self._armed)
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        try:
            p, view = self._params[pid], self._grads[pid]
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                raise RuntimeError("parameter %d: its .grad was replaced during backward; "
                                   "Braid reduces the bucket view bound at forward" % pid)
            self.reducer.mark_ready(pid)
        except Exception as e:
            # torch runs no queued callback after a hook raised: end the backward here.
            self._abandon_backward(str(e))

    def _finish_backward(self):
        self._in_backward = False
        self._owner().finish_backward()
        if self._stepper is None and self._mode != "allreduce" and not self._warned_unreduced:
            self._warned_unreduced = True
            warnings.warn("mode %r without ShardedAdamW: param.grad holds this rank's local "
                          "(unreduced) gradients; the reduced shards are in "
                          "reducer.shard(bucket)" % self._mode)


class _ShardedOptimizer:
    """Braid's sharded optimizer over a DistributedDataParallel in "reduce_scatter" or "hybrid"
    mode: each rank keeps f32 master weights and state for its shard only, steps each bucket
    as soon as its reduction completes (overlap=True) and all-gathers the updated parameters.
    Parameters' data become views over the gathered values (read them after synchronize();
    the model's forward waits by itself). Not a torch.optim.Optimizer (no param_groups, so no
    torch LR schedulers): change the rate with set_lr()."""

    def __init__(self, ddp, overlap, lr, **options):
        if ddp._stepper is not None:
            raise ValueError("this DistributedDataParallel already has a sharded optimizer")
        self.ddp = ddp
        self.optimizer = core.Optimizer(ddp.reducer, lr=lr, overlap=overlap, **options)
        self._overlap, self._lr = overlap, lr
        params = ddp._params
        for pid, p in enumerate(params):
            self.optimizer.set_param(pid, p.data.contiguous())
        self.optimizer.wait_all_params()
        for pid, p in enumerate(params):
            address, count = self.optimizer.param(pid)
            p.data = _view(self.optimizer, address, count, p.dtype, p.shape)
        self.optimizer.before_close.append(_weak_call(self._detach_params))
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

    def _detach_params(self):
        """Before the optimizer's memory goes (whoever closes it): unhook the forwards, give
        the parameters copies of their values."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        try:
            self.optimizer.wait_all_params()
        finally:
            for p in self.ddp._params:
                p.data = p.data.clone()
            if self.ddp._stepper is self.optimizer:
                self.ddp._stepper = None

    def close(self):
        """Unhooks the model's forwards, gives the parameters their own memory (copies) and
        frees the optimizer; the model keeps training with a torch optimizer after this."""
        self.optimizer.close()  # runs _detach_params first


class ShardedAdamW(_ShardedOptimizer):
    """Sharded AdamW: torch.optim.AdamW's math (decoupled weight decay, amsgrad off), plus
    optional exact global-norm clipping (max_grad_norm) and skipping non-finite steps."""

    def __init__(self, ddp, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 max_grad_norm=0.0, skip_nonfinite=False, overlap=True, threads=1,
                 timeout_ms=300000):
        super().__init__(ddp, overlap, lr, kind="adamw", betas=betas, eps=eps,
                         weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                         skip_nonfinite=skip_nonfinite, threads=threads, timeout_ms=timeout_ms)


class ShardedSGD(_ShardedOptimizer):
    """Sharded SGD: torch.optim.SGD's math (dampening 0) with momentum and nesterov."""

    def __init__(self, ddp, lr, momentum=0.0, nesterov=False, weight_decay=0.0,
                 max_grad_norm=0.0, skip_nonfinite=False, overlap=True, threads=1,
                 timeout_ms=300000):
        super().__init__(ddp, overlap, lr, kind="sgd", momentum=momentum, nesterov=nesterov,
                         weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                         skip_nonfinite=skip_nonfinite, threads=threads, timeout_ms=timeout_ms)
