/* braid.h: the C API of Braid (C99; libbraid.so exports only braid_* symbols).
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
 * Include this header only. It holds what every call shares (versions, status codes, the last
 * error, the opaque handles, dtypes and reduce ops) and includes, beside it, one part per handle:
 *   braid_world.h      worlds, groups, collectives and works (braid_world_*, braid_group_*, ...)
 *   braid_reducer.h    the gradient reducer, communication hooks, memory accounting
 *   braid_optimizer.h  the sharded optimizer, framework-written parameters, the whole state,
 *                      uneven inputs (join), fully sharded units
 * The parts refuse to be included alone; installed, they sit beside braid.h in include/.
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

/* ---- The parts, in this order (each uses what the ones before it declare) ------------------ */
/* (The comment above each #include also keeps clang-format from sorting them by name.) */

/* Worlds, groups, collectives and works. */
#include "braid_world.h"
/* The gradient reducer, communication hooks, memory accounting. */
#include "braid_reducer.h"
/* The sharded optimizer, framework-written parameters, the whole state, join, units. */
#include "braid_optimizer.h"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_CAPI_BRAID_H_ */
