// The int8 hook with error feedback (ZeRO++'s qgZ idea, over the collectives Braid's groups
// have): each rank adds its error-feedback residual to the bucket, quantizes the sum per block
// of `block` elements to int8 with one f32 scale per block (scale = max|v| / 127, q =
// round-to-nearest-even(v / scale)), keeps v - q * scale as the next step's residual, and
// all-gathers the int8 values with their scales. Every rank then dequantizes the elements of
// its result from every rank and sums them in f32 in group-rank order, then divides by the
// group size: all ranks get bit-identical results, exact in these terms (tests/comm_hook_test).
//
//   ASSIGN_OR_RETURN(auto hook, MakeInt8Hook({/*block=*/256}));
//   RETURN_IF_ERROR(reducer->SetCommHook(hook));
//
// Bytes received per rank: (n - 1) x (sent + 4 sent / block) for n ranks, where a ring moves
// 2 (n-1)/n x 4 count (f32 all-reduce) or (n-1)/n x 4 count (reduce-scatter, sent = n count):
// less up to about 8 ranks for all-reduce and 4 for reduce-scatter (an all-to-all, which Group
// lacks, would make it scale).
// The residuals are per (bucket, stage), kept across steps, dropped at a re-plan that changes
// the buckets (OnReplan: they follow elements that moved), carried through checkpoints by
// SaveState / LoadState (per rank, the same group size) with the bucket layout's fingerprint:
// residuals load only into the layout they were saved in; another layout's wait pending for
// the re-plan after the next step (installed if it yields their layout, dropped otherwise) and
// are never applied to other buckets (comm_hook.h, LoadState); meanwhile the residuals start
// at zero. The hook counts no steps: nothing else depends on the plan.
// f32 buckets only; host memory.
#ifndef BRAID_SCHEDULER_HOOKS_INT8_H_
#define BRAID_SCHEDULER_HOOKS_INT8_H_

#include <memory>

#include "absl/status/statusor.h"
#include "scheduler/comm_hook.h"

namespace braid::sched {

struct Int8Options {
  int block = 256;  // elements per scale, >= 1
  bool replica_only = false;
};

// InvalidArgument for block < 1.
absl::StatusOr<std::shared_ptr<CommHook>> MakeInt8Hook(const Int8Options& opts);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_HOOKS_INT8_H_
