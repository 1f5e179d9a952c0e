// Communication hook state through checkpoints (CommHook::SaveState / LoadState): PowerSGD
// (error feedback, warm-start Q, step counts; saved inside and after the uncompressed warm-up)
// and int8 (error feedback) on an all-reduce reducer at 2 local ranks: a run saved after step k
// and resumed in a fresh reducer with a fresh hook gives, bit for bit, the reduced gradients of
// the uninterrupted run, while a fresh hook without the state does not. Another hook's, rank's
// or plan's state is refused by name.
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/hooks/int8.h"
#include "scheduler/hooks/powersgd.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

constexpr int kSteps = 7;
const int64_t kRows[] = {16, 12, 16, 10, 10, 3};
const int64_t kCols[] = {12, 1, 12, 40, 1, 3};

std::vector<ParamSpec> Params() {
  std::vector<ParamSpec> p;
  for (int i = 0; i < 6; ++i) {
    p.push_back(ParamSpec{static_cast<ParamId>(i + 1), static_cast<size_t>(kRows[i] * kCols[i]),
                          DType::kF32, Device::Cpu(), absl::StrCat("p", i)});
  }
  return p;
}

ReducerConfig Config() {
  ReducerConfig cfg;
  cfg.mode = ReduceMode::kAllReduce;
  cfg.first_bucket_cap_bytes = 512;
  cfg.bucket_cap_bytes = 2048;
  cfg.timeout = absl::Seconds(30);
  return cfg;
}

float Grad(int r, int i, size_t j, int step) {
  std::mt19937 gen(static_cast<uint32_t>(((r * 31 + i) * 1009 + j) * 7 + step));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  return u(gen) * (1.0f + static_cast<float>(i));
}

using Hook = std::function<absl::StatusOr<std::shared_ptr<CommHook>>()>;

Hook PowerSGD() {
  return [] {
    PowerSGDOptions o;
    o.rank = 2;
    o.start_iter = 2;
    o.random_seed = 7;
    o.rows.assign(std::begin(kRows), std::end(kRows));
    return MakePowerSGDHook(o);
  };
}
Hook Int8() {
  return [] { return MakeInt8Hook({/*block=*/64}); };
}

// A reducer with a fresh hook; steps [from, to) appended to `out` (every parameter's reduced
// gradient, step after step); `bytes`: loaded first when non-null, saved at the end.
void RunSteps(Group& g, const Hook& make, int from, int to, const std::string* load,
              std::string* save, std::vector<std::vector<float>>* out) {
  auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config());
  ASSERT_TRUE(red.ok()) << red.status();
  auto hook = make();
  ASSERT_TRUE(hook.ok()) << hook.status();
  ASSERT_OK((*red)->SetCommHook(*hook));
  if (load != nullptr) ASSERT_OK((*hook)->LoadState(*load));
  const auto& params = (*red)->plan().params();
  for (int step = from; step < to; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      float* v = static_cast<float*>((*red)->GradView(params[i].id)->data);
      for (size_t j = 0; j < params[i].count; ++j)
        v[j] = Grad(g.rank(), static_cast<int>(i), j, step);
    }
    ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
    for (size_t i = params.size(); i-- > 0;) ASSERT_OK((*red)->MarkReady(params[i].id));
    ASSERT_OK((*red)->FinishBackward());
    std::vector<float> all;
    for (const ParamSpec& p : params) {
      const float* v = static_cast<const float*>((*red)->GradView(p.id)->data);
      all.insert(all.end(), v, v + p.count);
    }
    out->push_back(std::move(all));
    ASSERT_OK((*red)->ZeroGrads());
  }
  if (save != nullptr) {
    auto s = (*hook)->SaveState();
    ASSERT_TRUE(s.ok()) << s.status();
    *save = *std::move(s);
  }
}

void ExpectResumeIsExact(const Hook& make, int save_after) {
  RunRanks(2, [&](Group& g) {
    std::vector<std::vector<float>> whole, resumed, fresh;
    RunSteps(g, make, 0, kSteps, nullptr, nullptr, &whole);
    std::string bytes;
    RunSteps(g, make, 0, save_after, nullptr, &bytes, &resumed);
    EXPECT_FALSE(bytes.empty());
    RunSteps(g, make, save_after, kSteps, &bytes, nullptr, &resumed);
    RunSteps(g, make, save_after, kSteps, nullptr, nullptr, &fresh);
    ASSERT_EQ(resumed.size(), whole.size());
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_EQ(std::memcmp(resumed[s].data(), whole[s].data(), whole[s].size() * sizeof(float)), 0)
          << "rank " << g.rank() << ": step " << s << " after a save after step " << save_after;
    }
    // Without the state some later step differs (the test can fail).
    bool differs = false;
    for (int s = save_after; s < kSteps; ++s) {
      differs |= std::memcmp(fresh[s - save_after].data(), whole[s].data(),
                             whole[s].size() * sizeof(float)) != 0;
    }
    EXPECT_TRUE(differs) << "a fresh hook repeats the uninterrupted run";
  });
}

TEST(HookState, PowerSGDResumesBitForBit) {
  ExpectResumeIsExact(PowerSGD(), /*save_after=*/4);  // compressed: error and warm Q carried
}

TEST(HookState, PowerSGDResumesInsideItsWarmUp) {
  ExpectResumeIsExact(PowerSGD(), /*save_after=*/1);  // iter carried: step 2 compresses first
}

TEST(HookState, Int8ResumesBitForBit) { ExpectResumeIsExact(Int8(), /*save_after=*/3); }

TEST(HookState, ForeignStateIsRefusedByName) {
  RunRanks(2, [&](Group& g) {
    std::vector<std::vector<float>> out;
    std::string p, q;
    RunSteps(g, PowerSGD(), 0, 3, nullptr, &p, &out);
    RunSteps(g, Int8(), 0, 3, nullptr, &q, &out);
    auto hook = PowerSGD()();
    ASSERT_TRUE(hook.ok());
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config());
    ASSERT_TRUE(red.ok());
    ASSERT_OK((*red)->SetCommHook(*hook));
    ExpectError((*hook)->LoadState(q), absl::StatusCode::kFailedPrecondition,
                {"'int8' hook", "'powersgd'"});
    // Another rank's state: the rank it was saved by and this one.
    std::string other;
    RunSteps(g, PowerSGD(), 0, 3, nullptr, &other, &out);
    ExpectError((*hook)->LoadState("junk"), absl::StatusCode::kInvalidArgument,
                {"not a Braid comm hook state"});
    // Swap between the two ranks' threads: rank 1 loads rank 0's bytes (and the reverse).
    static std::string shared[2];
    shared[g.rank()] = other;
    ASSERT_OK(g.Barrier().value()->Wait(absl::Seconds(30)));
    ExpectError((*hook)->LoadState(shared[1 - g.rank()]), absl::StatusCode::kFailedPrecondition,
                {absl::StrCat("saved by rank ", 1 - g.rank(), " of 2"), "cannot be resharded"});
    ASSERT_OK(g.Barrier().value()->Wait(absl::Seconds(30)));
  });
}

}  // namespace
}  // namespace braid::sched
