"""World, Group and Work: Braid's worlds, their groups and the collectives' handles (braid.core
re-exports them; its docstring has the buffer and lifetime rules).

    world = World("mpi"); g = world.group(); g.allreduce(tensor, op="avg").wait()

Contract: a child keeps its parent alive (a Group its World) and a World closes whatever is
still open under it, newest first, at close() or interpreter exit.
"""

import atexit
import ctypes
import itertools
import os
import weakref

from . import _lib
from . import _torch_rendezvous
from ._handles import _OPS, _Handle, _out, buffer_info
from ._lib import BraidError

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
    under mpirun, World() with no backend stays "mpi" (it opens no port; braid's default world,
    braid/_default_world.py, runs torch's backend instead). Launched by
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
        g = Group(out.value, self)
        g._world_rank = rank  # names this rank's timeline file (braid/_timeline.py)
        return g

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
    _world_rank = None  # set where known: the world rank this group was made from

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

    def flight_recorder_dump(self, path=None):
        """Writes this rank's flight recorder (its last collectives over all its groups: group,
        seq, op, bytes, label, times, state) to `path` as JSON lines; None: the file under
        BRAID_FLIGHT_RECORDER_DIR. tools/braid_flight merges the ranks' files and names where
        they diverge (docs/hardening.md, "Flight recorder")."""
        _lib.call("braid_flight_recorder_dump", self.handle,
                  None if path is None else os.fsencode(path))

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
        return self._child(out.value) if out.value else None

    def mesh(self, replicas, shards):
        """Collective: (shard group, replica group) of a replicas x shards HSDP mesh."""
        shard, replica = _out(), _out()
        _lib.call("braid_mesh_create", self.handle, replicas, shards, ctypes.byref(shard),
                  ctypes.byref(replica))
        return self._child(shard.value), self._child(replica.value)

    def _child(self, handle):
        g = Group(handle, self._world)
        g._world_rank = self._world_rank
        return g

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
