"""The CUDA side of a fully sharded model (braid/fsdp.py) on a World("nccl"): streams, events
and allocator safety between torch's current stream and Braid's streams.

    dev = device_placement(named_tensors, groups, "FullyShardedDataParallel")  # None: host
    cuda = DeviceUnits(dev, reducer, offload)   # after the device reducer (host: HostUnits())
    opt = core.Optimizer(reducer, ..., **cuda.optimizer_options())  # gathers on cuda's stream
    cuda.order_gathers(); opt.unit_enter(u, phase)   # and before unit_exit, summon_params
    cuda.mark_grad(reducer, pid, grad)               # in the AccumulateGrad hook

Contract (torch's stream semantics, docs/design/pytorch.md "Fully sharded on CUDA"):
  - Gathers and prefetches run on `gather_stream`, a torch.cuda.Stream of the engine (the
    optimizer's gather_stream). unit_enter returns once its unit's gathers completed on the
    device (the host observed their events), so work queued after it on any stream reads the
    gathered values; the prefetch of the next unit keeps running on gather_stream meanwhile.
  - A gathered unit lives in Braid's pooled memory (not torch's caching allocator): a later
    gather may reuse a released unit's buffer. order_gathers() makes gather_stream wait for
    everything queued so far on the current stream (readers of a unit about to be released;
    writers of shards a torch optimizer stepped, which the next gather reads), and is called
    before every call that may launch or release a gather.
  - Gradients: the AccumulateGrad hook's gradient (torch's caching allocator, current stream)
    goes to mark_ready_grad with a torch.cuda.Event recorded after it on the current stream;
    Braid's comm stream waits on it and copies the gradient into its bucket, and the tensor is
    record_stream()ed on that stream (braid_reducer_grad_stream), so torch does not hand its
    memory to another tensor before the copy ran. Reads of Braid's reduced shards by torch
    (local pieces' p.grad) are ordered before Braid's next writes by reads_done().
  - Closing (the optimizer's close(), the engine's, dropping local pieces) frees Braid's memory
    right away: settle() drains torch's current stream first, so copies of it are complete.
  - offload (CPUOffloadPolicy): the sharded optimizer keeps master weights and moments in host
    memory and steps them with the CPU kernel as each bucket's reduction completes (the
    optimizer's offload); only ShardedAdamW / ShardedSGD do, so a backward over local pieces
    (a torch optimizer, or none) with offload raises.
"""

import torch

from ._views import _device_of, _ready_event


def device_placement(named, groups, what):
    """None for a module on the host (host backends), else its CUDA device index; ValueError
    naming a parameter on a device that does not match the groups' world."""
    device = _device_of(named, what)
    first = named[0][0] if named else "?"
    for g in groups:
        if device is not None and not g.device_memory:
            raise ValueError(
                "%s: parameter %r is on cuda:%d but group %r is on a %r world, whose "
                "collectives read host memory; CUDA modules need World('nccl') (one rank per "
                "process and GPU)" % (what, first, device, g.name, g._world.backend))
        if device is None and g.device_memory:
            raise ValueError(
                "%s: parameter %r is a CPU tensor but group %r is on an nccl world, whose "
                "collectives read device memory; move the module to its GPU (module.cuda()) "
                "or use a host backend" % (what, first, g.name))
    return device


class HostUnits:
    """The same calls for a host module: nothing to order (host operations are done when they
    return); gradients are copied in by mark_ready_grad before it returns."""

    def optimizer_options(self, kind="adamw"):
        return {}

    def order_gathers(self):
        pass

    def mark_grad(self, reducer, pid, grad):
        reducer.mark_ready_grad(pid, grad)

    def reads_done(self):
        pass

    def check_local(self):
        pass  # offload on the host is a no-op (everything is in host memory)

    def settle(self):
        pass


class DeviceUnits:
    """The engine's CUDA state (see the module docstring)."""

    def __init__(self, device, reducer, offload):
        self.device = device
        self.offload = bool(offload)
        where = torch.device("cuda", device)
        self.gather_stream = torch.cuda.Stream(where)
        # Braid's stream that reads mark_ready_grad's gradients and writes the reduced shards.
        self.grad_stream = torch.cuda.ExternalStream(reducer.grad_stream(), device=where)
        self._events = {}

    def optimizer_options(self, kind="adamw"):
        """core.Optimizer keywords: gathers on gather_stream; offload for a stepping kind."""
        options = {"gather_stream": self.gather_stream.cuda_stream}
        if self.offload and kind != "none":
            options["offload"] = True
        return options

    def order_gathers(self):
        """gather_stream waits for what torch queued so far on the current stream."""
        self.gather_stream.wait_stream(torch.cuda.current_stream(self.device))

    def mark_grad(self, reducer, pid, grad):
        """Hands `grad` (contiguous, on the device) to Braid after its writes on the current
        stream, keeping its memory from reuse until Braid's stream has copied it."""
        event = _ready_event(self._events, pid, self.device)
        reducer.mark_ready_grad(pid, grad, event)
        grad.record_stream(self.grad_stream)

    def reads_done(self):
        """Braid's stream waits for torch's reads of the reduced shards queued so far."""
        self.grad_stream.wait_stream(torch.cuda.current_stream(self.device))

    def settle(self):
        """Before Braid frees memory torch may still read (closing): torch's current stream
        and the gather stream drained (teardown only, never on the hot path)."""
        torch.cuda.current_stream(self.device).synchronize()
        self.gather_stream.synchronize()

    def check_local(self):
        """A backward over local pieces (no sharded optimizer) with offload: refused."""
        if self.offload:
            raise RuntimeError(
                "offload_policy=CPUOffloadPolicy(): only ShardedAdamW / ShardedSGD step "
                "offloaded shards (master weights and moments in host memory, CPU kernel); "
                "build one over model.parameters() before the first backward, or drop the "
                "offload policy to train with a torch optimizer over the device pieces")
