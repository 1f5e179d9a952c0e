// Google Benchmark suite for the timeline (scheduler/timeline.h): what one record call costs the
// recording thread when the timeline is off, on, and on with a full queue.
//
//   tools/bazelw run //bench:timeline_bench -- --benchmark_min_time=0.5
//
// Every case runs the same loop (RecordLoop: reload the Timeline pointer, one record call, a
// periodic writer catch-up outside the timed region), so BM_EmptyLoop, which records nothing, is
// the baseline to subtract. Enabled cases write to /dev/null through a symlink named like the
// trace file, so the writer thread does its real formatting work without filling a disk.
// BM_WriterDrain reports the writer's own throughput (events formatted and written per second).
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/gbench_main.h"
#include "benchmark/benchmark.h"
#include "scheduler/timeline.h"

namespace braid::sched {
namespace {

constexpr uint64_t kCatchUpEvery = uint64_t{1} << 14;  // < queue capacity: nothing is dropped

// A Timeline whose file is /dev/null (enabled) or none (disabled). Removes its directory at exit.
class BenchTimeline {
 public:
  BenchTimeline(bool enabled, TimelineOptions options = {}) {
    std::string prefix;
    if (enabled) {
      char dir_template[] = "/tmp/braid_timeline_bench.XXXXXX";
      dir_ = mkdtemp(dir_template);
      prefix = dir_ + "/bench";
      link_ = prefix + ".rank0.json";
      if (symlink("/dev/null", link_.c_str()) != 0) abort();
    }
    auto created = Timeline::Create(prefix, 0, options);
    if (!created.ok()) abort();
    timeline_ = *std::move(created);
  }
  ~BenchTimeline() {
    if (!timeline_->Close().ok()) abort();
    if (!link_.empty()) unlink(link_.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  Timeline* get() { return timeline_.get(); }

 private:
  std::string dir_, link_;
  std::unique_ptr<Timeline> timeline_;
};

// The loop every case shares. DoNotOptimize(tl) makes the compiler reload the Timeline (and its
// enabled flag) each iteration, as a call site inside real scheduler code would, instead of
// hoisting the check out of the loop.
template <typename Record>
void RecordLoop(benchmark::State& state, Timeline* tl, Record record) {
  int64_t i = 0;
  uint64_t since_catch_up = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(tl);
    record(tl, i);
    ++i;
    if (++since_catch_up == kCatchUpEvery) {
      since_catch_up = 0;
      state.PauseTiming();
      if (!tl->Flush().ok()) abort();  // let the writer catch up, outside the timed region
      state.ResumeTiming();
    }
  }
  state.counters["dropped"] = static_cast<double>(tl->dropped());
}

void BM_EmptyLoop(benchmark::State& state) {
  BenchTimeline tl(false);
  RecordLoop(state, tl.get(), [](Timeline*, int64_t i) { benchmark::DoNotOptimize(i); });
}
BENCHMARK(BM_EmptyLoop);

void BM_NowNs(benchmark::State& state) {  // the clock read an enabled Instant or span pays
  BenchTimeline tl(false);
  RecordLoop(state, tl.get(),
             [](Timeline*, int64_t) { benchmark::DoNotOptimize(Timeline::NowNs()); });
}
BENCHMARK(BM_NowNs);

void BM_InstantDisabled(benchmark::State& state) {
  BenchTimeline tl(false);
  RecordLoop(state, tl.get(), [](Timeline* t, int64_t i) { t->Instant(0, "mark", i); });
}
BENCHMARK(BM_InstantDisabled);

void BM_CompleteDisabled(benchmark::State& state) {
  BenchTimeline tl(false);
  RecordLoop(state, tl.get(),
             [](Timeline* t, int64_t i) { t->Complete(0, "allreduce", i, i + 1000, i); });
}
BENCHMARK(BM_CompleteDisabled);

void BM_SpanDisabled(benchmark::State& state) {
  BenchTimeline tl(false);
  RecordLoop(state, tl.get(), [](Timeline* t, int64_t i) { TimelineSpan span(*t, 0, "wait", i); });
}
BENCHMARK(BM_SpanDisabled);

void BM_InstantEnabled(benchmark::State& state) {  // includes one NowNs()
  BenchTimeline tl(true);
  const int track = tl.get()->Track("marks");
  RecordLoop(state, tl.get(), [track](Timeline* t, int64_t i) { t->Instant(track, "mark", i); });
}
BENCHMARK(BM_InstantEnabled);

void BM_CompleteEnabled(benchmark::State& state) {  // timestamps given: the queue push alone
  BenchTimeline tl(true);
  const int track = tl.get()->Track("group world");
  RecordLoop(state, tl.get(),
             [track](Timeline* t, int64_t i) { t->Complete(track, "allreduce", i, i + 1000, i); });
}
BENCHMARK(BM_CompleteEnabled);

void BM_SpanEnabled(benchmark::State& state) {  // two NowNs() + push
  BenchTimeline tl(true);
  const int track = tl.get()->Track("waits");
  RecordLoop(state, tl.get(),
             [track](Timeline* t, int64_t i) { TimelineSpan span(*t, track, "wait", i); });
}
BENCHMARK(BM_SpanEnabled);

void BM_CompleteEnabledQueueFull(benchmark::State& state) {  // the drop-and-count path
  TimelineOptions options;
  options.queue_capacity = 2;
  options.flush_interval = absl::Seconds(3600);
  BenchTimeline tl(true, options);
  const int track = tl.get()->Track("group world");
  for (int i = 0; i < 2; ++i) tl.get()->Complete(track, "fill", i, i + 1);
  int64_t i = 0;
  for (auto _ : state) {  // no catch-up: the writer sleeps, every call below is dropped
    Timeline* t = tl.get();
    benchmark::DoNotOptimize(t);
    t->Complete(track, "allreduce", i, i + 1000, i);
    ++i;
  }
  state.counters["dropped"] = static_cast<double>(tl.get()->dropped());
}
BENCHMARK(BM_CompleteEnabledQueueFull);

// The writer thread's side: format and write a batch of events (timed: Flush()).
void BM_WriterDrain(benchmark::State& state) {
  constexpr int kBatch = 1 << 14;
  TimelineOptions options;
  options.flush_interval = absl::Seconds(3600);  // drains only when asked
  BenchTimeline tl(true, options);
  const int track = tl.get()->Track("group world");
  int64_t i = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (int k = 0; k < kBatch; ++k, ++i) tl.get()->Complete(track, "allreduce", i, i + 1000, i);
    state.ResumeTiming();
    if (!tl.get()->Flush().ok()) abort();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["dropped"] = static_cast<double>(tl.get()->dropped());
}
BENCHMARK(BM_WriterDrain)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace braid::sched

BRAID_BENCHMARK_MAIN("timeline_bench",
                     "What one timeline record call costs the recording thread when the timeline "
                     "is off, on, and on with a full queue.");
