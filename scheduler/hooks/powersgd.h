// PowerSGD (Vogels et al. 2019) as torch 1.13's powerSGD_hook does it, on all-reduce buckets:
// each parameter's gradient viewed as a matrix (rows = its shape[0]) that is worth compressing
// ((rows + cols) x rank x min_compression_rate < rows x cols) is sent as two thin factors P and
// Q; the rest of the bucket is all-reduced as it is. Per bucket and step, with error feedback
// (e = what the last step's result missed, added to this step's gradient) and warm start (last
// step's Q reused): Q orthogonalized (Gram-Schmidt, hooks/low_rank.h); P = M Q; all-reduce
// [uncompressed | P] (sum); orthogonalize P; Q = M^T P; all-reduce Q, divide by the group size;
// result P Q^T (uncompressed: sum / size). The first `start_iter` steps are torch's
// allreduce_hook (divide, then sum). The first Q (and every Q without warm start) is uniform in
// [-1, 1) from a counter-based generator of (random_seed, bucket, draw), the same on every rank
// and every platform; draws are numbered hook-wide in Run order (torch: one state.rng draw per
// fill).
//
//   PowerSGDOptions o;  o.rank = 4;  o.start_iter = 10;  o.rows = {768, 1, 3072, ...};
//   ASSIGN_OR_RETURN(auto hook, MakePowerSGDHook(o));
//   RETURN_IF_ERROR(reducer->SetCommHook(hook));   // all-reduce reducers
//
// RANK ORDER: the first all-reduce is issued in Run (bucket order, on the bucket's group); the
// Q all-reduce, which depends on it, runs on a group of the hook's own (split at Attach) and is
// issued in the same bucket order through a cursor: bucket b's Q waits for every earlier
// bucket's Q to be issued, whatever order the P all-reduces complete in.
// State: the step count (torch's state.iter: steps run, advanced at the step's last bucket)
// and the draws' count are hook-wide and survive re-plans, as torch's survive its bucket
// rebuild; the error feedback and warm-start Q are per bucket and a re-plan that changes the
// buckets drops them (OnReplan; torch keys them by bucket index and its one rebuild comes
// before start_powerSGD_iter >= 2, when they are still empty). So a re-plan inside the warm-up
// changes nothing; after it, the next step compresses with zero error and a fresh Q.
// SaveState / LoadState carry all of it through checkpoints (per rank, the same group size),
// with the bucket layout's fingerprint: the step and draw counts load whatever the layout; the
// error feedback and Q load only into the layout they were saved in, and those of another
// layout wait pending for the re-plan after the next step (installed if it yields their layout,
// as torch's rebuild does on a resume; dropped otherwise), never applied to other buckets
// (comm_hook.h, LoadState). While they wait, the buckets compress with zero error and a fresh Q.
// f32 buckets; host memory; one reducer per hook instance.
#ifndef BRAID_SCHEDULER_HOOKS_POWERSGD_H_
#define BRAID_SCHEDULER_HOOKS_POWERSGD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/comm_hook.h"

namespace braid::sched {

struct PowerSGDOptions {
  int rank = 1;                       // matrix_approximation_rank, >= 1
  int start_iter = 1000;              // start_powerSGD_iter: steps all-reduced uncompressed
  double min_compression_rate = 2.0;  // > 0
  bool use_error_feedback = true;
  bool warm_start = true;
  float orthogonalization_epsilon = 0.0f;  // >= 0
  uint64_t random_seed = 0;
  // Per parameter, in registration order: its shape[0] (1 for a 0-d tensor). Empty: every
  // parameter is a vector (nothing is compressed). Checked at SetCommHook.
  std::vector<int64_t> rows;
};

// InvalidArgument for rank < 1, start_iter < 0, min_compression_rate <= 0, epsilon < 0.
absl::StatusOr<std::shared_ptr<CommHook>> MakePowerSGDHook(const PowerSGDOptions& opts);

// The k-th value (k >= 0) of the initial-Q stream of (seed, bucket, init = the hook-wide draw
// number): what the hook fills Q with, exposed so that references (tests, the torch
// comparison) can reproduce it.
float PowerSGDInitValue(uint64_t seed, int bucket, int init, uint64_t k);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_HOOKS_POWERSGD_H_
