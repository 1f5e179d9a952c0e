// The nccl backend's stream / event / future logic on fakes: readiness waits, the completion
// event, coalesced buckets, pre-mul-sum op life cycles, the nonblocking state machine, Split,
// event retirement. Each test checks results against a host computation, the order of CUDA
// and NCCL calls where it matters, and that nothing leaked (ExpectClean).
#include <algorithm>
#include <atomic>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/nccl/unique_id.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl::testing {
namespace {

using braid::testing::ExpectError;

constexpr absl::Duration kWait = absl::Seconds(30);

// Index of the first log line containing `what` at or after `from` (npos if none).
size_t Find(const std::vector<std::string>& log, const std::string& what, size_t from = 0) {
  for (size_t i = from; i < log.size(); ++i) {
    if (log[i].find(what) != std::string::npos) return i;
  }
  return std::string::npos;
}

TEST(NcclGroup, CapabilitiesAndIdentity) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& g) {
    EXPECT_EQ(g.backend_name(), "nccl");
    EXPECT_EQ(g.name(), "world");
    EXPECT_EQ(g.size(), 2);
    const Capabilities c = g.capabilities();
    EXPECT_TRUE(c.device_memory);
    EXPECT_FALSE(c.host_memory);
    EXPECT_TRUE(c.device_events);
    EXPECT_TRUE(c.native_avg);
    EXPECT_TRUE(c.native_premul_sum);
    EXPECT_TRUE(g.stream());
  });
  ExpectClean(gpu);
}

// The comm stream waits on the producer's event; the collective reads what the producer wrote
// only after it ran, and the host never blocked on it.
TEST(NcclGroup, WaitsOnReadyEventBeforeReading) {
  FakeGpu gpu;
  std::atomic<bool> release{false};
  std::atomic<int> checked{0};
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& g) {
    cudaStream_t producer;
    ASSERT_EQ(gpu.cuda->StreamCreate(&producer), cudaSuccess);
    cudaEvent_t ready;
    ASSERT_EQ(gpu.cuda->EventCreate(&ready), cudaSuccess);
    std::vector<float> buf(8, -1.0f);
    const float mine = static_cast<float>(g.rank() + 1);
    {
      // A "kernel" that writes the gradient once released.
      std::lock_guard<std::mutex> lock(gpu.cuda->mu());
      gpu.cuda->EnqueueLocked(producer, [&, mine] {
        if (!release.load()) return false;
        std::fill(buf.begin(), buf.end(), mine);
        return true;
      });
    }
    ASSERT_EQ(gpu.cuda->EventRecord(ready, producer), cudaSuccess);
    CollectiveOptions opts;
    opts.ready_event = DeviceEvent{ready};
    opts.label = "bucket 0";
    auto w = g.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum(), opts);
    ASSERT_TRUE(w.ok()) << w.status();
    // Launch returned although the producer has not run: the host did not block.
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_FALSE((*w)->Done());
    ++checked;
    if (g.rank() == 0) {
      const absl::Time deadline = absl::Now() + kWait;
      while (checked.load() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
      release = true;
    }
    ASSERT_OK((*w)->Wait(kWait));
    for (float v : buf) EXPECT_EQ(v, 3.0f);  // 1 + 2: the producer's values, not -1
    ASSERT_EQ(gpu.cuda->EventDestroy(ready), cudaSuccess);
    ASSERT_EQ(gpu.cuda->StreamDestroy(producer), cudaSuccess);
  });
  EXPECT_EQ(gpu.cuda->stream_wait_calls(), 2);
  // On each rank: StreamWaitEvent(comm stream, ready), then the call, then the completion record.
  const std::vector<std::string> log = gpu.cuda->log();
  const size_t wait = Find(log, "StreamWaitEvent");
  ASSERT_NE(wait, std::string::npos);
  EXPECT_NE(Find(log, "AllReduce", wait), std::string::npos) << absl::StrJoin(log, "\n");
  ExpectClean(gpu);
}

// Work::device_event() is an event recorded after ncclGroupEnd on the comm stream: a consumer
// stream that waits on it runs after the collective.
TEST(NcclGroup, CompletionEventOrdersConsumers) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& g) {
    std::vector<int32_t> buf(5, g.rank() + 10);
    auto w = g.AllReduce(buf.data(), buf.data(), buf.size(), DType::kI32, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status();
    const DeviceEvent done = (*w)->device_event();
    ASSERT_TRUE(done);
    cudaStream_t consumer;
    ASSERT_EQ(gpu.cuda->StreamCreate(&consumer), cudaSuccess);
    ASSERT_EQ(gpu.cuda->StreamWaitEvent(consumer, static_cast<cudaEvent_t>(done.handle)),
              cudaSuccess);
    std::vector<int32_t> seen;
    {
      std::lock_guard<std::mutex> lock(gpu.cuda->mu());
      gpu.cuda->EnqueueLocked(consumer, [&] {
        seen = buf;
        return true;
      });
    }
    cudaEvent_t consumed;
    ASSERT_EQ(gpu.cuda->EventCreate(&consumed), cudaSuccess);
    ASSERT_EQ(gpu.cuda->EventRecord(consumed, consumer), cudaSuccess);
    ASSERT_OK((*w)->Wait(kWait));
    const absl::Time deadline = absl::Now() + kWait;
    while (gpu.cuda->EventQuery(consumed) != cudaSuccess && absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(100));
    }
    EXPECT_EQ(seen, std::vector<int32_t>(5, 21));
    EXPECT_EQ(gpu.cuda->EventQuery(static_cast<cudaEvent_t>(done.handle)), cudaSuccess);
    ASSERT_EQ(gpu.cuda->EventDestroy(consumed), cudaSuccess);
    ASSERT_EQ(gpu.cuda->StreamDestroy(consumer), cudaSuccess);
  });
  const std::vector<std::string> log = gpu.cuda->log();
  const size_t end = Find(log, "GroupEnd");
  ASSERT_NE(end, std::string::npos);
  EXPECT_NE(Find(log, "EventRecord", end), std::string::npos) << absl::StrJoin(log, "\n");
  ExpectClean(gpu);
}

// UseStream: the group's collectives and buffer operations go on the caller's stream (a
// framework's prefetch stream) and back on the group's own once it is cleared.
TEST(NcclGroup, UseStreamQueuesOnTheCallersStream) {
  FakeGpu gpu;
  std::vector<std::string> names(2), own(2);
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& g) {
    cudaStream_t prefetch;
    ASSERT_EQ(gpu.cuda->StreamCreate(&prefetch), cudaSuccess);
    {
      std::lock_guard<std::mutex> lock(gpu.cuda->mu());
      names[g.rank()] = gpu.cuda->Name(prefetch);
      own[g.rank()] = gpu.cuda->Name(static_cast<cudaStream_t>(g.stream().handle));
    }
    ASSERT_OK(g.UseStream(DeviceStream{prefetch}));
    EXPECT_EQ(g.stream().handle, prefetch);
    EXPECT_EQ(g.buffer_ops().stream().handle, prefetch);
    std::vector<float> buf(8, 0.0f);
    std::fill(buf.begin() + 4 * g.rank(), buf.begin() + 4 * g.rank() + 4, g.rank() + 1.0f);
    std::vector<float> scratch(4, 1.0f);
    ASSERT_OK(g.buffer_ops().Zero(scratch.data(), sizeof(float) * scratch.size()));
    auto w = g.AllGather(buf.data() + 4 * g.rank(), buf.data(), 4, DType::kF32);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(kWait));
    EXPECT_EQ(buf, (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2}));
    EXPECT_EQ(scratch, std::vector<float>(4, 0.0f));  // ran before the gather on the same stream
    ASSERT_OK(g.UseStream(DeviceStream{}));
    EXPECT_NE(g.stream().handle, prefetch);
    auto w2 = g.AllGather(buf.data() + 4 * g.rank(), buf.data(), 4, DType::kF32);
    ASSERT_TRUE(w2.ok()) << w2.status();
    ASSERT_OK((*w2)->Wait(kWait));
    ASSERT_EQ(gpu.cuda->StreamDestroy(prefetch), cudaSuccess);
  });
  const std::vector<std::string> log = gpu.cuda->log();
  // Each rank's first gather ran on its prefetch stream, the second on its own stream.
  // The memset (buffer ops) and the completion events went there too.
  int on_prefetch = 0, on_own = 0, memsets = 0, records = 0;
  for (const std::string& line : log) {
    for (int r = 0; r < 2; ++r) {
      const bool prefetch = line.find("," + names[r] + ")") != std::string::npos;
      if (line.rfind("AllGather(", 0) == 0 && prefetch) ++on_prefetch;
      if (line.rfind("AllGather(", 0) == 0 && line.find("," + own[r] + ")") != std::string::npos)
        ++on_own;
      if (line.rfind("MemsetAsync(", 0) == 0 && prefetch) ++memsets;
      if (line.rfind("EventRecord(", 0) == 0 && prefetch) ++records;
    }
  }
  EXPECT_EQ(memsets, 2) << absl::StrJoin(log, "\n");
  EXPECT_GE(records, 2) << absl::StrJoin(log, "\n");
  EXPECT_EQ(on_prefetch, 2) << absl::StrJoin(log, "\n");
  EXPECT_EQ(on_own, 2) << absl::StrJoin(log, "\n");
  ExpectClean(gpu);
}

// A bucket of reduce-scatters in one ncclGroupStart/End, one completion event for all.
TEST(NcclGroup, CoalescedBucketIsOneGroupBracket) {
  FakeGpu gpu;
  constexpr int kRanks = 3;
  constexpr size_t kShard = 7;
  RunFakeRanks(gpu, kRanks, FakeConfig(), [&](NcclGroup& g) {
    std::vector<std::vector<float>> send(3, std::vector<float>(kRanks * kShard));
    std::vector<std::vector<float>> recv(3, std::vector<float>(kShard, -1.0f));
    for (int t = 0; t < 3; ++t) {
      for (size_t i = 0; i < send[t].size(); ++i) {
        send[t][i] = static_cast<float>(t * 1000 + g.rank() * 100 + static_cast<int>(i));
      }
    }
    ASSERT_OK(g.StartCoalescing());
    ExpectError(g.StartCoalescing(), absl::StatusCode::kFailedPrecondition,
                {"world", "already coalescing"});
    std::vector<WorkPtr> members;
    for (int t = 0; t < 3; ++t) {
      CollectiveOptions o;
      o.label = "param";
      const ReduceOp op = t == 2 ? ReduceOp::PreMulSum(0.5) : ReduceOp::Sum();
      auto w = g.ReduceScatter(send[t].data(), recv[t].data(), kShard, DType::kF32, op, o);
      ASSERT_TRUE(w.ok()) << w.status();
      members.push_back(*w);
    }
    ExpectError(g.Barrier().status(), absl::StatusCode::kInvalidArgument,
                {"barrier", "world", "coalescing"});
    auto bucket = g.EndCoalescing("bucket 2");
    ASSERT_TRUE(bucket.ok()) << bucket.status();
    ASSERT_OK((*bucket)->Wait(kWait));
    EXPECT_NE((*bucket)->info().op.find("coalesced(3 calls)"), std::string::npos);
    EXPECT_EQ((*bucket)->info().label, "bucket 2");
    for (int t = 0; t < 3; ++t) {
      ASSERT_OK(members[t]->Wait(kWait));
      EXPECT_EQ(members[t]->device_event().handle, (*bucket)->device_event().handle);
      EXPECT_EQ(members[t]->info().seq, static_cast<uint64_t>(t));
      for (size_t i = 0; i < kShard; ++i) {
        float want = 0;
        for (int r = 0; r < kRanks; ++r) {
          want += (t == 2 ? 0.5f : 1.0f) *
                  static_cast<float>(t * 1000 + r * 100 + g.rank() * static_cast<int>(kShard) +
                                     static_cast<int>(i));
        }
        EXPECT_EQ(recv[t][i], want) << "tensor " << t << " element " << i;
      }
    }
    ExpectError(g.EndCoalescing().status(), absl::StatusCode::kFailedPrecondition,
                {"EndCoalescing", "world", "without StartCoalescing"});
    // An empty bucket completes at once and consumes no sequence number.
    ASSERT_OK(g.StartCoalescing());
    auto empty = g.EndCoalescing();
    ASSERT_TRUE(empty.ok());
    EXPECT_TRUE((*empty)->Done());
  });
  EXPECT_EQ(gpu.nccl->group_ends(), kRanks);
  for (int n : gpu.nccl->ops_per_group()) EXPECT_EQ(n, 3);
  EXPECT_EQ(gpu.nccl->premul_created(), kRanks);
  EXPECT_EQ(gpu.nccl->premul_destroyed(), kRanks);
  ExpectClean(gpu);
}

// Pre-mul-sum: one op per launch, with this rank's scalar in the data type, destroyed right
// after ncclGroupEnd returned and before the completion event is recorded.
TEST(NcclGroup, PreMulSumOpCreatedPerLaunchAndDestroyed) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& g) {
    std::vector<uint16_t> bf(4, 0x3f80);  // bf16 1.0
    const double scalar = g.rank() == 0 ? 0.1 : 0.25;
    auto w =
        g.AllReduce(bf.data(), bf.data(), bf.size(), DType::kBF16, ReduceOp::PreMulSum(scalar));
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(kWait));
    // bf16(0.1) = 0.10009765625, plus 0.25 -> 0.35009765625 -> bf16 0.349609375 (0x3eb3)
    for (uint16_t v : bf) EXPECT_EQ(v, 0x3eb3) << std::hex << v;
  });
  EXPECT_EQ(gpu.nccl->premul_created(), 2);
  EXPECT_EQ(gpu.nccl->premul_destroyed(), 2);
  std::vector<double> scalars = gpu.nccl->premul_scalars();
  std::sort(scalars.begin(), scalars.end());
  EXPECT_EQ(scalars, (std::vector<double>{0.10009765625, 0.25}));  // bf16-rounded, as NCCL reads
  const std::vector<std::string> log = gpu.cuda->log();
  const size_t create = Find(log, "RedOpCreatePreMulSum");
  const size_t end = Find(log, "GroupEnd", create);
  const size_t destroy = Find(log, "RedOpDestroy", end);
  const size_t record = Find(log, "EventRecord", destroy);
  EXPECT_TRUE(create != std::string::npos && end != std::string::npos &&
              destroy != std::string::npos && record != std::string::npos)
      << absl::StrJoin(log, "\n");
  ExpectClean(gpu);
}

// Avg over one rank is the identity; the backend asks NCCL for a plain sum there.
TEST(NcclGroup, AvgAtWorldSizeOneIsIdentity) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 1, FakeConfig(), [&](NcclGroup& g) {
    std::vector<float> x = {1.5f, -2.0f, 3.25f};
    const std::vector<float> want = x;
    auto w = g.AllReduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::Avg());
    ASSERT_TRUE(w.ok());
    ASSERT_OK((*w)->Wait(kWait));
    EXPECT_EQ(x, want);
  });
  ExpectClean(gpu);
}

// Nonblocking communicators: init, collectives, split, barrier and finalize all go through
// ncclInProgress; the fake records any call made while in progress (ExpectClean checks none).
TEST(NcclGroup, NonblockingStateMachineNeverCallsWhileInProgress) {
  FakeGpu gpu;
  gpu.nccl->SetInProgressPolls(6);
  RunFakeRanks(gpu, 4, FakeConfig(/*blocking=*/false), [&](NcclGroup& g) {
    std::vector<double> x(33, g.rank() + 1.0);
    auto w = g.AllReduce(x.data(), x.data(), x.size(), DType::kF64, ReduceOp::PreMulSum(2.0));
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(kWait));
    for (double v : x) EXPECT_EQ(v, 20.0);
    auto half = g.Split(g.rank() % 2, g.rank(), "");
    ASSERT_TRUE(half.ok()) << half.status();
    ASSERT_NE(*half, nullptr);
    EXPECT_EQ((*half)->name(), "world/" + std::to_string(g.rank() % 2));
    auto b = (*half)->Barrier();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_OK((*b)->Wait(kWait));
    std::vector<float> y(3, static_cast<float>(g.rank()));
    auto w2 = (*half)->AllReduce(y.data(), y.data(), y.size(), DType::kF32, ReduceOp::Avg());
    ASSERT_TRUE(w2.ok()) << w2.status();
    ASSERT_OK((*w2)->Wait(kWait));
    for (float v : y) EXPECT_EQ(v, g.rank() % 2 == 0 ? 1.0f : 2.0f);  // avg(0,2), avg(1,3)
  });
  EXPECT_EQ(gpu.nccl->comms_created(), 8);
  EXPECT_EQ(gpu.nccl->comms_finalized(), 8);
  EXPECT_EQ(gpu.nccl->comms_aborted(), 0);
  ExpectClean(gpu);
}

// Split orders ranks by (key, old rank); kNoColor gives no group; a bad color fails on every
// rank, naming the rank, and leaves the parent usable.
TEST(NcclGroup, SplitByColorAndKey) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 4, FakeConfig(), [&](NcclGroup& g) {
    const int r = g.rank();
    auto rev = g.Split(0, -r, "reversed");
    ASSERT_TRUE(rev.ok()) << rev.status();
    EXPECT_EQ((*rev)->rank(), 3 - r);
    EXPECT_EQ((*rev)->size(), 4);
    EXPECT_EQ((*rev)->name(), "reversed");
    // Broadcast from the child's rank 0 (world rank 3).
    std::vector<int64_t> v(3, r);
    auto w = (*rev)->Broadcast(v.data(), v.size(), DType::kI64, 0);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(kWait));
    EXPECT_EQ(v, std::vector<int64_t>(3, 3));

    auto some = g.Split(r == 1 ? kNoColor : 7, r);
    ASSERT_TRUE(some.ok()) << some.status();
    if (r == 1) {
      EXPECT_EQ(*some, nullptr);
    } else {
      ASSERT_NE(*some, nullptr);
      EXPECT_EQ((*some)->size(), 3);
      EXPECT_EQ((*some)->name(), "world/7");
    }

    auto bad = g.Split(r == 2 ? -5 : 0, 0);
    ExpectError(bad.status(), absl::StatusCode::kInvalidArgument,
                {"split", "world", "rank 2 passed color -5"});
    std::vector<float> x(2, 1.0f);
    auto ok = g.AllReduce(x.data(), x.data(), 2, DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(ok.ok()) << ok.status();
    ASSERT_OK((*ok)->Wait(kWait));
    EXPECT_EQ(x[0], 4.0f);
  });
  ExpectClean(gpu);
}

// Completion events are the Works' device events: kept while a Work holds them, destroyed by
// the poller once every Work exposing them has been released.
TEST(NcclGroup, CompletionEventsRetireWhenWorksAreReleased) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 1, FakeConfig(), [&](NcclGroup& g) {
    std::vector<float> x(4, 1.0f);
    const int before = gpu.cuda->live_events();
    {
      auto w = g.AllReduce(x.data(), x.data(), 4, DType::kF32, ReduceOp::Sum());
      ASSERT_TRUE(w.ok());
      ASSERT_OK((*w)->Wait(kWait));
      absl::SleepFor(absl::Milliseconds(30));
      EXPECT_EQ(gpu.cuda->live_events(), before + 1);  // held: the Work is alive
      EXPECT_EQ(gpu.cuda->EventQuery(static_cast<cudaEvent_t>((*w)->device_event().handle)),
                cudaSuccess);
    }
    const absl::Time deadline = absl::Now() + kWait;
    while (gpu.cuda->live_events() != before && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(gpu.cuda->live_events(), before);
  });
  ExpectClean(gpu);
}

// The group may be dropped with work in flight: the work still completes (it holds the
// communicator and the stream), and the communicator is finalized after it.
TEST(NcclGroup, WorkOutlivesItsGroup) {
  FakeGpu gpu;
  std::atomic<int> arrived{0};
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& g) {
    // RunFakeRanks owns the group; emulate dropping it by using a split child we destroy.
    auto child = g.Split(0, g.rank());
    ASSERT_TRUE(child.ok()) << child.status();
    std::vector<float> x(16, 1.0f);
    WorkPtr w;
    {
      std::unique_ptr<Group> c = std::move(*child);
      if (g.rank() == 1) absl::SleepFor(absl::Milliseconds(20));  // rank 0 drops first
      auto launched = c->AllReduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::Sum());
      ASSERT_TRUE(launched.ok()) << launched.status();
      w = *launched;
      ++arrived;
    }
    ASSERT_OK(w->Wait(kWait));
    EXPECT_EQ(x[0], 2.0f);
  });
  EXPECT_EQ(arrived.load(), 2);
  EXPECT_EQ(gpu.nccl->comms_finalized(), 4);
  ExpectClean(gpu);
}

// Dropping the backend and the last group from a completion callback (which runs on the
// poller's own thread) releases the poller there: it must not join itself, and the thread must
// finish cleanly on its own, finalizing the communicator.
TEST(NcclGroup, LastReleaseFromACompletionCallback) {
  FakeGpu gpu;
  auto id = NewUniqueIdBytes(*gpu.nccl);
  ASSERT_TRUE(id.ok());
  auto backend = NcclBackend::CreateFromUniqueId(gpu.apis(), *id, 1, 0, FakeConfig());
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto world = (*backend)->WorldGroup(0);
  ASSERT_TRUE(world.ok()) << world.status();
  struct Holder {
    std::unique_ptr<NcclBackend> backend;
    std::unique_ptr<Group> world;
  };
  auto holder = std::make_shared<Holder>(Holder{std::move(*backend), std::move(*world)});
  std::vector<float> x(4, 1.0f);
  auto w = holder->world->AllReduce(x.data(), x.data(), 4, DType::kF32, ReduceOp::Sum());
  ASSERT_TRUE(w.ok()) << w.status();
  std::atomic<bool> released{false};
  (*w)->OnComplete([holder, &released](const absl::Status&) mutable {
    holder->world.reset();
    holder->backend.reset();
    released = true;
  });
  holder.reset();
  ASSERT_OK((*w)->Wait(kWait));
  const absl::Time deadline = absl::Now() + kWait;
  while ((!released.load() || gpu.nccl->live_comms() != 0 || gpu.cuda->live_events() != 0) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(released.load());
  EXPECT_EQ(gpu.nccl->comms_finalized(), 1);
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
