// A bounded buffer pool (scheduler/buffer_pool.h) under a shard_gradients reducer: backpressure
// on the gradient hand-over. One rank's reduce-scatters are stalled, so without a limit every
// bucket's pooled storage is in flight at once; with a limit of two buckets the pool never holds
// more (MarkReady waits for a launched bucket's storage to come back), and every rank's reduced
// shards are bit for bit the unbounded run's and the serial average. A wait that outlives the
// reducer's timeout fails the mark, naming the bucket and pool_limit_bytes; a limit below one
// bucket's storage is refused at Create. At the limit, free buffers of other sizes are freed
// to make room; a reducer destroyed holding storage leaves a shared pool's count.
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "backends/local/local_backend.h"
#include "comm/backend.h"
#include "gtest/gtest.h"
#include "scheduler/buffer_pool.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/memory_stats.h"
#include "scheduler/reducer_storage.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::LocalOptions;
using braid::testing::RunRanks;

constexpr int kParams = 8;
constexpr size_t kCount = 1024;  // elements per parameter; one bucket each, no padding

float GradValue(int rank, int param, size_t j, int step) {
  // Small dyadic values: any order of the sum is exact, so the average is too.
  return static_cast<float>(param + 1) + static_cast<float>(j % 64) / 4 +
         static_cast<float>(rank) / 8 + static_cast<float>(step);
}

std::vector<ParamSpec> Params() {
  std::vector<ParamSpec> out;
  for (int i = 0; i < kParams; ++i)
    out.push_back(ParamSpec{i, kCount, DType::kF32, Device::Cpu(), ""});
  return out;
}

ReducerConfig Config(std::shared_ptr<BufferPool> pool, MemoryStats* memory) {
  ReducerConfig cfg;
  cfg.mode = ReduceMode::kReduceScatter;
  cfg.shard_gradients = true;
  cfg.bucket_cap_bytes = cfg.first_bucket_cap_bytes = kCount * sizeof(float);
  cfg.shared_pool = std::move(pool);
  cfg.memory = memory;
  cfg.timeout = absl::Seconds(60);
  return cfg;
}

struct RunResult {
  std::vector<std::vector<float>> shards;  // [step * buckets + bucket], this rank's shard
  std::vector<int> param;                  // bucket -> its one parameter
  std::vector<size_t> offset;              // bucket -> the parameter's slot (elements)
  int64_t peak_held = 0;
  MemorySnapshot memory;
};

// Three synced backwards; every bucket's reduce-scatter on `stalled_rank` sleeps first (the
// ranks' other marks race ahead of it).
void RunSteps(Group& world, local::FaultInjector& faults, int64_t limit, RunResult* out) {
  MemoryStats memory;
  auto pool = std::make_shared<BufferPool>(BufferPool::Options{limit, &memory});
  auto red = GradientReducer::Create(Params(), {&world, nullptr}, Config(pool, &memory));
  ASSERT_TRUE(red.ok()) << red.status();
  GradientReducer& rd = **red;
  const BucketPlan& plan = rd.plan();
  ASSERT_EQ(plan.buckets().size(), static_cast<size_t>(kParams));
  for (const Bucket& bk : plan.buckets()) {
    ASSERT_EQ(bk.params.size(), 1u);
    out->param.push_back(bk.params[0]);
    out->offset.push_back(plan.slot(bk.params[0]).offset);
  }
  // The next collective on the world group is the first reduce-scatter: stall rank 1's.
  auto barrier = world.Barrier();
  ASSERT_TRUE(barrier.ok()) << barrier.status();
  ASSERT_OK((*barrier)->Wait(absl::Seconds(60)));
  const uint64_t first = (*barrier)->info().seq + 1;
  constexpr int kSteps = 3;
  if (world.rank() == 1) {
    for (uint64_t k = 0; k < kSteps * kParams; ++k)
      faults.StallRank(1, first + k, absl::Milliseconds(20), world.name());
  }
  std::vector<float> g(kCount);
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_OK(rd.BeginBackward(SyncMode::kSync));
    for (int b = 0; b < static_cast<int>(plan.buckets().size()); ++b) {  // launch order
      for (int i : plan.buckets()[b].params) {
        for (size_t j = 0; j < kCount; ++j) g[j] = GradValue(world.rank(), i, j, step);
        ASSERT_OK(rd.MarkReady(i, DeviceEvent{}, g.data()));
      }
    }
    ASSERT_OK(rd.FinishBackward());
    for (int b = 0; b < static_cast<int>(plan.buckets().size()); ++b) {
      const TensorView v = rd.ShardView(b);
      const float* f = static_cast<const float*>(v.data);
      out->shards.emplace_back(f, f + v.count);
    }
    ASSERT_OK(rd.ZeroGrads());
  }
  out->peak_held = pool->peak_held_bytes();
  out->memory = memory.Snapshot();
}

TEST(PoolLimit, PooledStorageStaysWithinTheLimitBitForBit) {
  constexpr int kRanks = 4;
  const int64_t bucket = static_cast<int64_t>(AlignedStorageBytes(kCount * sizeof(float)));
  const int64_t limit = 2 * bucket;
  std::vector<RunResult> bounded(kRanks), unbounded(kRanks);
  for (int64_t lim : {int64_t{0}, limit}) {
    auto backend = CreateBackend(LocalOptions(kRanks));
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto& faults = static_cast<local::LocalBackend*>(backend->get())->faults();
    RunRanks(**backend, [&](Group& world) {
      RunSteps(world, faults, lim, &(lim == 0 ? unbounded : bounded)[world.rank()]);
    });
  }
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    const RunResult& b = bounded[r];
    const RunResult& u = unbounded[r];
    // The limit held, by waiting (not by growing past it); without it the stalled
    // reduce-scatters kept more buckets' storage at once.
    EXPECT_LE(b.peak_held, limit);
    EXPECT_EQ(b.memory.pool_over_limit, 0);
    EXPECT_GT(b.memory.pool_waits, 0);
    EXPECT_GT(u.peak_held, limit);
    EXPECT_EQ(u.memory.pool_waits, 0);
    EXPECT_EQ(b.memory.by_use[static_cast<int>(MemoryUse::kGradBuckets)].peak, b.peak_held);
    // Bit for bit: the unbounded run, and the serial average.
    ASSERT_EQ(b.shards.size(), u.shards.size());
    for (size_t k = 0; k < b.shards.size(); ++k) {
      ASSERT_EQ(b.shards[k].size(), u.shards[k].size());
      EXPECT_EQ(std::memcmp(b.shards[k].data(), u.shards[k].data(), b.shards[k].size() * 4), 0)
          << "step " << k / kParams << " bucket " << k % kParams;
    }
    for (int step = 0; step < 3; ++step) {
      for (int bk = 0; bk < kParams; ++bk) {
        const std::vector<float>& got = b.shards[step * kParams + bk];
        // One parameter per bucket: this rank's shard starts at element r * shard_count.
        for (size_t e = 0; e < got.size(); ++e) {
          const size_t at = r * got.size() + e;
          if (at < b.offset[bk] || at >= b.offset[bk] + kCount) continue;  // gaps, padding
          const size_t j = at - b.offset[bk];
          float sum = 0;
          for (int q = 0; q < kRanks; ++q) sum += GradValue(q, b.param[bk], j, step);
          const float want = sum / kRanks;
          if (got[e] != want) {
            ADD_FAILURE() << "step " << step << " bucket " << bk << " element " << j << ": "
                          << got[e] << ", want " << want;
            break;
          }
        }
      }
    }
  }
}

TEST(PoolLimit, AWaitPastTheTimeoutNamesTheBucketAndTheLimit) {
  auto backend = CreateBackend(LocalOptions(2));
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto& faults = static_cast<local::LocalBackend*>(backend->get())->faults();
  RunRanks(**backend, [&](Group& world) {
    const int64_t bucket = static_cast<int64_t>(AlignedStorageBytes(kCount * sizeof(float)));
    auto pool = std::make_shared<BufferPool>(BufferPool::Options{bucket, nullptr});
    ReducerConfig cfg = Config(pool, nullptr);
    cfg.timeout = absl::Milliseconds(300);
    auto red = GradientReducer::Create(Params(), {&world, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    GradientReducer& rd = **red;
    auto barrier = world.Barrier();
    ASSERT_TRUE(barrier.ok()) << barrier.status();
    ASSERT_OK((*barrier)->Wait(absl::Seconds(60)));
    // Rank 1 joins bucket 0's reduce-scatter only after 2 s: bucket 1 cannot have its storage.
    if (world.rank() == 1) {
      faults.StallRank(1, (*barrier)->info().seq + 1, absl::Seconds(2), world.name());
    }
    std::vector<float> g(kCount, 1.0f);
    ASSERT_OK(rd.BeginBackward(SyncMode::kSync));
    const BucketPlan& plan = rd.plan();
    ASSERT_OK(rd.MarkReady(plan.buckets()[0].params[0], DeviceEvent{}, g.data()));
    const absl::Status st = rd.MarkReady(plan.buckets()[1].params[0], DeviceEvent{}, g.data());
    ExpectError(st, absl::StatusCode::kDeadlineExceeded,
                {"bucket 1", "pool_limit_bytes", "buffer pool"});
    // Bucket 0 still completes (bucket 1 never launched on any rank): nothing is lost.
    ASSERT_OK(rd.BucketWork(0)->Wait(absl::Seconds(30)));
    (void)rd.FinishBackward();
  });
}

// The pool's free buffer of `bytes`, or a new one the pool counted (allocated here, as its
// users do), waiting up to 5 s.
OwnedBuffer Acquire(BufferPool& pool, MemoryStats& memory, size_t bytes) {
  absl::StatusOr<OwnedBuffer> got = pool.Acquire(bytes, absl::Seconds(5));
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok() || *got) return got.ok() ? *std::move(got) : OwnedBuffer();
  absl::StatusOr<OwnedBuffer> fresh =
      CountedAllocate(&memory, HostBufferOps(), bytes, MemoryUse::kGradBuckets, "test");
  EXPECT_TRUE(fresh.ok()) << fresh.status();
  return fresh.ok() ? *std::move(fresh) : OwnedBuffer();
}

// Acquire at the limit with no free buffer of the size wanted but free ones of other sizes:
// those are freed (the smallest that makes room) instead of the pool growing past its limit,
// and instead of waiting for a returning buffer of another size; MemoryStats counts them freed.
TEST(PoolLimit, AtTheLimitFreeBuffersOfOtherSizesMakeRoom) {
  constexpr size_t kA = 4096, kB = 8192, kC = 6144;
  MemoryStats memory;
  BufferPool pool(BufferPool::Options{static_cast<int64_t>(kA + kB), &memory});
  const auto allocated = [&] {
    return memory.Snapshot().by_use[static_cast<int>(MemoryUse::kGradBuckets)].current;
  };
  OwnedBuffer a = Acquire(pool, memory, kA), b = Acquire(pool, memory, kB);
  pool.Give(std::move(a), kA);
  pool.Give(std::move(b), kB);
  ASSERT_EQ(pool.held_bytes(), static_cast<int64_t>(kA + kB));  // at the limit, all free
  ASSERT_EQ(allocated(), static_cast<int64_t>(kA + kB));
  EXPECT_TRUE(pool.Fits(kC));  // by freeing B
  // A buffer of another size in use elsewhere is returning: not worth waiting for.
  pool.StartReturning(kA + kB);
  OwnedBuffer c = Acquire(pool, memory, kC);
  ASSERT_TRUE(c);
  EXPECT_EQ(pool.held_bytes(), static_cast<int64_t>(kA + kC));  // B freed, A kept
  EXPECT_EQ(pool.free_bytes(), static_cast<int64_t>(kA));
  EXPECT_EQ(allocated(), static_cast<int64_t>(kA + kC));
  MemorySnapshot snap = memory.Snapshot();
  EXPECT_EQ(snap.pool_over_limit, 0);
  EXPECT_EQ(snap.pool_waits, 0);
  EXPECT_LE(pool.peak_held_bytes(), static_cast<int64_t>(kA + kB));
  pool.EndReturning(kA + kB);
  // A is still pooled: taken without an allocation.
  const int64_t before = memory.Snapshot().allocations;
  absl::StatusOr<OwnedBuffer> again = pool.Acquire(kA, absl::Milliseconds(300));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again);
  EXPECT_EQ(memory.Snapshot().allocations, before);
  // Nothing free and nothing returning: growing past the limit is still what happens.
  EXPECT_FALSE(pool.Fits(kB));
  OwnedBuffer b2 = Acquire(pool, memory, kB);
  EXPECT_EQ(memory.Snapshot().pool_over_limit, 1);
  EXPECT_EQ(pool.held_bytes(), static_cast<int64_t>(kA + kB + kC));
}

// Two reducers share a pool (limit: every bucket's storage once). The first is destroyed inside
// a no_sync window, holding every bucket's storage: that storage is freed and leaves the pool's
// held bytes, so the second takes its own within the limit (before, the pool still counted the
// freed storage and grew past its limit), and reduces as the serial average.
TEST(PoolLimit, AReducerDestroyedHoldingStorageLeavesTheSharedPool) {
  RunRanks(2, [&](Group& world) {
    const int64_t bucket = static_cast<int64_t>(AlignedStorageBytes(kCount * sizeof(float)));
    const int64_t limit = kParams * bucket;
    MemoryStats memory;
    auto pool = std::make_shared<BufferPool>(BufferPool::Options{limit, &memory});
    const auto pooled = [&] {
      return memory.Snapshot().by_use[static_cast<int>(MemoryUse::kGradBuckets)].current;
    };
    std::vector<float> g(kCount);
    {
      auto first = GradientReducer::Create(Params(), {&world, nullptr}, Config(pool, &memory));
      ASSERT_TRUE(first.ok()) << first.status();
      ASSERT_OK((*first)->BeginBackward(SyncMode::kNoSync));
      for (int i = 0; i < kParams; ++i) {
        for (size_t j = 0; j < kCount; ++j) g[j] = GradValue(world.rank(), i, j, 7);
        ASSERT_OK((*first)->MarkReady(i, DeviceEvent{}, g.data()));
      }
      ASSERT_OK((*first)->FinishBackward());
      ASSERT_EQ(pool->held_bytes(), limit);  // every bucket's storage, kept for the window
      ASSERT_EQ(pooled(), limit);
    }
    EXPECT_EQ(pool->held_bytes(), 0);
    EXPECT_EQ(pooled(), 0);
    auto second = GradientReducer::Create(Params(), {&world, nullptr}, Config(pool, &memory));
    ASSERT_TRUE(second.ok()) << second.status();
    GradientReducer& rd = **second;
    ASSERT_OK(rd.BeginBackward(SyncMode::kSync));
    for (int i = 0; i < kParams; ++i) {
      for (size_t j = 0; j < kCount; ++j) g[j] = GradValue(world.rank(), i, j, 0);
      ASSERT_OK(rd.MarkReady(i, DeviceEvent{}, g.data()));
    }
    ASSERT_OK(rd.FinishBackward());
    EXPECT_EQ(memory.Snapshot().pool_over_limit, 0);
    EXPECT_LE(pool->peak_held_bytes(), limit);
    EXPECT_EQ(pool->held_bytes(), pooled());
    const BucketPlan& plan = rd.plan();
    for (int b = 0; b < kParams; ++b) {
      const int i = plan.buckets()[b].params[0];
      const size_t offset = plan.slot(i).offset;
      const TensorView v = rd.ShardView(b);
      const float* f = static_cast<const float*>(v.data);
      for (size_t e = 0; e < v.count; ++e) {
        const size_t at = world.rank() * v.count + e;
        if (at < offset || at >= offset + kCount) continue;  // gaps, padding
        const float want = (GradValue(0, i, at - offset, 0) + GradValue(1, i, at - offset, 0)) / 2;
        ASSERT_EQ(f[e], want) << "bucket " << b << " element " << at - offset;
      }
    }
  });
}

TEST(PoolLimit, ALimitBelowOneBucketIsRefused) {
  RunRanks(2, [&](Group& world) {
    ReducerConfig cfg = Config(nullptr, nullptr);
    cfg.pool_limit_bytes = 100;
    auto red = GradientReducer::Create(Params(), {&world, nullptr}, cfg);
    ExpectError(red.status(), absl::StatusCode::kInvalidArgument,
                {"pool_limit_bytes 100", "bucket 0"});
    ReducerConfig full = Config(nullptr, nullptr);
    full.shard_gradients = false;
    full.pool_limit_bytes = 1 << 20;
    ExpectError(GradientReducer::Create(Params(), {&world, nullptr}, full).status(),
                absl::StatusCode::kInvalidArgument, {"pool_limit_bytes", "shard_gradients"});
  });
}

// At the limit, a returning buffer of the size wanted (a launched reduction's storage) is
// waited for and reused instead of freeing free buffers of other sizes to allocate one more:
// no allocation, the other sizes stay pooled; Fits says so (a prefetch is deferred).
TEST(PoolLimit, AReturningBufferOfTheSizeIsReusedNotReallocated) {
  constexpr size_t kA = 4096, kB = 8192;
  MemoryStats memory;
  BufferPool pool(BufferPool::Options{static_cast<int64_t>(kA + kB), &memory});
  OwnedBuffer a = Acquire(pool, memory, kA), b = Acquire(pool, memory, kB);
  ASSERT_TRUE(a && b);
  char* const a_at = a.get();
  pool.Give(std::move(b), kB);  // free, evictable
  pool.StartReturning(kA);      // `a` comes back on its own
  EXPECT_FALSE(pool.Fits(kA));  // would wait for `a`, not free B
  const int64_t allocations = memory.Snapshot().allocations;
  std::thread back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pool.Give(std::move(a), kA, /*returning=*/true);
  });
  absl::StatusOr<OwnedBuffer> got = pool.Acquire(kA, absl::Seconds(5));
  back.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->get(), a_at);  // the returned buffer itself
  EXPECT_EQ(memory.Snapshot().allocations, allocations);
  EXPECT_EQ(pool.free_bytes(), static_cast<int64_t>(kB));  // B was not freed
  EXPECT_EQ(pool.held_bytes(), static_cast<int64_t>(kA + kB));
  EXPECT_EQ(memory.Snapshot().pool_over_limit, 0);
  EXPECT_EQ(memory.Snapshot().pool_waits, 1);
}

}  // namespace
}  // namespace braid::sched
