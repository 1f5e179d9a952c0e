/* braid_world.h: part of braid.h, the C API of Braid -- worlds, groups, collectives and works.
 *
 * A world is a backend and this process's ranks; a group is a set of its ranks that
 * communicate (the world's own, a split, a replica x shard mesh); a collective on a group starts
 * at once and returns a work, the future to wait on, test or destroy:
 *
 *   braid_world_create(&wo, &world);  braid_world_group(world, rank, &g);
 *   braid_allreduce(g, grad, grad, n, BRAID_DTYPE_F32, BRAID_OP_AVG, NULL, &w);
 *   braid_work_wait(w, -1);  braid_work_destroy(w);
 *
 * Contract: braid.h's conventions, and its RANK-ORDER CONTRACT: every rank issues a group's
 * collectives and splits in the same order. Included by braid.h after the types it uses
 * (braid_status_t, braid_dtype_t, braid_reduce_op_t, the handles); include <braid.h>, not this.
 */
#ifndef BRAID_CAPI_BRAID_H_
#error "include <braid.h>, not braid_world.h"
#endif
#ifndef BRAID_CAPI_BRAID_WORLD_H_
#define BRAID_CAPI_BRAID_WORLD_H_

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

#endif /* BRAID_CAPI_BRAID_WORLD_H_ */
