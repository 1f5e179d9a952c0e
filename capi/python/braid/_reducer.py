"""Reducer: braid.h's gradient reducer (buckets, readiness, reduction) over one or two groups
(braid.core re-exports it; braid.pytorch wires torch modules to it).

    r = Reducer(group, [(0, numel, "float32", "w")]); r.begin_backward(); r.mark_ready(0)
    r.finish_backward()

Contract: as braid.h's braid_reducer_*: errors are BraidError naming the C call; the
gradients live in the reducer's buckets (grad(pid) gives their address) until close().
"""

import ctypes
import re

from . import _lib, _timeline
from ._handles import MODES, SYNC_MODES, _Handle, _out, buffer_info, dtype_code, dtype_size

# braid_reducer_options_t.agree_unused (braid.h's BRAID_UNUSED_*).
AGREE_UNUSED = {None: 0, "at_finish": 1, "declared": 2, "declared_at_finish": 3}

class Reducer(_Handle):
    """The gradient reducer. `params`: (id, count, dtype, name) tuples, in registration order
    (buckets fill in reverse: last registered first). `mode`: "allreduce", "reduce_scatter"
    or "hybrid" (then `replica` is the replica group). `device`: None (host memory) or the
    CUDA device index of every gradient, on groups of a World("nccl") (grad() and shard()
    then return device addresses; mark_ready takes the producer's cudaEvent_t as an int).
    Fully sharded training (0.7): `param_units` (one int >= 0 per entry of `params`: the
    parameter's wrapping unit; a bucket never mixes units; default every parameter in unit 0)
    and `shard_gradients` (reduce_scatter/hybrid only: full-size bucket storage only while a
    bucket is filled and reduced, then only this rank's shard is kept; gradients go in with
    mark_ready_grad, and grad() fails).
    Communication scheduling (0.9; braid.h's credit_bytes and priorities): `credit_mb` > 0
    reduces buckets larger than it as partitions of at most credit_mb MiB, a credit in flight
    per group; `priorities=True` lets an optimizer's parameter all-gathers (the next forward's
    inputs) go ahead of reduction partitions not yet issued. Same results bit for bit; every
    rank must pass the same values.
    Tied and reused parameters (0.11): `param_marks` (one int per entry of `params`: how many
    times it is marked ready per backward, >= 1, or 0 to have them counted in the first synced
    backward; default once each). `pool_limit_mb` (0.11, shard_gradients only; 0: none): the
    most MiB of full-size bucket storage (and gathered units sharing its pool) held at once;
    past it a mark waits for a launched reduction's storage (braid.h's pool_limit_bytes)."""

    _destroy = "braid_reducer_destroy"

    def __init__(self, shard, params, replica=None, mode="allreduce", bucket_cap_mb=25.0,
                 first_bucket_cap_mb=1.0, allow_unused=False, reduce_dtype=None,
                 timeout_ms=300000, timeline_prefix=None, device=None, param_units=None,
                 shard_gradients=False, credit_mb=0.0, priorities=False, agree_unused=None,
                 static_graph=False, param_marks=None, pool_limit_mb=0.0):
        opts = _lib.init_options(_lib.ReducerOptions, "braid_reducer_options_init")
        if mode not in MODES:
            raise ValueError("mode %r: one of %s" % (mode, ", ".join(MODES)))
        opts.mode = MODES[mode]
        opts.reduce_dtype = (_lib.REDUCE_DTYPE_NATIVE if reduce_dtype is None
                             else dtype_code(reduce_dtype))
        opts.bucket_cap_bytes = int(bucket_cap_mb * 1024 * 1024)
        opts.first_bucket_cap_bytes = int(first_bucket_cap_mb * 1024 * 1024)
        opts.allow_unused = 1 if allow_unused else 0
        opts.timeout_ms = timeout_ms
        opts.timeline_prefix = timeline_prefix.encode() if timeline_prefix else None
        self._timeline = (timeline_prefix, shard._world_rank) if timeline_prefix else None
        opts.device = _lib.DEVICE_HOST if device is None else device
        units = None
        if param_units is not None:
            if len(param_units) != len(params):
                raise ValueError("param_units has %d entries for %d parameters" %
                                 (len(param_units), len(params)))
            units = (ctypes.c_int * len(params))(*[int(u) for u in param_units])
            opts.param_units = units
        marks = None
        if param_marks is not None:
            if len(param_marks) != len(params):
                raise ValueError("param_marks has %d entries for %d parameters" %
                                 (len(param_marks), len(params)))
            marks = (ctypes.c_int * len(params))(*[int(m) for m in param_marks])
            opts.param_marks = marks
        opts.shard_gradients = 1 if shard_gradients else 0
        if credit_mb < 0:
            raise ValueError("credit_mb %r: 0 (off) or a positive size in MiB" % (credit_mb,))
        opts.credit_bytes = int(credit_mb * 1024 * 1024)
        opts.priorities = 1 if priorities else 0
        if pool_limit_mb < 0:
            raise ValueError("pool_limit_mb %r: 0 (no limit) or a positive size in MiB" %
                             (pool_limit_mb,))
        opts.pool_limit_bytes = int(pool_limit_mb * 1024 * 1024)
        if agree_unused not in AGREE_UNUSED:
            raise ValueError("agree_unused %r: one of %s" % (
                agree_unused, ", ".join(repr(k) for k in AGREE_UNUSED)))
        opts.agree_unused = AGREE_UNUSED[agree_unused]
        opts.static_graph = 1 if static_graph else 0
        array = (_lib.Param * len(params))()
        names = []
        self._specs = {}  # id -> (count, dtype)
        for slot, (pid, count, dtype, name) in zip(array, params):
            names.append(name.encode() if name else None)
            slot.id, slot.count, slot.dtype, slot.name = pid, count, dtype_code(dtype), names[-1]
            self._specs[pid] = (count, slot.dtype)
        out = _out()
        try:
            _lib.call("braid_reducer_create", shard.handle, replica.handle if replica else None,
                      array, len(params), ctypes.byref(opts), ctypes.byref(out))
        except _lib.BraidError as e:
            # The engine names braid.h's fields; say which argument here each one was.
            said = ["%s is this call's %s=%r" % (c, py, v) for c, py, v in (
                ("first_bucket_cap_bytes", "first_bucket_cap_mb", first_bucket_cap_mb),
                ("bucket_cap_bytes", "bucket_cap_mb", bucket_cap_mb),
                ("credit_bytes", "credit_mb", credit_mb),
                ("pool_limit_bytes", "pool_limit_mb", pool_limit_mb))
                if re.search(r"\b%s\b" % c, e.message)]
            if not said:
                raise
            raise _lib.BraidError(e.status, "%s (%s)" % (e.message, "; ".join(said))) from None
        self.shard_group, self.replica_group = shard, replica
        self.device = device  # None (host memory) or the CUDA device index
        super().__init__(out.value, shard._world)

    def grad(self, pid):
        """(address, element count) of parameter `pid`'s gradient in Braid's bucket storage,
        valid while the reducer lives."""
        ptr, count = ctypes.c_void_p(), ctypes.c_size_t()
        _lib.call("braid_reducer_grad", self.handle, pid, ctypes.byref(ptr), ctypes.byref(count))
        return ptr.value, count.value

    def spec(self, pid):
        """(element count, braid dtype) parameter `pid` was registered with."""
        if pid not in self._specs:
            raise KeyError("parameter %r is not registered" % (pid,))
        return self._specs[pid]

    def begin_backward(self, sync="sync"):
        _lib.call("braid_reducer_begin_backward", self.handle, SYNC_MODES[sync])

    def mark_ready(self, pid, device_event=None):
        _lib.call("braid_reducer_mark_ready", self.handle, pid, device_event)

    def mark_ready_grad(self, pid, grad, device_event=None):
        """mark_ready with the gradient's values: `grad` (a contiguous CPU tensor or array of the
        parameter's registered count and dtype, a writable buffer of its size in bytes, or a
        raw (address, count, dtype) tuple, e.g. device memory) is copied into the bucket (added
        within a no_sync window), so it may be freed once this returns."""
        ptr, n, dt = buffer_info(grad, "gradient of parameter %r" % (pid,),
                                 device=self.device is not None)
        count, dtype = self.spec(pid)
        if dt is not None and dt != dtype:
            raise ValueError("parameter %r: gradient of dtype code %d, registered %d" %
                             (pid, dt, dtype))
        want = count if dt is not None else count * dtype_size(dtype)
        if n != want:
            raise ValueError("parameter %r: gradient of %d %s, registered %d" %
                             (pid, n, "elements" if dt is not None else "bytes", want))
        _lib.call("braid_reducer_mark_ready_grad", self.handle, pid, ctypes.c_void_p(ptr),
                  device_event)

    def grad_stream(self):
        """The cudaStream_t (an int) on which a device reducer reads mark_ready_grad's gradients
        (braid_reducer_grad_stream); None on host reducers."""
        out = ctypes.c_void_p()
        _lib.call("braid_reducer_grad_stream", self.handle, ctypes.byref(out))
        return out.value

    def set_comm_hook(self, hook="none", replica_only=False, block=256, **powersgd):
        """A built-in communication hook (braid.h's braid_reducer_set_comm_hook, 0.11):
        "none" (the default collectives), "bf16_compress" or "fp16_compress" (torch's hooks of
        those names), "int8" (blockwise scales of `block` elements, error feedback), "powersgd"
        (keywords: braid_comm_hook_options_t's PowerSGD fields, param_rows a list);
        replica_only: the hybrid replica all-reduce only. Collective: every rank, between
        backwards, with the same arguments."""
        if hook not in _lib.COMM_HOOKS:
            raise ValueError("comm hook %r: one of %s" % (hook, ", ".join(_lib.COMM_HOOKS)))
        opts = _lib.init_options(_lib.CommHookOptions, "braid_comm_hook_options_init")
        opts.kind = _lib.COMM_HOOKS[hook]
        opts.replica_only = 1 if replica_only else 0
        opts.block = int(block)
        rows = powersgd.pop("param_rows", None)
        for key, value in powersgd.items():
            if key not in dict(_lib.CommHookOptions._fields_) or key == "struct_size":
                raise TypeError("set_comm_hook: unknown keyword %r" % key)
            setattr(opts, key, value)
        if rows is not None:
            array = (ctypes.c_int64 * len(rows))(*[int(r) for r in rows])
            opts.param_rows, opts.num_param_rows = array, len(rows)
        _lib.call("braid_reducer_set_comm_hook", self.handle, ctypes.byref(opts))

    def comm_hook_state(self):
        """This rank's comm hook state as bytes (braid_reducer_comm_hook_state, 0.11)."""
        size = ctypes.c_size_t()
        _lib.call("braid_reducer_comm_hook_state", self.handle, None, 0, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        _lib.call("braid_reducer_comm_hook_state", self.handle, buf, size.value,
                  ctypes.byref(size))
        return buf.raw[:size.value]

    def load_comm_hook_state(self, state):
        """Loads comm_hook_state()'s bytes into the same hook (braid.h says what is refused)."""
        state = bytes(state)
        _lib.call("braid_reducer_comm_hook_load_state", self.handle, state, len(state))

    def finish_backward(self):
        _lib.call("braid_reducer_finish_backward", self.handle)

    def declare_unused(self, pids):
        """agree_unused="declared" / "declared_at_finish": the ids this rank will not mark in
        this backward, once per backward on every rank (an empty list too) before its first
        mark_ready."""
        pids = [int(p) for p in pids]
        array = (ctypes.c_int64 * len(pids))(*pids)
        _lib.call("braid_reducer_declare_unused", self.handle, array, len(pids))

    def param_used(self, pid):
        """Whether some rank used parameter `pid` in the last agreed synced backward (True for
        every parameter without agree_unused or before the first agreement)."""
        used = ctypes.c_int()
        _lib.call("braid_reducer_param_used", self.handle, pid, ctypes.byref(used))
        return bool(used.value)

    def zero_grads(self):
        _lib.call("braid_reducer_zero_grads", self.handle)

    @property
    def num_buckets(self):
        n = ctypes.c_int()
        _lib.call("braid_reducer_num_buckets", self.handle, ctypes.byref(n))
        return n.value

    def param_bucket(self, pid):
        b = ctypes.c_int()
        _lib.call("braid_reducer_param_bucket", self.handle, pid, ctypes.byref(b))
        return b.value

    def wait_bucket(self, bucket, timeout_ms=-1):
        """braid_reducer_wait_bucket: returns once bucket `bucket`'s reduction in the current
        synced backward completed (raises its error, or TIMEOUT); from any thread, between the
        bucket's launch and finish_backward's return (ctypes releases the GIL meanwhile)."""
        _lib.call("braid_reducer_wait_bucket", self.handle, bucket, timeout_ms)

    def rebuild_buckets(self):
        """torch DDP's one-time bucket rebuild (braid_reducer_rebuild_buckets): between steps,
        at the same point on every rank; True when the buckets were rebuilt in world rank 0's
        readiness order of the first synced backward, so every grad() address, bucket index
        and shard changed (fetch them again). False (no communication) when there is nothing
        to rebuild."""
        rebuilt = ctypes.c_int()
        _lib.call("braid_reducer_rebuild_buckets", self.handle, ctypes.byref(rebuilt))
        return bool(rebuilt.value)

    def autotune(self, step_seconds):
        """braid_reducer_autotune: once per step at a step boundary, on every rank, with the
        time of the step that just ended. Returns (replanned, done): replanned is True when
        the buckets changed (fetch grad() addresses again)."""
        replanned, done = ctypes.c_int(), ctypes.c_int()
        _lib.call("braid_reducer_autotune", self.handle, float(step_seconds),
                  ctypes.byref(replanned), ctypes.byref(done))
        return bool(replanned.value), bool(done.value)

    def unit_buckets(self, unit):
        """The buckets of unit `unit` (param_units), in bucket order; [] for a unit no
        parameter names."""
        count = ctypes.c_int()
        _lib.call("braid_reducer_unit_buckets", self.handle, unit, None, 0, ctypes.byref(count))
        buckets = (ctypes.c_int * count.value)()
        _lib.call("braid_reducer_unit_buckets", self.handle, unit, buckets, count.value,
                  ctypes.byref(count))
        return list(buckets)

    @property
    def num_units(self):
        """1 + the largest unit any parameter names."""
        n = ctypes.c_int()
        _lib.call("braid_reducer_num_units", self.handle, ctypes.byref(n))
        return n.value

    def timeline_counters(self, names=None):
        """This rank's timeline counter samples so far, [(ts_us, name, value)], read from its
        timeline file (braid/_timeline.py): memory_stats()'s "host bytes" / "device bytes" over
        time. Needs timeline_prefix (ValueError otherwise)."""
        if self._timeline is None:
            raise ValueError("timeline_counters(): create the model with timeline_prefix=... "
                             "(the counters are the timeline file's)")
        prefix, world_rank = self._timeline
        if world_rank is None:
            raise ValueError("timeline_counters(): the group's world rank is unknown (a group "
                             "not made by braid.World.group/split/mesh); read the timeline "
                             "file '%s.rank<world rank>.json' with braid._timeline.read_counters"
                             % prefix)
        return _timeline.read_counters(_timeline.timeline_path(prefix, world_rank), names)

    def memory_stats(self):
        """Bytes Braid allocated for this reducer's rank (its buckets, and the gatherer's and
        optimizer's buffers once an optimizer is built on it), counted from allocation to free:
        {"host": (current, peak), "device": (current, peak), "by_use": {use: (current, peak)},
        "allocations": n}, uses as braid_memory_use_t ("grad_buckets", "optimizer_state", ...)."""
        m = _lib.MemoryStats()
        m.struct_size = ctypes.sizeof(m)
        _lib.call("braid_memory_stats", self.handle, ctypes.byref(m))
        pair = lambda c: (c.current, c.peak)  # noqa: E731
        return {"host": pair(m.host), "device": pair(m.device),
                "by_use": {u: pair(m.by_use[i]) for i, u in enumerate(_lib.MEMORY_USES)},
                "allocations": m.allocations}

    def reset_memory_peaks(self):
        _lib.call("braid_memory_reset_peaks", self.handle)

    def grad_shard(self, pid):
        """(address, element count, offset) of this rank's piece of parameter `pid`'s averaged
        gradient in its bucket's shard (after a synced finish_backward): elements [offset,
        offset + count) of its flat gradient; count 0 when it lies in other ranks' shards."""
        ptr, count, offset = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
        _lib.call("braid_reducer_grad_shard", self.handle, pid, ctypes.byref(ptr),
                  ctypes.byref(count), ctypes.byref(offset))
        return ptr.value, count.value, offset.value

    def shard(self, bucket):
        """(address, element count) of this rank's shard of `bucket`."""
        ptr, count = ctypes.c_void_p(), ctypes.c_size_t()
        _lib.call("braid_reducer_shard", self.handle, bucket, ctypes.byref(ptr),
                  ctypes.byref(count))
        return ptr.value, count.value
