/* braid.h: the C API of Braid (C99; one header; libbraid.so exports only braid_* symbols).
 *
 * A framework embeds Braid through these functions: create a world (a backend and this
 * process's ranks), take groups from it, run collectives that return works (futures), and hand
 * a reducer its parameters so it buckets, reduces and (with the sharded optimizer) steps them.
 *
 *   braid_world_options_t wo;  braid_world_t* world;  braid_group_t* g;  braid_work_t* w;
 *   braid_world_options_init(&wo);
 *   wo.backend = "local";  wo.local_ranks = 1;
 *   if (braid_world_create(&wo, &world) != BRAID_OK) { puts(braid_last_error()); return 1; }
 *   braid_world_group(world, 0, &g);
 *   braid_allreduce(g, buf, buf, n, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &w);
 *   braid_work_wait(w, -1);
 *   braid_work_destroy(w);  braid_group_destroy(g);  braid_world_destroy(world);
 *
 * Conventions (every function):
 *  - Returns a braid_status_t; BRAID_OK is 0. On any other code, braid_last_error() holds a
 *    message naming the function, the argument and the problem. Nothing is thrown across.
 *  - Out-parameters are written only on BRAID_OK (exceptions are noted where they occur).
 *  - Every handle argument is checked before use: NULL, destroyed, a handle of another type
 *    and pointers that are no Braid handle at all are each rejected with
 *    BRAID_INVALID_ARGUMENT, never dereferenced. Handles are opaque tokens (not addresses) and
 *    are never reused in a process, so a use after destroy is always recognized.
 *  - Destroy functions accept NULL (a no-op returning BRAID_OK). A handle cannot be destroyed
 *    while handles created from it are alive; the call then returns BRAID_FAILED_PRECONDITION
 *    naming how many of each kind remain, and changes nothing:
 *        world     <- groups (braid_world_group, braid_group_split, braid_mesh_create)
 *        group     <- works started on it, reducers that use it (shard or replica)
 *        reducer   <- the optimizer built on it
 *    So a world with work in flight cannot be destroyed: its groups are alive. A work may be
 *    destroyed before its operation completes; the operation then continues unobserved, and
 *    its buffers must stay valid until it completes.
 *  - Option structs begin with `size_t struct_size`. Fill them with the matching
 *    braid_*_options_init() (which sets struct_size to sizeof the struct and every field to
 *    its default), then change fields. Accepted: the size of any version of the struct this
 *    library knows (fields are only ever appended: an older caller's smaller struct is read
 *    as far as it goes and the fields it lacks keep their defaults; "since 0.N" marks the
 *    fields each version appended, and CHANGELOG.md lists the sizes), or a larger size (a
 *    newer header) whose extra bytes are all zero; otherwise BRAID_INVALID_ARGUMENT
 *    ("struct_size ..."). An options pointer may be NULL: every default.
 *  - Thread safety: any function may be called from any thread. Collectives and splits on one
 *    group are serialized by the library, but every rank must still issue a group's
 *    collectives in the same order (the RANK-ORDER CONTRACT: ranks match calls by position;
 *    a violation is an error on the local backend, a deadline error or a hang elsewhere).
 *    Do not issue collectives on a group while a reducer that uses it is inside a backward.
 *  - Process-wide state: one handle registry (a locked table) and each thread's last error.
 */
#ifndef BRAID_CAPI_BRAID_H_
#define BRAID_CAPI_BRAID_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define BRAID_API __attribute__((visibility("default")))
#else
#define BRAID_API
#endif

#define BRAID_VERSION_MAJOR 0
#define BRAID_VERSION_MINOR 11
#define BRAID_VERSION_PATCH 0
/* Bumped whenever a struct layout, enum value or signature changes incompatibly. */
#define BRAID_ABI_VERSION 1

/* ---- Versions, status codes, errors ------------------------------------------------------ */

/* "MAJOR.MINOR.PATCH" of the loaded library (compare with the BRAID_VERSION_* macros). */
BRAID_API const char* braid_version(void);
/* BRAID_ABI_VERSION of the loaded library; refuse to run when it differs from the header's. */
BRAID_API int braid_abi_version(void);

/* Mapping from the library's internal absl::StatusCode:
 *   OK -> BRAID_OK; InvalidArgument -> INVALID_ARGUMENT; NotFound -> NOT_FOUND;
 *   FailedPrecondition, AlreadyExists, PermissionDenied, Unauthenticated -> FAILED_PRECONDITION;
 *   OutOfRange -> OUT_OF_RANGE; DeadlineExceeded -> TIMEOUT;
 *   Cancelled, Aborted, Unavailable -> PEER_ERROR; Unimplemented -> UNIMPLEMENTED;
 *   DataLoss -> DATA_LOSS; Internal, Unknown, ResourceExhausted (out of memory) -> INTERNAL. */
typedef enum braid_status {
  BRAID_OK = 0,
  BRAID_IN_PROGRESS,         /* not an error: braid_work_test on an unfinished work */
  BRAID_INVALID_ARGUMENT,    /* bad value, NULL/destroyed/foreign handle, bad struct_size */
  BRAID_NOT_FOUND,           /* unknown backend, parameter id, missing file or plugin */
  BRAID_FAILED_PRECONDITION, /* call not valid in the current state (see each function) */
  BRAID_OUT_OF_RANGE,        /* index out of range, output array too small */
  BRAID_TIMEOUT,             /* a deadline passed */
  BRAID_PEER_ERROR,          /* a remote rank failed; operation cancelled, aborted, unavailable */
  BRAID_UNIMPLEMENTED,       /* the backend or this build lacks the feature */
  BRAID_DATA_LOSS,           /* corrupt state file */
  BRAID_INTERNAL             /* a bug or out of memory */
} braid_status_t;

/* "BRAID_OK", "BRAID_TIMEOUT", ...; "BRAID_UNKNOWN_STATUS" for a value outside the enum. */
BRAID_API const char* braid_status_name(braid_status_t status);
/* The message of the last call on this thread that failed (returned neither BRAID_OK nor
 * BRAID_IN_PROGRESS); "" if none. Successful calls leave it unchanged. The pointer is valid
 * until the next failing call on this thread or braid_clear_error(). Never NULL. */
BRAID_API const char* braid_last_error(void);
/* Resets this thread's last error to "". */
BRAID_API void braid_clear_error(void);

/* ---- Types --------------------------------------------------------------------------------- */

typedef struct braid_world braid_world_t;
typedef struct braid_group braid_group_t;
typedef struct braid_work braid_work_t;
typedef struct braid_reducer braid_reducer_t;
typedef struct braid_optimizer braid_optimizer_t;

/* Element types (values as Braid's C++ DType). bf16/f16 reduce with f32 accumulation. */
typedef enum braid_dtype {
  BRAID_DTYPE_F32 = 0,
  BRAID_DTYPE_F64 = 1,
  BRAID_DTYPE_BF16 = 2,
  BRAID_DTYPE_F16 = 3,
  BRAID_DTYPE_I32 = 4,
  BRAID_DTYPE_I64 = 5,
  BRAID_DTYPE_U8 = 6
} braid_dtype_t;
/* Bytes per element; 0 for a value outside the enum. */
BRAID_API size_t braid_dtype_size(braid_dtype_t dtype);

/* Reduction operators (values as Braid's C++ ReduceKind). AVG divides the sum by the group
 * size; PREMUL_SUM sums (s_r * x_r) with s_r this rank's premul_scalar (collective options);
 * AVG and PREMUL_SUM need floating dtypes. */
typedef enum braid_reduce_op {
  BRAID_OP_SUM = 0,
  BRAID_OP_AVG = 1,
  BRAID_OP_PREMUL_SUM = 2,
  BRAID_OP_MAX = 3,
  BRAID_OP_MIN = 4
} braid_reduce_op_t;

/* ---- World ---------------------------------------------------------------------------------- */

/* Since 0.10: an explicit rendezvous's channel for rank 0's store address (braid_world_options_t
 * rendezvous_publish / rendezvous_lookup), e.g. a store the framework already shares (PyTorch's
 * torch.distributed store). Both are called only on the thread inside braid_world_create, at
 * most once per call, and never after it returned. Return BRAID_OK, or a failure code:
 * BRAID_TIMEOUT when the key did not appear in time, anything else for other failures
 * (braid_world_create then fails with that code, naming the callback and the key). */
/* Rank 0: make `value` (a NUL-terminated "host:port") readable by every rank under `key`. */
typedef braid_status_t (*braid_rendezvous_publish_fn)(const char* key, const char* value,
                                                      void* user_data);
/* Every other rank: wait up to timeout_ms for `key` and copy its value, NUL-terminated, into
 * value[0, capacity) (capacity >= 256; BRAID_OUT_OF_RANGE when it does not fit). */
typedef braid_status_t (*braid_rendezvous_lookup_fn)(const char* key, int64_t timeout_ms,
                                                     char* value, size_t capacity, void* user_data);

typedef struct braid_world_options {
  size_t struct_size;
  /* "local" (ranks are threads of this process), "mpi" (one rank per process, from mpirun's
   * environment), "nccl" (one rank per process and CUDA device; see unique_id), "gloo" (one
   * rank per process, CPU buffers, over TCP; for torchrun / srun) or "plugin".
   * NULL (default): "plugin" when plugin_path is set, else BRAID_BACKEND when read_env, else
   * "local" -- except that with read_env, and neither this field, plugin_path, unique_id nor
   * BRAID_BACKEND naming one (BRAID_BACKEND unset or "local"), the launcher decides:
   *   mpirun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set)         -> "mpi"
   *   torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or
   *   srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with MASTER_ADDR and MASTER_PORT
   *   exported by the batch script), more than one rank                -> "nccl" where NCCL
   *                                       loads and a CUDA device is visible, else "gloo"
   *   none of these                                                    -> "local"
   * torchrun wins over the SLURM_* variables of the allocation it runs in. Under torchrun /
   * srun, rank 0 serves a TCP rendezvous store on MASTER_ADDR (port: store_port) and every
   * rank checks in there; a rank that does not arrive within timeout_ms fails the others,
   * naming it. An explicit rendezvous (world_size without unique_id) counts as a
   * launcher too, before mpirun: "nccl" where usable, else "gloo" (a world of one: as with no
   * launcher). braid_world_backend says which backend was chosen. "mpi" and "gloo" live in
   * modules beside libbraid.so (libbraid-mpi.so, libbraid-gloo.so; BRAID_BACKEND_MODULE_DIR)
   * loaded by the first world that needs them, so only those backends need Open MPI / Gloo
   * installed; when the module or its library is missing, braid_world_create fails with
   * BRAID_FAILED_PRECONDITION naming the library and the Debian package to install. */
  const char* backend;
  /* Shared library exporting braidBackendPlugin_v1. NULL (default): BRAID_BACKEND_PLUGIN when
   * read_env. */
  const char* plugin_path;
  /* local: ranks (threads) in this process; plugin: the world size request. 0 (default):
   * BRAID_LOCAL_RANKS when read_env, else 1. At most 4096 (as BRAID_LOCAL_RANKS). */
  int local_ranks;
  /* 1 (default): start from the BRAID_* environment variables (BRAID_LOG_LEVEL,
   * BRAID_SPIN_US, BRAID_VALIDATE_COLLECTIVES, ...); the fields above override them.
   * 0: ignore the environment. */
  int read_env;
  /* Deadline of every collective and internal wait. 0 (default): BRAID_TIMEOUT_MS when
   * read_env, else 300000. */
  int64_t timeout_ms;
  /* ---- since 0.6: the nccl backend. The library opens NCCL (BRAID_NCCL_LIBRARY when read_env,
   * else libnccl.so.2) with dlopen when an nccl world is first created; nothing else needs
   * NCCL or a GPU. */
  /* backend "nccl" only: the NCCL unique id (unique_id_size bytes, copied) that one rank made
   * with braid_nccl_unique_id and the caller handed to every rank through its own channel
   * (a store, a TCP connection, a file). Needs world_size and rank. NULL (default): "nccl"
   * bootstraps over MPI under mpirun (rank 0 makes the id and broadcasts it), through the TCP
   * rendezvous store under torchrun / srun (rank 0 publishes it there), or, outside any
   * launcher, makes a world of one rank. */
  const void* unique_id;
  /* The size braid_nccl_unique_id reported (128); 0 (default) without unique_id. */
  size_t unique_id_size;
  /* With unique_id: the world's number of ranks (>= 1; one process and GPU each) and this
   * process's rank in [0, world_size). Without unique_id, world_size >= 1 makes an
   * explicit rendezvous (see master_addr): this process is `rank` of world_size processes,
   * instead of what a launcher's RANK / WORLD_SIZE say (which, when set, must agree). Both 0
   * (default): no explicit rendezvous. */
  int world_size;
  int rank;
  /* nccl: this rank's CUDA device. -1 (default): BRAID_CUDA_DEVICE when read_env, else the
   * rank modulo the number of visible devices. */
  int cuda_device;
  /* nccl: 1 blocking communicators, 0 nonblocking (NCCL calls return at once and are polled
   * under the deadline, so a hung peer never blocks a thread inside NCCL). -1 (default):
   * BRAID_NCCL_BLOCKING when read_env, else 1. */
  int nccl_blocking;
  /* ---- since 0.10: where the ranks meet, for the backends that meet at rank 0's TCP
   * store ("gloo"; "nccl" without unique_id). Typical use: PyTorch with torch.distributed
   * initialized, whose rank, world size and store Braid then shares instead of opening
   * MASTER_PORT a second time (braid.World() does this by itself). The explicit rendezvous
   * (world_size >= 1 without unique_id) is used by those backends; with any other (named, or
   * from BRAID_BACKEND / mpirun) the world made must have world_size ranks with `rank` in this
   * process, else FAILED_PRECONDITION naming both. */
  /* Rank 0's host as every rank reaches it; its store listens there. NULL (default):
   * MASTER_ADDR. Needs world_size. */
  const char* master_addr;
  /* The port rank 0's store listens on, with or without an explicit rendezvous. -1 (default):
   * BRAID_STORE_PORT when read_env, else 0. 0: a port the OS picks; the other ranks learn it
   * through rendezvous_lookup when set, else from a bootstrap store rank 0 serves at
   * MASTER_ADDR:MASTER_PORT only while the world is created (MASTER_PORT is free again when
   * braid_world_create returns, on every rank). 1..65535: that port, for the world's life
   * (firewalls; no MASTER_PORT needed). */
  int store_port;
  /* The channel for the store's address when store_port is 0 (typedefs above): both or
   * neither; rendezvous_data is passed to both. Needs world_size. NULL (default): none. */
  braid_rendezvous_publish_fn rendezvous_publish;
  braid_rendezvous_lookup_fn rendezvous_lookup;
  void* rendezvous_data;
} braid_world_options_t;

/* Fills defaults and struct_size. NULL: no-op. */
BRAID_API void braid_world_options_init(braid_world_options_t* opts);

/* Creates the backend. `opts` may be NULL (defaults). On success *out is a new world.
 * Backend "nccl" with unique_id: this process is rank `rank` of a world of world_size ranks;
 * braid_world_group(world, rank, ...) is collective over all of them (ncclCommInitRank).
 * Errors: INVALID_ARGUMENT (bad struct_size, malformed BRAID_* variable, local_ranks < 0,
 * timeout_ms < 0, read_env not 0/1, NULL out; unique_id with another backend than "nccl",
 * unique_id_size not the id's size, unique_id_size set without unique_id, rank set without
 * unique_id or world_size, world_size < 1 or rank outside [0, world_size), cuda_device < -1
 * or not a visible device, nccl_blocking not -1/0/1; master_addr / rendezvous_* without
 * world_size, one of rendezvous_publish / rendezvous_lookup without the other, store_port
 * outside -1..65535, an explicit rank / world_size disagreeing with RANK / WORLD_SIZE, no
 * master address or way to learn the store's port: each naming the field); NOT_FOUND
 * (unknown backend name, listing the known ones; a plugin path with no library);
 * FAILED_PRECONDITION (nccl: NCCL cannot be loaded, naming the library path, the symbol and
 * the loader's message; no usable GPU, naming the CUDA error, e.g. 35 without a driver, 100
 * without a device; a backend other than gloo / nccl made a world the explicit
 * rendezvous contradicts); FAILED_PRECONDITION / UNIMPLEMENTED (plugin without a usable
 * table); INVALID_ARGUMENT naming the variable for a malformed torchrun / srun environment
 * (RANK >= WORLD_SIZE, MASTER_PORT missing, ...); DEADLINE_EXCEEDED naming the ranks that
 * never reached the rendezvous; PEER_ERROR when rank 0 cannot listen (MASTER_PORT or
 * store_port taken, naming the address); the callbacks' codes (see their typedefs); others
 * from the backend (e.g. mpi outside mpirun). */
BRAID_API braid_status_t braid_world_create(const braid_world_options_t* opts, braid_world_t** out);
/* *name = the world's backend ("local", "mpi", "nccl", "gloo", or a plugin's name), valid while
 * the world lives. Since 0.8. */
BRAID_API braid_status_t braid_world_backend(braid_world_t* world, const char** name);
/* *size = number of ranks in the world (all processes). */
BRAID_API braid_status_t braid_world_size(braid_world_t* world, int* size);
/* The world ranks hosted by this process (local: 0..N-1; mpi: this process's rank), in
 * increasing order. *count = their number (always written, even on OUT_OF_RANGE). `ranks` may
 * be NULL (count only); else up to `capacity` entries are written, and OUT_OF_RANGE is
 * returned when capacity < *count. */
BRAID_API braid_status_t braid_world_local_ranks(braid_world_t* world, int* ranks, int capacity,
                                                 int* count);
/* The world group as rank `rank` (one of braid_world_local_ranks) sees it; once per rank.
 * Hand it to the thread that plays that rank. Errors: INVALID_ARGUMENT (rank outside the
 * world), FAILED_PRECONDITION (that rank's group was already taken). */
BRAID_API braid_status_t braid_world_group(braid_world_t* world, int rank, braid_group_t** out);
/* Destroys the world. FAILED_PRECONDITION while groups created from it are alive. On "mpi" and
 * "gloo", a world destroyed (or closed at process exit) while the job has not aborted tells the
 * other processes that this rank left: 0.5 s later (at once on gloo when a call fails on its
 * closed connection) their pending collectives that have not completed and all their later
 * calls fail with BRAID_PEER_ERROR naming this rank ("rank 1 left the job: ..."). At the end of
 * a job every rank destroys its world, and nothing is left that needs the others. */
BRAID_API braid_status_t braid_world_destroy(braid_world_t* world);

/* A new NCCL unique id for a world of backend "nccl" (call it on one rank, e.g. rank 0, then
 * hand the bytes to every rank's braid_world_options_t.unique_id). Needs NCCL (opened from
 * BRAID_NCCL_LIBRARY, else libnccl.so.2), not a GPU. *size = the id's size in bytes (128;
 * always written, even on OUT_OF_RANGE). `out` may be NULL (size only); else the id is
 * written to out[0, *size). Errors: INVALID_ARGUMENT (NULL size, malformed BRAID_* variable);
 * OUT_OF_RANGE (capacity < *size: nothing made); FAILED_PRECONDITION (NCCL cannot be loaded,
 * naming the library path and the loader's message); INTERNAL (ncclGetUniqueId failed). */
BRAID_API braid_status_t braid_nccl_unique_id(void* out, size_t capacity, size_t* size);

/* ---- Groups --------------------------------------------------------------------------------- */

#define BRAID_NO_COLOR (-1) /* braid_group_split color: this rank joins no new group */

/* Since 0.10 (additive): writes the flight recorder of `group`'s rank (the last
 * BRAID_FLIGHT_RECORDER_ENTRIES collectives of all its groups: group, seq, op, bytes, label,
 * times, state) to `path` as JSON lines (docs/hardening.md#flight-recorder; tools/braid_flight
 * merges the ranks' files); `path` NULL: <BRAID_FLIGHT_RECORDER_DIR>/braid_flight.rank<R>.jsonl.
 * Safe while collectives run, from any thread (not from a signal handler). Errors:
 * FAILED_PRECONDITION (recording off: BRAID_FLIGHT_RECORDER_ENTRIES=0; `path` NULL without
 * BRAID_FLIGHT_RECORDER_DIR; the file cannot be written), NOT_FOUND (its directory is missing). */
BRAID_API braid_status_t braid_flight_recorder_dump(braid_group_t* group, const char* path);

BRAID_API braid_status_t braid_group_rank(braid_group_t* group, int* rank);
BRAID_API braid_status_t braid_group_size(braid_group_t* group, int* size);
/* *name: the group's name ("world", "world/shard", ...), valid while the group lives. */
BRAID_API braid_status_t braid_group_name(braid_group_t* group, const char** name);
/* Collective over `group`: ranks passing the same color (>= 0) form a new group, ordered by
 * (key, rank in `group`). BRAID_NO_COLOR: returns BRAID_OK with *out = NULL. `name` may be
 * NULL ("<parent>/<color>"). Blocks until every rank of `group` called it. Errors:
 * INVALID_ARGUMENT (other negative color, here or on a peer), TIMEOUT, PEER_ERROR. */
BRAID_API braid_status_t braid_group_split(braid_group_t* group, int color, int key,
                                           const char* name, braid_group_t** out);
/* Collective over a world group: replicas x shards (HSDP). World rank r is shard r % shards of
 * replica r / shards; *shard = the `shards` ranks of r's replica (reduce-scatter group),
 * *replica = the `replicas` ranks holding r's shard (all-reduce group). Both are new groups.
 * Errors: INVALID_ARGUMENT unless replicas * shards == the group's size. */
BRAID_API braid_status_t braid_mesh_create(braid_group_t* world_group, int replicas, int shards,
                                           braid_group_t** shard, braid_group_t** replica);
/* FAILED_PRECONDITION while works or reducers created on the group are alive. */
BRAID_API braid_status_t braid_group_destroy(braid_group_t* group);
/* Aborts the whole job, on every rank, with `reason` (e.g. "step 7: loss is NaN"), reported
 * as this group's rank: for failures Braid cannot see (the framework's step failed here).
 * Every pending work of every group on every rank then fails, and every later call is
 * refused, with BRAID_PEER_ERROR and a message naming this rank and the reason, within
 * milliseconds (local: threads of this process; mpi: a message to every process; gloo: the
 * rendezvous store; nccl: its communicators are aborted). Braid aborts the job by itself when a
 * collective fails on any rank (a deadline, a transport error), unless BRAID_ABORT_ON_FAILURE=0.
 * Not collective; BRAID_OK if the job had already aborted. Errors: INVALID_ARGUMENT (NULL or empty
 * reason), FAILED_PRECONDITION (a backend without aborts: plugins). Since 0.8. */
BRAID_API braid_status_t braid_group_abort(braid_group_t* group, const char* reason);

/* ---- Collectives and works ------------------------------------------------------------------ */

typedef struct braid_collective_options {
  size_t struct_size;
  int64_t timeout_ms;   /* 0 (default): the world's timeout */
  double premul_scalar; /* BRAID_OP_PREMUL_SUM: this rank's factor (default 1.0) */
  const char* label;    /* names the caller's unit in errors (e.g. "layer 3"); may be NULL */
  void* ready_event;    /* device backends: event to wait on before reading; NULL: none */
} braid_collective_options_t;

BRAID_API void braid_collective_options_init(braid_collective_options_t* opts);

/* Collectives: asynchronous; on success *out is a new work to wait on and destroy. Buffers
 * are the caller's and must stay valid until the work completes. In-place forms follow NCCL:
 * allreduce send == recv; reduce_scatter recv == send + rank * recvcount (elements);
 * allgather send == recv + rank * sendcount. `opts` may be NULL. Errors (returned at once,
 * nothing started): INVALID_ARGUMENT (NULL buffer with count > 0, overlapping out-of-place
 * buffers, dtype/op out of range or not valid together, bad root); UNIMPLEMENTED (the backend
 * lacks the op). Failures of the operation itself are reported by the work. */
/* Every rank receives the reduction of `count` elements. */
BRAID_API braid_status_t braid_allreduce(braid_group_t* group, const void* send, void* recv,
                                         size_t count, braid_dtype_t dtype, braid_reduce_op_t op,
                                         const braid_collective_options_t* opts,
                                         braid_work_t** out);
/* `send` holds size * recvcount elements; this rank receives block `rank`, reduced. */
BRAID_API braid_status_t braid_reduce_scatter(braid_group_t* group, const void* send, void* recv,
                                              size_t recvcount, braid_dtype_t dtype,
                                              braid_reduce_op_t op,
                                              const braid_collective_options_t* opts,
                                              braid_work_t** out);
/* `recv` receives size * sendcount elements, block r from rank r. */
BRAID_API braid_status_t braid_allgather(braid_group_t* group, const void* send, void* recv,
                                         size_t sendcount, braid_dtype_t dtype,
                                         const braid_collective_options_t* opts,
                                         braid_work_t** out);
/* `count` elements of `buf` on rank `root` are copied into `buf` on every rank. */
BRAID_API braid_status_t braid_broadcast(braid_group_t* group, void* buf, size_t count,
                                         braid_dtype_t dtype, int root,
                                         const braid_collective_options_t* opts,
                                         braid_work_t** out);
BRAID_API braid_status_t braid_barrier(braid_group_t* group, const braid_collective_options_t* opts,
                                       braid_work_t** out);

/* Waits up to timeout_ms (< 0: no limit; 0: just look) for the work. Returns the operation's
 * status once it completed (BRAID_OK, or e.g. PEER_ERROR / TIMEOUT naming group, op and
 * sequence number), or BRAID_TIMEOUT when it is still running at the deadline (it keeps
 * running: a later wait may succeed; braid_work_test tells the two timeouts apart). */
BRAID_API braid_status_t braid_work_wait(braid_work_t* work, int64_t timeout_ms);
/* Never blocks. *done = 0 and BRAID_IN_PROGRESS while the operation runs (last error
 * unchanged); *done = 1 and the operation's status once it completed. */
BRAID_API braid_status_t braid_work_test(braid_work_t* work, int* done);
/* *event = the work's device completion event (nccl: a cudaEvent_t recorded on Braid's comm
 * stream after the operation; cudaStreamWaitEvent(consumer, event, 0) orders a consumer
 * stream after it without blocking the host). NULL for host backends (local, mpi, plugin):
 * the results are in place once the work completed. Valid while the work's handle lives;
 * Braid owns it (never destroy it). */
BRAID_API braid_status_t braid_work_device_event(braid_work_t* work, void** event);
/* Releases the handle (see the conventions for unfinished works). */
BRAID_API braid_status_t braid_work_destroy(braid_work_t* work);

/* ---- Gradient reducer ------------------------------------------------------------------------
 * Buckets parameters' gradients and reduces each bucket as soon as all its gradients are
 * marked ready, in bucket order on every rank. Gradients live in Braid's bucket storage by
 * default (braid_reducer_grad: accumulate there, zero copy). */

typedef enum braid_reduce_mode {
  BRAID_MODE_ALLREDUCE = 0,      /* DDP: every rank gets every averaged gradient */
  BRAID_MODE_REDUCE_SCATTER = 1, /* ZeRO-2: each rank gets its averaged shard of each bucket */
  BRAID_MODE_HYBRID = 2          /* HSDP: reduce-scatter in shard, all-reduce in replica */
} braid_reduce_mode_t;

typedef enum braid_sync_mode {
  BRAID_SYNC = 0,               /* reduce this backward (plus what no_sync accumulated) */
  BRAID_NO_SYNC = 1,            /* communicate nothing; keep accumulating */
  BRAID_REDUCE_SCATTER_ONLY = 2 /* hybrid: reduce-scatter now, all-reduce at the next sync */
} braid_sync_mode_t;

/* One parameter. `name` (may be NULL) is copied; errors use it. Floating dtypes only. */
typedef struct braid_param {
  int64_t id; /* distinct per parameter; identical on every rank */
  /* Elements. count x the dtype's size, summed over a reducer's parameters, is at most 2^60
   * bytes (so no byte size wraps size_t): INVALID_ARGUMENT naming params[i].count otherwise. */
  size_t count;
  braid_dtype_t dtype;
  const char* name;
} braid_param_t;

#define BRAID_REDUCE_DTYPE_NATIVE (-1) /* braid_reducer_options_t.reduce_dtype default */
#define BRAID_DEVICE_HOST (-1)         /* braid_reducer_options_t.device default */

typedef struct braid_reducer_options {
  size_t struct_size;
  braid_reduce_mode_t mode; /* default BRAID_MODE_ALLREDUCE */
  /* BRAID_REDUCE_DTYPE_NATIVE (default; BRAID_DTYPE_BF16/F16 mean the same): each bucket is
   * reduced in its own dtype. BRAID_DTYPE_F32: bf16/f16 buckets are widened to f32 for the
   * reduction and rounded once at the end. Other values: INVALID_ARGUMENT. */
  int reduce_dtype;
  size_t bucket_cap_bytes;       /* default 25 MiB */
  size_t first_bucket_cap_bytes; /* default 1 MiB (the first bucket launches early) */
  int allow_unused;              /* 1: unmarked params are zero-filled and reduced; default 0 */
  int gradient_as_bucket_view;   /* 1 (default): grads live in buckets; 0: set_grad_buffer */
  int64_t timeout_ms;            /* finish_backward's deadline; default 300000 */
  /* Chrome-trace timeline written to "<prefix>.rank<world rank>.json"; NULL or "": off. */
  const char* timeline_prefix;
  /* Since 0.6. Where every parameter's gradient (and the buckets) live. BRAID_DEVICE_HOST (-1,
   * default): host memory. >= 0: that CUDA device, on groups of a "nccl" world whose
   * cuda_device it must be (the buckets are allocated and reduced there; Braid does not
   * check the match): braid_reducer_grad / braid_reducer_shard return device pointers, every
   * bucket operation is queued on Braid's comm streams, and mark_ready's device_event is
   * waited on by them; an optimizer on the reducer steps on the device too (f32/bf16/f16
   * gradients; f16 reduced natively with its pre/post-divide, BRAID_REDUCE_SCATTER_ONLY's
   * partial sums added on the device). */
  int device;
  /* ---- since 0.7: fully sharded training (ZeRO-3 / FSDP). */
  /* NULL (default): every parameter is in unit 0. Else n entries (the n of
   * braid_reducer_create), copied: param_units[i] >= 0 is params[i]'s unit, the framework's
   * wrapping unit (e.g. one transformer block). A bucket never mixes units, so a unit is
   * gathered and released as whole buckets (braid_reducer_unit_buckets). */
  const int* param_units;
  /* 1: FSDP's gradient memory (reduce-scatter and hybrid modes only). Full-size bucket storage
   * exists only while a bucket is being filled and reduced: gradients are handed over at mark
   * time (braid_reducer_mark_ready_grad copies them in), and once a bucket's synced reduction
   * completed only this rank's shard is kept (braid_reducer_shard); the bucket's storage
   * returns to a pool that later buckets reuse. Live gradient memory: the shards plus the
   * buckets in flight. BRAID_NO_SYNC keeps full buckets for the whole accumulation window
   * (that is no_sync's memory cost, as in FSDP); BRAID_REDUCE_SCATTER_ONLY accumulates into the
   * kept shard. braid_reducer_grad then fails (FAILED_PRECONDITION). 0 (default): off. */
  int shard_gradients;
  /* ---- since 0.9: communication scheduling (ByteScheduler's credit and priorities;
   * scheduler/op_scheduler.h). Either one set gives the reducer a launch scheduler of its own:
   * created with it (collective: every rank must pass the same two values, else
   * FAILED_PRECONDITION naming them), shared with an optimizer built on the reducer. Results
   * are bit-identical to an unscheduled reducer on local and on mpi at 2 ranks (and on the
   * fake NCCL device; real NCCL's per-element order may depend on the call size above 2 ranks).
   * Device reducers: partitions are queued on the comm stream as credit and priorities allow;
   * nothing waits on the host that did not before. */
  /* > 0: a bucket reduction larger than credit_bytes runs as partitions of at most
   * credit_bytes each, and at most credit_bytes of reduction partitions are in flight per
   * group, so an urgent operation waits for at most one partition. 0 (default): whole
   * buckets. Each partition is a collective of its own: worth it only for buckets several
   * times the credit (bench/overlap: 1 MiB credits on 6 MiB buckets). */
  size_t credit_bytes;
  /* 1: the parameter all-gathers of an optimizer built on this reducer (what the next forward,
   * or a fully sharded unit, waits for) go first: while one is in flight, reduction partitions
   * not yet issued wait (at most 100 ms each). Only when, never which: every group still
   * issues its collectives in the same order on every rank. 0 (default): off. */
  int priorities;
  /* ---- since 0.11: divergent control flow (torch DDP's find_unused_parameters). */
  /* BRAID_UNUSED_NONE (0, default): no agreement. BRAID_UNUSED_AT_FINISH: every synced backward
   * ends with one all-reduce of a used map (n int32) over the reducer's groups, after every
   * bucket completed: which parameters some rank marked in that backward or in the
   * BRAID_NO_SYNC / BRAID_REDUCE_SCATTER_ONLY backwards before it (braid_reducer_param_used).
   * An optimizer built on the reducer does not step the others (torch's optimizer skips a None
   * grad: moments, weight decay and that parameter's step count stay), and steps the rest with
   * the average (zeros from the ranks that did not use them). BRAID_UNUSED_DECLARED: the same
   * agreement issued as the backward's first collective, so it overlaps the backward, from the
   * ids every rank passes to braid_reducer_declare_unused in every backward.
   * BRAID_UNUSED_DECLARED_AT_FINISH: the declared ids are zero-filled and counted ready early,
   * as with DECLARED, but the agreement runs as with AT_FINISH, on what was marked: a parameter
   * neither declared nor marked is unused (torch's parameter that the outputs reach but that
   * gets no gradient); an optimizer then steps nothing before the backward ends. All three
   * imply allow_unused. Other values: INVALID_ARGUMENT. */
  int agree_unused;
  /* 1: with agree_unused, only the first synced backward agrees, at its end on what was marked
   * (DECLARED too: a parameter neither declared nor marked is unused, as in torch's first
   * iteration); later ones keep its map and communicate nothing more (torch DDP's
   * static_graph). 0 (default). */
  int static_graph;
  /* ---- since 0.11: tied and reused parameters. NULL (default): every parameter is marked
   * ready once per backward. Else n entries (the n of braid_reducer_create), copied:
   * param_marks[i] >= 1 declares that params[i] is marked that many times per backward (once
   * per contribution: a tied weight, a hook firing inside and outside a reentrant checkpoint;
   * braid_reducer_mark_ready_grad's gradients are added); BRAID_MARKS_COUNTED (0): counted in
   * the first synced backward that marks it, whose buckets from that parameter's on then launch
   * at braid_reducer_finish_backward (torch DDP's static_graph). A bucket launches after its
   * parameters' last marks. A mark beyond the count fails FAILED_PRECONDITION naming the
   * parameter and adds nothing; fewer marks than the count (but some) fail finish_backward by
   * name. < 0: INVALID_ARGUMENT naming params[i]. */
  const int* param_marks;
} braid_reducer_options_t;

#define BRAID_UNUSED_NONE 0               /* braid_reducer_options_t.agree_unused */
#define BRAID_UNUSED_AT_FINISH 1          /* agreed after the backward's buckets */
#define BRAID_UNUSED_DECLARED 2           /* agreed first, from braid_reducer_declare_unused */
#define BRAID_UNUSED_DECLARED_AT_FINISH 3 /* declared, agreed after the buckets on marks */
#define BRAID_MARKS_COUNTED 0 /* braid_reducer_options_t.param_marks: counted, not declared */

BRAID_API void braid_reducer_options_init(braid_reducer_options_t* opts);

/* Collective over `shard` (and `replica`): builds the bucket plan and checks that every rank
 * has the same one. `shard`: the data-parallel group (all-reduce mode) or the reduce-scatter
 * group; `replica`: hybrid mode only (else NULL), from the same world as `shard`. `params`:
 * n entries, copied. Errors: INVALID_ARGUMENT (NULL params with n > 0, duplicate id, bad dtype
 * or mode, replica missing in hybrid mode or given otherwise, groups of different worlds, a
 * plan that differs across ranks, device < -1), UNIMPLEMENTED (a device the backend lacks:
 * device >= 0 on a host backend, or a feature the device reducer lacks), NOT_FOUND
 * (timeline directory missing). */
BRAID_API braid_status_t braid_reducer_create(braid_group_t* shard, braid_group_t* replica,
                                              const braid_param_t* params, size_t n,
                                              const braid_reducer_options_t* opts,
                                              braid_reducer_t** out);
/* *data, *count: parameter `id`'s gradient inside its bucket (its registered dtype), valid
 * for the reducer's lifetime. All-reduce mode: holds the averaged gradient after
 * finish_backward. NOT_FOUND for an unknown id. */
BRAID_API braid_status_t braid_reducer_grad(braid_reducer_t* reducer, int64_t id, void** data,
                                            size_t* count);
/* gradient_as_bucket_view = 0: the framework's own gradient buffer of `id` (registered count
 * and dtype), kept alive by the caller; needed for every parameter before the first backward.
 * mark_ready copies it in; all-reduce mode copies the average back. FAILED_PRECONDITION
 * during a backward. */
BRAID_API braid_status_t braid_reducer_set_grad_buffer(braid_reducer_t* reducer, int64_t id,
                                                       void* grad);
/* Starts a backward. FAILED_PRECONDITION when one is in progress or an optimizer was built on
 * this reducer (use braid_optimizer_begin_backward), and while a reduction of an earlier
 * backward whose finish_backward failed at its deadline is still running (naming the bucket:
 * its storage is not reused under it; retry once it completed, or destroy the reducer);
 * INVALID_ARGUMENT for REDUCE_SCATTER_ONLY outside hybrid mode. */
BRAID_API braid_status_t braid_reducer_begin_backward(braid_reducer_t* reducer,
                                                      braid_sync_mode_t mode);
/* Parameter `id`'s gradient is final for this backward; any thread, any order, once per
 * parameter per backward. `device_event` (may be NULL): wait on it before reading (device
 * backends). On a device reducer pass the cudaEvent_t recorded after the gradient's last write:
 * Braid's comm stream is not ordered after the framework's streams, so NULL there means "this
 * gradient is already complete on the device" (e.g. after a synchronize), and is not checked.
 * Errors name the parameter: NOT_FOUND (unknown id), FAILED_PRECONDITION (marked twice in this
 * backward, or outside a backward: before begin or after finish). */
BRAID_API braid_status_t braid_reducer_mark_ready(braid_reducer_t* reducer, int64_t id,
                                                  void* device_event);
/* mark_ready with the gradient's values: copies `grad` (the parameter's registered count and
 * dtype; host memory, or device memory on a device reducer, read after `device_event`) into
 * its bucket, so the caller may free or reuse `grad` once the call returned (device: once the
 * comm stream passed the copy, i.e. after the bucket's work completed). In a BRAID_NO_SYNC
 * backward and in the synced backward after it, values are added to what the window
 * accumulated (the first mark of a parameter in the window copies, later ones add). The
 * gradient path of shard_gradients reducers; works on every reducer. Errors as mark_ready,
 * plus INVALID_ARGUMENT for a NULL grad. */
BRAID_API braid_status_t braid_reducer_mark_ready_grad(braid_reducer_t* reducer, int64_t id,
                                                       const void* grad, void* device_event);
/* Returns once every reduction of this backward completed. Errors: FAILED_PRECONDITION
 * (unmarked parameters, named, without allow_unused; no backward; an optimizer owns the
 * backward), TIMEOUT / PEER_ERROR naming bucket and group. */
BRAID_API braid_status_t braid_reducer_finish_backward(braid_reducer_t* reducer);
/* Since 0.11 (additive): waits up to timeout_ms (< 0: no limit) until bucket `bucket`'s
 * reduction in the current synced backward completed, and returns its status (BRAID_TIMEOUT
 * while it still runs). Callable from any thread once the bucket launched (its last parameter
 * was marked) until finish_backward returned on the backward's thread, beside it: what a
 * profiler needs to observe each collective's completion off that thread (braid.pytorch's
 * torch profiler ranges). OUT_OF_RANGE for no such bucket. */
BRAID_API braid_status_t braid_reducer_wait_bucket(braid_reducer_t* reducer, int bucket,
                                                   int64_t timeout_ms);
/* Since 0.11, agree_unused = BRAID_UNUSED_DECLARED or _DECLARED_AT_FINISH: the n ids (NULL
 * when n = 0) this rank will not mark in the current backward (torch finds them at the
 * forward's end). Every rank calls it once in every backward (n = 0 too), after begin_backward
 * and before any mark_ready of it. A synced backward issues the used-map agreement first
 * (DECLARED; _DECLARED_AT_FINISH agrees at finish_backward), then zero-fills the declared
 * gradients (a BRAID_NO_SYNC window's sums stay) and counts them ready, so later buckets need
 * not wait for the end of the backward; a BRAID_NO_SYNC backward ignores the list. Errors:
 * FAILED_PRECONDITION (other agree_unused, outside a backward, twice, after a mark_ready; a
 * later mark_ready of a declared id fails naming it), NOT_FOUND (unknown id), INVALID_ARGUMENT
 * (an id listed twice, NULL ids with n > 0). */
BRAID_API braid_status_t braid_reducer_declare_unused(braid_reducer_t* reducer, const int64_t* ids,
                                                      size_t n);
/* Since 0.11: *used = 1 when some rank used parameter `id` in the last agreed synced backward
 * (readable once finish_backward returned), else 0; 1 for every parameter without agree_unused
 * or before the first agreement. NOT_FOUND for an unknown id. */
BRAID_API braid_status_t braid_reducer_param_used(braid_reducer_t* reducer, int64_t id, int* used);
/* Zeroes every gradient (start of a new accumulation window). FAILED_PRECONDITION during a
 * backward, and while an optimizer built on the reducer is alive (it zeroes each bucket's
 * gradients itself once it stepped them). Device reducer: returns once the zeroes landed (any
 * stream may write after it); the memsets run on Braid's comm stream, so the framework's reads of
 * the reduced gradients must have finished first (synchronize the stream that reads them). A failed
 * memset is returned (naming the bucket), never only logged. */
BRAID_API braid_status_t braid_reducer_zero_grads(braid_reducer_t* reducer);
BRAID_API braid_status_t braid_reducer_num_buckets(braid_reducer_t* reducer, int* count);
/* Since 0.8: torch DDP's one-time bucket rebuild. Every reducer (but shard_gradients ones) records
 * the order in which parameters were marked ready in its first BRAID_SYNC backward (n ints).
 * Called between steps (after the gradients were consumed, before the next begin_backward) at
 * the same point on every rank, it rebuilds the buckets in world rank 0's recorded order
 * (parameters never marked last) so the first bucket holds the first gradients the backward
 * produces, and sets *rebuilt = 1; it is collective over the reducer's groups then (one
 * broadcast of n int64 and the plan check). *rebuilt = 0, without communication, when there is
 * nothing to rebuild: no synced backward finished yet, or the buckets were rebuilt already
 * (once per reducer). After a rebuild every braid_reducer_grad pointer, bucket index and
 * braid_reducer_shard changes: fetch them again (the old storage is freed; gradient values
 * moved with their parameters). With an optimizer built on the reducer (ZeRO-2, host
 * memory) its state follows: the whole state is all-gathered over the shard group, the optimizer
 * is built again over the new plan and loads this rank's part (master weights, moments, step
 * counts, hyper-parameters bit for bit; costs the state's full size in host memory for the
 * moment of the call); fetch every
 * braid_optimizer_param pointer again (the old ones stay readable until the next re-plan or
 * the optimizer's end). FAILED_PRECONDITION: during a backward; an optimizer that cannot follow
 * (fully_sharded, device reducers); shard_gradients (no full-size storage between
 * backwards to move gradients through).
 *
 *   run one synced step;  braid_reducer_rebuild_buckets(r, &rebuilt);
 *   if (rebuilt) for each id: braid_reducer_grad(r, id, &data, &count);   // new views */
BRAID_API braid_status_t braid_reducer_rebuild_buckets(braid_reducer_t* reducer, int* rebuilt);
/* Since 0.8: the autotuner (Horovod's fusion-buffer autotuning, by successive halving;
 * scheduler/autotuner.h). Off unless called; call it once per step at a step boundary (between
 * steps, same point on every rank, e.g. before each training forward) with the time of the step
 * that just ended on this rank. Candidates: the bucket cap the reducer was created with (the
 * default) and 1/8, 1/4, 1/2 and 2x it. Rounds run the surviving candidates round-robin, one
 * step each in turn (so drift in the machine's load hits them alike; the first pass of a round
 * is not timed), 2, 4, 8 ... timed steps each; at the end of a round one all-reduce over the
 * reducer's groups gives every rank the slowest rank's median per candidate, and the faster half
 * survives. The last survivor is adopted only if it beat the default by over 3 % in a round both
 * ran (a confirmation round runs them together if needed), so the job never settles on caps
 * measured slower than the default's. About 50-90 steps; then every call is local and does
 * nothing. While tuning, a call may re-plan the buckets for the next step's candidate:
 * *replanned = 1 then, and every braid_reducer_grad pointer, bucket index and shard changed
 * (fetch them again; values moved with their parameters). *done = 1 once the tuner settled
 * (either may be NULL). The trial table is logged (info) and recorded in the reducer's timeline
 * (track "autotune"). Collective at round ends and re-plans, so every rank must call it at every
 * step. A negative or NaN time counts as infinitely slow. An optimizer built on the reducer
 * follows each re-plan as in braid_reducer_rebuild_buckets. FAILED_PRECONDITION as
 * braid_reducer_rebuild_buckets (backward in progress, an optimizer that cannot follow,
 * shard_gradients), and while a BRAID_REDUCE_SCATTER_ONLY window holds partial sums. */
BRAID_API braid_status_t braid_reducer_autotune(braid_reducer_t* reducer, double step_seconds,
                                                int* replanned, int* done);
/* *bucket = the bucket holding parameter `id` (NOT_FOUND for an unknown id). */
BRAID_API braid_status_t braid_reducer_param_bucket(braid_reducer_t* reducer, int64_t id,
                                                    int* bucket);
/* The buckets of unit `unit` (param_units), in bucket order. *count = their number (always
 * written); `buckets` may be NULL (count only); OUT_OF_RANGE when capacity < *count. A unit no
 * parameter names has no buckets. INVALID_ARGUMENT for unit < 0. */
BRAID_API braid_status_t braid_reducer_unit_buckets(braid_reducer_t* reducer, int unit,
                                                    int* buckets, int capacity, int* count);
/* *units = 1 + the largest unit any parameter names. */
BRAID_API braid_status_t braid_reducer_num_units(braid_reducer_t* reducer, int* units);
/* This rank's shard of `bucket` (bucket dtype; reduce-scatter and hybrid modes: the averaged
 * shard after finish_backward). OUT_OF_RANGE for a bucket outside [0, num_buckets).
 * With an optimizer built on the reducer, the optimizer consumes the reduced gradients: once it
 * stepped a bucket, the bucket's gradients (braid_reducer_grad, _shard, _grad_shard) read zero,
 * ready for the next window; with overlap on that is usually so already when finish_backward
 * returns. Read them before the step only through the optimizer's own reports (last_step). */
BRAID_API braid_status_t braid_reducer_shard(braid_reducer_t* reducer, int bucket, void** data,
                                             size_t* count);
/* Since 0.10 (additive): this rank's piece of parameter `id`'s averaged gradient inside its
 * bucket's shard (reduce-scatter and hybrid modes; meaningful after a synced finish_backward,
 * until the next backward): elements [*offset, *offset + *count) of the parameter's flat
 * gradient at *data (bucket dtype), as braid_optimizer_param_shard lays out the parameter.
 * *count = 0 when the parameter lies wholly in other ranks' shards. NOT_FOUND for an unknown
 * id; FAILED_PRECONDITION on an all-reduce reducer. */
BRAID_API braid_status_t braid_reducer_grad_shard(braid_reducer_t* reducer, int64_t id, void** data,
                                                  size_t* count, size_t* offset);
/* Since 0.11 (additive): *stream = the cudaStream_t on which a device reducer reads the
 * gradients given to braid_reducer_mark_ready_grad (the shard group's comm stream), so a
 * framework whose allocator reuses memory in stream order can mark them used there (PyTorch:
 * grad.record_stream(torch.cuda.ExternalStream(stream)) after the call) and free them at once,
 * instead of keeping them until finish_backward. Braid owns it; valid while the reducer lives.
 * NULL on host reducers (nothing to order: the copy is done when mark_ready_grad returns). */
BRAID_API braid_status_t braid_reducer_grad_stream(braid_reducer_t* reducer, void** stream);
/* FAILED_PRECONDITION while an optimizer built on it is alive. A reduction still running (its
 * backward's finish_backward failed at its deadline) is waited for up to the reducer's
 * timeout; past it, that bucket's storage is leaked (logged), never freed under it. */
BRAID_API braid_status_t braid_reducer_destroy(braid_reducer_t* reducer);

/* ---- Communication hooks (since 0.11) ---------------------------------------------------------
 * torch DDP's register_comm_hook, with Braid's built-in hooks (scheduler/comm_hook.h): a hook
 * replaces the collective of each bucket stage it handles (all-reduce, the reduce-scatter, the
 * hybrid replica all-reduce) and leaves the group's average there, run in bucket order on every
 * rank. BRAID_COMM_HOOK_BF16 / _FP16: torch's bf16_compress_hook / fp16_compress_hook (each
 * value rounded to the wire dtype, divided by the group size there, summed in the wire dtype,
 * widened back): half the bytes of f32; f32/f64 buckets only (an f16/bf16 bucket fails its
 * backward naming the bucket and the hook). BRAID_COMM_HOOK_INT8: int8 values with one f32
 * scale per `block` elements and error feedback (each rank keeps its quantization error and
 * adds it to the next step's bucket), all-gathered and summed in f32 in rank order (the same
 * result on every rank; scheduler/hooks/int8.h); f32 buckets only. replica_only (hybrid
 * reducers): only the replica all-reduce, the stage that crosses hosts, is compressed.
 * BRAID_COMM_HOOK_POWERSGD: torch's powerSGD_hook (scheduler/hooks/powersgd.h), all-reduce
 * reducers, f32 buckets: each parameter viewed as param_rows[i] rows is sent as rank-r factors
 * P and Q when worth it, with error feedback and warm start; the powersgd_* fields are
 * torch's PowerSGDState fields of the same names.
 *
 *   braid_comm_hook_options_t h;  braid_comm_hook_options_init(&h);
 *   h.kind = BRAID_COMM_HOOK_BF16;
 *   braid_reducer_set_comm_hook(reducer, &h);   // every rank, between backwards */
#define BRAID_COMM_HOOK_NONE 0 /* the default collectives */
#define BRAID_COMM_HOOK_BF16 1
#define BRAID_COMM_HOOK_FP16 2
#define BRAID_COMM_HOOK_INT8 3
#define BRAID_COMM_HOOK_ALLREDUCE 4 /* torch's allreduce_hook: divide, then sum (any dtype) */
#define BRAID_COMM_HOOK_POWERSGD 5
typedef struct braid_comm_hook_options {
  size_t struct_size;
  int kind;         /* BRAID_COMM_HOOK_*; default NONE */
  int replica_only; /* 1: the hybrid replica all-reduce only (hybrid reducers); default 0 */
  int block;        /* INT8: elements per scale, >= 1; default 256 */
  /* POWERSGD (torch's PowerSGDState, the same names and defaults): */
  int matrix_approximation_rank;    /* >= 1; default 1 */
  int start_powerSGD_iter;          /* steps all-reduced uncompressed, >= 0; default 1000 */
  int use_error_feedback;           /* 0 or 1; default 1 */
  int warm_start;                   /* 0 or 1; default 1 */
  double min_compression_rate;      /* > 0; default 2 */
  double orthogonalization_epsilon; /* >= 0 (used as f32); default 0 */
  uint64_t random_seed; /* default 0; the first Q (uniform in [-1, 1)) derives from it */
  /* One per reducer parameter, in registration order: its shape[0] (1 for a 0-d tensor); each
   * count a multiple of it (INVALID_ARGUMENT naming the parameter). NULL: nothing compressed. */
  const int64_t* param_rows;
  size_t num_param_rows;
} braid_comm_hook_options_t;
BRAID_API void braid_comm_hook_options_init(braid_comm_hook_options_t* opts);
/* Collective over the reducer's groups, between backwards at the same point on every rank
 * (opts NULL: NONE). Every rank must pass the same options: otherwise FAILED_PRECONDITION on
 * every rank naming each rank's hook (nothing changes). A failing hook fails finish_backward
 * with an error naming the bucket and the hook, and leaves the gradients as they were: the step
 * can be retried with the hook removed (BRAID_COMM_HOOK_NONE, then mark every parameter again).
 * INVALID_ARGUMENT: an unknown kind, replica_only on a non-hybrid reducer. FAILED_PRECONDITION
 * during a backward. UNIMPLEMENTED on device reducers. */
BRAID_API braid_status_t braid_reducer_set_comm_hook(braid_reducer_t* reducer,
                                                     const braid_comm_hook_options_t* opts);
/* Since 0.11: the hook's state for checkpoints, this rank's (PowerSGD: per bucket its error
 * feedback, warm-start Q, step and init counts; INT8: its error feedback; stateless hooks and no
 * hook: 0 bytes). Between backwards. *size = the state's bytes (always written); `data` may be
 * NULL (size only); OUT_OF_RANGE when capacity < *size. Save it per rank beside the optimizer
 * state; load it into the same hook (same options, same group size, same rank) and the next
 * steps equal those of an uninterrupted run bit for bit. Another hook's, rank's or group size's
 * state: FAILED_PRECONDITION naming what differs (the state follows each rank's elements and
 * cannot be resharded: after a world size change load the checkpoint without it, and the hook
 * restarts its warm-up: PowerSGD's start_powerSGD_iter uncompressed steps, int8 with no error
 * feedback). size 0 clears the state. A bucket plan changed since the save fails that bucket's
 * next backward by name. FAILED_PRECONDITION inside a backward. */
BRAID_API braid_status_t braid_reducer_comm_hook_state(braid_reducer_t* reducer, void* data,
                                                       size_t capacity, size_t* size);
BRAID_API braid_status_t braid_reducer_comm_hook_load_state(braid_reducer_t* reducer,
                                                            const void* data, size_t size);

/* ---- Memory accounting -----------------------------------------------------------------------
 * Every byte Braid allocates for a reducer's rank (its buckets, staging and partial sums, and
 * the gatherer's and optimizer's buffers once an optimizer is built on it) is counted from
 * allocation to free: current and peak, host and device apart, and per use. The figures are the
 * bytes Braid asked for; the allocator's rounding and the caller's own buffers are not in them.
 * With a timeline (timeline_prefix), each change is also a counter sample on its "memory" row.
 *
 *   braid_memory_stats_t m;  m.struct_size = sizeof m;
 *   braid_memory_stats(reducer, &m);
 *   printf("peak device bytes %lld\n", (long long)m.device.peak);
 */
typedef enum braid_memory_use {
  BRAID_MEMORY_GRAD_BUCKETS = 0,    /* full-size gradient buckets (pooled ones included) */
  BRAID_MEMORY_GRAD_SHARDS = 1,     /* kept gradient shards and partial sums */
  BRAID_MEMORY_PARAM_GATHER = 2,    /* gathered (full) parameter buffers */
  BRAID_MEMORY_PARAM_SHARDS = 3,    /* this rank's parameter shards */
  BRAID_MEMORY_OPTIMIZER_STATE = 4, /* master weights and moments */
  BRAID_MEMORY_STAGING = 5,         /* reduce-dtype staging, statistics, transfers */
  BRAID_MEMORY_USES = 6
} braid_memory_use_t;

typedef struct braid_memory_counter {
  int64_t current; /* bytes allocated now */
  int64_t peak;    /* the most allocated at once since creation or braid_memory_reset_peaks */
} braid_memory_counter_t;

/* An output struct: set struct_size to sizeof(braid_memory_stats_t) before the call; the
 * library writes as many leading bytes as both it and the caller know. */
typedef struct braid_memory_stats {
  size_t struct_size;
  braid_memory_counter_t host;
  braid_memory_counter_t device;
  braid_memory_counter_t by_use[BRAID_MEMORY_USES]; /* host and device together */
  int64_t allocations;                              /* buffers allocated so far */
} braid_memory_stats_t;

/* This reducer's rank's figures (see above). Errors: INVALID_ARGUMENT (bad handle, NULL out,
 * out->struct_size smaller than the counters' start). */
BRAID_API braid_status_t braid_memory_stats(braid_reducer_t* reducer, braid_memory_stats_t* out);
/* Every peak becomes the current value (to measure one phase's peak). */
BRAID_API braid_status_t braid_memory_reset_peaks(braid_reducer_t* reducer);

/* ---- Sharded optimizer -----------------------------------------------------------------------
 * AdamW or SGD over this rank's shard of every bucket of a reduce-scatter or hybrid reducer,
 * stepped as each bucket's reduction completes, then all-gathered into full parameters.
 * Readiness is still marked through the reducer handle; begin/finish go through here.
 *   for each step: wait_params(b) before reading bucket b's parameters (braid_optimizer_param);
 *                  begin_backward; accumulate into braid_reducer_grad; mark_ready; finish. */

typedef enum braid_optimizer_kind {
  BRAID_OPTIMIZER_ADAMW = 0, /* torch.optim.AdamW (decoupled decay, amsgrad off) */
  BRAID_OPTIMIZER_SGD = 1,   /* torch.optim.SGD (dampening 0) */
  /* Since 0.10 (additive): no optimizer, the parameter side only (needs fully_sharded = 1). The
   * handle gathers, releases and prefetches units and runs the backwards; the framework steps
   * this rank's pieces itself (braid_optimizer_param_shard, braid_reducer_grad_shard) between
   * steps, and the next gather of each unit publishes them. The step's functions (set_param,
   * step, wait_params, set_lr, set_hyper, save, load, state, adopt, last_step) return
   * FAILED_PRECONDITION. Hyper-parameter options are ignored. */
  BRAID_OPTIMIZER_NONE = 2
} braid_optimizer_kind_t;

/* Since 0.11: what a fully sharded unit's parameters cross the wire as (braid_optimizer_options_t
 * gather_dtype). INT8: symmetric, scale = max|x| / 127 per block, round half to even. FP8_E4M3:
 * scale = max|x| / 448 per block, OCP E4M3 round half to even, saturating. A block holding an
 * inf or NaN gathers as NaN. BF16 / F16: each value rounded to nearest even, 2 bytes, no scales
 * (gather_block unused): a framework computing in that dtype gets the values it would get by
 * casting exact gathers. */
typedef enum braid_gather_dtype {
  BRAID_GATHER_EXACT = 0,
  BRAID_GATHER_INT8 = 1,
  BRAID_GATHER_FP8_E4M3 = 2,
  BRAID_GATHER_BF16 = 3,
  BRAID_GATHER_F16 = 4
} braid_gather_dtype_t;

typedef struct braid_optimizer_options {
  size_t struct_size;
  braid_optimizer_kind_t kind; /* default ADAMW */
  int threads;                 /* kernel threads per step, in [1, 256]; default 1 */
  double lr;                   /* default 1e-3 (set it for SGD) */
  double beta1, beta2, eps;    /* AdamW; defaults 0.9, 0.999, 1e-8 */
  double weight_decay;         /* default 0.01 (AdamW's; SGD users usually want 0) */
  double momentum;             /* SGD; default 0.9 */
  int nesterov;                /* SGD; default 0 */
  int skip_nonfinite;          /* 1: drop the step on every rank if any gradient is inf/NaN */
  double max_grad_norm;        /* > 0: exact global-norm clipping; default 0 (off); not NaN */
  int overlap;                 /* 1 (default): step buckets as they arrive; 0: call step */
  int64_t timeout_ms;          /* every wait; default 300000 */
  /* ---- since 0.7: fully sharded training (ZeRO-3 / FSDP) and offload. */
  /* 1: parameters live only as this rank's shard between uses. The framework brackets each
   * unit's use with braid_unit_enter / braid_unit_exit (below); a unit's buckets are
   * all-gathered (one coalesced call per bucket into a pooled flat buffer) before it is read
   * and released after. The optimizer writes updated shards and gathers nothing itself. The
   * first step records the forward unit order; braid_optimizer_end_step after it checks that
   * every rank recorded the same one; later steps prefetch in that order (backward in reverse).
   * braid_optimizer_param is valid only while its unit is entered. 0 (default): ZeRO-2 (the
   * optimizer all-gathers every bucket after its step; the full parameters stay). */
  int fully_sharded;
  /* fully_sharded: 1 (default) release a unit at braid_unit_exit(FORWARD) and gather it again
   * for its backward; 0 keep it gathered until braid_unit_exit(BACKWARD) (FSDP2's
   * reshard_after_forward=False: less communication, more memory). */
  int reshard_after_forward;
  /* fully_sharded: units prefetched ahead (default 1; 0: none). */
  int prefetch;
  /* fully_sharded: limit on gathered-but-not-released bytes (FSDP's limit_all_gathers,
   * DeepSpeed's max_live_parameters); a prefetch that would exceed it waits for a release.
   * A unit being entered is always gathered, so the limit must be at least the largest unit's
   * bytes (INVALID_ARGUMENT otherwise) and holds when each unit is exited before the one after
   * next is entered. 0 (default): 2 x the largest unit's bytes. */
  int64_t max_live_bytes;
  /* Device reducers: 1 keeps master weights and moments in host memory (ZeRO-Offload): each
   * bucket's reduced shard is copied to the host as its reduction completes, stepped there by
   * the CPU kernel while backward continues, and the updated shard copied back before its
   * gather. 0 (default): on the device. Host reducers: must be 0. */
  int offload;
  /* nccl: the stream gathers run on (a cudaStream_t of the framework's, e.g. its prefetch
   * stream; not owned, must outlive the optimizer). NULL (default): Braid's own gather stream.
   * Host backends: must be NULL. Either way braid_optimizer_gather_event gives each gather's
   * completion event for the consumer stream to wait on. */
  void* gather_stream;
  /* ---- since 0.8: parameter groups (torch.optim's param_groups). */
  /* Hyper-parameter groups (in [1, 65536]; default 1). Each starts with the hyper-parameters above;
   * braid_optimizer_set_hyper changes one group's from the next armed step on. */
  int num_groups;
  /* NULL (default): every parameter is in group 0. Else one entry per parameter of the
   * reducer, in braid_reducer_create's order, copied: param_groups[i] in [0, num_groups) is
   * params[i]'s group. INVALID_ARGUMENT names an entry out of range. */
  const int* param_groups;
  /* ---- since 0.10: the gradient norm of every step, for logging. */
  /* 1: braid_optimizer_last_step reports every step's global gradient norm (before clipping)
   * even without max_grad_norm / skip_nonfinite. The steps still overlap the backward: each
   * bucket's shard norm is summed right before its step (one more read of the shard), and one
   * 2-double all-reduce after the last bucket's gather started completes the step
   * (wait_all_params waits for it; wait_params does not). Host reducers only (UNIMPLEMENTED
   * on a device: max_grad_norm reports the norm there). 0 (default): off. */
  int track_grad_norm;
  /* ---- since 0.11: quantized parameter all-gathers (DeepSpeed ZeRO++'s qwZ). */
  /* gather_dtype != BRAID_GATHER_EXACT: elements per f32 scale, >= 1 (default 4096: DeepSpeed's
   * qwZ quantizer aims at 4k-8k element groups). INVALID_ARGUMENT below 1. */
  int64_t gather_block;
  /* fully_sharded, f32 host parameters: each unit's buckets are all-gathered as 1-byte codes
   * plus one scale per gather_block elements (about a quarter of the f32 bytes) and dequantized
   * into the gathered buffer; every rank computes with the same dequantized values, while the
   * shard the optimizer steps (the master weights) stays exact f32. BRAID_GATHER_EXACT (0,
   * default): unchanged. INVALID_ARGUMENT without fully_sharded, for another value, or for a
   * bf16 / f16 bucket (naming its first parameter); UNIMPLEMENTED on device reducers. */
  braid_gather_dtype_t gather_dtype;
} braid_optimizer_options_t;

/* One group's hyper-parameters (the kind's half is used: AdamW lr, beta1, beta2, eps,
 * weight_decay; SGD lr, momentum, weight_decay, nesterov). Set struct_size = sizeof. */
typedef struct braid_optimizer_hyper {
  size_t struct_size;
  double lr;
  double beta1, beta2, eps;
  double weight_decay;
  double momentum;
  int nesterov;
} braid_optimizer_hyper_t;

BRAID_API void braid_optimizer_options_init(braid_optimizer_options_t* opts);

/* Collective over the reducer's shard group: creates a gather group (a split of the shard
 * group with key = rank), the parameter gatherer and the optimizer, all owned by the handle.
 * A reducer on a CUDA device (its device option) gets the fused CUDA AdamW / SGD kernels:
 * master weights, moments and parameters live on that device (braid_optimizer_param returns
 * device pointers; set_param copies host values in). Errors: INVALID_ARGUMENT (bad
 * hyper-parameters: out of range, or non-finite where the kind uses them, naming the field,
 * e.g. "opts->lr must be finite, got inf"; threads or num_groups outside their range;
 * all-reduce mode reducer; a parameter other than f32, bf16 or f16, named), UNIMPLEMENTED (a
 * feature the device optimizer lacks, named; see optim/sharded_optimizer.h), INTERNAL (a thread
 * or buffer the machine could not provide, "could not start ... thread": nothing is left
 * started; the reducer stays usable), TIMEOUT / PEER_ERROR from the collectives. */
BRAID_API braid_status_t braid_optimizer_create(braid_reducer_t* reducer,
                                                const braid_optimizer_options_t* opts,
                                                braid_optimizer_t** out);
/* Since 0.11 (additive): one optimizer over several reducers (a MoE model's dense parameters on
 * the data-parallel group and experts on their expert-data-parallel group; tensor-parallel
 * shards on the data-parallel group of their tensor-parallel rank). Creates out[i], an ordinary
 * optimizer handle on reducers[i] built from opts[i] (its parameter groups and hyper-parameters
 * are its own), and links them by one global gradient norm: max_grad_norm, skip_nonfinite and
 * track_grad_norm decide once, from the norm over every reducer's shards on every rank, each
 * element counted once (a hybrid reducer's replica 0; reducers with tp_replicated[i] = 1, whose
 * parameters are the same on every rank of `tensor_parallel` and reduced without it, on its
 * rank 0 only), all-reduced over `span` (every rank of every reducer: usually the world group).
 * As Megatron-LM's global norm: different experts and different tensor-parallel shards add up.
 * Each handle is then driven as usual (begin/finish_backward, wait_params) and steps each bucket
 * as its reduction completes. Every handle must take part in every synced step (each synced
 * backward of one is a synced backward of all), else the others wait until their timeout;
 * destroying one handle leaves the others' next clipped step failing with TIMEOUT.
 * tensor_parallel and tp_replicated may be NULL. Collective over span (one split), then over
 * each reducer's groups in order. Errors: INVALID_ARGUMENT (n < 1, a reducer given twice,
 * opts[i] that differ from opts[0] in max_grad_norm, skip_nonfinite or track_grad_norm, overlap
 * = 0 or kind NONE, naming the reducer), FAILED_PRECONDITION (a reducer already has an
 * optimizer), and braid_optimizer_create's; no handle is created on error. */
BRAID_API braid_status_t braid_optimizer_create_linked(braid_reducer_t* const* reducers, int n,
                                                       const braid_optimizer_options_t* const* opts,
                                                       const int* tp_replicated,
                                                       braid_group_t* span,
                                                       braid_group_t* tensor_parallel,
                                                       braid_optimizer_t** out);
/* Initial value of parameter `id`: `values` holds its full count elements in its dtype,
 * identical on every rank. Between steps only; gathered by the next wait_params. */
BRAID_API braid_status_t braid_optimizer_set_param(braid_optimizer_t* opt, int64_t id,
                                                   const void* values);
/* *data, *count: read-only view of parameter `id`'s full values (its dtype), valid while the
 * optimizer lives; meaningful after wait_params of its bucket returned BRAID_OK. */
BRAID_API braid_status_t braid_optimizer_param(braid_optimizer_t* opt, int64_t id, void** data,
                                               size_t* count);
/* Starts a backward on the reducer and arms a step for a BRAID_SYNC one. FAILED_PRECONDITION
 * when a backward is in progress, or overlap is off and the last synced backward was not
 * stepped. */
BRAID_API braid_status_t braid_optimizer_begin_backward(braid_optimizer_t* opt,
                                                        braid_sync_mode_t mode);
/* The reducer's finish_backward; does not wait for the steps. */
BRAID_API braid_status_t braid_optimizer_finish_backward(braid_optimizer_t* opt);
/* overlap = 0: steps every bucket of the finished synced backward and starts the gathers.
 * FAILED_PRECONDITION with overlap on, or without a finished synced backward to step. */
BRAID_API braid_status_t braid_optimizer_step(braid_optimizer_t* opt);
/* Bucket `bucket`'s step and all-gather are complete: its parameters may be read.
 * OUT_OF_RANGE for an unknown bucket; TIMEOUT / PEER_ERROR naming the bucket. */
BRAID_API braid_status_t braid_optimizer_wait_params(braid_optimizer_t* opt, int bucket);
/* Every bucket's wait_params; outside a backward it also waits for the step's completion
 * (track_grad_norm's all-reduce), so last_step then reports it. */
BRAID_API braid_status_t braid_optimizer_wait_all_params(braid_optimizer_t* opt);
/* Learning rate of every parameter from the next armed step (lr >= 0, finite). Sets group 0's
 * only when there are several groups (use braid_optimizer_set_hyper). INVALID_ARGUMENT ("lr
 * must be finite", "lr must be >= 0"), changing nothing, otherwise. */
BRAID_API braid_status_t braid_optimizer_set_lr(braid_optimizer_t* opt, double lr);
/* Since 0.8: group `group`'s hyper-parameters from the next armed step on (a step is armed by
 * braid_optimizer_begin_backward of a synced backward: with overlap on, set them before the
 * backward whose gradients they should step; the armed step keeps its snapshot). The whole
 * struct is taken (get, change, set). Errors: OUT_OF_RANGE (no such group), INVALID_ARGUMENT
 * naming the group and the bad value (lr < 0, beta outside [0, 1), eps <= 0, ...; nothing is
 * changed), or naming the field ("hyper->lr must be finite") for a non-finite value the kind
 * uses (as braid_optimizer_create and braid_optimizer_set_lr), or a struct_size this library
 * does not know. */
BRAID_API braid_status_t braid_optimizer_set_hyper(braid_optimizer_t* opt, int group,
                                                   const braid_optimizer_hyper_t* hyper);
/* Per-rank state file (master weights, moments, step counts, hyper-parameters); waits for
 * the step in flight. Errors name the file (NOT_FOUND, FAILED_PRECONDITION, ...). The file keeps
 * one step count per bucket: after a step skipped parameters no rank used (agree_unused, 0.11)
 * it fails with FAILED_PRECONDITION naming the bucket; the whole state
 * (braid_optimizer_get_state) carries each parameter's own count. */
BRAID_API braid_status_t braid_optimizer_save(braid_optimizer_t* opt, const char* path);
/* Collective over the shard group: restores a saved state and gathers every bucket. Fails,
 * changing nothing, for a file of another plan, world, rank or kind (FAILED_PRECONDITION) or
 * a corrupt one (DATA_LOSS); NOT_FOUND when missing. */
BRAID_API braid_status_t braid_optimizer_load(braid_optimizer_t* opt, const char* path);
/* The latest completed step: rounds (synced steps so far, skipped ones included), skipped
 * (1 if skip_nonfinite dropped it), grad_norm (global norm before clipping, with
 * clipping / skip_nonfinite / track_grad_norm, else -1). Any out-pointer may be NULL. */
BRAID_API braid_status_t braid_optimizer_last_step(braid_optimizer_t* opt, int64_t* rounds,
                                                   int* skipped, double* grad_norm);
/* ---- since 0.10: parameters written by the framework (ZeRO-2) --------------------------------
 * The framework wrote parameter `id`'s values in place through braid_optimizer_param's pointer
 * (e.g. loading pretrained weights after creating the optimizer): this rank's part of them
 * becomes its master weights (widened to f32; moments and step counts stay), so the next step
 * steps from them instead of overwriting them. Nothing is gathered and nothing is collective:
 * each rank reads what it wrote until the next step's all-gather publishes every shard from
 * its owner (write the same values on every rank). Outside a backward (waits for the step in
 * flight; with overlap off, before braid_optimizer_step the step starts from the written
 * values; FAILED_PRECONDITION inside a backward); FAILED_PRECONDITION
 * for a fully_sharded optimizer (write inside a summon and braid_optimizer_set_param);
 * NOT_FOUND for an unknown id. */
BRAID_API braid_status_t braid_optimizer_adopt_param(braid_optimizer_t* opt, int64_t id);

/* *event = the device completion event of `bucket`'s latest all-gather (nccl: recorded on the
 * gather stream; cudaStreamWaitEvent(consumer, event, 0) orders a consumer after it without a
 * host wait); NULL when the bucket was never gathered or on host backends. Valid until the
 * bucket's next gather; Braid owns it. OUT_OF_RANGE for an unknown bucket. */
BRAID_API braid_status_t braid_optimizer_gather_event(braid_optimizer_t* opt, int bucket,
                                                      void** event);

/* ---- since 0.10: the whole optimizer state, unsharded (checkpoints that move) -------------------
 * A framework's optimizer state_dict() in its own layout (per parameter: master weights,
 * moments, step count), independent of the world size and the bucket plan: what one run
 * gathers, another run of any world size (or mesh, or bucket caps) over the same parameters
 * sets, each rank taking its own shard; or what the framework's own unsharded optimizer
 * saved. Through caller-owned host memory (also for device optimizers: copied in and out).
 *
 *   float* values[3 * P];           // AdamW: master, exp_avg, exp_avg_sq; P parameters
 *   int64_t steps[P], step;         // values[k * P + i]: parameter i's count floats
 *   braid_optimizer_get_state(opt, values, 3 * P, steps, &step);    // collective
 *   ...                             // e.g. save; in another job (M ranks), after create:
 *   braid_optimizer_set_state(opt2, values, 3 * P, steps, step);    // collective
 *
 * State buffers, in this order: AdamW "master", "exp_avg", "exp_avg_sq"; SGD "master",
 * "momentum" (B = 3 or 2). Parameters in braid_reducer_create's order (P of them);
 * values[k * P + i] holds parameter i's count f32 values of buffer k. "master" is the f32
 * master weights (the parameter's values for f32 parameters). Step counts are per parameter
 * (AdamW's bias correction; SGD's first step starts the momentum buffer), but Braid keeps one
 * per bucket: parameters that share a bucket must have equal counts to be set. get_state gives
 * each parameter its own (they differ after steps that skipped parameters no rank used:
 * agree_unused, 0.11). `step` is the count of
 * completed steps braid_optimizer_last_step reports. Hyper-parameters are not part of it
 * (braid_optimizer_set_hyper). Both are collective over the shard group, between steps
 * (FAILED_PRECONDITION inside a backward or accumulation window; they wait for a step in
 * flight). */

/* Gathers the whole state onto every rank (one all-gather per bucket and state buffer; the
 * state's full size in host memory while it runs). values: num_values == B * P pointers; a
 * NULL entry is skipped. param_steps: P entries, or NULL; step: or NULL. Errors:
 * INVALID_ARGUMENT (num_values), TIMEOUT / PEER_ERROR from the all-gathers. */
BRAID_API braid_status_t braid_optimizer_get_state(braid_optimizer_t* opt, float* const* values,
                                                   size_t num_values, int64_t* param_steps,
                                                   int64_t* step);
/* Sets the whole state: every rank passes the same values; each takes its shard, writes its
 * parameters' shards from the master weights and re-gathers them (ZeRO-2), as
 * braid_optimizer_load. Every rank loads or none does: when any rank's input is refused,
 * nothing changes on any rank; that rank gets INVALID_ARGUMENT naming it (num_values !=
 * B * P, a NULL entry, param_steps NULL or a count < 0, step < 0) or FAILED_PRECONDITION
 * (parameters sharing a bucket with different step counts, named), the others
 * FAILED_PRECONDITION. values == NULL: this rank takes part only to make every rank's call
 * fail (FAILED_PRECONDITION; for a caller whose own checks refused its input, so that no peer
 * waits). */
BRAID_API braid_status_t braid_optimizer_set_state(braid_optimizer_t* opt,
                                                   const float* const* values, size_t num_values,
                                                   const int64_t* param_steps, int64_t step);

/* ---- since 0.11: uneven inputs (join) ---------------------------------------------------------
 * torch DDP's model.join(): ranks may run out of data at different steps. Inside a join every
 * rank agrees once per step on how many ranks still have data; a rank that ran out shadows
 * the others' steps with zero gradients (the reducer's bucket reductions in bucket order in
 * every mode and, with an optimizer on the reducer, its shard's step and the parameter
 * gathers) until every rank has joined; then the last rank to join is the authoritative copy.
 *
 *   braid_join_begin(red, NULL);                      // every rank, before the loop
 *   while (next_batch()) {
 *     braid_join_agree(red, 1, BRAID_SYNC, &active, NULL);
 *     ... forward, begin_backward, mark_ready ..., finish_backward (optimizer: its own) ...
 *   }
 *   int last = 1;
 *   for (;;) {                                        // this rank has run out
 *     braid_join_agree(red, 0, BRAID_SYNC, &active, NULL);
 *     if (active == 0) break;                         // every rank joined
 *     braid_join_shadow(red);
 *     last = 0;
 *   }
 *   braid_join_end(red, last, &root);                 // then, for the model's state:
 *   braid_join_broadcast(red, params, n, BRAID_F32, root);
 *
 * RANK-ORDER CONTRACT: braid_join_agree is a collective over the reducer's groups: every rank
 * calls it once per step (per forward whose backward follows), at the same point, between
 * steps; the ranks with data pass the mode their backward will use (they must agree).
 * Divide: divide_by_initial_world_size = 1 (default) averages over the whole world (joined
 * ranks add zeros); 0 averages each step over the ranks that had data. Fully sharded units
 * (shard_gradients reducers): agree before the forward's first unit_enter, and a joined rank
 * replays each step itself (unit_enter/exit in the recorded order, every mark of zeros, its
 * optimizer's step): braid_join_shadow is UNIMPLEMENTED there. Not with units over a reducer
 * without shard_gradients, nor gradient_as_bucket_view = 0 (UNIMPLEMENTED, naming why). */
typedef struct braid_join_options {
  size_t struct_size;               /* sizeof(braid_join_options_t) */
  int divide_by_initial_world_size; /* default 1; 0: average over the ranks with data */
  /* 1: the first step at which some rank has run out fails on every rank (OUT_OF_RANGE:
   * torch's "Rank r exhausted all inputs." on that rank, "Detected at least one rank that
   * exhausted inputs. Throwing across all ranks." on the others). */
  int throw_on_early_termination; /* default 0 */
} braid_join_options_t;

BRAID_API void braid_join_options_init(braid_join_options_t* opts);
/* Enters a join on `reducer` (the optimizer built on it, if any, shadows its steps too). Local.
 * FAILED_PRECONDITION when a join is open or inside a backward; UNIMPLEMENTED as above. */
BRAID_API braid_status_t braid_join_begin(braid_reducer_t* reducer,
                                          const braid_join_options_t* opts);
/* Collective (see above). has_data: 1 when this rank runs this step, with backward `mode`;
 * 0 when it has run out (mode ignored). *active: ranks with data (0: every rank joined);
 * *agreed (may be NULL): their mode. INVALID_ARGUMENT on every rank when the ranks with data
 * pass different modes; OUT_OF_RANGE with throw_on_early_termination; FAILED_PRECONDITION
 * without an open join. */
BRAID_API braid_status_t braid_join_agree(braid_reducer_t* reducer, int has_data,
                                          braid_sync_mode_t mode, int* active,
                                          braid_sync_mode_t* agreed);
/* A rank that has run out, after braid_join_agree returned *active > 0: runs that step's
 * backward with zero gradients (nothing for BRAID_NO_SYNC) and, with an optimizer, steps its
 * shards with the averaged gradients and waits for the gathers. Collective like a step.
 * FAILED_PRECONDITION when the last agreement was not a joined one, or left nothing to do;
 * UNIMPLEMENTED on a shard_gradients reducer (the caller replays the step, see above). */
BRAID_API braid_status_t braid_join_shadow(braid_reducer_t* reducer);
/* Collective: closes the join. *root = the world rank (replica rank * shard size + shard rank
 * in hybrid mode) of the authoritative copy: the largest rank among those that joined last
 * (is_last_joiner = 1: this rank shadowed no step). The reducer's divide is back to normal. */
BRAID_API braid_status_t braid_join_end(braid_reducer_t* reducer, int is_last_joiner, int* root);
/* Local (no communication): closes an open join after an error left the ranks out of step
 * (e.g. an exception inside the join context); the reducer's divide is back to normal. Closing
 * no join is OK. */
BRAID_API braid_status_t braid_join_abort(braid_reducer_t* reducer);
/* Collective: `count` elements of `buf` (memory the reducer's groups use) from world rank
 * `root` (braid_join_end's) to every rank: torch's end-of-join model sync. Needs no open join. */
BRAID_API braid_status_t braid_join_broadcast(braid_reducer_t* reducer, void* buf, size_t count,
                                              braid_dtype_t dtype, int root);

/* ---- Fully sharded units (braid_optimizer_options_t.fully_sharded) ---------------------------
 * The framework's hooks bracket each unit's use; Braid gathers, releases and prefetches:
 *
 *   for each step:
 *     for u in forward order:  braid_unit_enter(opt, u, BRAID_PHASE_FORWARD);
 *                              ... forward reads braid_optimizer_param(opt, id) of u ...
 *                              braid_unit_exit(opt, u, BRAID_PHASE_FORWARD);
 *     braid_optimizer_begin_backward(opt, BRAID_SYNC);
 *     for u in reverse order:  braid_unit_enter(opt, u, BRAID_PHASE_BACKWARD);
 *                              ... backward: braid_reducer_mark_ready_grad(red, id, g, ev) ...
 *                              braid_unit_exit(opt, u, BRAID_PHASE_BACKWARD);
 *     braid_optimizer_finish_backward(opt);
 *     braid_optimizer_end_step(opt);
 *
 * RANK-ORDER CONTRACT: every rank enters the units in the same order. Gathers are launched
 * only in the recorded order (a prefetch is an earlier launch of the next unit, never a
 * reordering), so their sequence on the gather group is the same on every rank whatever the
 * timing. After the first step, entering a unit out of the recorded order is an error naming
 * the expected and the actual unit, unless that unit is gathered already (e.g. a root unit
 * kept from forward to backward); braid_optimizer_end_step reports a forward order that
 * differs across ranks, naming the ranks.
 * Kept units: a unit may stay entered from its forward into the backward (the root module's
 * parameters that no unit holds, used at the start and the end of the forward): enter it in
 * FORWARD and do not exit it there, enter it again in BACKWARD (it is gathered, so out of order
 * is fine) and exit it in BACKWARD, which releases it. With reshard_after_forward = 0 every
 * unit stays gathered after its forward; a forward without a backward (evaluation) must then
 * exit each unit in BACKWARD (which launches nothing) before braid_optimizer_end_step.
 * On a fully_sharded optimizer braid_optimizer_wait_params / wait_all_params wait for the
 * steps only (the shards are updated; nothing is gathered), set_param and load write shards
 * that the next gather of their unit reads. */
typedef enum braid_phase { BRAID_PHASE_FORWARD = 0, BRAID_PHASE_BACKWARD = 1 } braid_phase_t;

/* The unit is about to be read: returns once every bucket of it is gathered (waiting for the
 * optimizer's update of its shards first), after starting the prefetch of the next unit(s).
 * Errors: FAILED_PRECONDITION (optimizer not fully_sharded; the order deviates, naming the
 * units), INVALID_ARGUMENT (unit < 0 or holding no bucket), TIMEOUT / PEER_ERROR naming the
 * bucket. */
BRAID_API braid_status_t braid_unit_enter(braid_optimizer_t* opt, int unit, braid_phase_t phase);
/* The unit's last read in this phase is done (BACKWARD: every gradient of it was marked).
 * Releases its buckets (FORWARD: unless reshard_after_forward is 0); may start a prefetch that
 * waited for room. Any thread. FAILED_PRECONDITION when the unit was not entered in `phase`. */
BRAID_API braid_status_t braid_unit_exit(braid_optimizer_t* opt, int unit, braid_phase_t phase);
/* The pass's units are done: call it after every forward + backward pass (each microbatch of
 * an accumulation window too), before the next forward. After the first pass: collective over
 * the shard group, checks that every rank recorded the same forward order (FAILED_PRECONDITION
 * naming the ranks and their orders) and turns prefetching on. FAILED_PRECONDITION when a unit
 * is still entered or gathered (naming it). */
BRAID_API braid_status_t braid_optimizer_end_step(braid_optimizer_t* opt);
/* Collective over the shard group (outside a step, at the same point on every rank): gathers
 * every bucket and keeps it (on = 1), so braid_optimizer_param reads every parameter, e.g. for
 * evaluation or export (FSDP's summon_full_params); on = 0 releases them. Between the two the
 * units are not entered. Non-fully-sharded optimizers: waits for every parameter (on = 1). */
BRAID_API braid_status_t braid_optimizer_summon_params(braid_optimizer_t* opt, int on);
/* Since 0.10 (additive): this rank's piece of parameter `id` in its bucket's parameter shard (the
 * values the next gather of its unit publishes; FSDP1 use_orig_params' local view): elements
 * [*offset, *offset + *count) of the parameter's flat values (its dtype) live at *data, valid
 * while the handle lives. *count = 0 (and *data NULL) when the parameter lies wholly in other
 * ranks' shards. A gather-only handle's framework writes its updates here between steps; with an
 * optimizer it is read-only (its step writes it). NOT_FOUND for an unknown id. */
BRAID_API braid_status_t braid_optimizer_param_shard(braid_optimizer_t* opt, int64_t id,
                                                     void** data, size_t* count, size_t* offset);
/* Stops the optimizer's stepper thread (a step still waiting for reductions is cancelled),
 * waits for all-gathers in flight, then frees the optimizer, its gatherer and gather group.
 * The reducer stays usable (its own begin/finish_backward work again). */
BRAID_API braid_status_t braid_optimizer_destroy(braid_optimizer_t* opt);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_CAPI_BRAID_H_ */
