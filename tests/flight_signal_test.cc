// The flight recorder written on a signal (issue 23 item 5; comm/flight_signal.h): with
// BRAID_FLIGHT_RECORDER_SIGNAL=SIGUSR1 and a dump directory, `kill -USR1` makes every rank of
// the process write its ring while a collective hangs, without stopping anything, and the
// analysis (tools/flight_analysis.h) names the rank that never arrived. Also: no handler unless
// asked, the previous disposition back when the last world group is gone, a host's own handler
// never replaced, the options' refusals naming the variable.
#include "comm/flight_signal.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/backend.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/temp_dir.h"
#include "tools/flight_analysis.h"

namespace braid {
namespace {

using flight::FlightFinding;

bool DefaultDisposition(int signo) {
  struct sigaction sa;
  sigaction(signo, nullptr, &sa);
  return (sa.sa_flags & SA_SIGINFO) == 0 && sa.sa_handler == SIG_DFL;
}

// Every rank's dump written by the signal, once each shows `seq` of group 'world' on the ranks
// that issued it; empty if that did not happen within 10 s.
std::vector<flight::FlightDump> AwaitSignalDumps(const std::string& dir, int ranks, uint64_t seq) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end) {
    std::vector<flight::FlightDump> dumps;
    for (int r = 0; r < ranks; ++r) {
      auto d = flight::ReadFlightDump(absl::StrCat(dir, "/braid_flight.rank", r, ".jsonl"));
      if (!d.ok() || d->reason != "signal SIGUSR1") break;
      dumps.push_back(*std::move(d));
    }
    if (static_cast<int>(dumps.size()) == ranks) return dumps;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return {};
}

// Ranks 0 and 1 wait in all-reduce #3; rank 2 (a rank "hung" in the framework) has not issued
// it. An operator's kill -USR1 then writes every rank's ring, naming rank 2.
TEST(FlightSignal, SignalWritesEveryRankAndNamesTheRankThatNeverArrived) {
  ASSERT_TRUE(DefaultDisposition(SIGUSR1));
  TempDir dir("braid_flight_signal");
  {
    Options o = testing::LocalOptions(3, absl::Seconds(60));
    o.flight_recorder_dir = dir.path();
    o.flight_recorder_signal = SIGUSR1;
    auto b = CreateBackend(o);
    ASSERT_TRUE(b.ok()) << b.status();
    std::atomic<int> issued{0};
    std::vector<FlightFinding> findings;
    testing::RunRanks(**b, [&](Group& world) {
      EXPECT_FALSE(DefaultDisposition(SIGUSR1)) << "no handler while the world is up";
      std::vector<float> buf(16, 1.0f);
      for (int i = 0; i < 3; ++i) {
        auto w = world.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum());
        ASSERT_TRUE(w.ok()) << w.status();
        ASSERT_OK((*w)->Wait(absl::Seconds(30)));
      }
      if (world.rank() == 2) {
        while (issued.load() < 2) absl::SleepFor(absl::Milliseconds(1));
        ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
        std::vector<flight::FlightDump> dumps = AwaitSignalDumps(dir.path(), 3, 3);
        ASSERT_EQ(dumps.size(), 3u) << "not every rank wrote its ring on the signal";
        findings = flight::AnalyzeFlight(dumps);
      }
      auto w = world.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum());
      ASSERT_TRUE(w.ok()) << w.status();
      issued.fetch_add(1);
      ASSERT_OK((*w)->Wait(absl::Seconds(30)));  // rank 2 joins after the dump: all complete
    });
    ASSERT_FALSE(findings.empty());
    const FlightFinding& f = findings.front();
    EXPECT_EQ(f.kind, FlightFinding::Kind::kNeverArrived) << f.message;
    EXPECT_EQ(f.seq, 3u) << f.message;
    EXPECT_EQ(f.ranks, std::vector<int>{2}) << f.message;
  }
  EXPECT_TRUE(DefaultDisposition(SIGUSR1)) << "the disposition is restored with the last group";
}

TEST(FlightSignal, OffUnlessAsked) {
  TempDir dir("braid_flight_signal");
  Options o = testing::LocalOptions(1, absl::Seconds(60));
  o.flight_recorder_dir = dir.path();
  auto b = CreateBackend(o);
  ASSERT_TRUE(b.ok()) << b.status();
  auto g = (*b)->WorldGroup(0);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(DefaultDisposition(SIGUSR1));
  EXPECT_TRUE(DefaultDisposition(SIGUSR2));
}

extern "C" void HostHandler(int) {}

TEST(FlightSignal, NeverReplacesTheHostsHandler) {
  struct sigaction host, before;
  memset(&host, 0, sizeof(host));
  host.sa_handler = &HostHandler;
  sigemptyset(&host.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &host, &before), 0);
  TempDir dir("braid_flight_signal");
  Options o = testing::LocalOptions(1, absl::Seconds(60));
  o.flight_recorder_dir = dir.path();
  o.flight_recorder_signal = SIGUSR2;
  auto b = CreateBackend(o);
  ASSERT_TRUE(b.ok()) << b.status();
  testing::ExpectError((*b)->WorldGroup(0).status(), absl::StatusCode::kFailedPrecondition,
                       {"SIGUSR2", "already handles it", "braid_flight_recorder_dump"});
  struct sigaction now;
  sigaction(SIGUSR2, nullptr, &now);
  EXPECT_EQ(now.sa_handler, &HostHandler);
  sigaction(SIGUSR2, &before, nullptr);
}

TEST(FlightSignal, NeedsADirectory) {
  Options o = testing::LocalOptions(1, absl::Seconds(60));
  o.flight_recorder_signal = SIGUSR1;
  auto b = CreateBackend(o);
  ASSERT_TRUE(b.ok()) << b.status();
  testing::ExpectError((*b)->WorldGroup(0).status(), absl::StatusCode::kFailedPrecondition,
                       {"BRAID_FLIGHT_RECORDER_SIGNAL", "BRAID_FLIGHT_RECORDER_DIR"});
  EXPECT_TRUE(DefaultDisposition(SIGUSR1));
}

TEST(FlightSignal, OptionNamesTheVariable) {
  auto usr2 = Options::FromMap({{"BRAID_FLIGHT_RECORDER_SIGNAL", "USR2"}});
  ASSERT_TRUE(usr2.ok()) << usr2.status();
  EXPECT_EQ(usr2->flight_recorder_signal, SIGUSR2);
  testing::ExpectError(Options::FromMap({{"BRAID_FLIGHT_RECORDER_SIGNAL", "SIGTERM"}}).status(),
                       absl::StatusCode::kInvalidArgument,
                       {"BRAID_FLIGHT_RECORDER_SIGNAL='SIGTERM'", "SIGUSR1 or SIGUSR2"});
}

}  // namespace
}  // namespace braid
