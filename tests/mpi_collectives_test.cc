// The `mpi` backend under mpirun (run by tests/run_mpi.sh with 2 and 4 processes): every
// collective kind x reduce op x dtype x size {0, 1, 37, 65536+13} x in-place/out-of-place,
// bit for bit against the serial reference of tests/collective_check.h (with exact data, so
// MPI's own reduction order cannot change a bit); Split (colors, keys, kNoColor, a bad
// color); errors (avg/premul on integers, a count mismatch caught by
// BRAID_VALIDATE_COLLECTIVES and one MPI itself reports without it, a call refused before it
// takes a turn, a missed deadline); and completion without polling (callbacks fire with
// nobody in Wait, several collectives in flight at once). With --host_init=serialized|multiple
// it checks instead how the backend joins an MPI the host initialized (RunHostInitCheck).
//
// Every process runs the same tests in the same order (do not shuffle or filter differently
// per rank): the rank-order contract applies to the test itself. Every call has a 60 s
// deadline and the launcher a wall-clock limit, so a rank that fails an assertion and skips
// a collective makes its peers fail, not hang.
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "comm/backend.h"
#include "gtest/gtest.h"
#include "tests/collective_check.h"
#include "tests/mpi_gtest.h"
#include "tests/multirank.h"

namespace braid::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

// The groups every test uses, created once in main().
struct Worlds {
  Group* world = nullptr;       // default options
  Group* validating = nullptr;  // validate_collectives = true
  std::string engine = "auto";  // --mpi_engine= (BRAID_MPI_ENGINE of both backends)
};
Worlds& TheWorlds() {
  static Worlds worlds;
  return worlds;
}
Group& World() { return *TheWorlds().world; }
Group& ValidatingWorld() { return *TheWorlds().validating; }

using Param = std::tuple<int /*kind index*/, DType, bool /*in_place*/>;

class MpiCollectives : public ::testing::TestWithParam<Param> {};

TEST_P(MpiCollectives, MatchesSerialReference) {
  const auto [ki, dtype, in_place] = GetParam();
  const CollectiveVariant k = kCollectiveVariants[ki];
  Group& g = World();
  if (const char* why = MatrixSkipReason(k, dtype, in_place)) GTEST_SKIP() << why;
  if (RefusedUpFront(k, dtype)) {
    // Rejected up front on every rank, naming op and dtype; nothing reaches MPI.
    const absl::Status s = LaunchStatus(g, k.kind, dtype, k.op);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), DTypeName(dtype))) << s;
    return;
  }
  uint64_t seed = 1;
  for (size_t count : kCheckSizes) {
    const int root = static_cast<int>(count % static_cast<size_t>(g.size()));
    CollectiveCase c{k.kind, k.op, dtype, count, in_place, /*exact_data=*/true, seed++, root};
    EXPECT_OK(RunAndCheck(g, c, kTimeout));
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [ki, dtype, in_place] = info.param;
  const CollectiveVariant k = kCollectiveVariants[ki];
  std::string s(CollectiveName(k.kind));
  if (Reduces(k.kind)) absl::StrAppend(&s, "_", ReduceKindName(k.op));
  absl::StrAppend(&s, "_", DTypeName(dtype), in_place ? "_inplace" : "");
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    All, MpiCollectives,
    ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCollectiveVariants))),
                       ::testing::ValuesIn(kAllDTypes), ::testing::Bool()),
    ParamName);

// With validation on, matching calls still give exact results (record exchange, then turn).
TEST(MpiValidated, MatchingCallsPass) {
  uint64_t seed = 100;
  for (const CollectiveVariant& k : kCollectiveVariants) {
    for (DType dtype : {DType::kBF16, DType::kF32, DType::kI32}) {
      if (Reduces(k.kind) && (k.op == ReduceKind::kAvg || k.op == ReduceKind::kPreMulSum) &&
          !IsFloating(dtype)) {
        continue;
      }
      CollectiveCase c{k.kind, k.op, dtype, 37, /*in_place=*/seed % 2 == 0, true, seed++, 0};
      EXPECT_OK(RunAndCheck(ValidatingWorld(), c, kTimeout));
    }
  }
}

// A reduce-scatter whose count differs on one rank fails on every rank, naming ranks and
// calls; the group stays usable afterwards.
TEST(MpiValidated, CountMismatchFailsOnEveryRank) {
  Group& g = ValidatingWorld();
  const size_t count = g.rank() == 0 ? 8 : 9;
  std::vector<float> send(static_cast<size_t>(g.size()) * 9, 1.0f);
  std::vector<float> recv(9, 0.0f);
  auto w = g.ReduceScatter(send.data(), recv.data(), count, DType::kF32, ReduceOp::Sum());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const absl::Status s = (*w)->Wait(kTimeout);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 0: reduce_scatter count=8")) << s.ToString();
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1: reduce_scatter count=9")) << s.ToString();
  EXPECT_TRUE(absl::StrContains(s.message(), "on group 'world'")) << s.ToString();
  // Nothing was issued on the data communicator: the next call matches normally.
  CollectiveCase c{
      CollectiveKind::kAllReduce, ReduceKind::kSum, DType::kF32, 37, false, true, 7, 0};
  EXPECT_OK(RunAndCheck(g, c, kTimeout));
}

// Different kinds of call (all-reduce on one rank, all-gather on the others) are caught too.
TEST(MpiValidated, KindMismatchFailsOnEveryRank) {
  Group& g = ValidatingWorld();
  std::vector<float> buf(static_cast<size_t>(g.size()) * 4, 1.0f);
  float* mine = buf.data() + static_cast<size_t>(g.rank()) * 4;  // in-place all-gather form
  auto w = g.rank() == 0 ? g.AllReduce(buf.data(), buf.data(), 4, DType::kF32, ReduceOp::Sum())
                         : g.AllGather(mine, buf.data(), 4, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const absl::Status s = (*w)->Wait(kTimeout);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 0: allreduce")) << s.ToString();
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1: allgather")) << s.ToString();
}

// Many collectives in flight at once on the validating group: records are exchanged at
// launch, data calls are issued by turn; all complete, correct, in any wait order.
TEST(MpiValidated, ManyInFlight) {
  Group& g = ValidatingWorld();
  constexpr int kOps = 20;
  std::vector<std::vector<int32_t>> bufs(kOps, std::vector<int32_t>(101));
  std::vector<WorkPtr> works;
  for (int i = 0; i < kOps; ++i) {
    std::iota(bufs[i].begin(), bufs[i].end(), i + g.rank());
    auto w =
        g.AllReduce(bufs[i].data(), bufs[i].data(), bufs[i].size(), DType::kI32, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    works.push_back(*w);
  }
  const int n = g.size();
  for (int i = kOps - 1; i >= 0; --i) {
    ASSERT_OK(works[i]->Wait(kTimeout));
    for (size_t j = 0; j < bufs[i].size(); ++j) {
      ASSERT_EQ(bufs[i][j], n * (i + static_cast<int>(j)) + n * (n - 1) / 2) << i << "," << j;
    }
  }
}

// A call the backend refuses after comm/group.cc accepted it (a count above INT_MAX is
// Unimplemented, refused before any buffer is read) claims no sequence number and no turn:
// on a validating group the next collective must not wait for a turn nobody will use. On a
// group of its own, so a regression fails this test alone.
TEST(MpiValidated, RefusedCallConsumesNoTurn) {
  Group& g = ValidatingWorld();
  auto child = g.Split(0, g.rank(), "world/refused");
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  Group& c = **child;
  uint8_t byte = 0;  // the in-place form needs a buffer; it is never read
  const size_t too_many = static_cast<size_t>(std::numeric_limits<int>::max()) + 1;
  auto refused = c.AllReduce(&byte, &byte, too_many, DType::kU8, ReduceOp::Sum());
  ASSERT_FALSE(refused.ok());
  const absl::Status& why = refused.status();
  EXPECT_EQ(why.code(), absl::StatusCode::kUnimplemented) << why.ToString();
  EXPECT_TRUE(absl::StrContains(why.message(), "allreduce #0 on group 'world/refused'"))
      << why.ToString();
  std::vector<float> buf(37, static_cast<float>(c.rank() + 1));
  CollectiveOptions opts;
  opts.timeout = absl::Seconds(20);  // without the fix, this call waits here for turn 1
  auto w = c.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum(), opts);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->info().seq, 0u);
  ASSERT_OK((*w)->Wait(kTimeout));
  const int n = c.size();
  EXPECT_EQ(buf[0], static_cast<float>(n * (n + 1) / 2));
  EXPECT_EQ(buf[36], static_cast<float>(n * (n + 1) / 2));
}

// Two collectives of different kinds in flight at once, waited in reverse order.
TEST(MpiAsync, TwoInFlightComplete) {
  Group& g = World();
  const int n = g.size();
  const size_t count = 65536 + 13;
  std::vector<float> a(count, static_cast<float>(g.rank() + 1));
  std::vector<float> rs_send(count * n, 2.0f);
  std::vector<float> rs_recv(count, 0.0f);
  auto wa = g.AllReduce(a.data(), a.data(), count, DType::kF32, ReduceOp::Sum());
  auto wb = g.ReduceScatter(rs_send.data(), rs_recv.data(), count, DType::kF32, ReduceOp::Avg());
  ASSERT_TRUE(wa.ok() && wb.ok());
  EXPECT_NE((*wa)->info().seq, (*wb)->info().seq);
  ASSERT_OK((*wb)->Wait(kTimeout));
  ASSERT_OK((*wa)->Wait(kTimeout));
  EXPECT_EQ(a[0], static_cast<float>(n * (n + 1) / 2));
  EXPECT_EQ(a[count - 1], static_cast<float>(n * (n + 1) / 2));
  EXPECT_EQ(rs_recv[0], 2.0f);
  EXPECT_EQ(rs_recv[count - 1], 2.0f);
}

// The progress thread completes work nobody waits on: the callback fires while this thread
// only sleeps on its own condition variable.
TEST(MpiAsync, CallbackFiresWithoutWait) {
  Group& g = World();
  const int n = g.size();
  for (size_t count : {size_t{1}, size_t{65536 + 13}}) {
    std::vector<double> buf(count, 1.5);
    std::mutex mu;
    std::condition_variable cv;
    bool fired = false;
    absl::Status got = absl::UnknownError("callback never ran");
    auto w = g.AllReduce(buf.data(), buf.data(), count, DType::kF64, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    (*w)->OnComplete([&](const absl::Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      got = s;
      fired = true;
      cv.notify_all();
    });
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(60), [&] { return fired; });
      ASSERT_TRUE(fired) << "callback did not fire without Wait";
    }
    EXPECT_OK(got);
    EXPECT_TRUE((*w)->Done());
    EXPECT_EQ(buf[0], 1.5 * n);
    EXPECT_EQ(buf[count - 1], 1.5 * n);
  }
}

TEST(MpiSplit, EvenOddWithReversedKeys) {
  Group& g = World();
  const int color = g.rank() % 2;
  auto child = g.Split(color, -g.rank());
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_NE(*child, nullptr);
  Group& c = **child;
  // Members of my color ordered by key = -rank: the highest old rank comes first.
  std::vector<int> members;
  for (int r = g.size() - 1; r >= 0; --r) {
    if (r % 2 == color) members.push_back(r);
  }
  EXPECT_EQ(c.size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[c.rank()], g.rank());
  EXPECT_EQ(c.name(), absl::StrCat("world/", color));
  for (const CollectiveVariant& k : kCollectiveVariants) {
    CollectiveCase cc{k.kind, k.op, DType::kBF16, 37, false, true, 11, 0};
    EXPECT_OK(RunAndCheck(c, cc, kTimeout));
  }
  // The parent still works after the split, and a grandchild can be split off the child.
  CollectiveCase wc{
      CollectiveKind::kAllReduce, ReduceKind::kSum, DType::kF32, 37, true, true, 12, 0};
  EXPECT_OK(RunAndCheck(g, wc, kTimeout));
  auto grandchild = c.Split(0, 0, "grandchild");
  ASSERT_TRUE(grandchild.ok()) << grandchild.status().ToString();
  ASSERT_NE(*grandchild, nullptr);
  EXPECT_EQ((*grandchild)->name(), "grandchild");
  EXPECT_OK(RunAndCheck(**grandchild, wc, kTimeout));
}

TEST(MpiSplit, NoColorGetsNullGroup) {
  Group& g = World();
  const bool out = g.rank() == 0;
  auto child = g.Split(out ? kNoColor : 3, g.rank());
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  if (out) {
    EXPECT_EQ(*child, nullptr);
    return;
  }
  ASSERT_NE(*child, nullptr);
  EXPECT_EQ((*child)->size(), g.size() - 1);
  EXPECT_EQ((*child)->rank(), g.rank() - 1);
  CollectiveCase c{
      CollectiveKind::kAllReduce, ReduceKind::kAvg, DType::kF32, 65536 + 13, true, true, 13, 0};
  EXPECT_OK(RunAndCheck(**child, c, kTimeout));
}

TEST(MpiSplit, InvalidColorFailsOnEveryRankNamingIt) {
  Group& g = World();
  const int bad_rank = g.size() - 1;
  auto child = g.Split(g.rank() == bad_rank ? -5 : 0, 0);
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInvalidArgument) << child.status().ToString();
  EXPECT_TRUE(absl::StrContains(child.status().message(),
                                absl::StrCat("rank ", bad_rank, " passed color -5")))
      << child.status().ToString();
  // Every rank saw the same error, so the group is still in step.
  CollectiveCase c{
      CollectiveKind::kBroadcast, ReduceKind::kSum, DType::kU8, 37, false, true, 14, 1};
  EXPECT_OK(RunAndCheck(g, c, kTimeout));
}

// A collective that misses its deadline fails naming group, op and sequence number, fails the
// group, and later calls fail fast. Rank 0 calls alone; the others join the same collective
// afterwards, so MPI can finish it and rank 0's buffers (kept alive meanwhile) are released.
TEST(MpiDeadline, MissedDeadlineFailsTheGroup) {
  Group& g = World();
  auto child = g.Split(0, g.rank(), "world/deadline");
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  Group& c = **child;
  std::vector<float> buf(1000, 1.0f);
  WorkPtr late;
  if (g.rank() == 0) {
    CollectiveOptions opts;
    opts.timeout = absl::Milliseconds(300);
    opts.label = "bucket 7";
    auto w = c.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum(), opts);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const absl::Status s = (*w)->Wait(kTimeout);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s.ToString();
    EXPECT_TRUE(absl::StrContains(s.message(), "allreduce #0 on group 'world/deadline' (bucket 7)"))
        << s.ToString();
    auto again = c.Barrier();
    EXPECT_EQ(again.status().code(), absl::StatusCode::kDeadlineExceeded)
        << again.status().ToString();
    EXPECT_TRUE(absl::StrContains(again.status().message(), "has failed"))
        << again.status().ToString();
  }
  auto b1 = g.Barrier();
  ASSERT_TRUE(b1.ok());
  ASSERT_OK((*b1)->Wait(kTimeout));
  if (g.rank() != 0) {
    auto w = c.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_OK((*w)->Wait(kTimeout));
    EXPECT_EQ(buf[0], static_cast<float>(g.size()));
  }
  auto b2 = g.Barrier();
  ASSERT_TRUE(b2.ok());
  ASSERT_OK((*b2)->Wait(kTimeout));
}

// Without BRAID_VALIDATE_COLLECTIVES, ranks that disagree on a reduce-scatter's count reach
// MPI with different message sizes, and MPI reports MPI_ERR_TRUNCATE on the ranks that receive
// more than they expect. That error is raised while the request completes (MPI_Testsome),
// which Open MPI routes to MPI_COMM_WORLD's handler: it must come back as the Work's error,
// naming the op and MPI's text, and fail the group, never abort the job. Rank 0 passes the
// larger count: Open MPI's schedule (reduce to rank 0, then scatter from it) then truncates
// on the other ranks in its last step, so every rank gets an answer. (The other way round,
// rank 0 truncates during the reduce and its peers wait for a scatter that never comes: they
// fail only at the deadline, and MPI keeps their requests, so the backend would have to skip
// MPI_Finalize and mpirun would fail the job.)
// On a group of its own: the failure poisons no group that other tests use. Open MPI's libnbc
// prints "MPI Error in NBC subrequest" on the ranks that truncate; that is expected. Which code
// the request carries depends on where libnbc notices: MPI_ERR_TRUNCATE when the truncated
// receive completes the request, OMPI_ERROR (-1, "NBC_Start_round") when it aborts the schedule
// while starting the next round. Both are MPI's answer to the mismatch (seen on CI).
TEST(MpiErrors, CountMismatchWithoutValidationFailsTheCall) {
  if (TheWorlds().engine == "blocking") {
    // Blocking MPI_Reduce_scatter_block with counts that differ between ranks is undefined in
    // Open MPI's tuned component (it may hang or write out of bounds): nothing to check.
    GTEST_SKIP() << "needs the nonblocking engine (libnbc reports the truncation)";
  }
  Group& g = World();
  auto child = g.Split(0, g.rank(), "world/mismatch");
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  Group& c = **child;
  const size_t count = c.rank() == 0 ? 9 : 8;
  std::vector<float> send(static_cast<size_t>(c.size()) * 9, 1.0f);
  std::vector<float> recv(9, 0.0f);
  CollectiveOptions opts;
  opts.timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  auto w = c.ReduceScatter(send.data(), recv.data(), count, DType::kF32, ReduceOp::Sum(), opts);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const absl::Status s = (*w)->Wait(kTimeout);
  EXPECT_LT(absl::Now() - start, opts.timeout) << "a rank waited for its deadline";
  const bool truncated = absl::StrContains(s.message(), "MPI_ERR_TRUNCATE") ||
                         absl::StrContains(s.message(), "(MPI error -1)");
  if (!s.ok()) {
    EXPECT_TRUE(truncated) << s.ToString();
    EXPECT_TRUE(absl::StrContains(s.message(), "reduce_scatter #0 on group 'world/mismatch'"))
        << s.ToString();
    // The group has failed: the next call fails at once, with the cause.
    auto again = c.Barrier();
    EXPECT_FALSE(again.ok());
    EXPECT_TRUE(absl::StrContains(again.status().message(), "has failed"))
        << again.status().ToString();
    EXPECT_TRUE(absl::StrContains(again.status().message(), s.message()))
        << "the group's refusal names the cause: " << again.status().ToString();
  }
  // Every rank learns what the others saw, over the (untouched) world group.
  int32_t seen[2] = {s.ok() ? 0 : 1, truncated ? 1 : 0};
  auto tally = g.AllReduce(seen, seen, 2, DType::kI32, ReduceOp::Sum());
  ASSERT_TRUE(tally.ok()) << tally.status().ToString();
  ASSERT_OK((*tally)->Wait(kTimeout));
  EXPECT_GE(seen[0], 1) << "no rank saw the mismatch";
  EXPECT_EQ(seen[1], seen[0])
      << "a rank failed with something other than MPI's answer to the mismatch";
}

// Two groups over the same ranks, used at the same time from two threads: under the default
// engine their large calls run on two communication threads at once (MPI_THREAD_MULTIPLE,
// backends/mpi/comm_thread.h), each group's calls in issue order.
TEST(MpiCommThread, TwoGroupsConcurrently) {
  Group& g = World();
  auto a = g.Split(0, g.rank(), "world/a");
  auto b = g.Split(0, g.rank(), "world/b");
  ASSERT_TRUE(a.ok() && b.ok());
  constexpr size_t kCount = 65536;  // 256 KiB: the comm thread under `auto`
  constexpr int kCalls = 8;
  absl::Status results[2];
  auto run = [&](Group* grp, int which) {
    std::vector<float> buf(kCount);
    for (int i = 0; i < kCalls; ++i) {
      std::fill(buf.begin(), buf.end(), static_cast<float>(i + which));
      auto w = grp->AllReduce(buf.data(), buf.data(), kCount, DType::kF32, ReduceOp::Sum());
      absl::Status st = w.ok() ? (*w)->Wait(kTimeout) : w.status();
      if (st.ok() && buf[kCount - 1] != static_cast<float>((i + which) * grp->size())) {
        st = absl::InternalError(absl::StrCat("call ", i, ": got ", buf[kCount - 1]));
      }
      if (!st.ok()) {
        results[which] = st;
        return;
      }
    }
  };
  std::thread ta(run, a->get(), 0);
  std::thread tb(run, b->get(), 1);
  ta.join();
  tb.join();
  EXPECT_OK(results[0]);
  EXPECT_OK(results[1]);
}

// A group destroyed with calls still in flight runs them (its peers issued them too): their
// Works complete with the right results, on every engine. Large calls sit in the comm thread's
// queue (blocking, sized) or in libnbc (nonblocking); small ones are nonblocking under `sized`
// too. The destructor must not free the communicators under live libnbc requests: Open MPI's
// progress then crashes (the world all-reduce after each round drives that progress). Several
// rounds, because the crash needs a schedule still running when the group goes.
TEST(MpiCommThread, DestroyedGroupRunsQueuedCalls) {
  Group& g = World();
  constexpr size_t kLarge = 1 << 18;  // 1 MiB: the comm thread under blocking and sized
  constexpr size_t kSmall = 64;       // 256 B: nonblocking under sized
  constexpr int kCalls = 6;
  constexpr int kRounds = 4;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto child = g.Split(0, g.rank(), absl::StrCat("world/dropped", round));
    ASSERT_TRUE(child.ok()) << child.status();
    const float value = static_cast<float>(round + 1);
    std::vector<std::vector<float>> bufs;
    for (int i = 0; i < kCalls; ++i) bufs.emplace_back(i % 3 == 2 ? kSmall : kLarge, value);
    std::vector<WorkPtr> works;
    for (auto& buf : bufs) {
      auto w =
          (*child)->AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum());
      ASSERT_TRUE(w.ok()) << w.status();
      works.push_back(*w);
    }
    child->reset();
    for (size_t i = 0; i < works.size(); ++i) {
      const absl::Status done = works[i]->Wait(kTimeout);
      EXPECT_TRUE(done.ok()) << "call " << i << ": " << done;
      EXPECT_EQ(bufs[i].front(), value * static_cast<float>(g.size())) << "call " << i;
      EXPECT_EQ(bufs[i].back(), value * static_cast<float>(g.size())) << "call " << i;
    }
    int32_t one = 1;
    auto after = g.AllReduce(&one, &one, 1, DType::kI32, ReduceOp::Sum());
    ASSERT_TRUE(after.ok()) << after.status();
    ASSERT_OK((*after)->Wait(kTimeout));
    EXPECT_EQ(one, g.size());
  }
}

// A group destroyed while one of its nonblocking calls failed its deadline but MPI still owns
// the request (a peer had not issued it yet): the destructor returns once the call has failed,
// leaking the communicators instead of freeing them under the live request (it logs an
// error), and the peers that issue the call later complete it on the leaked communicator.
// bf16, so MPI works in the operation's own staging (kept alive by the engine), not in `buf`.
TEST(MpiDestroy, FailedCallLeaksTheCommunicator) {
  if (braid::testing::TheWorlds().engine == "blocking") {
    GTEST_SKIP() << "every call runs on the comm thread (DestroyedGroupRunsQueuedCalls)";
  }
  const auto bf16 = [](float f) {  // exact for the small integers used here
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof(bits));
    return static_cast<uint16_t>(bits >> 16);
  };
  Group& g = World();
  auto child = g.Split(0, g.rank(), "world/leaked");
  ASSERT_TRUE(child.ok()) << child.status();
  constexpr size_t kCount = 1000;  // 2000 B: nonblocking under sized too
  std::vector<uint16_t> buf(kCount, bf16(1.0f));
  if (g.rank() == 0) {
    CollectiveOptions opts;
    opts.timeout = absl::Milliseconds(300);
    auto w =
        (*child)->AllReduce(buf.data(), buf.data(), kCount, DType::kBF16, ReduceOp::Sum(), opts);
    ASSERT_TRUE(w.ok()) << w.status();
    const absl::Time start = absl::Now();
    child->reset();  // returns at the call's deadline
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    EXPECT_TRUE((*w)->Done()) << "the destructor returned with the group's call still in flight";
    const absl::Status s = (*w)->Wait(kTimeout);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "allreduce #0 on group 'world/leaked'")) << s;
  }
  auto b1 = g.Barrier();
  ASSERT_TRUE(b1.ok());
  ASSERT_OK((*b1)->Wait(kTimeout));
  if (g.rank() != 0) {
    auto w = (*child)->AllReduce(buf.data(), buf.data(), kCount, DType::kBF16, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(kTimeout));
    EXPECT_EQ(buf.front(), bf16(static_cast<float>(g.size())));
    EXPECT_EQ(buf.back(), bf16(static_cast<float>(g.size())));
    child->reset();
  }
  auto b2 = g.Barrier();
  ASSERT_TRUE(b2.ok());
  ASSERT_OK((*b2)->Wait(kTimeout));
}

TEST(MpiBackend, DescribesItself) {
  Group& g = World();
  EXPECT_EQ(g.backend_name(), "mpi");
  EXPECT_EQ(g.name(), "world");
  const Capabilities caps = g.capabilities();
  EXPECT_FALSE(caps.native_avg);
  EXPECT_FALSE(caps.native_premul_sum);
  EXPECT_FALSE(caps.native_half);
  EXPECT_TRUE(caps.async_progress);
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT_EQ(g.size(), world_size);
}

// `--host_init=serialized|multiple`: instead of the suite, checks how the backend joins an MPI
// that the host application initialized itself (the mpi_host_init_* targets):
//   serialized  the host asks for MPI_THREAD_SERIALIZED; creating the backend must fail with
//               FailedPrecondition naming that level (the progress thread would call MPI
//               concurrently with the host);
//   multiple    the host asks for MPI_THREAD_MULTIPLE; the backend works, leaves the host's
//               error handler on MPI_COMM_WORLD alone, and leaves finalizing to the host.
// Plain checks, not gtest: MPI can be initialized once per process. Returns the exit code.
int RunHostInitCheck(absl::string_view level) {
  const bool multiple = level == "multiple";
  if (!multiple && level != "serialized") {
    std::fprintf(stderr, "--host_init: expected serialized or multiple, got '%s'\n",
                 std::string(level).c_str());
    return 2;
  }
  int failures = 0;
  auto check = [&failures](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::fprintf(stderr, "host_init check FAILED: %s\n", what.c_str());
    }
  };
  int provided = MPI_THREAD_SINGLE;
  const int wanted = multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
  MPI_Init_thread(nullptr, nullptr, wanted, &provided);
  Options options;
  options.backend = "mpi";
  options.timeout = kTimeout;
  if (!multiple) {
    if (provided >= MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr, "host_init: MPI upgraded SERIALIZED to MULTIPLE; nothing to check\n");
    } else {
      auto backend = CreateBackend(options);
      const absl::Status s = backend.status();
      check(s.code() == absl::StatusCode::kFailedPrecondition,
            "a host's MPI_THREAD_SERIALIZED is refused with FailedPrecondition: " + s.ToString());
      check(absl::StrContains(s.message(), "MPI_THREAD_SERIALIZED") &&
                absl::StrContains(s.message(), "MPI_THREAD_MULTIPLE"),
            "the error names the level provided and the one needed: " + s.ToString());
    }
  } else {
    check(provided == MPI_THREAD_MULTIPLE, "the host got MPI_THREAD_MULTIPLE");
    {
      auto backend = CreateBackend(options);
      check(backend.ok(),
            "a host's MPI_THREAD_MULTIPLE is accepted: " + backend.status().ToString());
      if (backend.ok()) {
        const int rank = (*backend)->local_ranks().at(0);
        auto world = (*backend)->WorldGroup(rank);
        check(world.ok(), "world group: " + world.status().ToString());
        if (world.ok()) {
          int32_t x = rank + 1;
          auto w = (*world)->AllReduce(&x, &x, 1, DType::kI32, ReduceOp::Sum());
          const absl::Status s = w.ok() ? (*w)->Wait(kTimeout) : w.status();
          const int n = (*world)->size();
          check(s.ok() && x == n * (n + 1) / 2, "all-reduce on the host's MPI: " + s.ToString());
        }
        MPI_Errhandler handler = MPI_ERRHANDLER_NULL;
        MPI_Comm_get_errhandler(MPI_COMM_WORLD, &handler);
        check(handler == MPI_ERRORS_ARE_FATAL,
              "the host's MPI_ERRORS_ARE_FATAL on MPI_COMM_WORLD is left alone");
        if (handler != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&handler);
      }
    }
    int finalized = 1;
    MPI_Finalized(&finalized);
    check(!finalized, "the backend leaves finalizing to the host");
  }
  MPI_Finalize();
  std::fprintf(stderr, "host_init=%s: %s\n", std::string(level).c_str(),
               failures == 0 ? "all checks passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace braid::testing

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    constexpr absl::string_view kHostInit = "--host_init=";
    if (absl::StartsWith(argv[i], kHostInit)) {
      return braid::testing::RunHostInitCheck(absl::string_view(argv[i]).substr(kHostInit.size()));
    }
  }
  using braid::Options;
  Options options;
  options.backend = "mpi";
  for (int i = 1; i < argc; ++i) {
    constexpr absl::string_view kEngine = "--mpi_engine=";
    if (absl::StartsWith(argv[i], kEngine)) {
      options.mpi_engine = std::string(absl::string_view(argv[i]).substr(kEngine.size()));
      braid::testing::TheWorlds().engine = options.mpi_engine;
    }
  }
  options.timeout = braid::testing::kTimeout;
  // The error tests here fail one group and go on using the world: a failure must not abort
  // the job (tests/mpi_abort_test checks that it does by default).
  options.abort_on_failure = false;
  auto backend = braid::CreateBackend(options);
  if (!backend.ok()) {
    std::fprintf(stderr, "creating the mpi backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  const int rank = (*backend)->local_ranks().at(0);
  braid::testing::BeforeInitGoogleTest(rank);
  ::testing::InitGoogleTest(&argc, argv);
  Options validating_options = options;
  validating_options.validate_collectives = true;
  auto validating_backend = braid::CreateBackend(validating_options);
  if (!validating_backend.ok()) {
    std::fprintf(stderr, "creating the validating mpi backend: %s\n",
                 validating_backend.status().ToString().c_str());
    return 1;
  }
  auto world = (*backend)->WorldGroup(rank);
  auto validating = (*validating_backend)->WorldGroup(rank);
  if (!world.ok() || !validating.ok()) {
    std::fprintf(stderr, "creating the world groups: %s / %s\n", world.status().ToString().c_str(),
                 validating.status().ToString().c_str());
    return 1;
  }
  braid::testing::TheWorlds().world = world->get();
  braid::testing::TheWorlds().validating = validating->get();
  braid::testing::AfterInitGoogleTest(rank);
  const int result = RUN_ALL_TESTS();
  // Backends first: groups may outlive them, and the last group finalizes MPI.
  backend->reset();
  validating_backend->reset();
  world->reset();
  validating->reset();
  return result;
}
