"""ctypes declarations of capi/braid.h: the one place that knows the C ABI.

Everything here mirrors braid.h (ABI 1) one to one: the enums, the option structs (each
starting with struct_size) and every entry point's argtypes/restype. `load()` finds and opens
libbraid.so once per process (it is cached: the library stays loaded for the process's
lifetime, like any shared library); `call()` runs an entry point and turns a non-OK status into
a BraidError carrying the status and braid_last_error()'s message.
"""

import ctypes
import functools
import os

ABI_VERSION = 1  # BRAID_ABI_VERSION of the braid.h this file mirrors

# braid_status_t
OK = 0
IN_PROGRESS = 1
INVALID_ARGUMENT = 2
NOT_FOUND = 3
FAILED_PRECONDITION = 4
OUT_OF_RANGE = 5
TIMEOUT = 6
PEER_ERROR = 7
UNIMPLEMENTED = 8
DATA_LOSS = 9
INTERNAL = 10
STATUS_NAMES = {
    OK: "OK", IN_PROGRESS: "IN_PROGRESS", INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NOT_FOUND: "NOT_FOUND", FAILED_PRECONDITION: "FAILED_PRECONDITION",
    OUT_OF_RANGE: "OUT_OF_RANGE", TIMEOUT: "TIMEOUT", PEER_ERROR: "PEER_ERROR",
    UNIMPLEMENTED: "UNIMPLEMENTED", DATA_LOSS: "DATA_LOSS", INTERNAL: "INTERNAL",
}

# braid_dtype_t
DTYPE_F32, DTYPE_F64, DTYPE_BF16, DTYPE_F16, DTYPE_I32, DTYPE_I64, DTYPE_U8 = range(7)
# braid_reduce_op_t
OP_SUM, OP_AVG, OP_PREMUL_SUM, OP_MAX, OP_MIN = range(5)
# braid_reduce_mode_t
MODE_ALLREDUCE, MODE_REDUCE_SCATTER, MODE_HYBRID = range(3)
# braid_sync_mode_t
SYNC, NO_SYNC, REDUCE_SCATTER_ONLY = range(3)
# braid_optimizer_kind_t
OPTIMIZER_ADAMW, OPTIMIZER_SGD, OPTIMIZER_NONE = range(3)
GATHER_EXACT, GATHER_INT8, GATHER_FP8_E4M3, GATHER_BF16, GATHER_F16 = range(5)  # (0.11)
# braid_phase_t
PHASE_FORWARD, PHASE_BACKWARD = range(2)
NO_COLOR = -1
REDUCE_DTYPE_NATIVE = -1
DEVICE_HOST = -1  # BRAID_DEVICE_HOST: braid_reducer_options_t.device default (host memory)
NCCL_UNIQUE_ID_BYTES = 128  # what braid_nccl_unique_id reports


class BraidError(RuntimeError):
    """A Braid call returned a non-OK status. `.status` is the braid_status_t, `.code` its
    name ("INVALID_ARGUMENT", ...); the message is braid_last_error() of the failing call."""

    def __init__(self, status, message):
        self.status = status
        self.code = STATUS_NAMES.get(status, "status %d" % status)
        self.message = message
        super().__init__("%s: %s" % (self.code, message))

    def __reduce__(self):
        return (BraidError, (self.status, self.message))


# braid_rendezvous_publish_fn / braid_rendezvous_lookup_fn (0.10): return a braid_status_t.
RENDEZVOUS_PUBLISH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_void_p)
RENDEZVOUS_LOOKUP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int64,
                                        ctypes.POINTER(ctypes.c_char), ctypes.c_size_t,
                                        ctypes.c_void_p)


class WorldOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("backend", ctypes.c_char_p),
                ("plugin_path", ctypes.c_char_p), ("local_ranks", ctypes.c_int),
                ("read_env", ctypes.c_int), ("timeout_ms", ctypes.c_int64),
                # 0.6: the nccl backend
                ("unique_id", ctypes.c_void_p), ("unique_id_size", ctypes.c_size_t),
                ("world_size", ctypes.c_int), ("rank", ctypes.c_int),
                ("cuda_device", ctypes.c_int), ("nccl_blocking", ctypes.c_int),
                # 0.10: an explicit rendezvous
                ("master_addr", ctypes.c_char_p), ("store_port", ctypes.c_int),
                ("rendezvous_publish", RENDEZVOUS_PUBLISH_FN),
                ("rendezvous_lookup", RENDEZVOUS_LOOKUP_FN),
                ("rendezvous_data", ctypes.c_void_p)]


class CollectiveOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("timeout_ms", ctypes.c_int64),
                ("premul_scalar", ctypes.c_double), ("label", ctypes.c_char_p),
                ("ready_event", ctypes.c_void_p)]


class Param(ctypes.Structure):  # braid_param_t (an array element: no struct_size)
    _fields_ = [("id", ctypes.c_int64), ("count", ctypes.c_size_t), ("dtype", ctypes.c_int),
                ("name", ctypes.c_char_p)]


class ReducerOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("mode", ctypes.c_int),
                ("reduce_dtype", ctypes.c_int), ("bucket_cap_bytes", ctypes.c_size_t),
                ("first_bucket_cap_bytes", ctypes.c_size_t), ("allow_unused", ctypes.c_int),
                ("gradient_as_bucket_view", ctypes.c_int), ("timeout_ms", ctypes.c_int64),
                ("timeline_prefix", ctypes.c_char_p),
                ("device", ctypes.c_int),  # 0.6
                # 0.7: fully sharded training
                ("param_units", ctypes.POINTER(ctypes.c_int)), ("shard_gradients", ctypes.c_int),
                # 0.9: communication scheduling
                ("credit_bytes", ctypes.c_size_t), ("priorities", ctypes.c_int),
                # 0.11: divergent control flow (the used-map agreement)
                ("agree_unused", ctypes.c_int), ("static_graph", ctypes.c_int),
                ("param_marks", ctypes.POINTER(ctypes.c_int)),  # 0.11: tied / reused
                ("pool_limit_bytes", ctypes.c_int64)]  # 0.11: bounded fully sharded pool


class CommHookOptions(ctypes.Structure):  # 0.11: braid_comm_hook_options_t
    _fields_ = [("struct_size", ctypes.c_size_t), ("kind", ctypes.c_int),
                ("replica_only", ctypes.c_int), ("block", ctypes.c_int),
                # POWERSGD: torch's PowerSGDState fields
                ("matrix_approximation_rank", ctypes.c_int), ("start_powerSGD_iter", ctypes.c_int),
                ("use_error_feedback", ctypes.c_int), ("warm_start", ctypes.c_int),
                ("min_compression_rate", ctypes.c_double),
                ("orthogonalization_epsilon", ctypes.c_double), ("random_seed", ctypes.c_uint64),
                ("param_rows", ctypes.POINTER(ctypes.c_int64)), ("num_param_rows", ctypes.c_size_t)]


# braid.h's BRAID_COMM_HOOK_* (0.11), by the name of the hook.
COMM_HOOKS = {"none": 0, "bf16_compress": 1, "fp16_compress": 2, "int8": 3, "allreduce": 4,
              "powersgd": 5}


class OptimizerOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("kind", ctypes.c_int),
                ("threads", ctypes.c_int), ("lr", ctypes.c_double), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("momentum", ctypes.c_double),
                ("nesterov", ctypes.c_int), ("skip_nonfinite", ctypes.c_int),
                ("max_grad_norm", ctypes.c_double), ("overlap", ctypes.c_int),
                ("timeout_ms", ctypes.c_int64),
                # 0.7: fully sharded training and offload
                ("fully_sharded", ctypes.c_int), ("reshard_after_forward", ctypes.c_int),
                ("prefetch", ctypes.c_int), ("max_live_bytes", ctypes.c_int64),
                ("offload", ctypes.c_int), ("gather_stream", ctypes.c_void_p),
                # 0.8: parameter groups
                ("num_groups", ctypes.c_int), ("param_groups", ctypes.POINTER(ctypes.c_int)),
                # 0.10: every step's gradient norm
                ("track_grad_norm", ctypes.c_int),
                # 0.11: quantized parameter all-gathers (qwZ)
                ("gather_block", ctypes.c_int64), ("gather_dtype", ctypes.c_int)]


class JoinOptions(ctypes.Structure):  # 0.11
    _fields_ = [("struct_size", ctypes.c_size_t), ("divide_by_initial_world_size", ctypes.c_int),
                ("throw_on_early_termination", ctypes.c_int)]


class OptimizerHyper(ctypes.Structure):  # braid_optimizer_hyper_t (set struct_size)
    _fields_ = [("struct_size", ctypes.c_size_t), ("lr", ctypes.c_double),
                ("beta1", ctypes.c_double), ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("momentum", ctypes.c_double),
                ("nesterov", ctypes.c_int)]


MEMORY_USES = ("grad_buckets", "grad_shards", "param_gather", "param_shards",
               "optimizer_state", "staging")  # braid_memory_use_t, in value order


class MemoryCounter(ctypes.Structure):
    _fields_ = [("current", ctypes.c_int64), ("peak", ctypes.c_int64)]


class MemoryStats(ctypes.Structure):  # an output struct: the caller sets struct_size
    _fields_ = [("struct_size", ctypes.c_size_t), ("host", MemoryCounter),
                ("device", MemoryCounter), ("by_use", MemoryCounter * len(MEMORY_USES)),
                ("allocations", ctypes.c_int64)]


_p = ctypes.c_void_p  # every handle is an opaque pointer-sized token
_pp = ctypes.POINTER(ctypes.c_void_p)
_i = ctypes.c_int
_i64 = ctypes.c_int64
_sz = ctypes.c_size_t
_st = ctypes.c_int  # braid_status_t
_cs = ctypes.c_char_p

# name: (restype, argtypes). Kept in braid.h's order.
_SIGNATURES = {
    "braid_version": (_cs, []),
    "braid_abi_version": (_i, []),
    "braid_status_name": (_cs, [_st]),
    "braid_last_error": (_cs, []),
    "braid_clear_error": (None, []),
    "braid_dtype_size": (_sz, [_i]),
    "braid_world_options_init": (None, [ctypes.POINTER(WorldOptions)]),
    "braid_world_create": (_st, [ctypes.POINTER(WorldOptions), _pp]),
    "braid_world_backend": (_st, [_p, ctypes.POINTER(_cs)]),
    "braid_world_size": (_st, [_p, ctypes.POINTER(_i)]),
    "braid_world_local_ranks": (_st, [_p, ctypes.POINTER(_i), _i, ctypes.POINTER(_i)]),
    "braid_world_group": (_st, [_p, _i, _pp]),
    "braid_world_destroy": (_st, [_p]),
    "braid_nccl_unique_id": (_st, [_p, _sz, ctypes.POINTER(_sz)]),
    "braid_group_rank": (_st, [_p, ctypes.POINTER(_i)]),
    "braid_group_size": (_st, [_p, ctypes.POINTER(_i)]),
    "braid_group_name": (_st, [_p, ctypes.POINTER(_cs)]),
    "braid_group_abort": (_st, [_p, _cs]),
    "braid_flight_recorder_dump": (_st, [_p, _cs]),
    "braid_group_split": (_st, [_p, _i, _i, _cs, _pp]),
    "braid_mesh_create": (_st, [_p, _i, _i, _pp, _pp]),
    "braid_group_destroy": (_st, [_p]),
    "braid_collective_options_init": (None, [ctypes.POINTER(CollectiveOptions)]),
    "braid_allreduce": (_st, [_p, _p, _p, _sz, _i, _i, ctypes.POINTER(CollectiveOptions), _pp]),
    "braid_reduce_scatter": (_st, [_p, _p, _p, _sz, _i, _i, ctypes.POINTER(CollectiveOptions),
                                   _pp]),
    "braid_allgather": (_st, [_p, _p, _p, _sz, _i, ctypes.POINTER(CollectiveOptions), _pp]),
    "braid_broadcast": (_st, [_p, _p, _sz, _i, _i, ctypes.POINTER(CollectiveOptions), _pp]),
    "braid_barrier": (_st, [_p, ctypes.POINTER(CollectiveOptions), _pp]),
    "braid_work_wait": (_st, [_p, _i64]),
    "braid_work_test": (_st, [_p, ctypes.POINTER(_i)]),
    "braid_work_device_event": (_st, [_p, _pp]),
    "braid_work_destroy": (_st, [_p]),
    "braid_reducer_options_init": (None, [ctypes.POINTER(ReducerOptions)]),
    "braid_reducer_create": (_st, [_p, _p, ctypes.POINTER(Param), _sz,
                                   ctypes.POINTER(ReducerOptions), _pp]),
    "braid_reducer_grad": (_st, [_p, _i64, _pp, ctypes.POINTER(_sz)]),
    "braid_reducer_set_grad_buffer": (_st, [_p, _i64, _p]),
    "braid_reducer_begin_backward": (_st, [_p, _i]),
    "braid_reducer_mark_ready": (_st, [_p, _i64, _p]),
    "braid_reducer_mark_ready_grad": (_st, [_p, _i64, _p, _p]),
    "braid_reducer_grad_slot": (_st, [_p, _i64, _pp, ctypes.POINTER(_sz)]),
    "braid_reducer_finish_backward": (_st, [_p]),
    "braid_reducer_declare_unused": (_st, [_p, ctypes.POINTER(_i64), ctypes.c_size_t]),
    "braid_reducer_param_used": (_st, [_p, _i64, ctypes.POINTER(ctypes.c_int)]),
    "braid_reducer_zero_grads": (_st, [_p]),
    "braid_reducer_num_buckets": (_st, [_p, ctypes.POINTER(_i)]),
    "braid_reducer_wait_bucket": (_st, [_p, _i, _i64]),
    "braid_reducer_param_bucket": (_st, [_p, _i64, ctypes.POINTER(_i)]),
    "braid_reducer_rebuild_buckets": (_st, [_p, ctypes.POINTER(_i)]),
    "braid_reducer_autotune": (_st, [_p, ctypes.c_double, ctypes.POINTER(_i), ctypes.POINTER(_i)]),
    "braid_reducer_unit_buckets": (_st, [_p, _i, ctypes.POINTER(_i), _i, ctypes.POINTER(_i)]),
    "braid_reducer_num_units": (_st, [_p, ctypes.POINTER(_i)]),
    "braid_reducer_shard": (_st, [_p, _i, _pp, ctypes.POINTER(_sz)]),
    "braid_reducer_grad_shard": (_st, [_p, _i64, _pp, ctypes.POINTER(_sz), ctypes.POINTER(_sz)]),
    "braid_reducer_grad_stream": (_st, [_p, _pp]),  # 0.11
    "braid_reducer_destroy": (_st, [_p]),
    "braid_comm_hook_options_init": (None, [ctypes.POINTER(CommHookOptions)]),  # 0.11
    "braid_reducer_set_comm_hook": (_st, [_p, ctypes.POINTER(CommHookOptions)]),
    "braid_reducer_comm_hook_state": (_st, [_p, _p, ctypes.c_size_t,
                                             ctypes.POINTER(ctypes.c_size_t)]),
    "braid_reducer_comm_hook_load_state": (_st, [_p, _p, ctypes.c_size_t]),
    "braid_memory_stats": (_st, [_p, ctypes.POINTER(MemoryStats)]),
    "braid_memory_reset_peaks": (_st, [_p]),
    "braid_optimizer_options_init": (None, [ctypes.POINTER(OptimizerOptions)]),
    "braid_optimizer_create": (_st, [_p, ctypes.POINTER(OptimizerOptions), _pp]),
    "braid_optimizer_create_linked": (_st, [_pp, _i, ctypes.POINTER(ctypes.POINTER(
        OptimizerOptions)), ctypes.POINTER(_i), _p, _p, _pp]),  # 0.11
    "braid_optimizer_set_param": (_st, [_p, _i64, _p]),
    "braid_optimizer_param": (_st, [_p, _i64, _pp, ctypes.POINTER(_sz)]),
    "braid_optimizer_param_shard": (_st, [_p, _i64, _pp, ctypes.POINTER(_sz),
                                          ctypes.POINTER(_sz)]),
    "braid_optimizer_begin_backward": (_st, [_p, _i]),
    "braid_optimizer_finish_backward": (_st, [_p]),
    "braid_optimizer_step": (_st, [_p]),
    "braid_optimizer_wait_params": (_st, [_p, _i]),
    "braid_optimizer_wait_all_params": (_st, [_p]),
    "braid_optimizer_set_lr": (_st, [_p, ctypes.c_double]),
    "braid_optimizer_set_hyper": (_st, [_p, _i, ctypes.POINTER(OptimizerHyper)]),
    "braid_optimizer_save": (_st, [_p, _cs]),
    "braid_optimizer_load": (_st, [_p, _cs]),
    "braid_optimizer_last_step": (_st, [_p, ctypes.POINTER(_i64), ctypes.POINTER(_i),
                                        ctypes.POINTER(ctypes.c_double)]),
    "braid_optimizer_gather_event": (_st, [_p, _i, _pp]),
    "braid_optimizer_adopt_param": (_st, [_p, _i64]),  # 0.10
    # 0.10: the whole optimizer state, unsharded (values: an array of float pointers).
    "braid_optimizer_get_state": (_st, [_p, _pp, _sz, ctypes.POINTER(_i64),
                                        ctypes.POINTER(_i64)]),
    "braid_optimizer_set_state": (_st, [_p, _pp, _sz, ctypes.POINTER(_i64), _i64]),
    # 0.11: uneven inputs (join)
    "braid_join_options_init": (None, [ctypes.POINTER(JoinOptions)]),
    "braid_join_begin": (_st, [_p, ctypes.POINTER(JoinOptions)]),
    "braid_join_agree": (_st, [_p, _i, _i, ctypes.POINTER(_i), ctypes.POINTER(_i)]),
    "braid_join_shadow": (_st, [_p]),
    "braid_join_end": (_st, [_p, _i, ctypes.POINTER(_i)]),
    "braid_join_abort": (_st, [_p]),
    "braid_join_broadcast": (_st, [_p, _p, _sz, _i, _i]),
    "braid_unit_enter": (_st, [_p, _i, _i]),
    "braid_unit_exit": (_st, [_p, _i, _i]),
    "braid_optimizer_end_step": (_st, [_p]),
    "braid_optimizer_summon_params": (_st, [_p, _i]),
    "braid_optimizer_destroy": (_st, [_p]),
}


def _candidates():
    env = os.environ.get("LIBBRAID_SO")
    if env:
        return [env]  # an explicit choice is never second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", "..", ".."))
    return [os.path.join(here, "libbraid.so"),                      # installed (the wheel)
            os.path.join(repo, "bazel-bin", "capi", "libbraid.so")]  # the source tree, built


@functools.lru_cache(maxsize=None)
def load():
    """Opens libbraid.so ($LIBBRAID_SO, else the one inside this package, as the wheel installs
    it, else the source tree's bazel-bin) and declares every entry point. Raises OSError naming
    the paths tried, or when the library's ABI differs from this binding's."""
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        lib = ctypes.CDLL(path)
        lib.braid_abi_version.restype, lib.braid_abi_version.argtypes = ctypes.c_int, []
        abi = lib.braid_abi_version()
        if abi != ABI_VERSION:
            raise OSError("%s has Braid ABI %d; this binding speaks ABI %d" %
                          (path, abi, ABI_VERSION))
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        return lib
    raise OSError("libbraid.so not found (install the wheel: tools/bazelw build "
                  "//capi/python:wheel, then pip install bazel-bin/capi/python/braid-*.whl; or "
                  "build //capi:braid in the source tree; or set LIBBRAID_SO); tried: " +
                  ", ".join(tried))


def last_error():
    return load().braid_last_error().decode("utf-8", "replace")


def call(name, *args):
    """Calls braid_<name>(*args); raises BraidError unless it returned BRAID_OK."""
    status = getattr(load(), name)(*args)
    if status != OK:
        raise BraidError(status, last_error())
    return status


def init_options(struct_type, init_name):
    """`struct_type` filled by the library's `init_name` (defaults, struct_size). The library
    writes its own sizeof, so it writes into a scratch buffer with room to spare first: a
    library newer than this mirror (a larger struct) is refused instead of overrunning it."""
    mine = ctypes.sizeof(struct_type)
    scratch = ctypes.create_string_buffer(mine + 4096)
    init = getattr(load(), init_name)
    init(ctypes.cast(scratch, init.argtypes[0]))
    theirs = ctypes.c_size_t.from_buffer(scratch).value
    if theirs > mine:
        raise RuntimeError(
            "%s: libbraid.so (%s) fills %d bytes but this braid package knows %d: the Python "
            "package is older than the library; install both from one build" %
            (init_name, load()._name, theirs, mine))
    opts = struct_type()
    ctypes.memmove(ctypes.byref(opts), scratch, min(theirs, mine))
    return opts
