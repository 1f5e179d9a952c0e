// Hangs diagnosed after the fact: four local ranks break the rank-order contract (a skip,
// another order, a stall, a rank that never arrives), run to their short deadline or to the
// local backend's mismatch error, each rank's flight recorder is written on the failure or the
// abort (BRAID_FLIGHT_RECORDER_DIR), and the analysis (tools/braid_flight) names the culprit.
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/local/local_backend.h"
#include "comm/backend.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/temp_dir.h"
#include "tools/flight_analysis.h"

namespace braid {
namespace {

using flight::FlightFinding;

constexpr int kRanks = 4;

// Runs `body` on kRanks local ranks with a 400 ms deadline and dumps into `dir`; returns the
// analysis of the ranks' dumps (every rank must have written one).
std::vector<FlightFinding> RunAndAnalyze(const TempDir& dir,
                                         const std::function<void(local::LocalBackend&)>& setup,
                                         const std::function<void(Group&)>& body) {
  Options o = testing::LocalOptions(kRanks, absl::Milliseconds(400));
  o.flight_recorder_dir = dir.path();
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return {};
  setup(static_cast<local::LocalBackend&>(**b));
  testing::RunRanks(**b, body);
  std::vector<flight::FlightDump> dumps;
  for (int r = 0; r < kRanks; ++r) {
    absl::StatusOr<flight::FlightDump> d =
        flight::ReadFlightDump(absl::StrCat(dir.path(), "/braid_flight.rank", r, ".jsonl"));
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) dumps.push_back(*std::move(d));
  }
  return flight::AnalyzeFlight(dumps);
}

// Issues all-reduces of the given counts on `world` (all first, then waits, as a reducer
// launching buckets does); the results' errors are expected, not checked.
void IssueAll(Group& world, const std::vector<size_t>& counts) {
  std::vector<float> buf(64, 1.0f);
  std::vector<WorkPtr> works;
  for (size_t i = 0; i < counts.size(); ++i) {
    CollectiveOptions opts;
    const std::string label = absl::StrCat("bucket ", i);
    opts.label = label;
    auto w = world.AllReduce(buf.data(), buf.data(), counts[i], DType::kF32, ReduceOp::Sum(), opts);
    if (w.ok()) works.push_back(*w);
  }
  for (const WorkPtr& w : works) w->Wait(absl::Seconds(30)).IgnoreError();
}

// Every rank's dump is taken at its first failure: hold the ranks at #0 (rank 0 joins it late)
// until all have issued their calls, so the dumps hold the whole story.
void HoldFirstCall(local::LocalBackend& b) {
  b.faults().StallRank(0, 0, absl::Milliseconds(150), "world");
}

void ExpectFirst(const std::vector<FlightFinding>& fs, FlightFinding::Kind kind, uint64_t seq,
                 std::vector<int> ranks, absl::string_view text) {
  ASSERT_FALSE(fs.empty());
  for (const FlightFinding& f : fs) SCOPED_TRACE(f.message);
  const FlightFinding& f = fs.front();
  EXPECT_EQ(f.kind, kind) << f.message;
  EXPECT_EQ(f.group, "world");
  EXPECT_EQ(f.seq, seq) << f.message;
  EXPECT_EQ(f.ranks, ranks) << f.message;
  EXPECT_NE(f.message.find(std::string(text)), std::string::npos) << f.message;
}

TEST(FlightHangTest, NamesTheRankThatSkippedACollective) {
  TempDir dir("braid_flight_hang");
  auto fs = RunAndAnalyze(dir, HoldFirstCall, [](Group& world) {
    if (world.rank() == 1) {
      IssueAll(world, {8, 24, 32});  // skips bucket 1 (16 elements)
    } else {
      IssueAll(world, {8, 16, 24, 32});
    }
  });
  ExpectFirst(fs, FlightFinding::Kind::kSkipped, 1, {1},
              "rank 1 skipped allreduce #1 (16 x f32, 64 bytes, bucket 1)");
}

TEST(FlightHangTest, NamesTheRankThatIssuedInAnotherOrder) {
  TempDir dir("braid_flight_hang");
  auto fs = RunAndAnalyze(dir, HoldFirstCall, [](Group& world) {
    if (world.rank() == 2) {
      IssueAll(world, {8, 24, 16, 32});
    } else {
      IssueAll(world, {8, 16, 24, 32});
    }
  });
  ExpectFirst(fs, FlightFinding::Kind::kReordered, 1, {2}, "rank 2 issued calls in another order");
}

TEST(FlightHangTest, NamesTheRankThatStalledInACollective) {
  TempDir dir("braid_flight_hang");
  // Rank 3 issues #2 but does not join it (stuck before the transport); the others time out.
  auto fs = RunAndAnalyze(
      dir, [](local::LocalBackend& b) { b.faults().StallRank(3, 2, absl::Seconds(20), "world"); },
      [](Group& world) {
        IssueAll(world, {8, 16, 24, 32});
      });
  ExpectFirst(fs, FlightFinding::Kind::kStalled, 2, {3},
              "rank 3 stalled before allreduce #2 (24 x f32, 96 bytes, bucket 2)");
}

TEST(FlightHangTest, NamesTheRankThatNeverArrived) {
  TempDir dir("braid_flight_hang");
  auto fs = RunAndAnalyze(
      dir, [](local::LocalBackend&) {},
      [](Group& world) {
        if (world.rank() == 2) {
          IssueAll(world, {8, 16});  // stops before bucket 2, stuck in its own code
          const absl::Time until = absl::Now() + absl::Seconds(20);
          while (!world.abort_domain()->aborted() && absl::Now() < until) {
            absl::SleepFor(absl::Milliseconds(5));
          }
        } else {
          IssueAll(world, {8, 16, 24, 32});
        }
      });
  ExpectFirst(fs, FlightFinding::Kind::kNeverArrived, 2, {2},
              "rank 2 never arrived at allreduce #2 (24 x f32, 96 bytes, bucket 2)");
}

// The tool itself, on the dumps of a skip.
TEST(FlightHangTest, ToolNamesTheCulprit) {
  const char* tool = getenv("FLIGHT_TOOL");
  ASSERT_NE(tool, nullptr);
  TempDir dir("braid_flight_hang");
  RunAndAnalyze(dir, HoldFirstCall, [](Group& world) {
    IssueAll(world, world.rank() == 3 ? std::vector<size_t>{8, 24, 32}
                                      : std::vector<size_t>{8, 16, 24, 32});
  });
  FILE* p = popen(absl::StrCat(tool, " ", dir.path()).c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("skipped: group 'world' diverges at #1: rank 3 skipped allreduce #1"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rank 0: "), std::string::npos) << out;
}

// The analysis on hand-written records: a rank that issued and never completed while the others
// completed; every rank pending; rings that wrapped at different points.
flight::Entry E(uint64_t seq, size_t count, const char* state, int64_t started = 1) {
  flight::Entry e;
  e.group = "world";
  e.op = "allreduce";
  e.dtype = "f32";
  e.seq = seq;
  e.count = count;
  e.bytes = count * 4;
  e.state = state;
  e.started_ns = started;
  return e;
}

flight::FlightDump D(int rank, std::vector<flight::Entry> es) {
  flight::FlightDump d;
  d.rank = rank;
  d.entries = std::move(es);
  return d;
}

TEST(FlightAnalysisTest, StalledWhileOthersCompleted) {
  auto fs = flight::AnalyzeFlight({D(0, {E(4, 1, "completed"), E(5, 2, "completed")}),
                                   D(1, {E(5, 2, "issued")}),  // its ring wrapped sooner
                                   D(2, {E(4, 1, "completed"), E(5, 2, "completed")})});
  ExpectFirst(fs, FlightFinding::Kind::kStalled, 5, {1},
              "rank 1 stalled in allreduce #5 (2 x f32, 8 bytes) on group 'world': issued but "
              "never completed, while ranks 0,2 completed it");
}

TEST(FlightAnalysisTest, AllPendingNamesNoRank) {
  auto fs = flight::AnalyzeFlight({D(0, {E(0, 1, "failed")}), D(1, {E(0, 1, "issued")})});
  ExpectFirst(fs, FlightFinding::Kind::kAllPending, 0, {0, 1}, "no rank stands out");
}

TEST(FlightAnalysisTest, AgreeingRanksGiveNoFinding) {
  EXPECT_TRUE(
      flight::AnalyzeFlight({D(0, {E(0, 1, "completed")}), D(1, {E(0, 1, "completed")})}).empty());
}

TEST(FlightAnalysisTest, RejectsWhatIsNotADump) {
  EXPECT_FALSE(flight::ParseFlightDump("").ok());
  EXPECT_FALSE(flight::ParseFlightDump("{\"rank\":0}\n").ok());
  EXPECT_FALSE(
      flight::ParseFlightDump("{\"braid_flight_recorder\":1,\"rank\":0}\n{\"op\":1\n").ok());
}

}  // namespace
}  // namespace braid
