// The bucket layout an optimizer state file was saved with, recorded in the file itself so
// that a checkpoint can be read without the run that wrote it (optim/reshard.h re-shards it
// for another number of ranks; ShardedOptimizer::Load names the first parameter that differs).
//
//   LayoutSections layout(plan);                    // when saving: owns the encoded bytes
//   for (const StateSection& s : layout.sections()) sections.push_back(s);
//   ...
//   ASSIGN_OR_RETURN(sched::BucketPlan plan, ReadLayout(loaded));   // when reading
//   RETURN_IF_ERROR(CheckSameParams(plan.params(), my_plan.params(), loaded.path()));
//
// Sections (all optional for the reader of the state itself: files without them, written by
// Braid before this layout existed, still load; they only cannot be re-sharded):
//   "layout/params"   i64 x 3 per parameter in registration order: id, count, dtype
//   "layout/order"    i64 per parameter: parameter indices in bucket-fill order
//   "layout/options"  i64 x 4: bucket_cap_bytes, first_bucket_cap_bytes, shards, align_bytes
//   "layout/names"    u8: every parameter's name followed by a NUL, registration order
// ReadLayout rebuilds the plan from them (BucketPlan::BuildInOrder, every parameter on the
// CPU) and accepts it only when its fingerprint is the header's plan_fingerprint, so a layout
// that does not describe the state beside it is refused rather than trusted.
#ifndef BRAID_OPTIM_CHECKPOINT_LAYOUT_H_
#define BRAID_OPTIM_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optim/state_file.h"
#include "scheduler/bucket_plan.h"

namespace braid::optim {

inline constexpr char kLayoutParams[] = "layout/params";
inline constexpr char kLayoutOrder[] = "layout/order";
inline constexpr char kLayoutOptions[] = "layout/options";
inline constexpr char kLayoutNames[] = "layout/names";
// Fully sharded plans: each parameter's unit (ParamSpec::unit), present only when some unit
// is not 0 (so files of plans without units are as before).
inline constexpr char kLayoutUnits[] = "layout/units";

// The encoded layout of `plan`; sections() point into this object, which must outlive the
// WriteStateFile call they are passed to.
class LayoutSections {
 public:
  explicit LayoutSections(const sched::BucketPlan& plan);
  LayoutSections(const LayoutSections&) = delete;
  LayoutSections& operator=(const LayoutSections&) = delete;

  std::vector<StateSection> sections() const;

 private:
  std::vector<int64_t> params_, order_, options_, units_;  // units_: empty when every unit is 0
  std::string names_;
};

// Whether `file` records a layout at all (files from before the layout have none).
bool HasLayout(const LoadedState& file);

// The plan `file` was saved with, every parameter on the CPU. NotFound naming the path when the
// file has no layout sections; DataLoss naming the path and the section when they are
// malformed or do not reproduce the header's plan fingerprint.
absl::StatusOr<sched::BucketPlan> ReadLayout(const LoadedState& file);

// OK when `have` (a file's parameters) and `want` are the same parameters in the same
// registration order (id, count, dtype). Otherwise FailedPrecondition naming `path` and the
// first parameter that differs, e.g. "state file /c/rank0.braid: parameter #3 'fc.bias'
// (id 7) has 128 f32 elements in the file, 256 f32 here".
absl::Status CheckSameParams(const std::vector<sched::ParamSpec>& have,
                             const std::vector<sched::ParamSpec>& want, const std::string& path);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_CHECKPOINT_LAYOUT_H_
