// Time from a failure on one rank to the error on every other rank (issue 13 item 4), on the
// `local` backend with the default deadline (300 s), over repeated trials in one run. The `mpi`
// figures come from tests/mpi_abort_test.sh (one abort per MPI job), the nccl ones (fake
// device) from tests/nccl/nccl_abort_test.
//
//   tools/bazelw run //bench:abort_latency -- --trials=50
//
// Scenarios, each on a 2x2 mesh (shard groups {0,1} {2,3}, replica groups {0,2} {1,3}):
//   abort_job   rank 3 calls AbortJob; ranks 0-2 are blocked in a world all-reduce.
//   collective  rank 1 fails inside a shard all-reduce (fault injection); ranks 2 and 3 wait in a
//               replica all-reduce that ranks 0 and 1 never join.
//   deadline    rank 1 stalls; rank 0's shard all-reduce has a 100 ms per-call deadline; ranks
//               2 and 3 wait in a replica all-reduce. Reported: time after the 100 ms deadline.
// Without the abort domain every waiting rank would stop only at its own deadline (300 s).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "backends/local/local_backend.h"
#include "bench/bench_flags.h"
#include "comm/backend.h"

namespace braid {
namespace {

constexpr int kRanks = 4;

// One trial; returns the slowest waiting rank's time from the failure to its error (ms), or -1.
double Trial(const std::string& scenario) {
  Options o;
  o.backend = "local";
  o.local_ranks = kRanks;  // default deadline: 300 s
  auto backend = CreateBackend(o);
  if (!backend.ok()) return -1;
  auto* local = static_cast<local::LocalBackend*>(backend->get());
  std::vector<std::unique_ptr<Group>> worlds(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    auto w = (*backend)->WorldGroup(r);
    if (!w.ok()) return -1;
    worlds[r] = std::move(*w);
  }
  std::atomic<int64_t> failure_ns{0};
  std::atomic<int64_t> worst_ns{0};
  std::atomic<bool> bad{false};
  if (scenario == "collective") local->faults().FailRank(1, 0, "world/shard", "injected");
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      Group& world = *worlds[r];
      auto shard = world.Split(r / 2, r, "world/shard");
      auto replica = world.Split(r % 2, r, "world/replica");
      if (!shard.ok() || !replica.ok()) {
        bad = true;
        return;
      }
      float buf[64] = {};
      auto wait = [](absl::StatusOr<WorkPtr> w) {
        return w.ok() ? (*w)->Wait(absl::Seconds(400)) : w.status();
      };
      if (!wait(world.Barrier()).ok()) {
        bad = true;
        return;
      }
      bool waiter = false;
      absl::Status s;
      if (scenario == "abort_job") {
        if (r == 3) {
          absl::SleepFor(absl::Milliseconds(20));
          failure_ns = absl::GetCurrentTimeNanos();
          (void)world.AbortJob(absl::InternalError("bench"));
          return;
        }
        waiter = true;
        s = wait(world.AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum()));
      } else if (scenario == "collective") {
        if (r < 2) {
          s = wait((*shard)->AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum()));
          if (r == 1) failure_ns = absl::GetCurrentTimeNanos();  // upper bound of the failure
          return;
        }
        waiter = true;
        s = wait((*replica)->AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum()));
      } else {  // deadline
        if (r == 1) {
          while (!world.abort_domain()->aborted()) absl::SleepFor(absl::Milliseconds(1));
          return;
        }
        if (r == 0) {
          CollectiveOptions co;
          co.timeout = absl::Milliseconds(100);
          s = wait((*shard)->AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum(), co));
          failure_ns = absl::GetCurrentTimeNanos();
          return;
        }
        waiter = true;
        s = wait((*replica)->AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum()));
      }
      if (!waiter) return;
      if (s.ok()) bad = true;
      const int64_t now = absl::GetCurrentTimeNanos();
      for (int64_t cur = worst_ns.load(); now > cur && !worst_ns.compare_exchange_weak(cur, now);) {
      }
    });
  }
  for (auto& t : threads) t.join();
  if (bad || failure_ns == 0) return -1;
  // The collective scenario's failure time is taken when rank 1's own wait returns, which can
  // come after a waiter's: clamp at 0.
  return std::max<double>(0.0, (worst_ns.load() - failure_ns.load()) / 1e6);
}

int Main(int trials) {
  std::printf("# local backend, %d ranks (threads), default deadline 300 s, %d trials each\n",
              kRanks, trials);
  std::printf("%-12s %10s %10s %10s %8s\n", "scenario", "median_ms", "p90_ms", "max_ms", "failed");
  for (const std::string scenario : {"abort_job", "collective", "deadline"}) {
    std::vector<double> ms;
    int failed = 0;
    for (int t = 0; t < trials; ++t) {
      const double v = Trial(scenario);
      if (v < 0) {
        ++failed;
      } else {
        ms.push_back(v);
      }
    }
    std::sort(ms.begin(), ms.end());
    auto at = [&](double q) {
      return ms.empty() ? -1.0 : ms[static_cast<size_t>(q * (ms.size() - 1))];
    };
    std::printf("%-12s %10.3f %10.3f %10.3f %8d\n", scenario.c_str(), at(0.5), at(0.9),
                ms.empty() ? -1.0 : ms.back(), failed);
  }
  return 0;
}

}  // namespace
}  // namespace braid

constexpr char kUsage[] =
    R"(abort_latency: time from a failure on one rank to the error on every other rank
(abort_job, collective, deadline scenarios on a 2x2 mesh of the local backend).

usage: abort_latency [--trials=N]
  --trials=30   trials per scenario (>= 1)
)";

int main(int argc, char** argv) {
  auto flags = braid::bench::Flags::Parse(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", flags.status().ToString().c_str());
    return 2;
  }
  if (braid::bench::PrintHelp(*flags, kUsage)) return 0;
  auto trials = flags->Int("trials", 30);
  if (!trials.ok() || *trials < 1 || !flags->Unused().empty()) {
    std::fprintf(stderr, "usage: abort_latency [--trials=N (>= 1)]\n");
    return 2;
  }
  return braid::Main(static_cast<int>(*trials));
}
