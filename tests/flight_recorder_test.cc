// The flight recorder's ring (comm/flight_recorder.h): wrap-around, late finishes of overwritten
// records, concurrent writers, cut names, what a local world records, and the dump's format as
// the analysis reads it back (tools/flight_analysis.h).
#include "comm/flight_recorder.h"

#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/group.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tools/flight_analysis.h"

namespace braid {
namespace {

CollectiveArgs AllReduceArgs(size_t count) {
  CollectiveArgs a;
  a.kind = CollectiveKind::kAllReduce;
  a.count = count;
  a.dtype = DType::kF32;
  return a;
}

std::shared_ptr<FlightRecorder> Recorder(size_t entries) {
  FlightRecorder::Config c;
  c.entries = entries;
  return FlightRecorder::Create(c, /*rank=*/0, nullptr);
}

TEST(FlightRecorderTest, OffWhenNoEntries) { EXPECT_EQ(Recorder(0), nullptr); }

TEST(FlightRecorderTest, KeepsTheLastEntriesAndIgnoresLateFinishesOfOverwrittenOnes) {
  auto fr = Recorder(4);
  std::vector<WorkPtr> works;
  for (uint64_t i = 0; i < 10; ++i) {
    works.push_back(Work::Create(WorkInfo{"world", "allreduce", i, absl::StrCat("bucket ", i)}));
    fr->Record(AllReduceArgs(i + 1), 0, 2, *works.back(), /*issued_ns=*/100 + i);
  }
  works[3]->Complete(absl::InternalError("late"));  // slot 3 now holds record 7: ignored
  works[8]->Complete(absl::DeadlineExceededError("timed out"));
  works[9]->MarkStarted();
  works[9]->Complete(absl::OkStatus());
  EXPECT_EQ(fr->recorded(), 10u);
  const std::vector<FlightRecord> rs = fr->Snapshot();
  ASSERT_EQ(rs.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    const FlightRecord& r = rs[k];
    EXPECT_EQ(r.id, 6 + k);
    EXPECT_EQ(r.seq, 6 + k);
    EXPECT_EQ(r.count, 7 + k);
    EXPECT_EQ(r.bytes, 4 * (7 + k));
    EXPECT_EQ(r.issued_ns, static_cast<int64_t>(106 + k));
    EXPECT_STREQ(r.group, "world");
    EXPECT_EQ(std::string(r.label), absl::StrCat("bucket ", 6 + k));
    EXPECT_EQ(r.group_size, 2);
  }
  EXPECT_EQ(rs[1].state, FlightState::kIssued);  // record 7: the late finish of 3 ignored
  EXPECT_EQ(rs[1].completed_ns, 0);
  EXPECT_EQ(rs[2].state, FlightState::kFailed);
  EXPECT_EQ(rs[2].status_code, static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_STREQ(rs[2].error, "timed out");
  EXPECT_EQ(rs[2].started_ns, 0);
  EXPECT_EQ(rs[3].state, FlightState::kCompleted);
  EXPECT_GE(rs[3].completed_ns, rs[3].started_ns);
  EXPECT_GT(rs[3].started_ns, 0);
}

TEST(FlightRecorderTest, WorkDoneBeforeRecordIsFinishedAtOnce) {
  auto fr = Recorder(8);
  WorkPtr w = Work::Completed(WorkInfo{"world", "barrier", 0, ""}, absl::OkStatus());
  CollectiveArgs a;
  a.kind = CollectiveKind::kBarrier;
  fr->Record(a, 0, 1, *w, FlightRecorder::NowNs());
  const std::vector<FlightRecord> rs = fr->Snapshot();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].state, FlightState::kCompleted);
  EXPECT_EQ(rs[0].dtype, -1);
  EXPECT_EQ(rs[0].bytes, 0u);
}

TEST(FlightRecorderTest, CutsLongNamesVisibly) {
  auto fr = Recorder(2);
  const std::string group(100, 'g');
  WorkPtr w = Work::Create(WorkInfo{group, "allreduce", 0, std::string(100, 'l')});
  fr->Record(AllReduceArgs(1), 0, 1, *w, 1);
  const FlightRecord r = fr->Snapshot().at(0);
  EXPECT_EQ(std::string(r.group), std::string(46, 'g') + "~");
  EXPECT_EQ(std::string(r.label), std::string(38, 'l') + "~");
}

// Writers on several threads (groups of one rank run concurrently, Works finish on backend
// threads): every surviving record is whole, never a mix of two.
TEST(FlightRecorderTest, ConcurrentWritersLeaveWholeRecords) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  constexpr size_t kEntries = 64;
  auto fr = Recorder(kEntries);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string group = absl::StrCat("group", t);
      for (int i = 0; i < kPerThread; ++i) {
        WorkPtr w = Work::Create(
            WorkInfo{group, "allreduce", static_cast<uint64_t>(i), absl::StrCat(t, ":", i)});
        fr->Record(AllReduceArgs(static_cast<size_t>(t) * 1000000 + i), t, kThreads, *w, i);
        w->Complete(i % 2 == 0 ? absl::OkStatus() : absl::InternalError(absl::StrCat(t, ":", i)));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const std::vector<FlightRecord> rs = fr->Snapshot();
  ASSERT_EQ(rs.size(), kEntries);
  EXPECT_EQ(fr->recorded(), uint64_t{kThreads} * kPerThread);
  for (size_t k = 0; k < rs.size(); ++k) {
    const FlightRecord& r = rs[k];
    EXPECT_EQ(r.id, fr->recorded() - kEntries + k);
    const int t = r.group_rank;
    EXPECT_EQ(std::string(r.group), absl::StrCat("group", t));
    EXPECT_EQ(std::string(r.label), absl::StrCat(t, ":", r.seq));
    EXPECT_EQ(r.count, static_cast<uint64_t>(t) * 1000000 + r.seq);
    EXPECT_EQ(r.issued_ns, static_cast<int64_t>(r.seq));
    EXPECT_EQ(r.state, r.seq % 2 == 0 ? FlightState::kCompleted : FlightState::kFailed);
    if (r.seq % 2 == 1) {
      EXPECT_EQ(std::string(r.error), absl::StrCat(t, ":", r.seq));
    }
  }
}

// A local world records every collective of the world and of its splits, in the rank's order.
TEST(FlightRecorderTest, LocalWorldRecordsEveryGroupsCollectives) {
  testing::RunRanks(2, [](Group& world) {
    ASSERT_NE(world.flight_recorder(), nullptr);
    std::vector<float> buf(6, 1.0f), out(12);
    CollectiveOptions opts;
    opts.label = "bucket 1";
    auto w1 = world.AllReduce(buf.data(), buf.data(), 6, DType::kF32, ReduceOp::Sum(), opts);
    ASSERT_TRUE(w1.ok());
    ASSERT_TRUE((*w1)->Wait(absl::Seconds(30)).ok());
    auto child = world.Split(0, world.rank(), "pair");
    ASSERT_TRUE(child.ok());
    ASSERT_EQ((*child)->flight_recorder(), world.flight_recorder());
    auto w2 = (*child)->AllGather(buf.data(), out.data(), 6, DType::kF32);
    ASSERT_TRUE(w2.ok());
    ASSERT_TRUE((*w2)->Wait(absl::Seconds(30)).ok());
    const std::vector<FlightRecord> rs = world.flight_recorder()->Snapshot();
    ASSERT_EQ(rs.size(), 2u);
    EXPECT_STREQ(rs[0].group, "world");
    EXPECT_STREQ(rs[0].op, "allreduce");
    EXPECT_STREQ(rs[0].label, "bucket 1");
    EXPECT_EQ(rs[0].seq, 0u);
    EXPECT_EQ(rs[0].bytes, 24u);
    EXPECT_STREQ(rs[1].group, "pair");
    EXPECT_STREQ(rs[1].op, "allgather");
    EXPECT_EQ(rs[1].seq, 0u);
    for (const FlightRecord& r : rs) {
      EXPECT_EQ(r.group_rank, world.rank());
      EXPECT_EQ(r.group_size, 2);
      EXPECT_EQ(r.state, FlightState::kCompleted);
      EXPECT_LE(r.issued_ns, r.started_ns);
      EXPECT_LE(r.started_ns, r.completed_ns);
    }
  });
}

TEST(FlightRecorderTest, DumpReadsBackThroughTheAnalysis) {
  auto fr = Recorder(8);
  WorkPtr w = Work::Create(WorkInfo{"world \"q\"", "reduce_scatter", 5, "unit\n2"});
  fr->Record(AllReduceArgs(3), 0, 2, *w, 42);
  w->Complete(absl::InternalError("bad \"thing\"\\"));
  char dir_template[] = "/tmp/braid_flight_test.XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string path = dir + "/dump.jsonl";
  ASSERT_TRUE(fr->DumpTo(path, "asked").ok());
  absl::StatusOr<flight::FlightDump> d = flight::ReadFlightDump(path);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->rank, 0);
  EXPECT_EQ(d->reason, "asked");
  ASSERT_EQ(d->entries.size(), 1u);
  const flight::Entry& e = d->entries[0];
  EXPECT_EQ(e.group, "world \"q\"");
  EXPECT_EQ(e.op, "reduce_scatter");
  EXPECT_EQ(e.label, "unit\n2");
  EXPECT_EQ(e.error, "bad \"thing\"\\");
  EXPECT_EQ(e.state, "failed");
  EXPECT_EQ(e.dtype, "f32");
  EXPECT_EQ(e.seq, 5u);
  EXPECT_EQ(e.count, 3u);
  EXPECT_EQ(e.bytes, 12u);
  EXPECT_EQ(e.issued_ns, 42);
  EXPECT_EQ(unlink(path.c_str()), 0);
  EXPECT_EQ(rmdir(dir.c_str()), 0);
  EXPECT_FALSE(fr->DumpTo("/nonexistent-dir/x.jsonl", "asked").ok());
}

}  // namespace
}  // namespace braid
