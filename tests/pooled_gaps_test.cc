// shard_gradients' pooled bucket storage (scheduler/reducer_pooled_buckets.h) zero-fills only
// the gaps between and after the parameters' slots: every slot is written by its first mark
// (a copy, or the framework's own writes into GradientReducer::GradSlot's slot), or zeroed when
// its parameter is reduced as unused. The pool hands out buffers full of NaN here (what an
// earlier gather or reduction left, at its worst), and each rank's reduced shard must equal the
// serial average exactly: slots of marked parameters (with values, in place, or both in one
// no_sync window: the slot for the first contribution, values added after), the no_sync sum of
// a parameter marked only in an earlier microbatch, zeros for a parameter never marked in the
// window, zeros in the gaps. GradSlot's refusals name the parameter and what to do instead.
#include <cstring>
#include <memory>
#include <string>
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

// Whether `st`'s message says `text`.
::testing::AssertionResult Says(const absl::Status& st, const std::string& text) {
  if (std::string(st.message()).find(text) != std::string::npos)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << st << " does not say '" << text << "'";
}

float GradValue(int rank, int param, size_t j, int micro) {
  return static_cast<float>(param + 1) + static_cast<float>(j) / 4 + static_cast<float>(rank) / 8 +
         static_cast<float>(micro);
}

enum class Via { kSlot, kValues };
struct Contribution {
  int param;
  Via via;
};
struct Backward {
  SyncMode sync;
  std::vector<Contribution> marks;
};

std::vector<ParamSpec> Params() {
  std::vector<ParamSpec> params;
  const size_t counts[] = {5, 7, 3};
  for (int i : {0, 1, 2}) params.push_back(ParamSpec{i, counts[i], DType::kF32, Device::Cpu(), ""});
  return params;
}

ReducerConfig PooledConfig(std::shared_ptr<BufferPool> pool) {
  ReducerConfig cfg;
  cfg.mode = ReduceMode::kReduceScatter;
  cfg.shard_gradients = true;
  cfg.allow_unused = true;
  cfg.shared_pool = std::move(pool);
  return cfg;
}

// Each rank runs the windows (each a list of backwards) on one reducer whose pool hands out
// NaN-filled storage, and checks its reduced shard after each window.
void RunWindows(const std::vector<std::vector<Backward>>& windows) {
  RunRanks(2, [&](Group& world) {
    const int n = world.size();
    auto pool = std::make_shared<BufferPool>();
    const std::vector<ParamSpec> params = Params();
    auto red = GradientReducer::Create(params, {&world, nullptr}, PooledConfig(pool));
    ASSERT_TRUE(red.ok()) << red.status();
    GradientReducer& rd = **red;
    const BucketPlan& plan = rd.plan();
    ASSERT_EQ(plan.buckets().size(), 1u);
    const Bucket& bk = plan.buckets()[0];
    ASSERT_GT(bk.padded_count, bk.count);  // gaps and padding exist
    const size_t storage = AlignedStorageBytes(bk.bytes());
    for (const std::vector<Backward>& window : windows) {
      OwnedBuffer buf = pool->Take(storage);  // the buffer the bucket takes: NaN everywhere
      if (!buf) {
        auto a = HostBufferOps().Allocate(storage, "dirty pool buffer");
        ASSERT_TRUE(a.ok()) << a.status();
        buf = std::move(*a);
      }
      std::memset(buf.get(), 0xFF, storage);
      pool->Give(std::move(buf), storage);
      std::vector<double> want(bk.padded_count, 0.0);
      for (int micro = 0; micro < static_cast<int>(window.size()); ++micro) {
        ASSERT_OK(rd.BeginBackward(window[micro].sync));
        for (const Contribution& c : window[micro].marks) {
          const int p = c.param;
          for (size_t j = 0; j < params[p].count; ++j) {
            for (int r = 0; r < n; ++r) {
              want[plan.slot(p).offset + j] += static_cast<double>(GradValue(r, p, j, micro)) / n;
            }
          }
          if (c.via == Via::kSlot) {
            absl::StatusOr<TensorView> slot = rd.GradSlot(p);
            ASSERT_TRUE(slot.ok()) << slot.status();
            ASSERT_EQ(slot->count, params[p].count);
            float* g = static_cast<float*>(slot->data);
            for (size_t j = 0; j < slot->count; ++j) g[j] = GradValue(world.rank(), p, j, micro);
            ASSERT_OK(rd.MarkReady(p));
          } else {
            std::vector<float> g(params[p].count);
            for (size_t j = 0; j < g.size(); ++j) g[j] = GradValue(world.rank(), p, j, micro);
            ASSERT_OK(rd.MarkReady(p, DeviceEvent{}, g.data()));
          }
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

TEST(PooledGaps, DirtyPoolBuffersReduceAsTheSerialAverage) {
  RunWindows({
      {{SyncMode::kSync, {{0, Via::kValues}, {1, Via::kValues}, {2, Via::kValues}}}},
      {{SyncMode::kSync, {{0, Via::kValues}, {2, Via::kValues}}}},  // 1 unused: zeros
      {{SyncMode::kNoSync, {{1, Via::kValues}}},
       {SyncMode::kSync, {{0, Via::kValues}, {2, Via::kValues}}}},  // 1: its no_sync gradient
      {{SyncMode::kNoSync, {{0, Via::kValues}}},
       {SyncMode::kSync, {{0, Via::kValues}, {2, Via::kValues}}}},  // 1 never marked: zeros
  });
}

TEST(GradSlot, InPlaceGradientsReduceAsTheSerialAverage) {
  RunWindows({
      {{SyncMode::kSync, {{0, Via::kSlot}, {1, Via::kSlot}, {2, Via::kSlot}}}},
      {{SyncMode::kSync, {{0, Via::kSlot}, {1, Via::kValues}}}},  // 2 unused: zeros
      // no_sync: the first contribution in the slot, the next one's values added to it.
      {{SyncMode::kNoSync, {{0, Via::kSlot}, {2, Via::kSlot}}},
       {SyncMode::kSync, {{0, Via::kValues}, {1, Via::kSlot}}}},  // 2: its no_sync slot
  });
}

TEST(GradSlot, RefusalsNameTheParameterAndTheWayOut) {
  RunRanks(2, [&](Group& world) {
    std::vector<ParamSpec> params = Params();
    params[1].marks = 2;  // tied: two contributions per backward
    auto red = GradientReducer::Create(params, {&world, nullptr},
                                       PooledConfig(std::make_shared<BufferPool>()));
    ASSERT_TRUE(red.ok()) << red.status();
    GradientReducer& rd = **red;
    absl::StatusOr<TensorView> s = rd.GradSlot(0);
    EXPECT_TRUE(absl::IsFailedPrecondition(s.status())) << s.status();
    EXPECT_TRUE(Says(s.status(), "outside a backward"));

    ASSERT_OK(rd.BeginBackward(SyncMode::kNoSync));
    s = rd.GradSlot(1);
    EXPECT_TRUE(absl::IsFailedPrecondition(s.status())) << s.status();
    EXPECT_TRUE(Says(s.status(), "marked several times"));
    EXPECT_TRUE(absl::IsNotFound(rd.GradSlot(42).status()));
    // A values-less mark without a slot is still refused; with one it is taken once.
    EXPECT_TRUE(absl::IsFailedPrecondition(rd.MarkReady(0)));
    ASSERT_TRUE(rd.GradSlot(0).ok());
    ASSERT_TRUE(rd.GradSlot(0).ok());  // taken again before its mark: the same slot
    ASSERT_OK(rd.MarkReady(0));
    absl::Status again = rd.MarkReady(0);
    EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
    EXPECT_TRUE(Says(again, "without its gradient"));  // its slot was consumed
    ASSERT_OK(rd.FinishBackward());

    // The window's next microbatch: parameter 0 has a contribution, so its slot is refused.
    ASSERT_OK(rd.BeginBackward(SyncMode::kSync));
    s = rd.GradSlot(0);
    EXPECT_TRUE(absl::IsFailedPrecondition(s.status())) << s.status();
    EXPECT_TRUE(Says(s.status(), "parameter id 0"));
    EXPECT_TRUE(Says(s.status(), "MarkReady(id, ready, grad)"));
    // A slot taken in an earlier backward does not carry over to a values-less mark.
    absl::Status bare = rd.MarkReady(2);
    EXPECT_TRUE(absl::IsFailedPrecondition(bare)) << bare;
    ASSERT_OK(rd.FinishBackward());
  });
}

TEST(GradSlot, FullBucketsPointToGradView) {
  RunRanks(2, [&](Group& world) {
    ReducerConfig cfg;
    cfg.mode = ReduceMode::kReduceScatter;
    auto red = GradientReducer::Create(Params(), {&world, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
    absl::StatusOr<TensorView> s = (*red)->GradSlot(0);
    EXPECT_TRUE(absl::IsFailedPrecondition(s.status())) << s.status();
    EXPECT_TRUE(Says(s.status(), "GradView"));
    for (int p : {0, 1, 2}) ASSERT_OK((*red)->MarkReady(p));
    ASSERT_OK((*red)->FinishBackward());
  });
}

}  // namespace
}  // namespace braid::sched
