"""Parameters written by the user while a ZeRO-2 sharded optimizer owns them.

Under ShardedAdamW / ShardedSGD over DistributedDataParallel (reduce_scatter / hybrid), each
parameter's data is a view over Braid's gathered values, and the step starts from this rank's
f32 master weights. A write to a parameter (model.load_state_dict(pretrained) after the
optimizer exists, torch.nn.init.*, p.data.copy_(...)) must become the new master weights, as
torch's optimizer would step from the written value; otherwise the next gather silently
reverts it. WriteTracker records each parameter's autograd version counter (bumped by every
in-place write through the parameter) and, at the points the optimizer checks (each forward
of the wrapper, step() without overlap, synchronize()), lists the parameters written since;
the optimizer hands those to braid_optimizer_adopt_param (0.10) (AdoptsWrites, a mixin of
_ShardedOptimizer providing _adopt_writes / _refuse_late_writes over its _writes, optimizer,
ddp and _names).

    tracker = WriteTracker(ddp._params)   # classes switched, versions recorded
    ...                                   # the user writes some parameters
    for pid in tracker.changed(): optimizer.adopt_param(pid)
    tracker.record()

p.data returns a fresh tensor with its own version counter in torch, so a write through
p.data would go unseen: the parameters' class becomes ShardedParameter, whose `data` is
p.detach() (same memory, same version counter); setting p.data is unchanged. Its other
behaviour is torch.nn.Parameter's (no __torch_function__: no cost in the forward).
"""

import torch

_TENSOR_DATA = torch._C._TensorBase.data


class ShardedParameter(torch.nn.Parameter):
    """The class of a ZeRO-2 sharded optimizer's parameters: a torch.nn.Parameter whose
    p.data shares the parameter's version counter, so writes through it are seen (module
    docstring). Back to torch.nn.Parameter when the optimizer closes."""

    @property
    def data(self):
        return self.detach()

    @data.setter
    def data(self, value):
        _TENSOR_DATA.__set__(self, value)

    def __deepcopy__(self, memo):
        """A copy is a plain torch.nn.Parameter (it is not Braid's)."""
        if id(self) not in memo:
            memo[id(self)] = torch.nn.Parameter(
                self.detach().clone(memory_format=torch.preserve_format), self.requires_grad)
        return memo[id(self)]


class WriteTracker:
    """The version counters of `params` (a list of torch.nn.Parameter), recorded at record();
    changed() lists the indices written since."""

    def __init__(self, params):
        self._params = list(params)
        for p in self._params:
            if type(p) is torch.nn.Parameter:  # noqa: E721 (exactly: leave other classes be)
                p.__class__ = ShardedParameter
        self._versions = []
        self.record()

    def record(self):
        self._versions = [p._version for p in self._params]

    def changed(self):
        return [pid for pid, (p, v) in enumerate(zip(self._params, self._versions))
                if p._version != v]

    def close(self):
        """The parameters become plain torch.nn.Parameters again."""
        for p in self._params:
            if type(p) is ShardedParameter:  # noqa: E721
                p.__class__ = torch.nn.Parameter


class AdoptsWrites:
    """Mixin of _ShardedOptimizer: what it does with the writes WriteTracker sees."""

    def _adopt_writes(self):
        """Parameters written in place since the last check become this rank's master weights
        (braid_optimizer_adopt_param), so the next step starts from them as torch's would."""
        if self._writes is None:
            return
        changed = self._writes.changed()
        if not changed:
            return
        if self.ddp._device is not None:  # torch's writes are queued on its current stream
            torch.cuda.current_stream(self.ddp._device).synchronize()
        for pid in changed:
            self.optimizer.adopt_param(pid)
        self._writes.record()

    def _refuse_late_writes(self):
        """At step() of a step already taken (during the backward with overlap, or in
        clip_grad_norm_): a parameter written since the forward was stepped from its old
        value, and its gather may have overwritten the write."""
        changed = self._writes.changed() if self._writes is not None else []
        if changed:
            self._writes.record()
            raise RuntimeError(
                "%s.step(): parameter %r was written after the forward (between backward and "
                "step()?); Braid had already stepped it (during the backward with overlap=True, "
                "or in clip_grad_norm_), so the write may have been overwritten by the step's "
                "all-gather: write parameters after step() (or before the forward)" %
                (type(self).__name__, self._names[changed[0]]))
