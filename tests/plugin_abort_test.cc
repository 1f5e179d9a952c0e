// Plugins take part in the job's abort domain (issue 23 item 4; backends/plugin/plugin_abort.h):
// when one rank aborts the job (AbortJob, or an operation the plugin fails), every other rank
// of a plugin world stops within the built-ins' 2 s bound, although the plugin's own deadline
// (60 s here) has not passed: pending Works on any group fail with Aborted naming the rank
// that aborted and why, and every later call and Split is refused. The ranks are threads
// hosted by one process, through the test plugins of tests/plugins/ (the local backend behind
// the C ABI).
#include <atomic>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/backend.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/plugin_test_util.h"

namespace braid::testing {
namespace {

constexpr absl::Duration kPrompt = absl::Seconds(2);           // the built-ins' bound (issue 23)
constexpr absl::Duration kPluginDeadline = absl::Seconds(60);  // what the ranks would wait

std::unique_ptr<Backend> Create(const char* path, int ranks) {
  auto b = CreateBackend(PluginOptions(path, ranks, kPluginDeadline));
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Waits for `w` (at most the plugin's deadline) and checks the abort's error, and how soon
// after `aborted_at` it came.
void ExpectAbortedPromptly(const absl::StatusOr<WorkPtr>& w, const std::atomic<int64_t>& aborted_ns,
                           std::initializer_list<absl::string_view> parts, int rank) {
  const absl::Status s = w.ok() ? (*w)->Wait(kPluginDeadline) : w.status();
  const absl::Duration after = absl::Now() - absl::FromUnixNanos(aborted_ns.load());
  std::printf("rank %d: error %s after the abort: %s\n", rank, absl::FormatDuration(after).c_str(),
              s.ToString().c_str());
  ExpectError(s, absl::StatusCode::kAborted, parts);
  EXPECT_LT(after, kPrompt) << "rank " << rank;
}

// The aborting rank stays (its groups alive) until the others checked their errors: a rank
// whose groups are destroyed fails its peers through the plugin anyway, which is not what
// these tests look at.
void AwaitOthers(const std::atomic<int>& finished, int others) {
  const absl::Time end = absl::Now() + kPluginDeadline + absl::Seconds(5);
  while (finished.load() < others && absl::Now() < end) absl::SleepFor(absl::Milliseconds(1));
}

// 4 ranks, pairs {0, 1} and {2, 3} split from the world. Rank 1 waits in an all-reduce on its
// pair that rank 0 never joins, rank 2 on its pair, rank 3 in a world all-reduce nobody else
// joins; rank 0 then reports a failure Braid cannot see (a framework step) with AbortJob.
TEST(PluginAbort, AbortJobReachesRanksWaitingOnEveryGroup) {
  std::unique_ptr<Backend> backend = Create(kLocalPlugin, 4);
  ASSERT_NE(backend, nullptr);
  std::atomic<int> waiting{0};
  std::atomic<int64_t> aborted_ns{0};
  std::atomic<int> finished{0};
  RunRanks(*backend, [&](Group& world) {
    const int r = world.rank();
    auto pair = world.Split(r / 2, r % 2, absl::StrCat("pair", r / 2));
    ASSERT_TRUE(pair.ok()) << pair.status();
    std::vector<float> buf(256, 1.0f);
    if (r == 0) {
      while (waiting.load() < 3) absl::SleepFor(absl::Milliseconds(1));
      absl::SleepFor(absl::Milliseconds(50));  // the others are inside the plugin by now
      aborted_ns.store(absl::GetCurrentTimeNanos());
      ASSERT_OK(world.AbortJob(absl::InternalError("the framework's step 7 failed on rank 0")));
      // Everything after is refused, naming the cause.
      ExpectError(world.Barrier().status(), absl::StatusCode::kAborted,
                  {"group 'world' refuses new calls", "rank 0", "step 7 failed"});
      AwaitOthers(finished, 3);
      return;
    }
    Group& on = r == 3 ? world : **pair;
    auto w = on.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status();
    waiting.fetch_add(1);
    ExpectAbortedPromptly(w, aborted_ns,
                          {absl::StrCat("allreduce #0 on group '", on.name(), "'"),
                           "job aborted: rank 0 reported INTERNAL", "step 7 failed"},
                          r);
    ExpectError(on.Barrier().status(), absl::StatusCode::kAborted,
                {"refuses new calls", "rank 0", "step 7 failed"});
    ExpectError(world.Split(0, r).status(), absl::StatusCode::kAborted, {"refuses new calls"});
    finished.fetch_add(1);
  });
}

// An operation the plugin fails aborts the job: the faulty plugin's barrier fails at once
// (TIMEOUT through its callback) on rank 0 while ranks 1 and 2 wait in a world all-reduce
// that rank 0 never joins.
TEST(PluginAbort, PluginFailureAbortsTheJob) {
  std::unique_ptr<Backend> backend = Create(kFaultyPlugin, 3);
  ASSERT_NE(backend, nullptr);
  std::atomic<int> waiting{0};
  std::atomic<int64_t> failed_ns{0};
  std::atomic<int> finished{0};
  RunRanks(*backend, [&](Group& world) {
    std::vector<float> buf(64, 1.0f);
    if (world.rank() == 0) {
      while (waiting.load() < 2) absl::SleepFor(absl::Milliseconds(1));
      absl::SleepFor(absl::Milliseconds(50));
      failed_ns.store(absl::GetCurrentTimeNanos());
      auto b = world.Barrier();
      ASSERT_TRUE(b.ok()) << b.status();
      // The failing rank keeps its own error.
      ExpectError((*b)->Wait(absl::Seconds(5)), absl::StatusCode::kDeadlineExceeded,
                  {"barrier #0 on group 'world'", "barrier timed out"});
      AwaitOthers(finished, 2);
      return;
    }
    auto w = world.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status();
    waiting.fetch_add(1);
    ExpectAbortedPromptly(w, failed_ns,
                          {"plugin 'braid_test_faulty': allreduce #0 on group 'world'",
                           "job aborted: rank 0 reported DEADLINE_EXCEEDED", "barrier timed out"},
                          world.rank());
    finished.fetch_add(1);
  });
}

// BRAID_ABORT_ON_FAILURE=0: a plugin's failure fails only its own call; AbortJob still aborts.
TEST(PluginAbort, WithoutAbortOnFailureOnlyAbortJobAborts) {
  Options o = PluginOptions(kFaultyPlugin, 2, kPluginDeadline);
  o.abort_on_failure = false;
  auto backend = CreateBackend(o);
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::atomic<bool> waiting{false};
  std::atomic<int64_t> aborted_ns{0};
  std::atomic<int> finished{0};
  RunRanks(**backend, [&](Group& world) {
    std::vector<float> buf(64, 1.0f);
    if (world.rank() == 0) {
      while (!waiting.load()) absl::SleepFor(absl::Milliseconds(1));
      auto b = world.Barrier();  // fails at once, through the callback: no abort
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ((*b)->Wait(absl::Seconds(5)).code(), absl::StatusCode::kDeadlineExceeded);
      EXPECT_FALSE(world.abort_domain()->aborted());
      aborted_ns.store(absl::GetCurrentTimeNanos());
      ASSERT_OK(world.AbortJob(absl::UnavailableError("rank 0 gives up")));
      AwaitOthers(finished, 1);
      return;
    }
    auto w = world.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status();
    waiting.store(true);
    ExpectAbortedPromptly(w, aborted_ns, {"job aborted: rank 0 reported UNAVAILABLE", "gives up"},
                          1);
    finished.fetch_add(1);
  });
}

}  // namespace
}  // namespace braid::testing
