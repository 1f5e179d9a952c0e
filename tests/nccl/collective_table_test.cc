// bench/collective_table (the core of `collective_latency --backend=nccl`) on the fake device:
// every collective, in and out of place, on 1, 2 and 4 fake ranks, with the bench's own exact
// check. On a device group the bench's buffers are device allocations filled and read back
// through host staging; a row with #wrong != 0 means data did not make the round trip.
#include "bench/collective_table.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl::testing {
namespace {

using bench::CollectiveConfig;
using bench::CollectiveRow;

CollectiveConfig SmallSweep(DType dtype, ReduceKind op, bool in_place) {
  CollectiveConfig c;
  c.backend = "nccl";
  c.minbytes = 64;
  c.maxbytes = 4096;
  c.step = 8;
  c.iters = 2;
  c.warmup = 1;
  c.dtype = dtype;
  c.redop = op;
  c.in_place = in_place;
  c.ops = {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllGather,
           CollectiveKind::kBroadcast, CollectiveKind::kBarrier};
  return c;
}

struct Case {
  int ranks;
  DType dtype;
  ReduceKind op;
  bool in_place;
};

class CollectiveTableOnFakeDevice : public ::testing::TestWithParam<Case> {};

TEST_P(CollectiveTableOnFakeDevice, EveryRowChecksExact) {
  const Case k = GetParam();
  const CollectiveConfig c = SmallSweep(k.dtype, k.op, k.in_place);
  FakeGpu gpu;
  std::vector<CollectiveRow> rows;
  RunFakeRanks(gpu, k.ranks, FakeConfig(), [&](NcclGroup& g) {
    ASSERT_FALSE(g.buffer_ops().synchronous());  // the bench must take its device path
    EXPECT_OK(bench::RunCollectiveSweep(g, c, g.rank() == 0 ? &rows : nullptr, false));
    if (g.rank() == 0) {
      absl::StatusOr<CollectiveRow> copy = bench::CopyBaselineRow(g, 4096);
      ASSERT_TRUE(copy.ok()) << copy.status();
      EXPECT_EQ(copy->op, "d2d_copy");
      EXPECT_GT(copy->algbw, 0);
    }
  });
  ExpectClean(gpu);
  // 64, 512, 4096 bytes for four collectives (reduce-scatter / all-gather at 64 B on 4 ranks of
  // 8-byte elements still have count 2), plus one barrier row.
  ASSERT_EQ(rows.size(), 13u);
  for (const CollectiveRow& r : rows) {
    EXPECT_EQ(r.wrong, 0) << r.op << " " << r.bytes << " B";
    EXPECT_GT(r.time_us, 0) << r.op;
  }
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& k = info.param;
  return std::string(DTypeName(k.dtype)) + "_" + std::string(ReduceKindName(k.op)) + "_" +
         std::to_string(k.ranks) + "ranks" + (k.in_place ? "_inplace" : "");
}

INSTANTIATE_TEST_SUITE_P(Sweep, CollectiveTableOnFakeDevice,
                         ::testing::Values(Case{1, DType::kF32, ReduceKind::kSum, false},
                                           Case{2, DType::kF32, ReduceKind::kSum, false},
                                           Case{4, DType::kF32, ReduceKind::kSum, true},
                                           Case{2, DType::kBF16, ReduceKind::kPreMulSum, false},
                                           Case{4, DType::kF16, ReduceKind::kMax, true},
                                           Case{4, DType::kF64, ReduceKind::kAvg, false}),
                         Name);

}  // namespace
}  // namespace braid::nccl::testing
