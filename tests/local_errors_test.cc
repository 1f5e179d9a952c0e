// Bad input, broken rank-order contracts, splits, and injected faults on the `local` backend:
// each returns an error that names the problem; nothing hangs.
#include <sanitizer/asan_interface.h>

#include <atomic>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "gtest/gtest.h"
#include "tests/collective_check.h"
#include "tests/multirank.h"

namespace braid::testing {
namespace {

TEST(LocalErrors, NullBuffersWithNonzeroCount) {
  RunRanks(2, [](Group& g) {
    float buf[4] = {};
    ExpectError(g.AllReduce(nullptr, buf, 4, DType::kF32, ReduceOp::Sum()).status(),
                absl::StatusCode::kInvalidArgument, {"allreduce", "send buffer is null", "4"});
    ExpectError(g.ReduceScatter(buf, nullptr, 2, DType::kF32, ReduceOp::Sum()).status(),
                absl::StatusCode::kInvalidArgument, {"reduce_scatter", "recv buffer is null"});
    ExpectError(g.AllGather(nullptr, buf, 2, DType::kF32).status(),
                absl::StatusCode::kInvalidArgument, {"allgather", "send buffer is null"});
    ExpectError(g.Broadcast(nullptr, 3, DType::kF32, 0).status(),
                absl::StatusCode::kInvalidArgument, {"broadcast"});
    // Zero elements with null buffers is a valid no-op collective.
    auto w = g.AllReduce(nullptr, nullptr, 0, DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_OK((*w)->Wait(absl::Seconds(10)));
  });
}

TEST(LocalErrors, DTypeOpCombinationsThatMakeNoSense) {
  RunRanks(1, [](Group& g) {
    int32_t i[2] = {};
    ExpectError(g.AllReduce(i, i, 2, DType::kI32, ReduceOp::Avg()).status(),
                absl::StatusCode::kInvalidArgument, {"avg", "i32"});
    uint8_t u[2] = {};
    ExpectError(g.ReduceScatter(u, u, 2, DType::kU8, ReduceOp::PreMulSum(0.5)).status(),
                absl::StatusCode::kInvalidArgument, {"premul_sum", "u8"});
    float f[2] = {};
    ExpectError(g.AllReduce(f, f, 2, DType::kF32, ReduceOp::PreMulSum(INFINITY)).status(),
                absl::StatusCode::kInvalidArgument, {"finite"});
    ExpectError(g.AllReduce(f, f, 2, static_cast<DType>(99), ReduceOp::Sum()).status(),
                absl::StatusCode::kInvalidArgument, {"dtype", "99"});
    ExpectError(g.AllReduce(f, f, 2, DType::kF32, ReduceOp{static_cast<ReduceKind>(9), 1}).status(),
                absl::StatusCode::kInvalidArgument, {"reduce op"});
  });
}

TEST(LocalErrors, BadRootAndOverlappingBuffers) {
  RunRanks(2, [](Group& g) {
    float buf[16] = {};
    ExpectError(g.Broadcast(buf, 4, DType::kF32, 2).status(), absl::StatusCode::kInvalidArgument,
                {"root 2", "size 2"});
    ExpectError(g.Broadcast(buf, 4, DType::kF32, -1).status(), absl::StatusCode::kInvalidArgument,
                {"root -1"});
    // Overlapping, but not NCCL's in-place form.
    ExpectError(g.AllReduce(buf, buf + 1, 4, DType::kF32, ReduceOp::Sum()).status(),
                absl::StatusCode::kInvalidArgument, {"overlap", "send == recv"});
    const int wrong = 1 - g.rank();  // the other rank's slot: overlaps, not in place
    ExpectError(g.ReduceScatter(buf, buf + wrong * 4, 4, DType::kF32, ReduceOp::Sum()).status(),
                absl::StatusCode::kInvalidArgument, {"recv == send + rank*recvcount"});
    ExpectError(g.AllGather(buf + wrong * 4, buf, 4, DType::kF32).status(),
                absl::StatusCode::kInvalidArgument, {"send == recv + rank*sendcount"});
  });
}

TEST(LocalErrors, ReduceScatterCountMismatchNamesEveryRanksCall) {
  RunRanks(3, [](Group& g) {
    std::vector<float> send(3 * 8, 1.0f), recv(8);
    const size_t count = g.rank() == 1 ? 7 : 8;  // rank 1 disagrees
    auto w = g.ReduceScatter(send.data(), recv.data(), count, DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(w.ok());
    absl::Status s = (*w)->Wait(absl::Seconds(30));
    ExpectError(
        s, absl::StatusCode::kInvalidArgument,
        {"reduce_scatter", "rank 1: reduce_scatter count=7", "rank 0: reduce_scatter count=8"});
    // A failed collective aborts the job (BRAID_ABORT_ON_FAILURE=1, the default): the next call
    // is refused with the cause.
    ExpectError(
        g.Barrier().status(), absl::StatusCode::kAborted,
        {"refuses new calls", "job aborted", "INVALID_ARGUMENT", "rank 1: reduce_scatter count=7"});
  });
}

TEST(LocalErrors, WithoutAbortOnFailureAMismatchLeavesTheGroupUsable) {
  Options o = LocalOptions(3);
  o.abort_on_failure = false;
  auto backend = CreateBackend(o);
  ASSERT_TRUE(backend.ok());
  RunRanks(**backend, [](Group& g) {
    std::vector<float> send(3 * 8, 1.0f), recv(8);
    const size_t count = g.rank() == 1 ? 7 : 8;
    auto w = g.ReduceScatter(send.data(), recv.data(), count, DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(w.ok());
    ExpectError((*w)->Wait(absl::Seconds(30)), absl::StatusCode::kInvalidArgument,
                {"rank 1: reduce_scatter count=7"});
    // Every rank saw the mismatch at the same point, so the group can go on.
    EXPECT_OK(RunAndCheck(
        g, CollectiveCase{CollectiveKind::kAllReduce, ReduceKind::kSum, DType::kF32, 10}));
  });
}

TEST(LocalErrors, DifferentCollectivesBreakTheContract) {
  RunRanks(2, [](Group& g) {
    float buf[4] = {1, 2, 3, 4};
    absl::StatusOr<WorkPtr> w = g.rank() == 0
                                    ? g.AllReduce(buf, buf, 4, DType::kF32, ReduceOp::Sum())
                                    : g.Broadcast(buf, 4, DType::kF32, 0);
    ASSERT_TRUE(w.ok());
    ExpectError((*w)->Wait(absl::Seconds(30)), absl::StatusCode::kInvalidArgument,
                {"rank-order contract", "rank 0: allreduce", "rank 1: broadcast"});
  });
}

TEST(LocalErrors, UnknownBackendAndBadWorlds) {
  Options o = LocalOptions(2);
  o.backend = "infiniband9000";
  auto b = CreateBackend(o);
  ExpectError(b.status(), absl::StatusCode::kNotFound, {"infiniband9000", "local"});
  o = LocalOptions(0);
  ExpectError(CreateBackend(o).status(), absl::StatusCode::kInvalidArgument, {"local_ranks"});
  auto ok = CreateBackend(LocalOptions(2));
  ASSERT_TRUE(ok.ok());
  ExpectError((*ok)->WorldGroup(5).status(), absl::StatusCode::kInvalidArgument, {"rank 5"});
  ASSERT_TRUE((*ok)->WorldGroup(0).ok());
  ExpectError((*ok)->WorldGroup(0).status(), absl::StatusCode::kFailedPrecondition,
              {"rank 0", "already"});
}

TEST(LocalSplit, MeshOfShardsAndReplicasComputesCorrectly) {
  // 8 ranks as 2 replicas x 4 shards: shard groups {0-3}, {4-7}; replica groups {0,4}, ...
  RunRanks(8, [](Group& world) {
    const int r = world.rank();
    auto shard = world.Split(r / 4, r, "shard");
    ASSERT_TRUE(shard.ok()) << shard.status();
    auto replica = world.Split(r % 4, r);
    ASSERT_TRUE(replica.ok()) << replica.status();
    ASSERT_NE(*shard, nullptr);
    EXPECT_EQ((*shard)->size(), 4);
    EXPECT_EQ((*shard)->rank(), r % 4);
    EXPECT_EQ((*shard)->name(), "shard");
    EXPECT_EQ((*replica)->size(), 2);
    EXPECT_EQ((*replica)->rank(), r / 4);
    EXPECT_EQ((*replica)->name(), absl::StrCat("world/", r % 4));
    // HSDP shape: reduce-scatter in the shard group, then all-reduce in the replica group,
    // with both groups' collectives in flight at once.
    EXPECT_OK(RunAndCheck(**shard, CollectiveCase{CollectiveKind::kReduceScatter, ReduceKind::kAvg,
                                                  DType::kBF16, 1001}));
    EXPECT_OK(RunAndCheck(
        **replica, CollectiveCase{CollectiveKind::kAllReduce, ReduceKind::kSum, DType::kF32, 333}));
    EXPECT_OK(RunAndCheck(
        world, CollectiveCase{CollectiveKind::kAllGather, ReduceKind::kSum, DType::kI64, 5}));
  });
}

TEST(LocalSplit, KeyReordersRanksAndNoColorGivesNoGroup) {
  RunRanks(4, [](Group& world) {
    const int r = world.rank();
    // Rank 3 opts out; the others are reversed by key.
    auto child = world.Split(r == 3 ? kNoColor : 0, -r);
    ASSERT_TRUE(child.ok()) << child.status();
    if (r == 3) {
      EXPECT_EQ(*child, nullptr);
      return;
    }
    ASSERT_NE(*child, nullptr);
    EXPECT_EQ((*child)->size(), 3);
    EXPECT_EQ((*child)->rank(), 2 - r);
    int32_t mine = 100 + r, all[3] = {};
    auto w = (*child)->AllGather(&mine, all, 1, DType::kI32);
    ASSERT_TRUE(w.ok());
    ASSERT_OK((*w)->Wait(absl::Seconds(30)));
    EXPECT_EQ(all[0], 102);
    EXPECT_EQ(all[1], 101);
    EXPECT_EQ(all[2], 100);
  });
}

TEST(LocalSplit, InvalidColorIsAnErrorOnEveryRankNamingTheRank) {
  RunRanks(3, [](Group& world) {
    auto child = world.Split(world.rank() == 2 ? -7 : 0, 0);
    ExpectError(child.status(), absl::StatusCode::kInvalidArgument, {"rank 2", "color -7"});
  });
}

TEST(LocalFaults, FailedRankIsNamedOnEveryOtherRankAndGroupFailsFast) {
  auto backend = CreateBackend(LocalOptions(4));
  ASSERT_TRUE(backend.ok());
  auto* local = static_cast<local::LocalBackend*>(backend->get());
  local->faults().FailRank(2, /*seq=*/1, "", "simulated NIC loss");
  RunRanks(**backend, [](Group& g) {
    EXPECT_OK(RunAndCheck(g, CollectiveCase{CollectiveKind::kAllReduce, ReduceKind::kSum,
                                            DType::kF32, 64}));  // seq 0 is fine
    float buf[64] = {};
    // seq 1: rank 2 fails. A rank that calls after the job aborted is refused at the call.
    auto w = g.AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum());
    absl::Status s = w.ok() ? (*w)->Wait(absl::Seconds(30)) : w.status();
    ExpectError(s, w.ok() ? absl::StatusCode::kInternal : absl::StatusCode::kAborted,
                {"rank 2 failed", "simulated NIC loss", "#1"});
    // Later collectives fail fast with the same cause instead of hanging.
    auto w2 = g.Barrier();
    ASSERT_FALSE(w2.ok());
    ExpectError(w2.status(), absl::StatusCode::kAborted,
                {"refuses new calls", "rank 2 failed", "simulated NIC loss"});
  });
}

TEST(LocalFaults, StalledRankIsNamedWhenTheDeadlinePasses) {
  auto backend = CreateBackend(LocalOptions(3, absl::Milliseconds(300)));
  ASSERT_TRUE(backend.ok());
  static_cast<local::LocalBackend*>(backend->get())->faults().StallRank(1, 0, absl::Seconds(30));
  const absl::Time start = absl::Now();
  RunRanks(**backend, [](Group& g) {
    float buf[8] = {};
    CollectiveOptions opts;
    opts.label = "bucket 0";
    auto w = g.AllReduce(buf, buf, 8, DType::kF32, ReduceOp::Sum(), opts);
    ASSERT_TRUE(w.ok());
    absl::Status s = (*w)->Wait(absl::Seconds(30));
    if (g.rank() != 1) {
      ExpectError(s, absl::StatusCode::kDeadlineExceeded,
                  {"rank(s) 1 did not arrive", "allreduce #0", "'world'", "bucket 0"});
    } else {
      EXPECT_FALSE(s.ok());  // the stalled rank wakes to a failed group, not a hang
    }
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // nowhere near the 30 s stall
}

TEST(LocalFaults, PerCallTimeoutOverridesTheGroupDefault) {
  RunRanks(2, [](Group& g) {
    if (g.rank() == 1) return;  // rank 1 never joins
    CollectiveOptions opts;
    opts.timeout = absl::Milliseconds(50);
    auto w = g.Barrier(opts);
    ASSERT_TRUE(w.ok());
    absl::Status s = (*w)->Wait(absl::Seconds(20));
    ExpectError(s, absl::StatusCode::kDeadlineExceeded, {"rank(s) 1"});
  });
}

TEST(LocalFaults, DestroyingAGroupWithWorkInFlightReleasesPeers) {
  auto backend = CreateBackend(LocalOptions(2));
  ASSERT_TRUE(backend.ok());
  auto g0 = (*backend)->WorldGroup(0);
  auto g1 = (*backend)->WorldGroup(1);
  ASSERT_TRUE(g0.ok() && g1.ok());
  float buf[4] = {};
  auto w = (*g0)->AllReduce(buf, buf, 4, DType::kF32, ReduceOp::Sum());
  ASSERT_TRUE(w.ok());
  g1->reset();  // rank 1 leaves without joining
  ExpectError((*w)->Wait(absl::Seconds(20)), absl::StatusCode::kCancelled,
              {"rank 1 destroyed its handle of group 'world'"});
  g0->reset();
}

// A Work that fails (here: a per-call deadline shorter than the data phase of a large
// all-reduce) must not complete while peers can still write into its buffers: the caller may
// reuse them as soon as Wait() returns.
TEST(LocalFaults, NoPeerWritesIntoABufferAfterItsWorkCompleted) {
  RunRanks(4, [](Group& g) {
    const size_t n = size_t{64} << 20 >> 2;  // 64 MiB of f32
    std::vector<float> send(n, 1.0f), recv(n, 0.0f);
    auto sync = g.Barrier();
    ASSERT_TRUE(sync.ok());
    ASSERT_OK((*sync)->Wait(absl::Seconds(30)));  // start together
    CollectiveOptions opts;
    opts.timeout = absl::Milliseconds(5);  // shorter than the data phase
    auto w = g.AllReduce(send.data(), recv.data(), n, DType::kF32, ReduceOp::Sum(), opts);
    if (!w.ok()) {  // a peer's 5 ms passed before this rank called (a loaded machine): refused
      ExpectError(w.status(), absl::StatusCode::kAborted, {"refuses new calls"});
      return;
    }
    (void)(*w)->Wait(absl::Seconds(60));  // fails or succeeds: either way it is over
    ASSERT_TRUE((*w)->Done());
    std::fill(recv.begin(), recv.end(), -7.0f);
    absl::SleepFor(absl::Milliseconds(300));
    size_t changed = 0;
    for (float x : recv) changed += x != -7.0f;
    EXPECT_EQ(changed, 0u) << "elements written by peers after the Work completed";
  });
}

// Fuzz finding 9 (docs/hardening.md): a rank whose Work failed at its deadline waited only a
// bounded time for a peer still inside the collective, then completed; its caller freed the
// buffers and the peer, descheduled between the rendezvous and its copy, read them. Here rank
// 1 stalls 1 s after the rendezvous, past rank 0's 100 ms deadline plus the 100 ms world
// timeout that bounded the wait. Rank 0's Work must complete only once rank 1 is out: from
// the moment its Wait returns, its buffers are poisoned (ASan reports any later access, as
// after a free) and must not change. Both ranks fail; neither reports a result.
TEST(LocalFaults, AFailedWorkCompletesOnlyAfterAPeerMidCopyLeft) {
  auto backend = CreateBackend(LocalOptions(2, absl::Milliseconds(100)));
  ASSERT_TRUE(backend.ok());
  static_cast<local::LocalBackend*>(backend->get())
      ->faults()
      .StallRankInCopy(1, /*seq=*/1, absl::Seconds(1), "world");
  std::atomic<bool> rank1_done{false};
  RunRanks(**backend, [&](Group& g) {
    constexpr size_t kCount = 64;  // f32: rank 1 reduces chunk [32, 64) into both outputs
    std::vector<float> send(kCount, 1.0f + g.rank()), recv(kCount, 0.0f);
    CollectiveOptions start;
    start.timeout = absl::Seconds(30);
    auto sync = g.Barrier(start);  // seq 0: both ranks ready
    ASSERT_TRUE(sync.ok());
    ASSERT_OK((*sync)->Wait(absl::Seconds(30)));
    CollectiveOptions opts;
    opts.timeout = absl::Milliseconds(100);
    auto w = g.AllReduce(send.data(), recv.data(), kCount, DType::kF32, ReduceOp::Sum(), opts);
    ASSERT_TRUE(w.ok());
    const absl::Status s = (*w)->Wait(absl::Seconds(30));
    ExpectError(s, absl::StatusCode::kDeadlineExceeded,
                {"allreduce #1", "rank(s) 1 did not arrive before the deadline"});
    if (g.rank() == 1) {
      rank1_done = true;
      return;
    }
    const std::vector<float> seen = recv;
    ASAN_POISON_MEMORY_REGION(send.data(), kCount * sizeof(float));
    ASAN_POISON_MEMORY_REGION(recv.data(), kCount * sizeof(float));
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while (!rank1_done && absl::Now() < end) absl::SleepFor(absl::Milliseconds(1));
    ASAN_UNPOISON_MEMORY_REGION(send.data(), kCount * sizeof(float));
    ASAN_UNPOISON_MEMORY_REGION(recv.data(), kCount * sizeof(float));
    EXPECT_TRUE(rank1_done);
    size_t changed = 0;
    for (size_t i = 0; i < kCount; ++i) changed += recv[i] != seen[i];
    EXPECT_EQ(changed, 0u) << "elements rank 1 wrote into rank 0's output after its Work completed";
  });
}

}  // namespace
}  // namespace braid::testing
