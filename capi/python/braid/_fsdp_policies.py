"""FSDP2's policies for braid.fully_shard: MixedPrecisionPolicy, OffloadPolicy and
CPUOffloadPolicy, with torch's names and defaults (torch.distributed.fsdp), and what Braid does
with each field on host tensors (docs/pytorch.md, "fully_shard"):

    fully_shard(net, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))

  - param_dtype: None, or the parameters' own dtype. Another dtype is refused (ValueError naming
    param_dtype): Braid gathers parameters in their registered dtype and has no cast on the
    gather; train a bf16 module (net.to(torch.bfloat16)) with ShardedAdamW instead, which keeps
    f32 master weights of the shards.
  - reduce_dtype: None or the parameters' dtype (reduce in it), or float32 for bf16/f16
    parameters (reduced in f32, rounded once). A narrower reduce dtype than the parameters'
    is refused, naming reduce_dtype.
  - output_dtype: the root's floating-point outputs are cast to it (autograd flows through).
  - cast_forward_inputs: accepted (it only acts with a param_dtype, which is the parameters').
  - CPUOffloadPolicy on host modules: accepted, and a no-op with a meaning: parameters,
    gradients and optimizer state already live in host memory (the policy's goal). On CUDA
    modules (nccl worlds) ShardedAdamW / ShardedSGD keep master weights and moments in host
    memory and step them with the CPU kernel as each bucket's reduction completes; gradient
    shards go down to the host for it and updated parameter shards come back before their
    gather (braid/_fsdp_device.py). pin_memory is accepted; see docs/pytorch.md for what is
    pinned.
"""

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class MixedPrecisionPolicy:
    param_dtype: torch.dtype = None
    reduce_dtype: torch.dtype = None
    output_dtype: torch.dtype = None
    cast_forward_inputs: bool = True


@dataclasses.dataclass
class OffloadPolicy:
    """No offloading (FSDP2's default)."""


@dataclasses.dataclass
class CPUOffloadPolicy(OffloadPolicy):
    pin_memory: bool = True


_WIDE = (torch.bfloat16, torch.float16)


def reduce_dtype_for(mp, dtypes, where):
    """The Reducer's reduce_dtype for `mp` over parameters of `dtypes` (a set); ValueError
    naming the field otherwise. `where` names the fully_shard call."""
    if mp is None:
        return None
    if not isinstance(mp, MixedPrecisionPolicy):
        raise TypeError("%s: mp_policy must be a MixedPrecisionPolicy, got %s" %
                        (where, type(mp).__name__))
    for field in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = getattr(mp, field)
        if value is not None and (not isinstance(value, torch.dtype) or
                                  not value.is_floating_point):
            raise ValueError("%s: mp_policy.%s=%r is not a floating-point torch.dtype" %
                             (where, field, value))
    if mp.param_dtype is not None and set(dtypes) - {mp.param_dtype}:
        raise ValueError(
            "%s: mp_policy.param_dtype=%s with parameters of %s: Braid gathers parameters in "
            "their own dtype (no cast on the gather); convert the module (net.to(%s)) and "
            "train it with ShardedAdamW, which keeps f32 master weights of the shards, or leave "
            "param_dtype None" % (where, mp.param_dtype, sorted(str(d) for d in dtypes),
                                  mp.param_dtype))
    r = mp.reduce_dtype
    if r is None or set(dtypes) == {r}:
        return None
    if r == torch.float32 and set(dtypes) <= set(_WIDE):
        return torch.float32
    raise ValueError(
        "%s: mp_policy.reduce_dtype=%s with parameters of %s: Braid reduces each bucket in its "
        "own dtype, or bf16/f16 buckets in float32; a reduction narrower than the parameters "
        "is not supported" % (where, r, sorted(str(d) for d in dtypes)))


def check_offload(policy, where):
    """None, OffloadPolicy() or CPUOffloadPolicy(); TypeError naming `where` otherwise. What
    CPUOffloadPolicy does: nothing on host modules (everything is in host memory already); on
    CUDA modules braid/_fsdp_device.py (the sharded optimizer's state in host memory)."""
    if policy is None or isinstance(policy, OffloadPolicy):
        return
    raise TypeError("%s: offload_policy must be an OffloadPolicy or CPUOffloadPolicy, got %s" %
                    (where, type(policy).__name__))


def offloads(policy):
    """Whether `policy` asks for offload (a CPUOffloadPolicy)."""
    return isinstance(policy, CPUOffloadPolicy)


def cast_outputs(value, dtype):
    """`value` (tensors in lists, tuples, dicts) with floating-point tensors cast to dtype."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*[cast_outputs(v, dtype) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(cast_outputs(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: cast_outputs(v, dtype) for k, v in value.items()}
    return value
