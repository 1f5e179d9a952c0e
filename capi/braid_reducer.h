/* braid_reducer.h: part of braid.h, the C API of Braid -- the gradient reducer (buckets,
 * readiness, reduction; DDP, ZeRO-2, HSDP), its communication hooks and memory accounting.
 *
 * A reducer takes a model's parameters once, then, each step, the backward's gradients as they
 * become ready, and reduces them bucket by bucket while the backward still runs:
 *
 *   braid_reducer_create(g, NULL, params, n, &ro, &red);             // collective
 *   for each step:
 *     braid_reducer_begin_backward(red, BRAID_SYNC);
 *     ... backward: accumulate into braid_reducer_grad(red, id, ...), then
 *         braid_reducer_mark_ready(red, id, ...) ...
 *     braid_reducer_finish_backward(red);                             // averaged gradients
 *
 * Contract: braid.h's conventions, and the RANK-ORDER CONTRACT: buckets are reduced in bucket
 * order on every rank, so every rank creates the same reducer and runs the same steps. Included
 * by braid.h after braid_world.h (groups, works); include <braid.h>, not this.
 */
#ifndef BRAID_CAPI_BRAID_H_
#error "include <braid.h>, not braid_reducer.h"
#endif
#ifndef BRAID_CAPI_BRAID_REDUCER_H_
#define BRAID_CAPI_BRAID_REDUCER_H_

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
  /* ---- since 0.11: bounded memory for fully sharded training. > 0 (with shard_gradients = 1):
   * the most bytes of full-size bucket storage this rank's pool holds at once, gathered
   * parameters included when an optimizer's fully sharded units share that pool. Taking
   * storage past it waits, up to timeout_ms, for the storage of a reduction already launched
   * to come back (never for one not launched: no rank-order cycle; with none in flight the
   * pool grows past the limit instead), and a unit's prefetch waits for room. A wait past the
   * deadline fails the mark with TIMEOUT naming the bucket and pool_limit_bytes. 0 (default):
   * no limit. < 0, below one bucket's storage, or without shard_gradients: INVALID_ARGUMENT. */
  int64_t pool_limit_bytes;
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
/* Since 0.11 (additive), shard_gradients reducers: *data, *count: where the framework may
 * compute the gradient of `id` in place instead of passing it to mark_ready_grad, saving that
 * copy (a kernel that writes its output where it is told). The slot lies in the bucket's pooled
 * storage, taken now (at pool_limit_bytes this waits, as a mark does); its values are
 * unspecified: write all of it (never accumulate into it), then braid_reducer_mark_ready(red,
 * id, event) without values (device: `event` recorded after the writes; the call returns after
 * a host wait for the comm stream, so the writes may come from any stream). Valid until that
 * mark, for the accumulation window's first contribution only. Errors naming the parameter:
 * NOT_FOUND, FAILED_PRECONDITION outside a backward, on full-size buckets (use
 * braid_reducer_grad), for a parameter marked several times per backward (param_marks),
 * declared unused, or one with a contribution in this window already (an earlier
 * BRAID_NO_SYNC backward): pass those with mark_ready_grad. */
BRAID_API braid_status_t braid_reducer_grad_slot(braid_reducer_t* reducer, int64_t id, void** data,
                                                 size_t* count);
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
 * feedback). size 0 clears the state. The state records its bucket layout: per-bucket state
 * saved in another layout is never applied to these buckets; it waits for the re-plan after
 * the next step (torch's rebuild) and is installed if that yields its layout, else dropped;
 * the step counts load in any case (scheduler/comm_hook.h). A state of an older format
 * version: INVALID_ARGUMENT naming it. FAILED_PRECONDITION inside a backward. */
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

#endif /* BRAID_CAPI_BRAID_REDUCER_H_ */
