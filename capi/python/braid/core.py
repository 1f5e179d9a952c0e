"""Python objects over Braid's C handles: World, Group, Work, Reducer, Optimizer.

Each object owns one handle and releases it in close() (also on `with` exit and, as a last
resort, at garbage collection or interpreter exit). Children keep their parents alive (a Group
its World, a Reducer its groups, an Optimizer its Reducer), and a World closes whatever is
still open under it, newest first, when it closes: so an `mpi` world always reaches
MPI_Finalize, even in a script that forgets to close.

Buffers: anything exposing its memory — a torch.Tensor (contiguous, CPU), a numpy array, a
bytearray/memoryview, a ctypes array — is accepted where braid.h takes a pointer; the object is
kept referenced by the Work until the collective completes. Device memory: on a World("nccl")
the collectives take contiguous CUDA tensors, and a device Reducer (device=...) takes them for
mark_ready_grad; a raw (address, element count, dtype) tuple works everywhere (e.g. from
Reducer.grad() or your own allocator). braid.pytorch wires CUDA modules (see its docstring).
"""

import atexit
import collections
import ctypes
import itertools
import os
import weakref

from . import _lib
from . import _torch_rendezvous
from ._lib import BraidError  # noqa: F401  (re-exported)

_DTYPES = {"float32": _lib.DTYPE_F32, "float64": _lib.DTYPE_F64, "bfloat16": _lib.DTYPE_BF16,
           "float16": _lib.DTYPE_F16, "int32": _lib.DTYPE_I32, "int64": _lib.DTYPE_I64,
           "uint8": _lib.DTYPE_U8}
_OPS = {"sum": _lib.OP_SUM, "avg": _lib.OP_AVG, "premul_sum": _lib.OP_PREMUL_SUM,
        "max": _lib.OP_MAX, "min": _lib.OP_MIN}
MODES = {"allreduce": _lib.MODE_ALLREDUCE, "reduce_scatter": _lib.MODE_REDUCE_SCATTER,
         "hybrid": _lib.MODE_HYBRID}
SYNC_MODES = {"sync": _lib.SYNC, "no_sync": _lib.NO_SYNC,
              "reduce_scatter_only": _lib.REDUCE_SCATTER_ONLY}

StepReport = collections.namedtuple("StepReport", "rounds skipped grad_norm")


def dtype_code(dtype):
    """braid_dtype_t of a dtype given as a name ("float32"), a torch/numpy dtype or a code."""
    if isinstance(dtype, int):
        return dtype
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise ValueError("dtype %r: Braid supports %s" % (dtype, ", ".join(sorted(_DTYPES))))
    return _DTYPES[name]


def dtype_size(dtype):
    return _lib.load().braid_dtype_size(dtype_code(dtype))


def buffer_info(buf, what="buffer", device=False):
    """(address, element count, braid dtype) of a tensor or array, or of a raw (address,
    count, dtype) tuple (device memory); (address, bytes, None) of a plain writable buffer.
    device=True: CUDA tensors are taken too (their device address; for nccl worlds and device
    reducers, whose streams read device memory). Raises ValueError naming `what` for an
    unusable one."""
    if isinstance(buf, tuple):
        if len(buf) != 3 or not isinstance(buf[0], int) or not isinstance(buf[1], int):
            raise ValueError("%s: a raw buffer is an (address, element count, dtype) tuple" %
                             what)
        return buf[0], buf[1], dtype_code(buf[2])
    if hasattr(buf, "data_ptr") and hasattr(buf, "is_contiguous"):  # torch.Tensor
        if buf.device.type != "cpu" and not (device and buf.device.type == "cuda"):
            raise ValueError("%s: a %s tensor; %s" % (
                what, buf.device.type, "give a CUDA tensor" if device else
                "this object takes CPU memory (CUDA tensors need an nccl world and, for a "
                "reducer, device=...)"))
        if not buf.is_contiguous():
            raise ValueError("%s: tensor is not contiguous" % what)
        return buf.data_ptr(), buf.numel(), dtype_code(buf.dtype)
    if hasattr(buf, "__array_interface__"):  # numpy
        iface = buf.__array_interface__
        if iface.get("strides") is not None and not buf.flags["C_CONTIGUOUS"]:
            raise ValueError("%s: array is not C-contiguous" % what)
        return iface["data"][0], buf.size, dtype_code(buf.dtype.name)
    try:
        view = memoryview(buf)
    except TypeError:
        raise ValueError("%s: %s exposes no memory (give a tensor, array or buffer)" %
                         (what, type(buf).__name__)) from None
    if view.readonly:
        raise ValueError("%s: read-only buffer" % what)
    if not view.contiguous:
        raise ValueError("%s: buffer is not contiguous" % what)
    array = (ctypes.c_char * view.nbytes).from_buffer(view)
    return ctypes.addressof(array), view.nbytes, None


class _Handle:
    """One C handle; `close()` is idempotent. Subclasses set _destroy (a braid_*_destroy).
    `before_close` callbacks run first (the PyTorch wrappers detach tensors viewing Braid's
    memory there, whoever closes the handle)."""

    _destroy = None

    def __init__(self, handle, world):
        self._h = ctypes.c_void_p(handle)
        self._world = world
        self.before_close = []
        self._serial = world._adopt(self) if world is not None else 0

    @property
    def handle(self):
        if not self._h:
            raise ValueError("%s is closed" % type(self).__name__)
        return self._h

    @property
    def closed(self):
        return not self._h

    def close(self):
        if self._h:
            for callback in self.before_close:
                callback()
            self.before_close = []
            _lib.call(self._destroy, self._h)
            self._h = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            # Children still alive in C (the cycle collector frees in no fixed order): the
            # world destroys the handle later, newest first, so it is never leaked.
            world = getattr(self, "_world", None)
            handle = getattr(self, "_h", None)
            if world is not None and handle:
                world._orphans.append((self._serial, self._destroy, handle.value))
                self._h = ctypes.c_void_p()  # the world owns the raw handle now


def _out():
    return ctypes.c_void_p()


def nccl_unique_id():
    """A new NCCL unique id (bytes) for World("nccl", unique_id=...): make it on one rank and
    hand it to the others through your own channel. Needs NCCL (BRAID_NCCL_LIBRARY, else
    libnccl.so.2), not a GPU."""
    size = ctypes.c_size_t()
    _lib.call("braid_nccl_unique_id", None, 0, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    _lib.call("braid_nccl_unique_id", buf, size.value, ctypes.byref(size))
    return buf.raw[:size.value]


def _launched_by_mpi():
    """Whether an MPI launcher started this process (the variables braid.h's launcher rule
    reads: Open MPI's, PMI's, PMIx's)."""
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


class World(_Handle):
    """A backend and this process's ranks: World("mpi") under mpirun, World("local",
    local_ranks=N) for N ranks as threads of this process, World(plugin_path=...), and
    World("nccl", unique_id=braid.nccl_unique_id() bytes from one rank, world_size=N, rank=r)
    for one rank per process and GPU (cuda_device: default BRAID_CUDA_DEVICE or rank % GPUs;
    nccl_blocking: default BRAID_NCCL_BLOCKING or blocking). World("nccl") without a
    unique_id bootstraps over MPI under mpirun, through a TCP rendezvous store under torchrun
    / srun, or is a world of one rank outside a launcher. World("gloo"): Gloo over TCP on CPU
    buffers, for torchrun / srun.

    World() with no backend (and BRAID_BACKEND unset) follows the launcher (braid.h's rule):
    mpirun -> "mpi"; torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or srun
    (SLURM_PROCID, SLURM_NTASKS, with MASTER_ADDR / MASTER_PORT exported) -> "nccl" where NCCL
    loads and a GPU is visible, else "gloo"; otherwise "local". `backend` says which.

    Beside torch.distributed (World() with no backend, "gloo" or "nccl"; no unique_id): when
    torch.distributed is already initialized, the world is torch's (its rank and world size,
    checked against RANK / WORLD_SIZE when set) and the ranks find Braid's store through
    torch's default store, so MASTER_PORT is not opened again (braid/_torch_rendezvous.py);
    under mpirun, World() with no backend stays "mpi" (it opens no port). Launched by
    torchrun / srun before
    torch.distributed is initialized, rank 0 holds MASTER_PORT only while World() runs, so
    init_process_group may follow. Ports: rank 0's store listens on store_port (default
    BRAID_STORE_PORT, else 0: a port the OS picks); master_addr (default MASTER_ADDR, else
    the host of torch's TCPStore) is rank 0's host as the other ranks reach it."""

    _destroy = "braid_world_destroy"

    def __init__(self, backend=None, local_ranks=0, plugin_path=None, timeout_ms=0,
                 read_env=True, unique_id=None, world_size=0, rank=0, cuda_device=-1,
                 nccl_blocking=None, store_port=None, master_addr=None):
        torch_rendezvous = None
        chosen = backend or (os.environ.get("BRAID_BACKEND") if read_env else None)
        if unique_id is None and (chosen in ("gloo", "nccl") or
                                  (chosen is None and not _launched_by_mpi())):
            dist = _torch_rendezvous.initialized_torch_distributed()
            if dist is not None:
                torch_rendezvous = _torch_rendezvous.TorchRendezvous(dist, master_addr,
                                                                     world_size, rank)
        opts = _lib.init_options(_lib.WorldOptions, "braid_world_options_init")
        opts.backend = backend.encode() if backend else None
        opts.plugin_path = plugin_path.encode() if plugin_path else None
        opts.local_ranks = local_ranks
        opts.read_env = 1 if read_env else 0
        opts.timeout_ms = timeout_ms
        id_buf = None
        if unique_id is not None:
            id_buf = ctypes.create_string_buffer(bytes(unique_id), len(unique_id))
            opts.unique_id = ctypes.cast(id_buf, ctypes.c_void_p)
            opts.unique_id_size = len(unique_id)
        opts.world_size, opts.rank, opts.cuda_device = world_size, rank, cuda_device
        if nccl_blocking is not None:
            opts.nccl_blocking = 1 if nccl_blocking else 0
        opts.store_port = -1 if store_port is None else store_port
        opts.master_addr = master_addr.encode() if master_addr else None
        if torch_rendezvous is not None:
            torch_rendezvous.fill(opts)
        out = _out()
        try:
            _lib.call("braid_world_create", ctypes.byref(opts), ctypes.byref(out))
        except BraidError as e:
            cause = torch_rendezvous.error if torch_rendezvous is not None else None
            if cause is None:
                raise
            raise BraidError(e.status, "%s (torch.distributed's store raised %s: %s)" % (
                e.message, type(cause).__name__, cause)) from cause
        self._children = weakref.WeakValueDictionary()
        self._orphans = []  # (serial, destroy function, raw handle) of collected objects
        self._serials = itertools.count(1)
        super().__init__(out.value, None)
        atexit.register(_close_at_exit, weakref.ref(self))

    def _adopt(self, child):
        serial = next(self._serials)
        self._children[serial] = child
        return serial

    @property
    def backend(self):
        """The backend's name: "local", "mpi", "nccl", "gloo" or a plugin's."""
        s = ctypes.c_char_p()
        _lib.call("braid_world_backend", self.handle, ctypes.byref(s))
        return s.value.decode()

    @property
    def size(self):
        n = ctypes.c_int()
        _lib.call("braid_world_size", self.handle, ctypes.byref(n))
        return n.value

    @property
    def local_ranks(self):
        count = ctypes.c_int()
        _lib.call("braid_world_local_ranks", self.handle, None, 0, ctypes.byref(count))
        ranks = (ctypes.c_int * count.value)()
        _lib.call("braid_world_local_ranks", self.handle, ranks, count.value, ctypes.byref(count))
        return list(ranks)

    def group(self, rank=None):
        """The world group as `rank` sees it (default: this process's only rank)."""
        if rank is None:
            ranks = self.local_ranks
            if len(ranks) != 1:
                raise ValueError("this process hosts ranks %s: name one" % ranks)
            rank = ranks[0]
        out = _out()
        _lib.call("braid_world_group", self.handle, rank, ctypes.byref(out))
        return Group(out.value, self)

    def close(self):
        """Closes every object still open under this world, newest first (children before
        parents), then the world. Goes on past a failing child; raises the first error."""
        if not self._h:
            return
        first_error = None
        live = [(key, self._children.get(key)) for key in list(self._children.keys())]
        pending = [(key, child, None, None) for key, child in live if child is not None]
        pending += [(serial, None, destroy, handle) for serial, destroy, handle in self._orphans]
        for _, child, destroy, handle in sorted(pending, key=lambda e: e[0], reverse=True):
            try:
                if child is not None:
                    child.close()
                else:
                    _lib.call(destroy, ctypes.c_void_p(handle))
            except BraidError as e:
                first_error = first_error or e
        self._orphans = []
        super().close()
        if first_error is not None:
            raise first_error


def _close_at_exit(world_ref):
    world = world_ref()
    if world is not None:
        try:
            world.close()
        except BraidError:
            pass


class Group(_Handle):
    _destroy = "braid_group_destroy"

    def _int(self, fn):
        v = ctypes.c_int()
        _lib.call(fn, self.handle, ctypes.byref(v))
        return v.value

    @property
    def rank(self):
        return self._int("braid_group_rank")

    @property
    def size(self):
        return self._int("braid_group_size")

    @property
    def name(self):
        s = ctypes.c_char_p()
        _lib.call("braid_group_name", self.handle, ctypes.byref(s))
        return s.value.decode()

    def abort_job(self, reason):
        """Fails the whole job now, on every rank: every pending work of every group fails
        and every later call is refused (BraidError, BRAID_PEER_ERROR) naming this rank and
        `reason`. For failures Braid cannot see, e.g. this rank's step raised:

            try:
                train_step()
            except Exception as e:
                group.abort_job(f"step {i}: {e!r}")   # the other ranks stop waiting at once
                raise
        """
        _lib.call("braid_group_abort", self.handle, str(reason).encode())

    def split(self, color, key=0, name=None):
        """Collective: ranks with the same color (>= 0) form a new group; None for
        color == braid.NO_COLOR."""
        out = _out()
        _lib.call("braid_group_split", self.handle, color, key,
                  name.encode() if name else None, ctypes.byref(out))
        return Group(out.value, self._world) if out.value else None

    def mesh(self, replicas, shards):
        """Collective: (shard group, replica group) of a replicas x shards HSDP mesh."""
        shard, replica = _out(), _out()
        _lib.call("braid_mesh_create", self.handle, replicas, shards, ctypes.byref(shard),
                  ctypes.byref(replica))
        return Group(shard.value, self._world), Group(replica.value, self._world)

    # Collectives: asynchronous, each returns a Work (wait() it). `recv` defaults to `send`
    # (in place).
    def _options(self, timeout_ms, premul_scalar, label, ready_event=None):
        opts = _lib.init_options(_lib.CollectiveOptions, "braid_collective_options_init")
        opts.timeout_ms = timeout_ms
        opts.premul_scalar = premul_scalar
        opts.label = label.encode() if label else None
        opts.ready_event = ready_event  # nccl: the producer's cudaEvent_t (an int); else None
        return opts

    def _launch(self, fn, bufs, *args, opts):
        out = _out()
        _lib.call(fn, self.handle, *args, ctypes.byref(opts), ctypes.byref(out))
        return Work(out.value, self, bufs)

    @property
    def device_memory(self):
        """True on an nccl world: collectives take CUDA tensors (device memory)."""
        if self._device_memory is None:
            self._device_memory = self._world.backend == "nccl"
        return self._device_memory

    _device_memory = None

    def _typed(self, send, recv):
        dev = self.device_memory
        s_ptr, s_n, s_dt = buffer_info(send, "send", dev)
        r_ptr, r_n, r_dt = (buffer_info(recv, "recv", dev) if recv is not None
                            else (s_ptr, s_n, s_dt))
        if s_dt is None or r_dt is None or s_dt != r_dt:
            raise ValueError("send and recv must be typed (tensor or array) of one dtype")
        return s_ptr, s_n, r_ptr, r_n, s_dt

    def allreduce(self, send, recv=None, op="sum", timeout_ms=0, premul_scalar=1.0, label=None,
                  ready_event=None):
        s, n, r, rn, dt = self._typed(send, recv)
        if rn != n:
            raise ValueError("allreduce: recv has %d elements, send %d" % (rn, n))
        return self._launch("braid_allreduce", (send, recv), s, r, n, dt, _OPS[op],
                            opts=self._options(timeout_ms, premul_scalar, label, ready_event))

    def reduce_scatter(self, send, recv, op="sum", timeout_ms=0, premul_scalar=1.0, label=None,
                       ready_event=None):
        s, n, r, rn, dt = self._typed(send, recv)
        if n != rn * self.size:
            raise ValueError("reduce_scatter: send has %d elements, want size * %d" % (n, rn))
        return self._launch("braid_reduce_scatter", (send, recv), s, r, rn, dt, _OPS[op],
                            opts=self._options(timeout_ms, premul_scalar, label, ready_event))

    def allgather(self, send, recv, timeout_ms=0, label=None, ready_event=None):
        s, n, r, rn, dt = self._typed(send, recv)
        if rn != n * self.size:
            raise ValueError("allgather: recv has %d elements, want size * %d" % (rn, n))
        return self._launch("braid_allgather", (send, recv), s, r, n, dt,
                            opts=self._options(timeout_ms, 1.0, label, ready_event))

    def broadcast(self, buf, root=0, timeout_ms=0, label=None, ready_event=None):
        p, n, _, _, dt = self._typed(buf, None)
        return self._launch("braid_broadcast", (buf,), p, n, dt, root,
                            opts=self._options(timeout_ms, 1.0, label, ready_event))

    def barrier(self, timeout_ms=0):
        return self._launch("braid_barrier", (), opts=self._options(timeout_ms, 1.0, None))


class Work(_Handle):
    """A collective in flight; holds its buffers until it completes or is closed."""

    _destroy = "braid_work_destroy"

    def __init__(self, handle, group, buffers):
        super().__init__(handle, group._world)
        self._group = group  # a group cannot be destroyed under its works
        self._buffers = buffers

    def close(self):
        """Waits for the operation (its own deadline bounds this) so that no buffer is freed
        under it, then releases the handle; the operation's error, if any, is not raised
        here (wait() reports it)."""
        if self._h:
            _lib.load().braid_work_wait(self._h, -1)
            super().close()
            self._buffers = self._group = None

    def wait(self, timeout_ms=-1):
        """Waits (< 0: no limit); raises BraidError for a failed operation, or TIMEOUT when it
        is still running at the deadline."""
        _lib.call("braid_work_wait", self.handle, timeout_ms)

    @property
    def device_event(self):
        """The completion event (an int: a cudaEvent_t on nccl worlds) a consumer stream waits
        on, e.g. torch.cuda.ExternalStream-style cudaStreamWaitEvent; None on host backends.
        Valid while this Work is open."""
        event = ctypes.c_void_p()
        _lib.call("braid_work_device_event", self.handle, ctypes.byref(event))
        return event.value

    def done(self):
        """True once completed (raises BraidError if it failed)."""
        flag = ctypes.c_int()
        status = _lib.load().braid_work_test(self.handle, ctypes.byref(flag))
        if status not in (_lib.OK, _lib.IN_PROGRESS):
            raise BraidError(status, _lib.last_error())
        return bool(flag.value)


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
    rank must pass the same values."""

    _destroy = "braid_reducer_destroy"

    def __init__(self, shard, params, replica=None, mode="allreduce", bucket_cap_mb=25.0,
                 first_bucket_cap_mb=1.0, allow_unused=False, reduce_dtype=None,
                 timeout_ms=300000, timeline_prefix=None, device=None, param_units=None,
                 shard_gradients=False, credit_mb=0.0, priorities=False):
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
        opts.device = _lib.DEVICE_HOST if device is None else device
        units = None
        if param_units is not None:
            if len(param_units) != len(params):
                raise ValueError("param_units has %d entries for %d parameters" %
                                 (len(param_units), len(params)))
            units = (ctypes.c_int * len(params))(*[int(u) for u in param_units])
            opts.param_units = units
        opts.shard_gradients = 1 if shard_gradients else 0
        if credit_mb < 0:
            raise ValueError("credit_mb %r: 0 (off) or a positive size in MiB" % (credit_mb,))
        opts.credit_bytes = int(credit_mb * 1024 * 1024)
        opts.priorities = 1 if priorities else 0
        array = (_lib.Param * len(params))()
        names = []
        self._specs = {}  # id -> (count, dtype)
        for slot, (pid, count, dtype, name) in zip(array, params):
            names.append(name.encode() if name else None)
            slot.id, slot.count, slot.dtype, slot.name = pid, count, dtype_code(dtype), names[-1]
            self._specs[pid] = (count, slot.dtype)
        out = _out()
        _lib.call("braid_reducer_create", shard.handle, replica.handle if replica else None,
                  array, len(params), ctypes.byref(opts), ctypes.byref(out))
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

    def finish_backward(self):
        _lib.call("braid_reducer_finish_backward", self.handle)

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


# The process-wide default world (braid/_default_world.py) and the Optimizer
# (braid/_optimizer.py): imported last, both build on this module.
from ._default_world import default_group, default_world  # noqa: E402,F401
from ._optimizer import PHASES, Optimizer  # noqa: E402,F401
