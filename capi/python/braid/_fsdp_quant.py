"""Quantized parameter all-gathers for fully sharded models (DeepSpeed ZeRO++'s qwZ): the
gather_dtype= / gather_block= keywords of FullyShardedDataParallel and of the root fully_shard
call, turned into braid_optimizer_options_t's gather_dtype / gather_block (0.11).

    FullyShardedDataParallel(net, g, units=blocks, gather_dtype="int8")   # or "float8_e4m3fn"
    fully_shard(net, group=g, gather_dtype=torch.int8, gather_block=2048)

Each unit's f32 parameters then cross the wire as one byte per element plus one f32 scale per
gather_block elements (default 4096) and are dequantized into the gathered buffer that the
forward and backward read; every rank reads the same values. What the optimizer steps, this
rank's shard of the master weights, stays exact f32 (ShardedAdamW and torch optimizers alike),
and state_dict() reads it exact. None / "float32" / torch.float32 (default): exact gathers.
Host f32 parameters only; the C API refuses the rest by name (docs/pytorch.md).

"bfloat16" / "float16" (or torch's dtypes) gather each value rounded to that dtype, 2 bytes an
element, no scales, on host and CUDA modules: what a MixedPrecisionPolicy.param_dtype computes
with anyway, so with a param_dtype gather_dtype None gathers in param_dtype (FSDP2's wire,
half the bytes of float32) and the values the units compute with are bit for bit those of a
float32 gather cast afterwards. gather_dtype="float32" keeps float32 gathers.
"""

import torch

from . import _lib

_DTYPES = {
    None: _lib.GATHER_EXACT, "float32": _lib.GATHER_EXACT, torch.float32: _lib.GATHER_EXACT,
    "int8": _lib.GATHER_INT8, torch.int8: _lib.GATHER_INT8,
    "float8_e4m3fn": _lib.GATHER_FP8_E4M3, "fp8": _lib.GATHER_FP8_E4M3,
    "bfloat16": _lib.GATHER_BF16, torch.bfloat16: _lib.GATHER_BF16,
    "float16": _lib.GATHER_F16, torch.float16: _lib.GATHER_F16,
}
_FP8 = getattr(torch, "float8_e4m3fn", None)  # torch >= 2.1
if _FP8 is not None:
    _DTYPES[_FP8] = _lib.GATHER_FP8_E4M3


def gather_options(gather_dtype, gather_block, where, param_dtype=None):
    """The optimizer options for `gather_dtype` / `gather_block` ({} for exact gathers);
    gather_dtype None with a param_dtype (bfloat16 / float16 over float32 parameters, checked
    by the caller) gathers in param_dtype."""
    if gather_dtype is None and param_dtype is not None:
        gather_dtype = param_dtype
    try:
        code = _DTYPES.get(gather_dtype, -1)
    except TypeError:  # unhashable
        code = -1
    if code == -1:
        raise ValueError("%s: gather_dtype=%r: None (exact, or param_dtype's), \"float32\", "
                         "\"int8\" / torch.int8, \"float8_e4m3fn\", \"bfloat16\" or "
                         "\"float16\"" % (where, gather_dtype))
    if isinstance(gather_block, bool) or not isinstance(gather_block, int) or gather_block < 1:
        raise ValueError("%s: gather_block=%r: a positive int (elements per scale)" %
                         (where, gather_block))
    if code == _lib.GATHER_EXACT:
        return {}
    return {"gather_dtype": code, "gather_block": gather_block}
