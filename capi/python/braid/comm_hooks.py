"""Communication hooks for braid.pytorch.DistributedDataParallel.register_comm_hook (torch
DDP's), run by Braid's reducer (braid.h's braid_reducer_set_comm_hook):

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)     # torch's own hook
    model.register_comm_hook(None, braid.comm_hooks.bf16_compress(replica_only=True))

torch's allreduce_hook, fp16_compress_hook and bf16_compress_hook are recognised and run as
Braid's built-in hooks of the same arithmetic (round to the wire dtype, or keep the bucket's for
allreduce_hook; divide by the group size there, sum in that dtype, widen back); their state must
be None or the model's own group. torch's powerSGD_hook with its PowerSGDState runs as Braid's
PowerSGD (braid.h's BRAID_COMM_HOOK_POWERSGD: the state's fields mapped; its first Q drawn from
Braid's generator, not torch's RNG); a PowerSGDState that has run already (a loaded checkpoint's)
runs torch's own hook instead, as a Python hook. Braid's own
hooks add `replica_only` (hybrid mode: only the replica all-reduce, the stage that crosses
hosts, is compressed). Any other callable (a hook of your own, torch's batched_powerSGD_hook,
post_localSGD_hook, quantization hooks) runs as a Python hook with torch's meaning: called per
bucket at the end of each synced backward, its future's value written as the bucket's reduced
gradient (braid/_python_hook.py)."""


class CommHook:
    """One of Braid's built-in hooks: `name` and keywords as braid.core.Reducer.set_comm_hook
    takes them."""

    def __init__(self, name, replica_only=False, **params):
        self.name, self.replica_only, self.params = name, bool(replica_only), params

    def __repr__(self):
        args = ["replica_only=%s" % self.replica_only] + ["%s=%r" % kv
                                                          for kv in sorted(self.params.items())]
        return "braid.comm_hooks.%s(%s)" % (self.name, ", ".join(args))


def bf16_compress(replica_only=False):
    """torch's bf16_compress_hook, as a Braid hook."""
    return CommHook("bf16_compress", replica_only)


def fp16_compress(replica_only=False):
    """torch's fp16_compress_hook, as a Braid hook."""
    return CommHook("fp16_compress", replica_only)


def int8(block=256, replica_only=False):
    """int8 with one f32 scale per `block` elements and error feedback (Braid's own; the same
    result on every rank): braid.h's BRAID_COMM_HOOK_INT8."""
    return CommHook("int8", replica_only, block=int(block))


def powersgd(matrix_approximation_rank=1, start_powerSGD_iter=1000, min_compression_rate=2,
             use_error_feedback=True, warm_start=True, orthogonalization_epsilon=0,
             random_seed=0):
    """torch's powerSGD_hook with a PowerSGDState of these fields (the same names and defaults),
    as a Braid hook; the model's parameter shapes are passed at registration."""
    return CommHook("powersgd", False, matrix_approximation_rank=int(matrix_approximation_rank),
                    start_powerSGD_iter=int(start_powerSGD_iter),
                    min_compression_rate=float(min_compression_rate),
                    use_error_feedback=int(bool(use_error_feedback)),
                    warm_start=int(bool(warm_start)),
                    orthogonalization_epsilon=float(orthogonalization_epsilon),
                    random_seed=int(random_seed))


def _from_powersgd_state(state, own_groups):
    """Braid's powersgd for torch's PowerSGDState (its rng gives the seed: one draw, the same on
    every rank that built the state alike); None (run torch's hook as a Python hook) for a
    state that has run already: its error and P/Q memories carry on only in torch's hook."""
    if not hasattr(state, "error_dict"):  # not a PowerSGDState: torch's hook, as torch does
        return None
    if state.error_dict or state.p_memory_dict or state.q_memory_dict:
        return None
    group = getattr(state, "process_group", None)
    if group is not None and not any(group is g for g in own_groups):
        raise ValueError("register_comm_hook(PowerSGDState, powerSGD_hook): Braid runs it over "
                         "the model's own group; pass process_group=None or that group")
    return powersgd(state.matrix_approximation_rank,
                    max(0, state.start_powerSGD_iter - state.iter), state.min_compression_rate,
                    state.use_error_feedback, state.warm_start, state.orthogonalization_epsilon,
                    random_seed=int(state.rng.randint(1 << 31)))


_POWERSGD = ("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook", "powerSGD_hook")
# torch's hooks Braid runs itself, by their module and name.
_TORCH = {("torch.distributed.algorithms.ddp_comm_hooks.default_hooks", "allreduce_hook"):
          "allreduce",
          ("torch.distributed.algorithms.ddp_comm_hooks.default_hooks", "fp16_compress_hook"):
          "fp16_compress",
          ("torch.distributed.algorithms.ddp_comm_hooks.default_hooks", "bf16_compress_hook"):
          "bf16_compress"}

def resolve(hook, state, own_groups):
    """The Braid hook (a CommHook) for register_comm_hook(state, hook), or None where the
    callable runs as a Python hook (braid/_python_hook.py); `own_groups`: what state may be
    besides None for Braid's hooks (the model's group, as a torch or a Braid group). Raises
    TypeError / ValueError naming the hook and saying what Braid accepts."""
    if isinstance(hook, CommHook):
        if state is not None and not any(state is g for g in own_groups):
            raise ValueError("register_comm_hook(%r): state must be None or the model's group; "
                             "Braid's hooks keep their own state" % (hook,))
        return hook
    if not callable(hook):
        raise TypeError("Communication hook must be callable.")  # torch's message
    key = (getattr(hook, "__module__", None), getattr(hook, "__qualname__", None))
    if key == _POWERSGD:
        return _from_powersgd_state(state, own_groups)
    if key in _TORCH:
        if state is not None and not any(state is g for g in own_groups):
            raise ValueError(
                "register_comm_hook(state, %s): Braid runs it over the model's own group; pass "
                "state=None or that group (got %r)" % (key[1], state))
        return CommHook(_TORCH[key])
    return None  # a Python hook
