// ParamSkips: which parameters of a bucket's shard a step leaves alone (no rank used them in
// the step: scheduler/used_map.h), and each parameter's own step count, as torch's AdamW / SGD
// skip a parameter whose .grad is None (state, step count and weight decay untouched).
//
//   ++shard.steps;
//   const std::vector<StepRun>& runs =
//       shard.skips.Plan(shard.segments, shard.steps, bucket.params, reducer.used_map().map());
//   for (const StepRun& r : runs) ... step [r.lo, r.hi) at StepScalars(h, r.steps) ...
//
// Contract: while no parameter of the bucket was ever skipped, the runs are the shard's
// segments at the shard's count (bit for bit the step without this file); afterwards one run
// per parameter piece in the shard, at shard steps minus that parameter's skips. The counts
// are per parameter of the bucket (every rank tracks all of them: the map is agreed), so the
// whole state's per-parameter step is known on every rank.
#ifndef BRAID_OPTIM_PARAM_SKIPS_H_
#define BRAID_OPTIM_PARAM_SKIPS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace braid::optim {

// A range of this rank's shard holding (parts of) parameters of one group.
struct Segment {
  size_t lo, hi;  // elements, relative to the shard start
  int group;
};

// What one step runs the kernels over: [lo, hi) of the shard at step count `steps`.
struct StepRun {
  size_t lo, hi;
  int group;
  int64_t steps;
};

class ParamSkips {
 public:
  // The piece [lo, hi) of the shard holds part of the bucket's k-th parameter (in order).
  void AddPiece(int k, size_t lo, size_t hi, int group) { pieces_.push_back({k, lo, hi, group}); }
  void SetParams(size_t n) { skips_.assign(n, 0); }
  // This step's runs (after the shard's count was incremented to `steps`): counts a skip for
  // every parameter k of the bucket with used[bucket_params[k]] == 0 (`used`: the agreed map by
  // plan index; null: all used).
  const std::vector<StepRun>& Plan(const std::vector<Segment>& segments, int64_t steps,
                                   const std::vector<int>& bucket_params, const uint8_t* used);
  // The bucket's k-th parameter's own step count.
  int64_t StepsOf(int k, int64_t steps) const { return steps - skips_[k]; }
  bool any() const;  // some parameter of the bucket was skipped
  void Reset();      // a loaded state: one count per bucket again

 private:
  struct Piece {
    int k;
    size_t lo, hi;
    int group;
  };
  std::vector<Piece> pieces_;
  std::vector<int64_t> skips_;  // per parameter of the bucket
  std::vector<StepRun> runs_;   // this step's (reused)
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_PARAM_SKIPS_H_
