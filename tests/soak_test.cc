// Randomized soak: many short runs, each drawn from a seed, each step checked bit for bit
// against a serial reference.
//  - reducer rounds (tests/reducer_reference.h RunScenario): mode all-reduce / reduce-scatter /
//    hybrid, world 1-4 or a 2x2 / 2x4 mesh, f32 / bf16 / f16 / mixed gradients, an
//    accumulation schedule of no_sync / reduce_scatter_only microbatches ending in sync,
//    framework-owned or bucket-view gradients, f32 reduction of half gradients; every rank
//    marks in its own random order from two threads; 2 steps per round.
//  - optimizer rounds (tests/optim/optimizer_harness.h CheckAgainstReference): AdamW or SGD,
//    random parameter sizes and bucket caps, f32 / bf16 / f16 models, world 1/2/4 or a 2x2
//    mesh, overlap on/off, clipping, skip_nonfinite with an inf or NaN step, accumulation.
//  - fully sharded rounds (tests/soak_fsdp_round.cc): units in random membership and forward
//    order, prefetch depths and live-bytes limits, checked at every forward.
//  - re-plan rounds (tests/soak_replan_round.cc): DDP's rebuild and Replan to random caps
//    under an optimizer, at random step boundaries.
//  - offload rounds (tests/soak_offload_round.cc): optimizer state on the host, parameters on
//    the nccl backend's fake device.
//  The optimizer-side rounds all draw clipping and skip_nonfinite (tests/soak_rounds.h).
//
//   bazel-bin/tests/soak_test [--steps=N] [--seed=S]     (defaults: 200 steps, seed 1)
//   bazel-bin/tests/soak_test --round=fsdp:<round seed>  (one round again, as a failure names it)
//
// A failure names its round's kind and seed ("fsdp round seed 123: ..."); --round replays
// that round alone. docs/hardening.md records the long runs.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/optim/optimizer_harness.h"
#include "tests/reducer_reference.h"
#include "tests/soak_rounds.h"

namespace braid::testing {
namespace {

struct SoakFlags {
  int64_t steps = 200;
  uint64_t seed = 1;
  std::string round;  // --round=KIND:SEED: only that round
};

// --steps=N and --seed=S from the command line (gtest keeps the arguments it does not know).
SoakFlags ParseFlags() {
  SoakFlags f;
  for (const std::string& a : ::testing::internal::GetArgvs()) {
    if (a.rfind("--steps=", 0) == 0) f.steps = std::strtoll(a.c_str() + 8, nullptr, 10);
    if (a.rfind("--seed=", 0) == 0) f.seed = std::strtoull(a.c_str() + 7, nullptr, 10);
    if (a.rfind("--round=", 0) == 0) f.round = a.substr(8);
  }
  return f;
}

double Grad(int r, int p, int m, int s, size_t i) {
  uint64_t z =
      ((((static_cast<uint64_t>(r) * 131 + p) * 17 + m) * 7 + s) << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

std::string Schedule(std::mt19937_64& rng, bool hybrid) {
  std::string s;
  for (int k = static_cast<int>(rng() % 3); k > 0; --k) s += (hybrid && rng() % 2) ? 'R' : 'N';
  return s + 'S';
}

// One reducer round: 2 steps.
int ReducerRound(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string schedule;  // sc.schedule points into it; RunScenario returns before it goes
  sched::reference::Scenario sc{};
  const int mode = static_cast<int>(rng() % 3);
  sc.mode = mode == 0   ? sched::ReduceMode::kAllReduce
            : mode == 1 ? sched::ReduceMode::kReduceScatter
                        : sched::ReduceMode::kHybrid;
  if (mode == 2) {
    sc.replicas = 2;
    sc.shards = rng() % 2 ? 2 : 4;
  } else {
    sc.replicas = 1;
    sc.shards = 1 + static_cast<int>(rng() % 4);
  }
  sc.dtypes = static_cast<int>(rng() % 4);
  schedule = Schedule(rng, mode == 2);
  sc.schedule = schedule.c_str();
  sc.copy_in = mode == 0 && rng() % 3 == 0;
  sc.reduce_f32 = rng() % 3 == 0;
  // Named in the failure itself: the rank threads do not see a SCOPED_TRACE of this thread.
  const std::string what =
      absl::StrCat("reducer round seed ", seed, ": ", sched::reference::ScenarioName(sc));
  RunRanks(sc.replicas * sc.shards, [&](Group& world) {
    const absl::Status st = sched::reference::RunScenario(world, sc, Grad, absl::Seconds(60));
    EXPECT_TRUE(st.ok()) << what << ": " << st;
  });
  return 2;
}

// One optimizer round: 2-3 steps.
int OptimizerRound(uint64_t seed) {
  std::mt19937_64 rng(seed);
  static const int kMeshes[][2] = {{1, 1}, {1, 2}, {1, 4}, {2, 2}};
  const auto& mesh = kMeshes[rng() % 4];
  optim::testing::OptScenario s = optim::testing::TwoGroupScenario(mesh[0], mesh[1]);
  s.opt.kind = rng() % 3 == 0 ? optim::OptimizerKind::kSgd : optim::OptimizerKind::kAdamW;
  static const DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  s.dtype = kDtypes[rng() % 3];
  for (size_t& c : s.counts) c = 1 + rng() % 300;
  s.bucket_cap_bytes = size_t{256} << (rng() % 5);
  s.steps = 2 + static_cast<int>(rng() % 2);
  s.opt.overlap = rng() % 4 != 0;
  if (rng() % 3 == 0) s.opt.max_grad_norm = 0.5;
  if (rng() % 4 == 0) {
    s.opt.skip_nonfinite = true;
    s.inf_step = static_cast<int>(rng() % s.steps);
    if (rng() % 2) s.bad_value = std::numeric_limits<float>::quiet_NaN();
  }
  s.schedule.clear();
  for (char c : Schedule(rng, s.replicas > 1)) {
    s.schedule.push_back(c == 'S'   ? optim::testing::SyncMode::kSync
                         : c == 'R' ? optim::testing::SyncMode::kReduceScatterOnly
                                    : optim::testing::SyncMode::kNoSync);
  }
  const std::string what = absl::StrCat("optimizer round seed ", seed, ": ", DescribeOptimizer(s));
  RunRanks(s.replicas * s.shards, [&](Group& world) {
    const absl::Status st = optim::testing::CheckAgainstReference(world, s);
    EXPECT_TRUE(st.ok()) << what << ": " << st;
  });
  return s.steps;
}

struct RoundKind {
  const char* name;  // as failures name it: "<name> round seed <seed>"
  int (*run)(uint64_t seed);
};
const std::array<RoundKind, 5> kRounds = {{{"reducer", &ReducerRound},
                                           {"optimizer", &OptimizerRound},
                                           {"fsdp", &FsdpRound},
                                           {"replan", &ReplanRound},
                                           {"offload", &OffloadRound}}};

TEST(Soak, RandomScenariosMatchTheSerialReferences) {
  const SoakFlags flags = ParseFlags();
  if (!flags.round.empty()) {
    const size_t colon = flags.round.find(':');
    for (const RoundKind& k : kRounds) {
      if (colon != std::string::npos && flags.round.compare(0, colon, k.name) == 0) {
        const uint64_t seed = std::strtoull(flags.round.c_str() + colon + 1, nullptr, 10);
        std::printf("soak: %s round seed %llu: %d steps checked\n", k.name,
                    static_cast<unsigned long long>(seed), k.run(seed));
        return;
      }
    }
    FAIL() << "--round=" << flags.round << ": expected KIND:SEED, KIND one of reducer, "
           << "optimizer, fsdp, replan, offload";
  }
  std::printf("soak: --steps=%lld --seed=%llu\n", static_cast<long long>(flags.steps),
              static_cast<unsigned long long>(flags.seed));
  std::mt19937_64 rng(flags.seed);
  int64_t steps = 0;
  int rounds = 0;
  const absl::Time start = absl::Now();
  while (steps < flags.steps && !::testing::Test::HasFailure()) {
    const uint64_t seed = rng();
    steps += kRounds[rounds % kRounds.size()].run(seed);
    ++rounds;
  }
  std::printf("soak: seed %llu: %d rounds, %lld steps checked in %s\n",
              static_cast<unsigned long long>(flags.seed), rounds, static_cast<long long>(steps),
              absl::FormatDuration(absl::Now() - start).c_str());
}

}  // namespace
}  // namespace braid::testing
