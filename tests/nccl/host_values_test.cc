// comm/host_values.h on both kinds of group: host groups (`local` ranks, the caller's memory)
// and device groups (the nccl backend on the fake device: staged through the group's memory,
// MemcpyAsync in and out). Results against values computed here; errors name the label.
#include "comm/host_values.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl::testing {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

constexpr int kRanks = 3;

absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

// Every function once, checked against what each rank contributed.
void CheckAll(Group& g) {
  const int r = g.rank(), n = g.size();
  // All-reduce (max), in place: values differ by rank, including negatives and NaN-free ties.
  std::vector<double> v = {1.0 * r, -2.5 * r, 7.0, r == 1 ? 1e300 : -1e300};
  ASSERT_OK(AllReduceHostValues(g, v.data(), v.size(), DType::kF64, ReduceOp::Max(), "test max",
                                Deadline()));
  EXPECT_EQ(v, (std::vector<double>{1.0 * (n - 1), 0.0, 7.0, n > 1 ? 1e300 : -1e300}));
  // All-gather of two int64 per rank.
  const int64_t mine[2] = {100 + r, -(int64_t{1} << 40) - r};
  std::vector<int64_t> all(2 * n, 0);
  ASSERT_OK(AllGatherHostValues(g, mine, all.data(), 2, DType::kI64, "test gather", Deadline()));
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(all[2 * k], 100 + k);
    EXPECT_EQ(all[2 * k + 1], -(int64_t{1} << 40) - k);
  }
  // Broadcast from the last rank.
  std::vector<int64_t> order = {r, 10 * r, 100 * r};
  ASSERT_OK(BroadcastHostValues(g, order.data(), order.size(), DType::kI64, n - 1, "test order",
                                Deadline()));
  EXPECT_EQ(order, (std::vector<int64_t>{n - 1, 10 * (n - 1), 100 * (n - 1)}));
}

TEST(HostValues, HostGroupsUseTheCallersMemory) {
  RunRanks(kRanks, [](Group& g) { CheckAll(g); });
}

TEST(HostValues, DeviceGroupsStageThroughTheirMemory) {
  FakeGpu gpu;
  RunFakeRanks(gpu, kRanks, FakeConfig(), [&](NcclGroup& g) { CheckAll(g); });
  // Each call copies in and out on every rank: 3 calls x 2 copies x kRanks.
  int copies = 0;
  for (const std::string& line : gpu.cuda->log()) copies += line.rfind("MemcpyAsync(", 0) == 0;
  EXPECT_EQ(copies, 3 * 2 * kRanks) << absl::StrJoin(gpu.cuda->log(), "\n");
  ExpectClean(gpu);  // every staging buffer freed
}

TEST(HostValues, ErrorsNameTheLabel) {
  RunRanks(2, [](Group& g) {
    int64_t v = 1;
    ExpectError(BroadcastHostValues(g, &v, 1, DType::kI64, 5, "the rebuild order", Deadline()),
                absl::StatusCode::kInvalidArgument, {"root"});
  });
}

}  // namespace
}  // namespace braid::nccl::testing
