/* Braid backend plugin ABI, version 1: what a shared library exports to be a Braid backend.
 *
 * A backend can live outside Braid's build: a shared library that exports one symbol,
 * `braidBackendPlugin_v1`, a `braid_backend_v1` struct of function pointers. Braid loads it
 * with the `plugin` backend:
 *
 *   BRAID_BACKEND=plugin BRAID_BACKEND_PLUGIN=/opt/acme/libacme_braid.so ./trainer
 *
 * and the plugin's side is one constant table (C99 or C++, no Braid headers needed):
 *
 *   #include "braid_backend_v1.h"
 *   static int AcmeInit(braid_backend_log_fn_v1 log, void* log_arg, int world_size,
 *                       int64_t timeout_ms, void** ctx, braid_backend_error_v1* error);
 *   ...
 *   const braid_backend_v1 braidBackendPlugin_v1 = {
 *     BRAID_BACKEND_ABI_VERSION, sizeof(braid_backend_v1), "acme",
 *     AcmeInit, AcmeFinalize, ...   // in the order of the struct below
 *   };
 *
 * A released struct never changes; a new version is a new struct and symbol
 * (braid_backend_v2), and Braid keeps loading the older ones (why, and the model in NCCL's
 * plugins: docs/design/backends.md, "Plugins").
 *
 * Loading (backends/plugin/plugin_library.h): Braid dlopens the library (RTLD_NOW |
 * RTLD_LOCAL), takes the newest `braidBackendPlugin_v<N>` it knows, and refuses the table
 * with an error naming the file when `abi_version` is not N, `struct_size` is smaller than
 * the struct of version N, `name` is NULL or a required entry is NULL. Optional entries may be
 * NULL: Braid then answers a call needing one with Unimplemented, naming the entry.
 *
 * Errors: every entry that can fail returns an int status, BRAID_BACKEND_OK (0) or one of the
 * codes below, and explains a failure in the caller-owned `braid_backend_error_v1` it was
 * given. Nothing is thrown across this boundary; a C++ plugin catches its own exceptions.
 * Braid turns a code into an absl::Status whose message starts with the plugin's name and
 * the operation (e.g. "plugin 'acme': allreduce #12 on group 'world': <your message>").
 *
 * Threading, in one place:
 *   - init and finalize run once per context, on one thread, with nothing else of that
 *     context in flight. Each Braid backend object is one context; a process may hold several
 *     contexts of one library at once (dlopen shares the loaded image between them).
 *   - Entries on one comm are never called concurrently (Braid serializes the calls on a
 *     Group), but different comms are used concurrently: a process hosting several ranks
 *     drives each rank's comms from its own thread, and comm_split is entered by all of them
 *     at once.
 *   - Completion callbacks and the log callback may be called from any thread.
 *
 * v1 has no per-call timeout (init's applies to every operation), no device events or
 * streams, and no group names.
 *
 * Rank-order contract (as for every Braid backend, see comm/group.h): every rank of a comm
 * issues that comm's collectives and splits in the same order with matching arguments; the
 * plugin may rely on it to match calls across ranks.
 */
#ifndef BRAID_BACKENDS_PLUGIN_BRAID_BACKEND_V1_H_
#define BRAID_BACKENDS_PLUGIN_BRAID_BACKEND_V1_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BRAID_BACKEND_ABI_VERSION 1

/* The symbol a version-1 plugin exports: `const braid_backend_v1 braidBackendPlugin_v1`. */
#define BRAID_BACKEND_PLUGIN_SYMBOL_V1 "braidBackendPlugin_v1"
/* Every version's symbol is this prefix followed by the version number. */
#define BRAID_BACKEND_PLUGIN_SYMBOL_PREFIX "braidBackendPlugin_v"

/* Status codes returned by entries and passed to completion callbacks. */
enum {
  BRAID_BACKEND_OK = 0,
  BRAID_BACKEND_INVALID_ARGUMENT = 1, /* the call's arguments are wrong (absl InvalidArgument) */
  BRAID_BACKEND_UNIMPLEMENTED = 2,    /* this plugin cannot do that (absl Unimplemented) */
  BRAID_BACKEND_TIMEOUT = 3,          /* a deadline passed (absl DeadlineExceeded) */
  BRAID_BACKEND_PEER_FAILURE = 4,     /* another rank failed or left (absl Aborted) */
  BRAID_BACKEND_INTERNAL = 5          /* anything else (absl Internal) */
};
/* Any other nonzero code is reported as Internal, naming the code. */

/* Element types: the same numbering as braid::DType (comm/dtype.h). Passed as `int dtype`. */
enum {
  BRAID_BACKEND_F32 = 0,
  BRAID_BACKEND_F64 = 1,
  BRAID_BACKEND_BF16 = 2, /* bfloat16, raw 16-bit storage */
  BRAID_BACKEND_F16 = 3,  /* IEEE half, raw 16-bit storage */
  BRAID_BACKEND_I32 = 4,
  BRAID_BACKEND_I64 = 5,
  BRAID_BACKEND_U8 = 6
};

/* Reduction kinds: the same numbering as braid::ReduceKind (comm/reduce_op.h), with the same
 * semantics (spelled out there). Passed as `int op` together with `double scalar`, which only
 * BRAID_BACKEND_PREMUL_SUM reads: this rank's input is multiplied by it before the sum. */
enum {
  BRAID_BACKEND_SUM = 0,
  BRAID_BACKEND_AVG = 1,        /* sum / comm size; floating dtypes only */
  BRAID_BACKEND_PREMUL_SUM = 2, /* sum of (scalar_r * x_r); floating dtypes only */
  BRAID_BACKEND_MAX = 3,
  BRAID_BACKEND_MIN = 4
};

/* Log levels of the host log callback: the same numbering as spdlog's levels. */
enum {
  BRAID_BACKEND_LOG_TRACE = 0,
  BRAID_BACKEND_LOG_DEBUG = 1,
  BRAID_BACKEND_LOG_INFO = 2,
  BRAID_BACKEND_LOG_WARN = 3,
  BRAID_BACKEND_LOG_ERROR = 4,
  BRAID_BACKEND_LOG_CRITICAL = 5
};

/* Capability bits returned by `capabilities`. They fill braid::Capabilities (comm/group.h). */
#define BRAID_BACKEND_CAP_HOST_MEMORY (UINT64_C(1) << 0)       /* buffers in host memory */
#define BRAID_BACKEND_CAP_DEVICE_MEMORY (UINT64_C(1) << 1)     /* buffers in device memory */
#define BRAID_BACKEND_CAP_NATIVE_AVG (UINT64_C(1) << 2)        /* avg without a scaling pass */
#define BRAID_BACKEND_CAP_NATIVE_PREMUL_SUM (UINT64_C(1) << 3) /* premul_sum, no scaling pass */
#define BRAID_BACKEND_CAP_NATIVE_HALF (UINT64_C(1) << 4)       /* bf16/f16 without staging */
#define BRAID_BACKEND_CAP_ASYNC_PROGRESS (UINT64_C(1) << 5)    /* completes without polling */
#define BRAID_BACKEND_CAP_DETERMINISTIC (UINT64_C(1) << 6)     /* bit-identical run to run */
/* Bits 7..63 are reserved and must be zero. Split support is not a bit: it is whether
 * `comm_split` is non-NULL. */

#define BRAID_BACKEND_ERROR_MESSAGE_SIZE 1024

/* Where a failing entry explains itself. Owned by the caller (Braid), who always passes one
 * (never NULL) and clears `message` before the call; the plugin writes a NUL-terminated message
 * (truncated to fit) only when it returns nonzero. Say what failed and why, e.g. "rank 3 is outside
 * the world of size 2". */
typedef struct braid_backend_error_v1 {
  char message[BRAID_BACKEND_ERROR_MESSAGE_SIZE];
} braid_backend_error_v1;

/* The host's logger, handed to init. `level` is a BRAID_BACKEND_LOG_* value; `message` is one
 * line without a trailing newline, read during the call only. Thread-safe; callable from any
 * thread from init until finalize returns. Braid prefixes each line with the plugin's name
 * and drops lines below its own level (BRAID_LOG_LEVEL), so the plugin need not filter. */
typedef void (*braid_backend_log_fn_v1)(void* log_arg, int level, const char* message);

/* Completion of an asynchronous collective. `status` is BRAID_BACKEND_OK or an error code,
 * `message` explains an error (may be NULL or empty on success) and is read during the call
 * only. Called exactly once per launch that returned BRAID_BACKEND_OK, from any thread,
 * possibly before the launch itself has returned; never for a launch that returned nonzero.
 * Braid's callback does not block, and it may call back into the plugin (a completion may
 * launch the next collective), so the plugin must not hold a lock across it that its entries
 * take. After it returns the operation's buffers belong to the caller again. */
typedef void (*braid_backend_done_fn_v1)(void* arg, int status, const char* message);

typedef struct braid_backend_v1 {
  /* BRAID_BACKEND_ABI_VERSION as the plugin was compiled: must be 1 in a v1 table. */
  int32_t abi_version;
  /* sizeof(braid_backend_v1) as the plugin was compiled: at least the size Braid knows. */
  uint32_t struct_size;
  /* Short name used in every message about this plugin, e.g. "acme". Static storage. */
  const char* name;

  /* ---- Lifetime (required) -------------------------------------------------------------- */

  /* Creates the plugin's context: the world this process takes part in.
   *  in:  log, log_arg: the host logger (see braid_backend_log_fn_v1); keep both until
   *       finalize returns.
   *       world_size: the host's request (BRAID_LOCAL_RANKS). A plugin that hosts every rank
   *       in this process builds a world of that size; one whose world is set by its own
   *       launcher (mpirun) ignores it and reports the real size through `world_size`.
   *       timeout_ms: the deadline of every collective and internal wait (BRAID_TIMEOUT_MS),
   *       > 0. An operation that passes it completes with BRAID_BACKEND_TIMEOUT.
   *  out: *ctx: the context, passed to every ctx entry; owned by the plugin, released by
   *       finalize. Written only on success.
   *  fail: nonzero + error->message; Braid reports the backend as not creatable and will
   *       not call finalize. */
  int (*init)(braid_backend_log_fn_v1 log, void* log_arg, int world_size, int64_t timeout_ms,
              void** ctx, braid_backend_error_v1* error);

  /* Releases the context. Braid calls it last, after every comm was destroyed, and unloads
   * the library afterwards: no plugin thread may outlive it.
   *  fail: nonzero + error->message is logged as a warning; the context is gone regardless. */
  int (*finalize)(void* ctx, braid_backend_error_v1* error);

  /* ---- World (required) ----------------------------------------------------------------- */

  /* Number of ranks of the world. out: *world_size >= 1. */
  int (*world_size)(void* ctx, int* world_size, braid_backend_error_v1* error);

  /* World ranks hosted by this process, ascending (threads of one process: all of them; one
   * process per rank: that one).
   *  in:  ranks: room for `capacity` ints (Braid passes capacity == world size).
   *  out: *count: how many ranks this process hosts; the first min(*count, capacity) of them
   *       are written to `ranks`. */
  int (*local_ranks)(void* ctx, int* ranks, int capacity, int* count,
                     braid_backend_error_v1* error);

  /* ---- Communicators -------------------------------------------------------------------- */

  /* (required) The world comm as `rank` (one of local_ranks) sees it. Called once per local
   * rank, one after another from one thread: it must not wait for the other ranks.
   *  out: *comm: an opaque handle owned by the plugin until comm_destroy. */
  int (*comm_create_world)(void* ctx, int rank, void** comm, braid_backend_error_v1* error);

  /* (required) This rank's position in `comm` and the comm's size. Cheap; called once per
   * comm right after it is created. */
  int (*comm_info)(void* comm, int* rank, int* size, braid_backend_error_v1* error);

  /* (optional) Collective over `comm`, like MPI_Comm_split: ranks passing the same color
   * (>= 0) form a new comm, ordered by (key, rank in `comm`). Every rank of `comm` calls it
   * (each local rank from its own thread) and it returns once this rank's child exists.
   *  in:  color: >= 0, or -1 for "join no comm". Any other negative color is this rank's
   *       error: fail it with BRAID_BACKEND_INVALID_ARGUMENT on every rank, naming the rank,
   *       rather than leaving peers waiting.
   *  out: *child: the new comm (owned as from comm_create_world), or NULL for color -1.
   *  fail: nonzero + message; no child was created on this rank. NULL entry: Braid reports
   *       Unimplemented ("does not implement comm_split"). */
  int (*comm_split)(void* comm, int color, int key, void** child, braid_backend_error_v1* error);

  /* (required) Releases a comm. Every launch on it that returned BRAID_BACKEND_OK has its
   * callback called before comm_destroy returns (with an error if it had to be abandoned);
   * no callback for this comm runs afterwards. Peers still using the comm should get an error
   * rather than a hang. fail: nonzero + message is logged as a warning; the comm is gone.
   * It is also how Braid ends a comm's operations when the job aborts (an operation failed on
   * some rank, or the framework aborted the job): Braid then calls it early, from a thread of
   * its own, once no other entry on that comm is running, and never touches the comm again;
   * the sooner the callbacks come, the sooner every rank learns of the failure. */
  int (*comm_destroy)(void* comm, braid_backend_error_v1* error);

  /* (optional) BRAID_BACKEND_CAP_* bits of every comm of this context. NULL: host memory
   * only, no other claim. */
  uint64_t (*capabilities)(void* ctx);

  /* ---- Collectives (each optional) ------------------------------------------------------ *
   * Asynchronous: a launch checks its arguments, starts the operation and returns without
   * waiting for peers.
   *  - Returns BRAID_BACKEND_OK: `done(done_arg, status, message)` will be called exactly
   *    once, from any thread, possibly before the launch returns (see
   *    braid_backend_done_fn_v1). Until then the caller keeps the buffers alive and does
   *    not touch them.
   *  - Returns nonzero (+ error->message): nothing was started and `done` is never called.
   * Braid has already checked the arguments its own way (dtype valid, op allowed for the
   * dtype, buffers non-NULL when count > 0, root in range, buffers either the in-place form
   * or not overlapping), so a plugin need only reject what it cannot do. Counts are in
   * elements, NCCL-style; in-place forms follow NCCL (below). Host memory unless the
   * capabilities claim device memory. A NULL entry: Braid reports Unimplemented naming it. */

  /* recv[i] = op over ranks of send[i], i < count. In place when send == recv. */
  int (*all_reduce)(void* comm, const void* send, void* recv, size_t count, int dtype, int op,
                    double scalar, braid_backend_done_fn_v1 done, void* done_arg,
                    braid_backend_error_v1* error);

  /* `send` holds size * recvcount elements; recv = op over ranks of send block `rank`. In
   * place when recv == send + rank * recvcount. */
  int (*reduce_scatter)(void* comm, const void* send, void* recv, size_t recvcount, int dtype,
                        int op, double scalar, braid_backend_done_fn_v1 done, void* done_arg,
                        braid_backend_error_v1* error);

  /* recv block r (sendcount elements) = send of rank r. In place when
   * send == recv + rank * sendcount. */
  int (*all_gather)(void* comm, const void* send, void* recv, size_t sendcount, int dtype,
                    braid_backend_done_fn_v1 done, void* done_arg, braid_backend_error_v1* error);

  /* recv = send of rank `root`; only the root reads `send`. Braid always passes
   * send == recv (its broadcast is in place). */
  int (*broadcast)(void* comm, const void* send, void* recv, size_t count, int dtype, int root,
                   braid_backend_done_fn_v1 done, void* done_arg, braid_backend_error_v1* error);

  /* Completes once every rank of the comm has entered it. */
  int (*barrier)(void* comm, braid_backend_done_fn_v1 done, void* done_arg,
                 braid_backend_error_v1* error);
} braid_backend_v1;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_BACKENDS_PLUGIN_BRAID_BACKEND_V1_H_ */
