"""Mixed precision for fully sharded units: MixedPrecisionPolicy.param_dtype.

    fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                      reduce_dtype=torch.float32))

With a param_dtype narrower than the parameters (bf16 / f16 over float32), a unit's forward and
backward compute with param_dtype copies of its gathered parameters, as FSDP2's: the gathered
float32 values are cast when the unit is entered (cast(gather(x)) == gather(cast(x)), cast being
elementwise, so the values equal FSDP2's), the gradients autograd produces in param_dtype are
cast back to float32 when their hook fires and reduced in float32 into float32 shards, and the
optimizer steps float32 master shards. Floating-point inputs of the root and of every unit are
cast to param_dtype (cast_forward_inputs, FSDP2's default). Outside a forward and backward the
parameters are float32 (their pieces, or released); summon_full_params() gives float32 values.

The gather moves param_dtype, as FSDP2's (each shard rounded before the wire:
braid/_fsdp_quant.py), into a float32 buffer that the cast then reads exactly; on a CUDA module
the rounding and widening are kernels on the gather stream around the NCCL all-gather (not yet
measured on a GPU). Differences from FSDP2, by design: a gathered unit holds both copies until
it is released; reduce_dtype None reduces in float32 (FSDP2 reduces in param_dtype then), more
precise. NoCast is the identity.
"""

import torch



class NoCast:
    """param_dtype None or the parameters' own: nothing to do."""
    active = False

    def compute(self, pid, view):
        return view

    def grad(self, pid, g):
        return g

    def inputs(self, args, kwargs):
        return args, kwargs

    def track(self, pid, p, hook):
        pass


class ParamCast(NoCast):
    active = True

    def __init__(self, param_dtype, dtypes, cast_inputs):
        self.dtype = param_dtype
        self.registered = list(dtypes)  # each parameter's registered (master) dtype
        self.cast_inputs = bool(cast_inputs)
        self.accs = {}  # pid -> the AccumulateGrad node of its param_dtype data, hooked

    def track(self, pid, p, hook):
        """After p.data became a param_dtype copy: torch gives a parameter whose data changes
        dtype a new AccumulateGrad node, so the wrapper's hook (registered on the float32 one)
        would never fire. Hook the node of this binding (kept alive until the next one: the
        graph the forward records holds it from then on)."""
        with torch.enable_grad():
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
        if self.accs.get(pid) is not acc:
            acc.register_hook(hook)
            self.accs[pid] = acc

    def compute(self, pid, view):
        return view.to(self.dtype)

    def grad(self, pid, g):
        return g.to(self.registered[pid])

    def inputs(self, args, kwargs):
        if not self.cast_inputs:
            return args, kwargs
        return cast_outputs(args, self.dtype), cast_outputs(kwargs, self.dtype)


def param_cast(param_dtype, dtypes, cast_inputs, where):
    """NoCast, or ParamCast for a param_dtype narrower than every parameter's (float32);
    ValueError naming param_dtype otherwise."""
    if param_dtype is None or set(dtypes) <= {param_dtype}:
        return NoCast()
    if param_dtype in (torch.bfloat16, torch.float16) and set(dtypes) <= {torch.float32}:
        return ParamCast(param_dtype, dtypes, cast_inputs)
    raise ValueError(
        "%s: param_dtype=%s with parameters of %s: Braid casts float32 parameters to bfloat16 "
        "or float16 for compute; convert the module to one float dtype first (net.to(...)), or "
        "leave param_dtype None" % (where, param_dtype, sorted(str(d) for d in set(dtypes))))


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
