/* braid_optimizer.h: part of braid.h, the C API of Braid -- the sharded optimizer (ZeRO-2 /
 * FSDP), stepped on each rank's shard as its gradients arrive: parameters the framework
 * writes, the whole state unsharded (checkpoints that move), uneven inputs (join) and fully
 * sharded units.
 *
 *   braid_optimizer_create(red, &oo, &opt);     // red: a reduce-scatter or hybrid reducer
 *   for each step:
 *     braid_optimizer_wait_all_params(opt);     // then read braid_optimizer_param(opt, id, ...)
 *     braid_optimizer_begin_backward(opt, BRAID_SYNC);
 *     ... backward: braid_reducer_mark_ready(red, id, ...) ...
 *     braid_optimizer_finish_backward(opt);     // shards step as their reductions complete
 *
 * Contract: braid.h's conventions, and the RANK-ORDER CONTRACT of each section below. Included
 * by braid.h after braid_reducer.h (the reducer it is built on, braid_sync_mode_t); include
 * <braid.h>, not this.
 */
#ifndef BRAID_CAPI_BRAID_H_
#error "include <braid.h>, not braid_optimizer.h"
#endif
#ifndef BRAID_CAPI_BRAID_OPTIMIZER_H_
#define BRAID_CAPI_BRAID_OPTIMIZER_H_

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
  /* fully_sharded, f32 parameters: each unit's buckets are all-gathered as 1-byte codes plus
   * one scale per gather_block elements (about a quarter of the f32 bytes; host reducers) or
   * as BF16 / F16 values (half the bytes; host and device reducers, whose cast kernels run on
   * the gather stream) and decoded into the gathered buffer; every rank computes with the same
   * decoded values, while the shard the optimizer steps (the master weights) stays exact f32.
   * BRAID_GATHER_EXACT (0, default): unchanged. INVALID_ARGUMENT without fully_sharded, for
   * another value, or for a bf16 / f16 bucket (naming its first parameter); UNIMPLEMENTED for
   * INT8 / FP8_E4M3 on device reducers. */
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

#endif /* BRAID_CAPI_BRAID_OPTIMIZER_H_ */
