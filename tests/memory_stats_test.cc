// MemoryStats: bytes counted from allocation to free, host and device apart, per use, peaks,
// the timeline's counter samples, and buffers that outlive the stats object.
#include "scheduler/memory_stats.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace braid::sched {
namespace {

// Host memory that claims to be asynchronous: what the stats count as device memory.
class AsyncHostOps : public BufferOps {
 public:
  bool synchronous() const override { return false; }
  absl::StatusOr<OwnedBuffer> Allocate(size_t bytes, absl::string_view what) override {
    return HostBufferOps().Allocate(bytes, what);
  }
  absl::Status Zero(void*, size_t) override { return absl::OkStatus(); }
  absl::Status Copy(void*, const void*, size_t) override { return absl::OkStatus(); }
  absl::Status CastScale(const void*, DType, void*, DType, size_t, const ScaleSpec&) override {
    return absl::OkStatus();
  }
  absl::Status Add(const void*, const void*, void*, size_t, DType) override {
    return absl::OkStatus();
  }
  bool can_add() const override { return true; }
  absl::Status WaitFor(DeviceEvent) override { return absl::OkStatus(); }
  absl::Status Synchronize(absl::Time) override { return absl::OkStatus(); }
  absl::Status CompleteAfter(const WorkPtr&, absl::Time) override { return absl::OkStatus(); }
};

TEST(MemoryStats, CountsCurrentAndPeakPerSideAndUse) {
  MemoryStats stats;
  AsyncHostOps device_ops;
  {
    auto a = stats.Allocate(HostBufferOps(), 1000, MemoryUse::kGradBuckets, "a");
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = stats.Allocate(device_ops, 300, MemoryUse::kParamGather, "b");
    ASSERT_TRUE(b.ok());
    {
      auto c = stats.Allocate(HostBufferOps(), 24, MemoryUse::kGradBuckets, "c");
      ASSERT_TRUE(c.ok());
      MemorySnapshot s = stats.Snapshot();
      EXPECT_EQ(s.host.current, 1024);
      EXPECT_EQ(s.device.current, 300);
      EXPECT_EQ(s.by_use[static_cast<int>(MemoryUse::kGradBuckets)].current, 1024);
      EXPECT_EQ(s.by_use[static_cast<int>(MemoryUse::kParamGather)].current, 300);
      EXPECT_EQ(s.allocations, 3);
    }
    MemorySnapshot s = stats.Snapshot();
    EXPECT_EQ(s.host.current, 1000);
    EXPECT_EQ(s.host.peak, 1024);
    // A moved buffer is still counted once, and freed once.
    OwnedBuffer moved = *std::move(a);
    EXPECT_EQ(stats.Snapshot().host.current, 1000);
    stats.ResetPeaks();
    EXPECT_EQ(stats.Snapshot().host.peak, 1000);
  }
  MemorySnapshot s = stats.Snapshot();
  EXPECT_EQ(s.host.current, 0);
  EXPECT_EQ(s.device.current, 0);
  EXPECT_EQ(s.device.peak, 300);
  EXPECT_EQ(s.host.peak, 1000);
  EXPECT_GE(CountedAllocate(nullptr, HostBufferOps(), 8, MemoryUse::kStaging, "x")->bytes(), 8u);
  EXPECT_EQ(stats.Snapshot().allocations, 3);  // not through the stats: not counted
}

TEST(MemoryStats, BufferMayOutliveTheStats) {
  OwnedBuffer kept;
  {
    MemoryStats stats;
    kept = *stats.Allocate(HostBufferOps(), 64, MemoryUse::kStaging, "kept");
  }
  ASSERT_TRUE(kept);
  static_cast<char*>(kept.get())[63] = 1;
  kept.Reset();  // counts into counters nobody reads; no use after free (ASan would say)
}

TEST(MemoryStats, WritesCounterSamplesToTheTimeline) {
  const std::string prefix = ::testing::TempDir() + "/memtl";
  auto tl = Timeline::Create(prefix, 0);
  ASSERT_TRUE(tl.ok()) << tl.status();
  MemoryStats stats;
  stats.SetTimeline(tl->get());
  { auto a = stats.Allocate(HostBufferOps(), 4096, MemoryUse::kOptimizerState, "a"); }
  stats.SetTimeline(nullptr);
  ASSERT_TRUE((*tl)->Close().ok());
  std::ifstream in((*tl)->path());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string json = ss.str();
  EXPECT_NE(json.find("\"ph\":\"C\""), std::string::npos) << json;
  EXPECT_NE(json.find("{\"host bytes\":4096}"), std::string::npos) << json;
  EXPECT_NE(json.find("{\"host bytes\":0}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"memory\""), std::string::npos) << json;
}

}  // namespace
}  // namespace braid::sched
