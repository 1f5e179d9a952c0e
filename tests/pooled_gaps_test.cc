// shard_gradients' pooled bucket storage zero-fills only the gaps between and after the
// parameters' slots (scheduler/reducer_pooled_buckets.h): every slot is written by its first
// mark, or zeroed when its parameter is reduced as unused. The pool hands out buffers full of
// NaN here (what an earlier gather or reduction left, at its worst), and each rank's reduced
// shard must equal the serial average exactly: slots of marked parameters, the no_sync sum of
// a parameter marked only in an earlier microbatch, zeros for a parameter never marked in the
// window, zeros in the gaps.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "comm/element.h"
#include "gtest/gtest.h"
#include "scheduler/buffer_pool.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/reducer_storage.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::RunRanks;

float GradValue(int rank, int param, size_t j, int micro) {
  return static_cast<float>(param + 1) + static_cast<float>(j) / 4 + static_cast<float>(rank) / 8 +
         static_cast<float>(micro);
}

struct Backward {
  SyncMode sync;
  std::vector<int> marked;  // parameter indices (= ids)
};

TEST(PooledGaps, DirtyPoolBuffersReduceAsTheSerialAverage) {
  const std::vector<std::vector<Backward>> windows = {
      {{SyncMode::kSync, {0, 1, 2}}},
      {{SyncMode::kSync, {0, 2}}},                            // 1 unused: zeros
      {{SyncMode::kNoSync, {1}}, {SyncMode::kSync, {0, 2}}},  // 1: its no_sync gradient
      {{SyncMode::kNoSync, {0}}, {SyncMode::kSync, {0, 2}}},  // 1 never marked: zeros
  };
  RunRanks(2, [&](Group& world) {
    const int n = world.size();
    auto pool = std::make_shared<BufferPool>();
    ReducerConfig cfg;
    cfg.mode = ReduceMode::kReduceScatter;
    cfg.shard_gradients = true;
    cfg.allow_unused = true;
    cfg.shared_pool = pool;
    std::vector<ParamSpec> params;
    for (int i : {0, 1, 2}) {
      params.push_back(ParamSpec{i, static_cast<size_t>(std::vector<int>{5, 7, 3}[i]), DType::kF32,
                                 Device::Cpu(), ""});
    }
    auto red = GradientReducer::Create(params, {&world, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    GradientReducer& rd = **red;
    const BucketPlan& plan = rd.plan();
    ASSERT_EQ(plan.buckets().size(), 1u);
    const Bucket& bk = plan.buckets()[0];
    ASSERT_GT(bk.padded_count, bk.count);  // gaps and padding exist
    const size_t storage = AlignedStorageBytes(bk.bytes());
    for (const std::vector<Backward>& window : windows) {
      // The buffer the bucket will take: NaN everywhere.
      OwnedBuffer buf = pool->Take(storage);
      if (!buf) {
        auto a = HostBufferOps().Allocate(storage, "dirty pool buffer");
        ASSERT_TRUE(a.ok()) << a.status();
        buf = std::move(*a);
      }
      std::memset(buf.get(), 0xFF, storage);
      pool->Give(std::move(buf), storage);
      std::vector<double> want(bk.padded_count, 0.0);  // the full bucket, averaged
      for (int micro = 0; micro < static_cast<int>(window.size()); ++micro) {
        const Backward& bw = window[micro];
        ASSERT_OK(rd.BeginBackward(bw.sync));
        for (int p : bw.marked) {
          std::vector<float> g(params[p].count);
          for (size_t j = 0; j < g.size(); ++j) {
            g[j] = GradValue(world.rank(), p, j, micro);
            for (int r = 0; r < n; ++r) {
              want[plan.slot(p).offset + j] += static_cast<double>(GradValue(r, p, j, micro)) / n;
            }
          }
          ASSERT_OK(rd.MarkReady(p, DeviceEvent{}, g.data()));
        }
        ASSERT_OK(rd.FinishBackward());
      }
      const TensorView v = rd.ShardView(0);
      ASSERT_EQ(v.count, bk.shard_count);
      for (size_t e = 0; e < v.count; ++e) {
        const size_t at = world.rank() * bk.shard_count + e;
        ASSERT_EQ(LoadElement(v.data, DType::kF32, e), want[at])
            << "rank " << world.rank() << " bucket element " << at;
      }
      ASSERT_OK(rd.ZeroBucket(0));  // the optimizer consumed it
    }
  });
}

}  // namespace
}  // namespace braid::sched
