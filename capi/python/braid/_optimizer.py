"""braid.core's Optimizer: Braid's sharded optimizer (AdamW / SGD) over a reduce_scatter or
hybrid Reducer, and its fully sharded units (braid_optimizer_* and braid_unit_* of braid.h).
Import it from braid.core (or braid): this module is core.py's, split off by concept."""

import ctypes

from . import _lib
from ._handles import SYNC_MODES, StepReport, _Handle, _out, buffer_info, dtype_size

PHASES = {"forward": _lib.PHASE_FORWARD, "backward": _lib.PHASE_BACKWARD}


def _phase(phase):
    if isinstance(phase, int) and phase in PHASES.values():
        return phase
    if phase not in PHASES:
        raise ValueError("phase %r: forward or backward" % (phase,))
    return PHASES[phase]


def _options(reducer, kind="adamw", lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
             momentum=0.9, nesterov=False, max_grad_norm=0.0, skip_nonfinite=False,
             overlap=True, threads=1, timeout_ms=300000, fully_sharded=False,
             reshard_after_forward=True, prefetch=1, max_live_bytes=0, offload=False,
             gather_stream=None, param_groups=None, track_grad_norm=False, num_groups=None,
             gather_dtype=_lib.GATHER_EXACT, gather_block=4096):
    """(braid_optimizer_options_t, what must stay alive while the C call reads it)."""
    opts = _lib.init_options(_lib.OptimizerOptions, "braid_optimizer_options_init")
    kinds = {"adamw": _lib.OPTIMIZER_ADAMW, "sgd": _lib.OPTIMIZER_SGD,
             "none": _lib.OPTIMIZER_NONE}
    if kind not in kinds:
        raise ValueError("kind %r: one of adamw, sgd, none" % (kind,))
    opts.kind = kinds[kind]
    opts.lr, (opts.beta1, opts.beta2), opts.eps = lr, betas, eps
    opts.weight_decay, opts.momentum, opts.nesterov = weight_decay, momentum, int(nesterov)
    opts.max_grad_norm, opts.skip_nonfinite = max_grad_norm, int(skip_nonfinite)
    opts.overlap, opts.threads, opts.timeout_ms = int(overlap), threads, timeout_ms
    opts.fully_sharded = int(bool(fully_sharded))
    opts.reshard_after_forward = int(bool(reshard_after_forward))
    opts.prefetch, opts.max_live_bytes = prefetch, int(max_live_bytes or 0)
    opts.offload, opts.gather_stream = int(bool(offload)), gather_stream
    opts.track_grad_norm = int(bool(track_grad_norm))
    opts.gather_dtype, opts.gather_block = gather_dtype, gather_block  # 0.11 (_fsdp_quant.py)
    groups = None
    if param_groups is not None:
        if len(param_groups) != len(reducer._specs):
            raise ValueError("param_groups has %d entries for %d parameters" %
                             (len(param_groups), len(reducer._specs)))
        groups = (ctypes.c_int * len(param_groups))(*[int(g) for g in param_groups])
        # num_groups: also groups no parameter is in (default: the highest index + 1).
        opts.num_groups = max(param_groups) + 1 if num_groups is None else num_groups
        opts.param_groups = groups
    return opts, groups


class Optimizer(_Handle):
    """The sharded optimizer (AdamW or SGD) over a reduce_scatter/hybrid reducer.

    Fully sharded training (0.7): fully_sharded=True keeps parameters only as this rank's
    shard between uses; bracket each unit's reads with unit_enter(u, phase) / unit_exit(u,
    phase) (phase "forward" or "backward"), call end_step() once the step's units are done;
    param(pid) is valid only while pid's unit is entered (or between summon_params(True) and
    summon_params(False)). reshard_after_forward (default True), prefetch (units ahead, default
    1), max_live_bytes (limit on gathered bytes; 0: twice the largest unit), offload (device
    reducers: optimizer state in host memory) and gather_stream (nccl: a cudaStream_t as an
    int) as braid_optimizer_options_t says. param_groups (0.8): one group index per registered
    parameter, in registration order (default: all in group 0); every group starts with the
    hyper-parameters given here, set_hyper(group, ...) changes one; num_groups (default: the
    highest index + 1) counts groups no parameter is in too. track_grad_norm (0.10):
    last_step().grad_norm of every step, also without clipping (host parameters). kind="none"
    (with fully_sharded=True): no optimizer, the units only; the framework steps the pieces of
    param_shard() itself (the hyper-parameters are ignored). gather_dtype / gather_block
    (0.11, fully_sharded): quantized unit gathers, braid/_fsdp_quant.py."""

    _destroy = "braid_optimizer_destroy"

    def __init__(self, reducer, *args, **options):
        opts, keep = _options(reducer, *args, **options)
        out = _out()
        _lib.call("braid_optimizer_create", reducer.handle, ctypes.byref(opts), ctypes.byref(out))
        del keep
        self._adopt(out.value, reducer, opts)

    def _adopt(self, handle, reducer, opts):
        self.reducer = reducer
        self.fully_sharded = bool(opts.fully_sharded)
        self.overlap = bool(opts.overlap)
        # Callbacks run right before a step is armed (a synced begin_backward with overlap, else
        # step()): the last moment hyper-parameters can change for that step.
        self.before_arm = []
        super().__init__(handle, reducer._world)

    @classmethod
    def create_linked(cls, reducers, options, span, tensor_parallel=None, tp_replicated=None):
        """0.11 (braid_optimizer_create_linked): one Optimizer per reducer (options[i] its
        keyword arguments, as Optimizer's), all clipped / checked by one global gradient norm
        over every reducer's shards, summed over the Group `span`; tp_replicated[i] True: the
        reducer's parameters are the same on every rank of the Group `tensor_parallel` and
        count there once. Collective over span, then each reducer's groups."""
        n = len(reducers)
        built = [_options(r, **o) for r, o in zip(reducers, options)]
        handles = (ctypes.c_void_p * n)(*[r.handle for r in reducers])
        opts = (ctypes.POINTER(_lib.OptimizerOptions) * n)(
            *[ctypes.pointer(o) for o, _ in built])
        tp = None
        if tp_replicated is not None:
            tp = (ctypes.c_int * n)(*[int(bool(x)) for x in tp_replicated])
        out = (ctypes.c_void_p * n)()
        _lib.call("braid_optimizer_create_linked", handles, n, opts, tp, span.handle,
                  tensor_parallel.handle if tensor_parallel is not None else None, out)
        linked = []
        for r, (o, _), h in zip(reducers, built, out):
            opt = cls.__new__(cls)
            opt._adopt(h, r, o)
            linked.append(opt)
        return linked

    def set_param(self, pid, values):
        ptr, n, dt = buffer_info(values, "values of parameter %d" % pid)
        count, dtype = self.reducer.spec(pid)
        if dt is not None and dt != dtype:
            raise ValueError("parameter %d: values of dtype code %d, registered %d" %
                             (pid, dt, dtype))
        want = count if dt is not None else count * dtype_size(dtype)
        if n != want:
            raise ValueError("parameter %d: %d %s given, registered %d" %
                             (pid, n, "elements" if dt is not None else "bytes", want))
        _lib.call("braid_optimizer_set_param", self.handle, pid, ctypes.c_void_p(ptr))

    def param(self, pid):
        """(address, element count) of parameter `pid`'s full values (read-only for callers)."""
        ptr, count = ctypes.c_void_p(), ctypes.c_size_t()
        _lib.call("braid_optimizer_param", self.handle, pid, ctypes.byref(ptr),
                  ctypes.byref(count))
        return ptr.value, count.value

    def param_shard(self, pid):
        """(address, element count, offset) of this rank's piece of parameter `pid` in its
        parameter shard: elements [offset, offset + count) of its flat values (count 0: none
        here). kind="none" (gather only, fully sharded): the framework's optimizer writes its
        updates there between steps (braid_optimizer_param_shard)."""
        ptr, count, offset = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
        _lib.call("braid_optimizer_param_shard", self.handle, pid, ctypes.byref(ptr),
                  ctypes.byref(count), ctypes.byref(offset))
        return ptr.value, count.value, offset.value

    def adopt_param(self, pid):
        """0.10: parameter `pid`'s values were written in place (through param()'s memory):
        this rank's part becomes its master weights (braid_optimizer_adopt_param)."""
        _lib.call("braid_optimizer_adopt_param", self.handle, pid)

    def begin_backward(self, sync="sync"):
        if sync == "sync" and self.overlap:
            for callback in self.before_arm:
                callback()
        _lib.call("braid_optimizer_begin_backward", self.handle, SYNC_MODES[sync])

    def finish_backward(self):
        _lib.call("braid_optimizer_finish_backward", self.handle)

    def step(self):
        if not self.overlap:
            for callback in self.before_arm:
                callback()
        _lib.call("braid_optimizer_step", self.handle)

    def wait_params(self, bucket):
        _lib.call("braid_optimizer_wait_params", self.handle, bucket)

    def wait_all_params(self):
        _lib.call("braid_optimizer_wait_all_params", self.handle)

    def set_lr(self, lr):
        """Group 0's learning rate (every parameter's without param_groups)."""
        _lib.call("braid_optimizer_set_lr", self.handle, float(lr))

    def set_hyper(self, group, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                  momentum=0.0, nesterov=False):
        """Group `group`'s hyper-parameters (param_groups' index) from the next armed step on
        (AdamW reads lr, betas, eps, weight_decay; SGD lr, momentum, weight_decay, nesterov).
        Raises BraidError naming the group and the bad value; nothing changes then."""
        h = _lib.OptimizerHyper()
        h.struct_size = ctypes.sizeof(h)
        h.lr, (h.beta1, h.beta2), h.eps = float(lr), (float(b) for b in betas), float(eps)
        h.weight_decay, h.momentum = float(weight_decay), float(momentum)
        h.nesterov = int(bool(nesterov))
        _lib.call("braid_optimizer_set_hyper", self.handle, group, ctypes.byref(h))

    def save(self, path):
        _lib.call("braid_optimizer_save", self.handle, str(path).encode())

    def load(self, path):
        _lib.call("braid_optimizer_load", self.handle, str(path).encode())

    def last_step(self):
        rounds, skipped, norm = ctypes.c_int64(), ctypes.c_int(), ctypes.c_double()
        _lib.call("braid_optimizer_last_step", self.handle, ctypes.byref(rounds),
                  ctypes.byref(skipped), ctypes.byref(norm))
        return StepReport(rounds.value, bool(skipped.value), norm.value)

    def gather_event(self, bucket):
        """The device completion event (an int: a cudaEvent_t) of `bucket`'s latest all-gather,
        for a consumer stream to wait on; None on host backends or before its first gather."""
        event = ctypes.c_void_p()
        _lib.call("braid_optimizer_gather_event", self.handle, bucket, ctypes.byref(event))
        return event.value

    # The whole state, unsharded (0.10; braid.h's braid_optimizer_get_state / set_state).
    STATE_BUFFERS = {"adamw": ("master", "exp_avg", "exp_avg_sq"), "sgd": ("master", "momentum")}

    def _state_pointers(self, values):
        counts = [count for count, _ in self.reducer._specs.values()]  # registration order
        n = len(counts)
        if n == 0 or len(values) % n:
            raise ValueError("%d state buffers for %d parameters" % (len(values), n))
        ptrs = (ctypes.c_void_p * len(values))()
        for j, v in enumerate(values):
            if v is None:
                continue
            ptr, count, dt = buffer_info(v, "state buffer %d of parameter %d" % (j // n, j % n))
            want = counts[j % n]
            if dt != _lib.DTYPE_F32 or count != want:
                raise ValueError("state buffer %d of parameter %d: %d float32 values needed" %
                                 (j // n, j % n, want))
            ptrs[j] = ptr
        return ptrs

    def get_state(self, values):
        """Collective over the shard group: every rank gets the whole state. `values`: one
        writable float32 buffer (or None: skipped) per state buffer and parameter,
        values[k * P + i] for STATE_BUFFERS[kind][k] of parameter i (registration order).
        Returns (step, per-parameter step counts)."""
        ptrs = self._state_pointers(values)
        steps = (ctypes.c_int64 * len(self.reducer._specs))()
        step = ctypes.c_int64()
        _lib.call("braid_optimizer_get_state", self.handle, ptrs, len(values), steps,
                  ctypes.byref(step))
        return step.value, list(steps)

    def set_state(self, values, param_steps=None, step=0):
        """Collective over the shard group: every rank passes the same whole state (get_state's
        layout; every buffer given) and takes its shard. values=None: this rank refuses, and
        every rank's call fails with nothing loaded."""
        if values is None:
            _lib.call("braid_optimizer_set_state", self.handle, None, 0, None, 0)
            return
        ptrs = self._state_pointers(values)
        steps = (ctypes.c_int64 * len(param_steps))(*[int(s) for s in param_steps])
        _lib.call("braid_optimizer_set_state", self.handle, ptrs, len(values), steps, int(step))

    # Fully sharded units (fully_sharded=True).
    def unit_enter(self, unit, phase):
        """Unit `unit` is about to be read in `phase` ("forward"/"backward"): returns once its
        buckets are gathered (the next unit's prefetch started)."""
        _lib.call("braid_unit_enter", self.handle, unit, _phase(phase))

    def unit_exit(self, unit, phase):
        """Unit `unit`'s last read in `phase` is done (backward: all its gradients marked):
        its buckets are released (forward: unless reshard_after_forward is off)."""
        _lib.call("braid_unit_exit", self.handle, unit, _phase(phase))

    def end_step(self):
        """The step's units are done (collective after the first step: checks the forward
        unit order across ranks and turns prefetching on)."""
        _lib.call("braid_optimizer_end_step", self.handle)

    def summon_params(self, on):
        """Collective: on=True gathers every bucket and keeps it (param() reads every
        parameter); on=False releases them."""
        _lib.call("braid_optimizer_summon_params", self.handle, 1 if on else 0)
