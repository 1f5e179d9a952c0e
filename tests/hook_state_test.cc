// Communication hook state through checkpoints (CommHook::SaveState / LoadState): PowerSGD
// (error feedback, warm-start Q, step counts; saved inside and after the uncompressed warm-up)
// and int8 (error feedback) on an all-reduce reducer at 2 local ranks: a run saved after step k
// and resumed in a fresh reducer with a fresh hook gives, bit for bit, the reduced gradients of
// the uninterrupted run, while a fresh hook without the state does not. Another hook's, rank's
// or version's state is refused by name. State saved in another bucket layout with buckets of
// the same sizes (torch's rebuild on a resume) is never applied to the current buckets: it
// waits for the re-plan into its layout, or is dropped.
#include "scheduler/hooks/hook_state.h"

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
    // Version 1 (no bucket layout recorded): refused by its number.
    std::string v1 = "BRHS";
    const int64_t one = 1;
    v1.append(reinterpret_cast<const char*>(&one), sizeof one);
    v1 += other.substr(v1.size());
    ExpectError((*hook)->LoadState(v1), absl::StatusCode::kInvalidArgument,
                {"version 1", "reads version 2", "bucket layout"});
    // Swap between the two ranks' threads: rank 1 loads rank 0's bytes (and the reverse).
    static std::string shared[2];
    shared[g.rank()] = other;
    ASSERT_OK(g.Barrier().value()->Wait(absl::Seconds(30)));
    ExpectError((*hook)->LoadState(shared[1 - g.rank()]), absl::StatusCode::kFailedPrecondition,
                {absl::StrCat("saved by rank ", 1 - g.rank(), " of 2"), "cannot be resharded"});
    ASSERT_OK(g.Barrier().value()->Wait(absl::Seconds(30)));
  });
}

// ---- Another bucket layout ----------------------------------------------------------------
// Four 16 x 12 parameters, two per bucket. The first plan (reverse registration) is
// B = {p3, p2}, {p1, p0}; a first backward marking p0, p2, p1, p3 rebuilds it into
// A = {p0, p2}, {p1, p3}: bucket for bucket the same sizes, other parameters, so records of A
// fit B's buckets and only the layout's fingerprint tells them apart.
constexpr int kSquare = 4;
constexpr size_t kSquareCount = 16 * 12;
const int kOrderA[kSquare] = {0, 2, 1, 3};
using Results = std::vector<std::vector<float>>;

std::vector<ParamSpec> SquareParams() {
  std::vector<ParamSpec> p;
  for (int i = 0; i < kSquare; ++i) {
    p.push_back(ParamSpec{static_cast<ParamId>(i + 1), kSquareCount, DType::kF32, Device::Cpu(),
                          absl::StrCat("s", i)});
  }
  return p;
}

Hook SquarePowerSGD() {
  return [] {
    PowerSGDOptions o;
    o.rank = 2;
    o.start_iter = 2;
    o.random_seed = 7;
    o.rows.assign(kSquare, 16);
    return MakePowerSGDHook(o);
  };
}

std::unique_ptr<GradientReducer> SquareReducer(Group& g) {
  ReducerConfig cfg = Config();
  cfg.first_bucket_cap_bytes = cfg.bucket_cap_bytes = 2 * kSquareCount * sizeof(float);
  cfg.rebuild_bucket_order = true;
  auto red = GradientReducer::Create(SquareParams(), {&g, nullptr}, cfg);
  EXPECT_TRUE(red.ok()) << red.status();
  return red.ok() ? *std::move(red) : nullptr;
}

std::shared_ptr<CommHook> SetHook(GradientReducer& red, const Hook& make) {
  auto hook = make();
  EXPECT_TRUE(hook.ok()) << hook.status();
  EXPECT_OK(red.SetCommHook(*hook));
  return *hook;
}

// Step `step`'s gradients, marked in A's order; the reduced gradients appended to `out`.
void SquareStep(GradientReducer& red, int rank, int step, Results* out) {
  const auto& params = red.plan().params();
  for (int i = 0; i < kSquare; ++i) {
    float* v = static_cast<float*>(red.GradView(params[i].id)->data);
    for (size_t j = 0; j < kSquareCount; ++j) v[j] = Grad(rank, i, j, step);
  }
  ASSERT_OK(red.BeginBackward(SyncMode::kSync));
  for (int i : kOrderA) ASSERT_OK(red.MarkReady(params[i].id));
  ASSERT_OK(red.FinishBackward());
  std::vector<float> all;
  for (const ParamSpec& p : params) {
    const float* v = static_cast<const float*>(red.GradView(p.id)->data);
    all.insert(all.end(), v, v + p.count);
  }
  if (out != nullptr) out->push_back(std::move(all));
  ASSERT_OK(red.ZeroGrads());
}

// B -> A after a step (torch's one-time rebuild): other parameters in same-size buckets.
void RebuildIntoA(GradientReducer& red) {
  const uint64_t before = red.plan().Fingerprint();
  std::vector<size_t> sizes;
  for (const Bucket& b : red.plan().buckets()) sizes.push_back(b.padded_count);
  absl::StatusOr<bool> rebuilt = red.RebuildBucketsIfPending();
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  ASSERT_TRUE(*rebuilt);
  ASSERT_NE(red.plan().Fingerprint(), before);
  std::vector<size_t> after;
  for (const Bucket& b : red.plan().buckets()) after.push_back(b.padded_count);
  ASSERT_EQ(after, sizes);
  ASSERT_EQ(after.size(), 2u);
}

// `bytes` with the per-bucket records left out: the first `counters` fields (hook-wide) kept.
std::string WithoutBuckets(const std::string& bytes, const CommHook& hook, Group& g, int counters) {
  auto r = HookStateReader::Open(bytes, hook.name(), g.size(), g.rank());
  EXPECT_TRUE(r.ok()) << r.status();
  HookStateWriter w(hook.name(), g.size(), g.rank(), r->layout());
  for (int i = 0; i < counters; ++i) w.Int(r->Int().value());
  return w.Finish();
}

// Steps 0-3 (step 0 in B, the rebuild into A, steps 1-3 in A); the hook's state after them.
std::string SavedInA(Group& g, const Hook& make) {
  auto red = SquareReducer(g);
  auto hook = SetHook(*red, make);
  SquareStep(*red, g.rank(), 0, nullptr);
  RebuildIntoA(*red);
  for (int step = 1; step < 4; ++step) SquareStep(*red, g.rank(), step, nullptr);
  absl::StatusOr<std::string> bytes = hook->SaveState();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::string();
}

void ExpectSame(const Results& got, size_t from, const Results& want, int rank, const char* what) {
  ASSERT_GE(got.size(), from + want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(std::memcmp(got[from + s].data(), want[s].data(), want[s].size() * sizeof(float)), 0)
        << "rank " << rank << ": " << what << ", step " << s;
  }
}

// State saved in A after step 3 (compressed since step 2), loaded into a fresh reducer, which
// is in B: step 4 (in B) equals a run whose per-bucket records were dropped (counters kept),
// not one where A's records were applied to B's buckets; after the rebuild into A, steps 5-6
// equal the saved run continued from its state in A (the records were installed).
void ExpectOtherLayoutPendsThenInstalls(const Hook& make, int counters) {
  RunRanks(2, [&](Group& g) {
    const std::string bytes = SavedInA(g, make);
    Results resumed, dropped, continued;
    {
      auto red = SquareReducer(g);
      auto hook = SetHook(*red, make);
      ASSERT_OK(hook->LoadState(bytes));
      // Saved while pending: the records under their layout, as loaded.
      EXPECT_EQ(hook->SaveState().value(), bytes);
      SquareStep(*red, g.rank(), 4, &resumed);
      RebuildIntoA(*red);
      for (int step = 5; step < 7; ++step) SquareStep(*red, g.rank(), step, &resumed);
    }
    {
      auto red = SquareReducer(g);
      auto hook = SetHook(*red, make);
      ASSERT_OK(hook->LoadState(WithoutBuckets(bytes, *hook, g, counters)));
      SquareStep(*red, g.rank(), 4, &dropped);
    }
    {  // into A without the hook, then the state loaded in its own layout
      auto red = SquareReducer(g);
      SquareStep(*red, g.rank(), 4, nullptr);
      RebuildIntoA(*red);
      auto hook = SetHook(*red, make);
      ASSERT_OK(hook->LoadState(bytes));
      for (int step = 5; step < 7; ++step) SquareStep(*red, g.rank(), step, &continued);
    }
    ExpectSame(resumed, 0, dropped, g.rank(), "in the other layout, as with the records dropped");
    ExpectSame(resumed, 1, continued, g.rank(), "back in the saved layout, as continued there");
  });
}

TEST(HookState, PowerSGDStateOfAnotherLayoutWaitsForIt) {
  ExpectOtherLayoutPendsThenInstalls(SquarePowerSGD(), /*counters=*/2);
}

TEST(HookState, Int8StateOfAnotherLayoutWaitsForIt) {
  ExpectOtherLayoutPendsThenInstalls(Int8(), /*counters=*/0);
}

// Pending records are dropped, not installed later, by a re-plan to a third layout and by a
// second step in the other layout: the runs equal those whose records were dropped at the load.
void ExpectPendingDropped(const Hook& make, int counters) {
  RunRanks(2, [&](Group& g) {
    const std::string bytes = SavedInA(g, make);
    Results third[2], second[2];
    for (bool dropped : {false, true}) {
      {  // B, then a re-plan to larger caps (one bucket: neither A nor B)
        auto red = SquareReducer(g);
        auto hook = SetHook(*red, make);
        ASSERT_OK(hook->LoadState(dropped ? WithoutBuckets(bytes, *hook, g, counters) : bytes));
        absl::StatusOr<bool> changed = red->Replan(1 << 20, 1 << 20);
        ASSERT_TRUE(changed.ok() && *changed) << changed.status();
        for (int step = 4; step < 6; ++step) SquareStep(*red, g.rank(), step, &third[dropped]);
      }
      {  // two steps in B, then the rebuild into A
        auto red = SquareReducer(g);
        auto hook = SetHook(*red, make);
        ASSERT_OK(hook->LoadState(dropped ? WithoutBuckets(bytes, *hook, g, counters) : bytes));
        SquareStep(*red, g.rank(), 4, &second[dropped]);
        SquareStep(*red, g.rank(), 5, &second[dropped]);
        RebuildIntoA(*red);
        SquareStep(*red, g.rank(), 6, &second[dropped]);
      }
      if (dropped) {
        ExpectSame(third[0], 0, third[1], g.rank(), "after a re-plan to a third layout");
        ExpectSame(second[0], 0, second[1], g.rank(), "after a second step in the other layout");
      }
    }
  });
}

TEST(HookState, PowerSGDPendingStateIsDroppedOtherwise) {
  ExpectPendingDropped(SquarePowerSGD(), /*counters=*/2);
}

TEST(HookState, Int8PendingStateIsDroppedOtherwise) {
  ExpectPendingDropped(Int8(), /*counters=*/0);
}

}  // namespace
}  // namespace braid::sched
