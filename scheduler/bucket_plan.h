// BucketPlan: which gradient goes into which bucket, where, and which slice of each bucket is
// this rank's shard. Pure computation: the same inputs give the same plan on every rank.
//
//   std::vector<ParamSpec> params = {{/*id=*/0, 4096, DType::kBF16, Device::Cpu(), "emb"}, ...};
//   PlanOptions o;
//   o.shards = 4;                                   // reduce-scatter over 4 ranks
//   ASSIGN_OR_RETURN(BucketPlan plan, BucketPlan::Build(params, o));
//   const ParamSlot& s = plan.slot(plan.IndexOf(7).value());   // bucket and offset of param 7
//
// Rules (DDP's, plus sharding):
//  - buckets are filled in reverse registration order (the last layers' gradients are ready
//    first in backward, so bucket 0 holds them and launches first);
//  - one dtype, device and unit per bucket: each (dtype, device, unit) has its own open bucket
//    (the smaller first cap applies to the first bucket of each (dtype, device));
//  - a bucket closes when the next parameter would take it past its cap (the first bucket of
//    each (dtype, device) has the smaller first_bucket_cap_bytes); a parameter larger than
//    the cap gets a bucket of its own;
//  - each parameter starts at an offset aligned to align_bytes; gaps are zero-filled padding;
//  - the bucket is padded to a multiple of shards * align, so every rank's shard is one equal,
//    contiguous, aligned range [rank * shard_count, (rank + 1) * shard_count); a parameter may
//    straddle shards.
// An explicit order (e.g. the readiness order seen in a first backward) replaces the reverse
// registration order.
#ifndef BRAID_SCHEDULER_BUCKET_PLAN_H_
#define BRAID_SCHEDULER_BUCKET_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "comm/dtype.h"
#include "comm/tensor.h"

namespace braid::sched {

using ParamId = int64_t;

// ParamSpec::marks: the reducer counts the marks of the first synced backward that has any.
inline constexpr int kCountMarks = 0;

struct ParamSpec {
  ParamId id = 0;
  size_t count = 0;
  DType dtype = DType::kF32;
  Device device = Device::Cpu();
  std::string name;  // optional; errors use it when set
  // Fully sharded training: the framework's wrapping unit (e.g. one transformer block) this
  // parameter belongs to, >= 0. A bucket never mixes units, so a unit is gathered and released
  // as whole buckets. Every parameter is in unit 0 unless told otherwise.
  int unit = 0;
  // Reducer only (not part of the plan's layout): how many times the framework marks this
  // parameter ready in one backward (a tied or reused parameter: once per contribution). 1 (the
  // default) or more: declared; kCountMarks: counted in the first synced backward that marks it
  // (scheduler/reducer_marks.h).
  int marks = 1;

  std::string Label() const;  // "'name' (id 7)" or "id 7"
};

// The most bytes a plan's parameters may hold together (each count x element size, summed):
// far above any memory, far enough below SIZE_MAX that padding and offsets cannot wrap.
inline constexpr size_t kMaxPlanBytes = size_t{1} << 60;

struct PlanOptions {
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t first_bucket_cap_bytes = size_t{1} << 20;
  int shards = 1;           // ranks a bucket is reduce-scattered over (1: all-reduce)
  size_t align_bytes = 64;  // parameter offsets and shard boundaries
};

struct ParamSlot {
  int bucket = -1;
  size_t offset = 0;  // elements from the start of the bucket
};

struct Bucket {
  DType dtype = DType::kF32;
  Device device = Device::Cpu();
  int unit = 0;             // the unit of every parameter in it (ParamSpec::unit)
  bool first = false;       // the first bucket of its (dtype, device): the smaller cap
  std::vector<int> params;  // parameter indices (registration order numbers), in bucket order
  size_t count = 0;         // elements up to the end of the last parameter
  size_t padded_count = 0;  // count rounded up to shards * align; the buffer's size
  size_t shard_count = 0;   // padded_count / shards

  size_t bytes() const { return padded_count * DTypeSize(dtype); }
};

class BucketPlan {
 public:
  // Reverse registration order. InvalidArgument naming the parameter for a duplicate id, an
  // invalid dtype, or options that make no sense.
  static absl::StatusOr<BucketPlan> Build(std::vector<ParamSpec> params, const PlanOptions& o);
  // `order` lists every parameter index exactly once, first-filled first.
  static absl::StatusOr<BucketPlan> BuildInOrder(std::vector<ParamSpec> params,
                                                 const std::vector<int>& order,
                                                 const PlanOptions& o);

  const std::vector<ParamSpec>& params() const { return params_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ParamSlot& slot(int param_index) const { return slots_[param_index]; }
  const PlanOptions& options() const { return options_; }
  // NotFound naming the id.
  absl::StatusOr<int> IndexOf(ParamId id) const;
  // A hash of everything that must match across ranks (params and layout).
  uint64_t Fingerprint() const;
  // Fingerprint() as if every parameter were on `device`: the same layout wherever it lives
  // (what the optimizer's state files record, so a file saved on a GPU loads on the CPU and
  // back). Equals Fingerprint() when every parameter is on `device`.
  uint64_t FingerprintOn(Device device) const;
  // Buckets of unit `u`, in bucket order (empty for a unit no parameter names).
  std::vector<int> UnitBuckets(int u) const;
  // 1 + the largest unit any parameter names (0 without parameters).
  int num_units() const { return num_units_; }
  // Hash of one parameter's spec (id, count, dtype, device; the unit when not 0), for
  // pinpointing a mismatch.
  static uint64_t ParamHash(const ParamSpec& p);

 private:
  // Fingerprint, with every parameter's device taken as *device when not null.
  uint64_t HashLayout(const Device* device) const;

  PlanOptions options_;
  std::vector<ParamSpec> params_;
  std::vector<ParamSlot> slots_;
  std::vector<Bucket> buckets_;
  absl::flat_hash_map<ParamId, int> index_;
  int num_units_ = 0;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_BUCKET_PLAN_H_
