#include "tests/partition_checks.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "scheduler/op_scheduler.h"
#include "tests/reducer_reference.h"

namespace braid::sched::testing {
namespace {

double Noise(int rank, int param, size_t i) {
  uint64_t z = ((static_cast<uint64_t>(rank) * 7919 + param) << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

// One synced backward; returns the result bytes (see the header).
absl::StatusOr<std::vector<std::vector<char>>> Reduce(GradientReducer& red, int rank,
                                                      absl::Duration timeout) {
  const BucketPlan& plan = red.plan();
  RETURN_IF_ERROR(red.ZeroGrads());
  RETURN_IF_ERROR(red.BeginBackward(SyncMode::kSync));
  std::vector<int> order(plan.params().size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(99 + rank);
  std::shuffle(order.begin(), order.end(), rng);
  for (int p : order) {
    ASSIGN_OR_RETURN(TensorView v, red.GradView(plan.params()[p].id));
    for (size_t i = 0; i < v.count; ++i) StoreElement(v.data, v.dtype, i, Noise(rank, p, i));
    RETURN_IF_ERROR(red.MarkReady(plan.params()[p].id));
  }
  RETURN_IF_ERROR(red.FinishBackward());
  std::vector<std::vector<char>> out;
  if (red.mode() == ReduceMode::kAllReduce) {
    for (const ParamSpec& p : plan.params()) {
      ASSIGN_OR_RETURN(TensorView v, red.GradView(p.id));
      const char* c = static_cast<const char*>(v.data);
      out.emplace_back(c, c + v.count * DTypeSize(v.dtype));
    }
  } else {
    for (size_t b = 0; b < plan.buckets().size(); ++b) {
      TensorView v = red.ShardView(static_cast<int>(b));
      const char* c = static_cast<const char*>(v.data);
      out.emplace_back(c, c + v.count * DTypeSize(v.dtype));
    }
  }
  (void)timeout;
  return out;
}

}  // namespace

absl::Status CheckPartitionedMatchesUnpartitioned(Group& world, ReduceMode mode, int dtypes,
                                                  size_t credit, bool reduce_f32,
                                                  absl::Duration timeout) {
  Mesh mesh;
  ReducerGroups groups{&world, nullptr};
  if (mode == ReduceMode::kHybrid) {
    ASSIGN_OR_RETURN(mesh, MakeMesh(world, 2, world.size() / 2));
    groups = {mesh.shard.get(), mesh.replica.get()};
  }
  OpSchedulerConfig oc;
  oc.credit_bytes = credit;
  oc.timeout = timeout;
  ASSIGN_OR_RETURN(std::unique_ptr<OpScheduler> scheduler, OpScheduler::Create(oc, &world));
  ReducerConfig cfg;
  cfg.mode = mode;
  cfg.first_bucket_cap_bytes = 256;
  cfg.bucket_cap_bytes = 4096;
  cfg.timeout = timeout;
  if (reduce_f32) cfg.reduce_dtype = DType::kF32;
  const std::vector<ParamSpec> params = reference::MakeParams(dtypes);
  ASSIGN_OR_RETURN(std::unique_ptr<GradientReducer> plain,
                   GradientReducer::Create(params, groups, cfg));
  cfg.scheduler = scheduler.get();
  ASSIGN_OR_RETURN(std::unique_ptr<GradientReducer> parted,
                   GradientReducer::Create(params, groups, cfg));
  ASSIGN_OR_RETURN(auto want, Reduce(*plain, world.rank(), timeout));
  const int64_t before = scheduler->partitions_issued();
  ASSIGN_OR_RETURN(auto got, Reduce(*parted, world.rank(), timeout));
  const int64_t parts = scheduler->partitions_issued() - before;
  const int64_t calls = scheduler->reductions_submitted();
  if (parts <= calls) {
    return absl::InternalError(
        absl::StrCat("credit ", credit, ": ", parts, " partitions for ", calls,
                     " reductions: nothing was partitioned, the test tests nothing"));
  }
  for (size_t k = 0; k < want.size(); ++k) {
    if (want[k] == got[k]) continue;
    size_t i = 0;
    while (i < want[k].size() && want[k][i] == got[k][i]) ++i;
    return absl::InternalError(absl::StrCat(
        "rank ", world.rank(), ", ", mode == ReduceMode::kAllReduce ? "parameter " : "bucket ", k,
        ": partitioned result differs from unpartitioned at byte ", i, " (credit ", credit, ")"));
  }
  return absl::OkStatus();
}

}  // namespace braid::sched::testing
