"""The ground floor of braid.core: dtype and op tables, buffers as braid.h takes them, and the
one-handle base class every Python object over a C handle derives from.

    code = dtype_code("float32"); address, count, dtype = buffer_info(tensor)
    class World(_Handle): _destroy = "braid_world_destroy"

Contract: _Handle.close() is idempotent, runs `before_close` callbacks first, and a handle
whose close fails at garbage collection is handed to its world (destroyed later, newest
first), never leaked; buffer_info raises ValueError naming `what` for an unusable buffer.
Imports only braid/_lib.py: every other module of the package may import this one.
"""

import collections
import ctypes

from . import _lib

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
