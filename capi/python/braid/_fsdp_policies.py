"""FSDP2's policies for braid.fully_shard: MixedPrecisionPolicy, OffloadPolicy and
CPUOffloadPolicy, with torch's names and defaults (torch.distributed.fsdp), and what Braid does
with each field on host tensors (docs/pytorch.md, "fully_shard"):

    fully_shard(net, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))

  - param_dtype: None, the parameters' own dtype, or bfloat16 / float16 over float32 parameters:
    units compute with param_dtype copies of their gathered parameters, gradients are reduced
    and stepped in float32 (braid/_fsdp_cast.py). Another dtype is refused (ValueError naming
    param_dtype).
  - reduce_dtype: None or the parameters' dtype (reduce in it), or float32 for bf16/f16
    parameters (reduced in f32, rounded once). A narrower reduce dtype than the parameters'
    is refused, naming reduce_dtype.
  - output_dtype: the root's floating-point outputs are cast to it (autograd flows through).
  - cast_forward_inputs: with a param_dtype cast, the root's and every unit's floating-point
    inputs are cast to it (True, FSDP2's default) or left alone.
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

from ._fsdp_cast import param_cast


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
    param_cast(mp.param_dtype, dtypes, mp.cast_forward_inputs,
               "%s: mp_policy" % where)  # refuses, naming param_dtype
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

