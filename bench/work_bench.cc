// Google Benchmark suite for Work (the collective future) and the local backend's issue path.
//
//   tools/bazelw run //bench:work_bench -- --benchmark_min_time=0.2
//
// Baselines inside the suite: BM_SharedPtrAlloc (the allocation every Work costs at least) and
// BM_CondvarPingPong vs BM_SpinPingPong (a sleeping vs a busy-polling cross-thread hand-off,
// which is what Wait() chooses between).
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "bench/gbench_main.h"
#include "benchmark/benchmark.h"
#include "comm/backend.h"
#include "comm/spin.h"
#include "comm/work.h"

namespace braid {
namespace {

WorkInfo Info() { return WorkInfo{"world", "allreduce", 0, ""}; }

void BM_SharedPtrAlloc(benchmark::State& state) {
  for (auto _ : state) {
    auto p = std::make_shared<std::pair<int64_t, int64_t>>();
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_SharedPtrAlloc);

void BM_WorkCreateComplete(benchmark::State& state) {
  for (auto _ : state) {
    WorkPtr w = Work::Create(Info());
    w->Complete(absl::OkStatus());
    benchmark::DoNotOptimize(w->Done());
  }
}
BENCHMARK(BM_WorkCreateComplete);

void BM_WorkCallbackThenComplete(benchmark::State& state) {
  int64_t calls = 0;
  for (auto _ : state) {
    WorkPtr w = Work::Create(Info());
    w->OnComplete([&calls](const absl::Status&) { ++calls; });
    w->Complete(absl::OkStatus());
  }
  benchmark::DoNotOptimize(calls);
}
BENCHMARK(BM_WorkCallbackThenComplete);

void BM_WorkWaitAlreadyDone(benchmark::State& state) {
  WorkPtr w = Work::Completed(Info(), absl::OkStatus());
  for (auto _ : state) benchmark::DoNotOptimize(w->Wait(absl::Seconds(1)).ok());
}
BENCHMARK(BM_WorkWaitAlreadyDone);

// Round trip: this thread completes a Work the peer waits on, then waits on the peer's.
void WorkPingPong(benchmark::State& state, absl::Duration spin) {
  std::atomic<WorkPtr*> to_peer{nullptr}, to_me{nullptr};
  std::atomic<bool> stop{false};
  std::thread peer([&] {
    while (!stop.load()) {
      WorkPtr* w = to_peer.exchange(nullptr);
      if (w == nullptr) {
        CpuRelax();
        continue;
      }
      (*w)->Complete(absl::OkStatus());
    }
  });
  for (auto _ : state) {
    WorkPtr w = Work::Create(Info(), spin);
    to_peer.store(&w);
    benchmark::DoNotOptimize(w->Wait(absl::Seconds(10)).ok());
  }
  stop.store(true);
  peer.join();
}
void BM_WorkCrossThreadSpinWait(benchmark::State& state) {
  WorkPingPong(state, absl::Microseconds(50));
}
void BM_WorkCrossThreadSleepWait(benchmark::State& state) {
  WorkPingPong(state, absl::ZeroDuration());
}
BENCHMARK(BM_WorkCrossThreadSpinWait)->UseRealTime();
BENCHMARK(BM_WorkCrossThreadSleepWait)->UseRealTime();

void BM_CondvarPingPong(benchmark::State& state) {
  std::mutex mu;
  std::condition_variable cv;
  int turn = 0;
  bool stop = false;
  std::thread peer([&] {
    std::unique_lock<std::mutex> l(mu);
    while (true) {
      cv.wait(l, [&] { return turn == 1 || stop; });
      if (stop) return;
      turn = 0;
      cv.notify_all();
    }
  });
  for (auto _ : state) {
    std::unique_lock<std::mutex> l(mu);
    turn = 1;
    cv.notify_all();
    cv.wait(l, [&] { return turn == 0; });
  }
  {
    std::lock_guard<std::mutex> l(mu);
    stop = true;
  }
  cv.notify_all();
  peer.join();
}
BENCHMARK(BM_CondvarPingPong)->UseRealTime();

void BM_SpinPingPong(benchmark::State& state) {
  std::atomic<int> turn{0};
  std::atomic<bool> stop{false};
  std::thread peer([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      if (turn.load(std::memory_order_acquire) == 1)
        turn.store(0, std::memory_order_release);
      else
        CpuRelax();
    }
  });
  for (auto _ : state) {
    turn.store(1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 0) CpuRelax();
  }
  stop.store(true);
  peer.join();
}
BENCHMARK(BM_SpinPingPong)->UseRealTime();

// Issue + wait of an 8-byte all-reduce on a 1-rank local world (the backend's fixed cost:
// validation, Work, worker hand-off).
void BM_LocalAllReduce8BOneRank(benchmark::State& state) {
  Options o;
  o.local_ranks = 1;
  auto backend = CreateBackend(o);
  auto g = (*backend)->WorldGroup(0);
  double x = 1;
  for (auto _ : state) {
    auto w = (*g)->AllReduce(&x, &x, 1, DType::kF64, ReduceOp::Sum());
    benchmark::DoNotOptimize((*w)->Wait(absl::Seconds(10)).ok());
  }
}
BENCHMARK(BM_LocalAllReduce8BOneRank)->UseRealTime();

}  // namespace
}  // namespace braid

BRAID_BENCHMARK_MAIN("work_bench",
                     "Work (the collective future) and the local backend's issue path: allocation, "
                     "sleeping vs busy-polling hand-off.");
