// Google Benchmark suite for the flight recorder (comm/flight_recorder.h): what recording one
// collective costs, against what tracing the same collective in the timeline costs
// (scheduler/timeline.h), in one run.
//
//   tools/bazelw run //bench:flight_recorder_bench -- --benchmark_min_time=0.5
//
// Every case runs one collective's life on a pooled Work (create, start, complete) as a backend
// does; BM_Work does only that and is the baseline to subtract. BM_WorkRecorded adds what
// Group::ValidateAndLaunch and the Work pay with a recorder (issue clock read, Record, the start
// and finish updates of the slot); BM_WorkTimeline adds what a traced collective pays in the
// timeline (two clock reads and a span pushed to its writer, which writes to /dev/null). The
// cost ratio is (Recorded - Work) / (Timeline - Work). "allocs" counts operator new per
// iteration (0: no allocation per record).
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "bench/alloc_counter.h"
#include "bench/gbench_main.h"
#include "benchmark/benchmark.h"
#include "comm/flight_recorder.h"
#include "comm/group.h"
#include "comm/work_pool.h"
#include "scheduler/timeline.h"

namespace braid {
namespace {

CollectiveArgs Args() {
  CollectiveArgs a;
  a.kind = CollectiveKind::kAllReduce;
  a.count = 1 << 20;
  a.dtype = DType::kBF16;
  return a;
}

// Runs `body` per iteration and reports its heap allocations per iteration.
template <typename Body>
void Loop(benchmark::State& state, Body body) {
  WorkPool pool;
  uint64_t seq = 0;
  for (int i = 0; i < 64; ++i) body(pool, seq++);  // warm the pool
  const uint64_t allocs = alloc_counter::ThreadAllocs();
  for (auto _ : state) body(pool, seq++);
  state.counters["allocs"] =
      benchmark::Counter(static_cast<double>(alloc_counter::ThreadAllocs() - allocs),
                         benchmark::Counter::kAvgIterations);
}

void BM_Work(benchmark::State& state) {
  Loop(state, [](WorkPool& pool, uint64_t seq) {
    WorkPtr w = pool.Create(WorkInfo{"world", "allreduce", seq, "bucket 3"});
    w->MarkStarted();
    w->Complete(absl::OkStatus());
    benchmark::DoNotOptimize(w);
  });
}
BENCHMARK(BM_Work);

void BM_WorkRecorded(benchmark::State& state) {
  FlightRecorder::Config config;  // the default ring
  std::shared_ptr<FlightRecorder> fr = FlightRecorder::Create(config, 0, nullptr);
  const CollectiveArgs args = Args();
  Loop(state, [&](WorkPool& pool, uint64_t seq) {
    const int64_t issued = FlightRecorder::NowNs();
    WorkPtr w = pool.Create(WorkInfo{"world", "allreduce", seq, "bucket 3"});
    fr->Record(args, 0, 8, *w, issued);
    w->MarkStarted();
    w->Complete(absl::OkStatus());
    benchmark::DoNotOptimize(w);
  });
}
BENCHMARK(BM_WorkRecorded);

void BM_WorkTimeline(benchmark::State& state) {
  char dir_template[] = "/tmp/braid_flight_bench.XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string prefix = dir + "/bench";
  const std::string link = prefix + ".rank0.json";
  if (symlink("/dev/null", link.c_str()) != 0) abort();
  auto created = sched::Timeline::Create(prefix, 0);
  if (!created.ok()) abort();
  std::unique_ptr<sched::Timeline> tl = *std::move(created);
  const int track = tl->Track("group world");
  uint64_t since_flush = 0;
  Loop(state, [&](WorkPool& pool, uint64_t seq) {
    const int64_t t0 = sched::Timeline::NowNs();
    WorkPtr w = pool.Create(WorkInfo{"world", "allreduce", seq, "bucket 3"});
    w->MarkStarted();
    w->Complete(absl::OkStatus());
    tl->Complete(track, "allreduce", t0, sched::Timeline::NowNs(), static_cast<int64_t>(seq));
    benchmark::DoNotOptimize(w);
    if (++since_flush == (uint64_t{1} << 13)) {  // the writer catches up: nothing is dropped
      since_flush = 0;
      if (!tl->Flush().ok()) abort();
    }
  });
  state.counters["dropped"] = static_cast<double>(tl->dropped());
  if (!tl->Close().ok()) abort();
  unlink(link.c_str());
  rmdir(dir.c_str());
}
BENCHMARK(BM_WorkTimeline);

}  // namespace
}  // namespace braid

BRAID_BENCHMARK_MAIN("flight_recorder_bench",
                     "what recording one collective in the flight recorder costs, against "
                     "tracing it in the timeline (same run)")
