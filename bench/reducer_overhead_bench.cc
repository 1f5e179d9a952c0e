// Google Benchmark suite for the gradient reducer's hot path: what MarkReady -> bucket launch
// costs per parameter, and how many heap allocations one steady-state backward makes.
//
//   tools/bazelw run //bench:reducer_overhead_bench -- --benchmark_min_time=0.5
//
// Every case runs on a 1-rank `local` world (no peer to wait for) with a model of `params`
// small f32 parameters (64 elements, 256 B) packed into `buckets` equal buckets, and times one
// iteration = BeginBackward + one MarkReady per parameter (reverse registration order, the
// order a backward produces them) + FinishBackward.
//
// Counters (all per iteration unless named per mark):
//   time_per_mark      wall time of the whole iteration / params (printed in seconds: "310n"
//                      is 310 ns). The target is < 0.5 us.
//   begin_ns, marks_ns, finish_ns
//                      wall time of the three phases (marks_ns covers all the MarkReady calls,
//                      including the bucket launches they trigger; finish_ns is mostly waiting
//                      for the last bucket's collective on the backend's worker thread).
//   allocs_per_iter    global operator new calls on every thread (this binary replaces
//                      operator new/delete with a counting wrapper; target: 0). malloc() called
//                      directly (e.g. std::aligned_alloc) is not counted, and none happens in
//                      the steady state.
//   alloc_bytes_per_iter
//   allocs_begin, allocs_marks, allocs_finish
//                      the calling thread's operator new calls in each phase (a thread-local
//                      counter); allocs_other_threads = the rest (the backend's worker thread,
//                      which runs the collectives and the reducer's completion callbacks).
//
// Baselines, with the same counters:
//   BM_BaselineAtomicDecrement  one relaxed atomic decrement per parameter on its bucket's
//                               pending counter: the floor of any readiness counting.
//   BM_BaselineBookkeeping      the reducer's bookkeeping without Braid: id -> index hash
//                               lookup, a marked-flag exchange, the bucket's pending decrement,
//                               and a mutex-guarded launch cursor when a bucket completes (no
//                               collective is launched).
//   BM_DirectBucketAllReduce    the same bucket all-reduces issued straight on the group and
//                               waited for: the communication floor under BM_ReducerSync.
//   BM_ReducerNoSync            a kNoSync backward: MarkReady's checks with no launch at all.
// So: reducer overhead per mark ~ (BM_ReducerSync - BM_DirectBucketAllReduce) / params.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "bench/alloc_counter.h"
#include "bench/gbench_main.h"
#include "benchmark/benchmark.h"
#include "comm/backend.h"
#include "comm/status_macros.h"
#include "scheduler/divide.h"
#include "scheduler/gradient_reducer.h"

namespace braid::sched {
namespace {

constexpr size_t kElemsPerParam = 64;  // 256 B of f32: the collective's data cost stays small

using Clock = std::chrono::steady_clock;

int64_t NsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// Per-iteration sums of the phase timings and allocation counts, turned into counters at the
// end. The six clock reads per iteration cost ~0.1-0.2 ns per mark at 1000 marks.
struct PhaseTotals {
  int64_t begin_ns = 0, marks_ns = 0, finish_ns = 0;
  uint64_t allocs_begin = 0, allocs_marks = 0, allocs_finish = 0;
  uint64_t allocs_all = 0, alloc_bytes = 0;
};

// Allocation counts across a timed loop: all threads, and per phase on the calling thread.
class AllocWindow {
 public:
  AllocWindow() : all0_(alloc_counter::Allocs()), bytes0_(alloc_counter::AllocBytes()) {}
  void Close(PhaseTotals* t) const {
    t->allocs_all = alloc_counter::Allocs() - all0_;
    t->alloc_bytes = alloc_counter::AllocBytes() - bytes0_;
  }

 private:
  uint64_t all0_, bytes0_;
};

void ReportCounters(benchmark::State& state, int64_t marks, const PhaseTotals& t, bool phases) {
  using benchmark::Counter;
  state.counters["time_per_mark"] =
      Counter(static_cast<double>(marks), Counter::kIsIterationInvariantRate | Counter::kInvert);
  state.counters["allocs_per_iter"] =
      Counter(static_cast<double>(t.allocs_all), Counter::kAvgIterations);
  state.counters["alloc_bytes_per_iter"] =
      Counter(static_cast<double>(t.alloc_bytes), Counter::kAvgIterations);
  if (!phases) return;
  state.counters["begin_ns"] = Counter(static_cast<double>(t.begin_ns), Counter::kAvgIterations);
  state.counters["marks_ns"] = Counter(static_cast<double>(t.marks_ns), Counter::kAvgIterations);
  state.counters["finish_ns"] = Counter(static_cast<double>(t.finish_ns), Counter::kAvgIterations);
  state.counters["allocs_begin"] =
      Counter(static_cast<double>(t.allocs_begin), Counter::kAvgIterations);
  state.counters["allocs_marks"] =
      Counter(static_cast<double>(t.allocs_marks), Counter::kAvgIterations);
  state.counters["allocs_finish"] =
      Counter(static_cast<double>(t.allocs_finish), Counter::kAvgIterations);
  const uint64_t mine = t.allocs_begin + t.allocs_marks + t.allocs_finish;
  state.counters["allocs_other_threads"] =
      Counter(t.allocs_all >= mine ? static_cast<double>(t.allocs_all - mine) : 0.0,
              Counter::kAvgIterations);
}

// A 1-rank local world and a reducer over `params` x 64-element f32 parameters in `buckets`
// equal buckets (ids 0..params-1, registration order).
class OneRankReducer {
 public:
  static absl::StatusOr<std::unique_ptr<OneRankReducer>> Create(int params, int buckets) {
    auto r = std::unique_ptr<OneRankReducer>(new OneRankReducer());
    Options o;
    o.backend = "local";
    o.local_ranks = 1;
    ASSIGN_OR_RETURN(r->backend_, CreateBackend(o));
    ASSIGN_OR_RETURN(r->world_, r->backend_->WorldGroup(0));
    std::vector<ParamSpec> specs;
    specs.reserve(params);
    for (int i = 0; i < params; ++i) {
      specs.push_back(
          ParamSpec{i, kElemsPerParam, DType::kF32, Device::Cpu(), absl::StrCat("p", i)});
    }
    const int per_bucket = (params + buckets - 1) / buckets;
    ReducerConfig cfg;
    cfg.bucket_cap_bytes = static_cast<size_t>(per_bucket) * kElemsPerParam * sizeof(float);
    cfg.first_bucket_cap_bytes = cfg.bucket_cap_bytes;
    ASSIGN_OR_RETURN(r->reducer_,
                     GradientReducer::Create(std::move(specs), {r->world_.get(), nullptr}, cfg));
    return r;
  }

  GradientReducer& reducer() { return *reducer_; }
  Group& world() { return *world_; }

 private:
  OneRankReducer() = default;
  std::unique_ptr<Backend> backend_;
  // Destroyed in reverse: the reducer (waits for nothing in flight), then the group.
  std::unique_ptr<Group> world_;
  std::unique_ptr<GradientReducer> reducer_;
};

// One backward: BeginBackward(mode), MarkReady(params-1 .. 0), FinishBackward.
absl::Status Backward(GradientReducer& r, SyncMode mode, int params, PhaseTotals* t) {
  auto t0 = Clock::now();
  uint64_t a0 = alloc_counter::ThreadAllocs();
  RETURN_IF_ERROR(r.BeginBackward(mode));
  t->begin_ns += NsSince(t0);
  t->allocs_begin += alloc_counter::ThreadAllocs() - a0;

  t0 = Clock::now();
  a0 = alloc_counter::ThreadAllocs();
  for (int64_t id = params - 1; id >= 0; --id) RETURN_IF_ERROR(r.MarkReady(id));
  t->marks_ns += NsSince(t0);
  t->allocs_marks += alloc_counter::ThreadAllocs() - a0;

  t0 = Clock::now();
  a0 = alloc_counter::ThreadAllocs();
  RETURN_IF_ERROR(r.FinishBackward());
  t->finish_ns += NsSince(t0);
  t->allocs_finish += alloc_counter::ThreadAllocs() - a0;
  return absl::OkStatus();
}

void ReducerCase(benchmark::State& state, SyncMode mode) {
  const int params = static_cast<int>(state.range(0));
  const int buckets = static_cast<int>(state.range(1));
  auto setup = OneRankReducer::Create(params, buckets);
  if (!setup.ok()) {
    state.SkipWithError(setup.status().ToString().c_str());
    return;
  }
  GradientReducer& r = (*setup)->reducer();
  // Warm-up outside the timed loop: first-use allocations (queues, thread-locals) settle here.
  PhaseTotals scratch;
  for (int i = 0; i < 3; ++i) {
    absl::Status s = Backward(r, mode, params, &scratch);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  PhaseTotals t;
  AllocWindow window;
  for (auto _ : state) {
    absl::Status s = Backward(r, mode, params, &t);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
  }
  window.Close(&t);
  state.counters["buckets"] = static_cast<double>(r.plan().buckets().size());
  ReportCounters(state, params, t, /*phases=*/true);
}

void BM_ReducerSync(benchmark::State& state) { ReducerCase(state, SyncMode::kSync); }
void BM_ReducerNoSync(benchmark::State& state) { ReducerCase(state, SyncMode::kNoSync); }

// The buckets' all-reduces issued directly (the reducer's collective calls with nothing around
// them): per iteration, one AllReduce per bucket on its flat storage, then wait for all.
void BM_DirectBucketAllReduce(benchmark::State& state) {
  const int params = static_cast<int>(state.range(0));
  const int buckets = static_cast<int>(state.range(1));
  auto setup = OneRankReducer::Create(params, buckets);
  if (!setup.ok()) {
    state.SkipWithError(setup.status().ToString().c_str());
    return;
  }
  GradientReducer& r = (*setup)->reducer();
  Group& g = (*setup)->world();
  std::vector<TensorView> views;  // in all-reduce mode a bucket's shard is the whole bucket
  for (int b = 0; b < static_cast<int>(r.plan().buckets().size()); ++b) {
    views.push_back(r.ShardView(b));
    views.back().count = r.plan().buckets()[b].count;  // what the reducer reduces
  }
  const ReduceOp op = StepFor(DType::kF32, g.size()).op;
  std::vector<WorkPtr> works(views.size());
  PhaseTotals t;
  AllocWindow window;
  for (auto _ : state) {
    for (size_t b = 0; b < views.size(); ++b) {
      auto w = g.AllReduce(views[b].data, views[b].data, views[b].count, DType::kF32, op);
      if (!w.ok()) {
        state.SkipWithError(w.status().ToString().c_str());
        return;
      }
      works[b] = std::move(*w);
    }
    for (WorkPtr& w : works) {
      absl::Status s = w->Wait(absl::Seconds(30));
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        return;
      }
    }
  }
  window.Close(&t);
  state.counters["buckets"] = static_cast<double>(views.size());
  ReportCounters(state, params, t, /*phases=*/false);
}

// Floor: one atomic decrement per parameter (counters reset per iteration, as BeginBackward
// resets the reducer's).
void BM_BaselineAtomicDecrement(benchmark::State& state) {
  const int params = static_cast<int>(state.range(0));
  const int buckets = static_cast<int>(state.range(1));
  const int per_bucket = (params + buckets - 1) / buckets;
  std::unique_ptr<std::atomic<int>[]> pending(new std::atomic<int>[buckets]);
  int64_t completed = 0;
  PhaseTotals t;
  AllocWindow window;
  for (auto _ : state) {
    for (int b = 0; b < buckets; ++b)
      pending[b].store(std::min(per_bucket, params - b * per_bucket), std::memory_order_relaxed);
    for (int i = params - 1; i >= 0; --i) {
      // Bucket 0 holds the last parameters, as the reducer's reverse-order plan does.
      const int b = (params - 1 - i) / per_bucket;
      if (pending[b].fetch_sub(1, std::memory_order_acq_rel) == 1) ++completed;
    }
  }
  benchmark::DoNotOptimize(completed);
  window.Close(&t);
  ReportCounters(state, params, t, /*phases=*/false);
}

// The reducer's bookkeeping by hand, with no collective launched.
void BM_BaselineBookkeeping(benchmark::State& state) {
  const int params = static_cast<int>(state.range(0));
  const int buckets = static_cast<int>(state.range(1));
  const int per_bucket = (params + buckets - 1) / buckets;
  absl::flat_hash_map<int64_t, int> index;
  std::vector<int> bucket_of(params);
  for (int i = 0; i < params; ++i) {
    index[i] = i;
    bucket_of[i] = (params - 1 - i) / per_bucket;
  }
  std::unique_ptr<std::atomic<uint8_t>[]> marked(new std::atomic<uint8_t>[params]);
  std::unique_ptr<std::atomic<int>[]> pending(new std::atomic<int>[buckets]);
  std::vector<uint8_t> ready(buckets);
  std::mutex mu;
  int cursor = 0;
  int64_t launched = 0;
  PhaseTotals t;
  AllocWindow window;
  for (auto _ : state) {
    for (int i = 0; i < params; ++i) marked[i].store(0, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu);
      cursor = 0;
      for (int b = 0; b < buckets; ++b) {
        pending[b].store(std::min(per_bucket, params - b * per_bucket), std::memory_order_relaxed);
        ready[b] = 0;
      }
    }
    for (int64_t id = params - 1; id >= 0; --id) {
      auto it = index.find(id);
      if (it == index.end()) std::abort();
      const int i = it->second;
      if (marked[i].exchange(1, std::memory_order_acq_rel) != 0) std::abort();
      const int b = bucket_of[i];
      if (pending[b].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      std::lock_guard<std::mutex> lock(mu);
      ready[b] = 1;
      while (cursor < buckets && ready[cursor]) {
        ++cursor;
        ++launched;  // the reducer would issue the bucket's collective here
      }
    }
  }
  benchmark::DoNotOptimize(launched);
  window.Close(&t);
  ReportCounters(state, params, t, /*phases=*/false);
}

// {params, buckets}: 1000 parameters in 1, 4 and 16 buckets, and a 100-parameter model.
void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"params", "buckets"});
  b->Args({1000, 1})->Args({1000, 4})->Args({1000, 16})->Args({100, 4});
}

BENCHMARK(BM_BaselineAtomicDecrement)->Apply(Shapes)->UseRealTime();
BENCHMARK(BM_BaselineBookkeeping)->Apply(Shapes)->UseRealTime();
BENCHMARK(BM_ReducerNoSync)->Apply(Shapes)->UseRealTime();
BENCHMARK(BM_DirectBucketAllReduce)->Apply(Shapes)->UseRealTime();
BENCHMARK(BM_ReducerSync)->Apply(Shapes)->UseRealTime();

}  // namespace
}  // namespace braid::sched

BRAID_BENCHMARK_MAIN("reducer_overhead_bench",
                     "The gradient reducer's hot path: MarkReady -> bucket launch cost per "
                     "parameter, heap allocations per backward.");
