// Communication hooks on a GradientReducer (scheduler/comm_hook.h): the low-precision wire bit
// for bit against a serial reference (all-reduce, reduce-scatter, hybrid replica-only), and
// bad hooks (failing, wrong size, different across ranks) as errors naming the bucket and the
// hook on every rank, with the bucket's gradients intact for a retry without the hook.
#include "scheduler/comm_hook.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "backends/local/local_backend.h"
#include "comm/half.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/hooks/int8.h"
#include "scheduler/hooks/low_precision.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

// Two buckets (a 1 KiB first bucket): odd sizes that straddle shards.
std::vector<ParamSpec> Params() {
  return {ParamSpec{1, 301, DType::kF32, Device::Cpu(), "fc1.weight"},
          ParamSpec{2, 7, DType::kF32, Device::Cpu(), "fc1.bias"},
          ParamSpec{3, 250, DType::kF32, Device::Cpu(), "fc2.weight"}};
}
ReducerConfig Config(ReduceMode mode) {
  ReducerConfig cfg;
  cfg.mode = mode;
  cfg.first_bucket_cap_bytes = 1024;
  cfg.bucket_cap_bytes = 2048;
  cfg.timeout = absl::Seconds(30);
  return cfg;
}

// Rank r's gradient of parameter i, element j, at `step`: magnitudes from 1e-7 (f16
// subnormals) to 1e3, so the wire's rounding and the divide are exercised.
float Grad(int r, int i, size_t j, int step) {
  std::mt19937 gen(static_cast<uint32_t>(((r * 31 + i) * 1009 + j) * 7 + step));
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f), exp10(-7.0f, 3.0f);
  return mant(gen) * std::pow(10.0f, exp10(gen));
}

float Wire(float x, DType wire) {
  return wire == DType::kF16 ? ToFloat(ToF16(x)) : ToFloat(ToBF16(x));
}
// The low-precision hook's result for one element: torch's order (round, divide in the wire
// dtype), then the local backend's sum (f32, group-rank order, rounded once).
float LowPrecision(const std::vector<float>& x, DType wire) {
  const int n = static_cast<int>(x.size());
  float acc = 0;
  for (int r = 0; r < n; ++r) {
    const float h = n > 1 ? Wire(Wire(x[r], wire) / static_cast<float>(n), wire) : Wire(x[r], wire);
    acc = r == 0 ? h : acc + h;
  }
  return Wire(acc, wire);
}
float Average(const std::vector<float>& x) {  // the local backend's f32 avg
  float acc = x[0];
  for (size_t r = 1; r < x.size(); ++r) acc += x[r];
  return acc / static_cast<float>(x.size());
}

// Bucket b as rank r holds it at `step` (padding zero).
std::vector<float> BucketOf(const BucketPlan& plan, int b, int r, int step) {
  const Bucket& bk = plan.buckets()[b];
  std::vector<float> v(bk.padded_count, 0.0f);
  for (int i : bk.params) {
    for (size_t j = 0; j < plan.params()[i].count; ++j)
      v[plan.slot(i).offset + j] = Grad(r, i, j, step);
  }
  return v;
}

// One synced backward: every gradient written into its view, every parameter marked.
absl::Status Backward(GradientReducer& red, int r, int step) {
  const auto& params = red.plan().params();
  for (size_t i = 0; i < params.size(); ++i) {
    absl::StatusOr<TensorView> v = red.GradView(params[i].id);
    if (!v.ok()) return v.status();
    float* g = static_cast<float*>(v->data);
    for (size_t j = 0; j < params[i].count; ++j) g[j] = Grad(r, static_cast<int>(i), j, step);
  }
  RETURN_IF_ERROR(red.BeginBackward(SyncMode::kSync));
  for (size_t i = params.size(); i-- > 0;) RETURN_IF_ERROR(red.MarkReady(params[i].id));
  return red.FinishBackward();
}

// Every parameter's gradient view against f(values of all ranks) (all-reduce mode).
void ExpectAllReduced(GradientReducer& red, int n, int step,
                      const std::function<float(const std::vector<float>&)>& f) {
  const auto& params = red.plan().params();
  for (size_t i = 0; i < params.size(); ++i) {
    const float* g = static_cast<const float*>(red.GradView(params[i].id)->data);
    for (size_t j = 0; j < params[i].count; ++j) {
      std::vector<float> x(n);
      for (int r = 0; r < n; ++r) x[r] = Grad(r, static_cast<int>(i), j, step);
      ASSERT_EQ(g[j], f(x)) << params[i].name << "[" << j << "] step " << step;
    }
  }
}

class LowPrecisionTest : public ::testing::TestWithParam<DType> {};

TEST_P(LowPrecisionTest, AllReduceMatchesSerialReference) {
  const DType wire = GetParam();
  RunRanks(3, [wire](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config(ReduceMode::kAllReduce));
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_GE((*red)->plan().buckets().size(), 2u);
    ASSERT_OK((*red)->SetCommHook(*MakeLowPrecisionHook({wire})));
    for (int step = 0; step < 2; ++step) {  // the hook's buffers are reused
      ASSERT_OK(Backward(**red, g.rank(), step));
      ExpectAllReduced(**red, 3, step, [wire](const auto& x) { return LowPrecision(x, wire); });
      ASSERT_OK((*red)->ZeroGrads());
    }
    ASSERT_OK((*red)->SetCommHook(nullptr));  // back to the default path, bit for bit
    ASSERT_OK(Backward(**red, g.rank(), 2));
    ExpectAllReduced(**red, 3, 2, Average);
  });
}

// torch's allreduce_hook: divide in f32, then sum (3 ranks: not the default's sum-then-divide).
TEST(DivideFirstHook, AllReduceMatchesSerialReference) {
  RunRanks(3, [](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config(ReduceMode::kAllReduce));
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->SetCommHook(MakeDivideFirstHook()));
    ASSERT_OK(Backward(**red, g.rank(), 0));
    ExpectAllReduced(**red, 3, 0, [](const std::vector<float>& x) {
      float acc = x[0] / 3.0f;
      for (size_t r = 1; r < x.size(); ++r) acc += x[r] / 3.0f;
      return acc;
    });
  });
}

TEST_P(LowPrecisionTest, ReduceScatterMatchesSerialReference) {
  const DType wire = GetParam();
  RunRanks(3, [wire](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config(ReduceMode::kReduceScatter));
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->SetCommHook(*MakeLowPrecisionHook({wire})));
    ASSERT_OK(Backward(**red, g.rank(), 0));
    const BucketPlan& plan = (*red)->plan();
    for (size_t b = 0; b < plan.buckets().size(); ++b) {
      std::vector<std::vector<float>> all;
      for (int r = 0; r < 3; ++r) all.push_back(BucketOf(plan, b, r, 0));
      const size_t sc = plan.buckets()[b].shard_count;
      const float* shard = static_cast<const float*>((*red)->ShardView(b).data);
      for (size_t k = 0; k < sc; ++k) {
        std::vector<float> x;
        for (int r = 0; r < 3; ++r) x.push_back(all[r][g.rank() * sc + k]);
        ASSERT_EQ(shard[k], LowPrecision(x, wire)) << "bucket " << b << " [" << k << "]";
      }
    }
  });
}

// Hybrid 2x2, replica_only or not: the shard stage exact or on the wire, then the replicas'.
void CheckHybrid(DType wire, bool replica_only) {
  RunRanks(4, [wire, replica_only](Group& world) {
    auto mesh = MakeMesh(world, /*replicas=*/2, /*shards=*/2);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto red = GradientReducer::Create(Params(), {mesh->shard.get(), mesh->replica.get()},
                                       Config(ReduceMode::kHybrid));
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->SetCommHook(*MakeLowPrecisionHook({wire, replica_only})));
    ASSERT_OK(Backward(**red, world.rank(), 0));
    const BucketPlan& plan = (*red)->plan();
    const int s = world.rank() % 2;  // this rank's shard index
    for (size_t b = 0; b < plan.buckets().size(); ++b) {
      const size_t sc = plan.buckets()[b].shard_count;
      const float* shard = static_cast<const float*>((*red)->ShardView(b).data);
      std::vector<std::vector<float>> all;
      for (int r = 0; r < 4; ++r) all.push_back(BucketOf(plan, b, r, 0));
      for (size_t k = 0; k < sc; ++k) {
        std::vector<float> per_replica;  // the shard stage's result inside each replica
        for (int q = 0; q < 2; ++q) {
          const std::vector<float> x = {all[2 * q][s * sc + k], all[2 * q + 1][s * sc + k]};
          per_replica.push_back(replica_only ? Average(x) : LowPrecision(x, wire));
        }
        ASSERT_EQ(shard[k], LowPrecision(per_replica, wire)) << "bucket " << b << " [" << k << "]";
      }
    }
  });
}

TEST_P(LowPrecisionTest, HybridReplicaOnlyKeepsTheShardStageExact) {
  CheckHybrid(GetParam(), /*replica_only=*/true);
}

TEST_P(LowPrecisionTest, HybridBothStagesOnTheWire) { CheckHybrid(GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(Wires, LowPrecisionTest, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// The int8 hook's arithmetic, written out: v = x + residual per block, scale = max|v| / 127,
// q = nearest-even(v / scale) within [-127, 127], residual = v - q * scale. Returns q * scale.
std::vector<float> Int8Reference(const std::vector<float>& x, std::vector<float>& residual,
                                 size_t block) {
  std::vector<float> v(x.size()), deq(x.size());
  for (size_t i = 0; i < x.size(); ++i) v[i] = x[i] + residual[i];
  for (size_t lo = 0; lo < x.size(); lo += block) {
    const size_t hi = std::min(x.size(), lo + block);
    float amax = 0;
    for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float scale = amax / 127.0f;
    for (size_t i = lo; i < hi; ++i) {
      const float q = scale > 0 ? std::clamp(std::nearbyint(v[i] / scale), -127.0f, 127.0f) : 0;
      deq[i] = q * scale;
      residual[i] = v[i] - deq[i];
    }
  }
  return deq;
}

constexpr int kInt8Ranks = 3, kInt8Block = 7;
// residual[b][r]: rank r's error feedback for bucket b (the reference's).
using Residuals = std::vector<std::vector<std::vector<float>>>;

// One synced backward of `step` with the int8 hook, every result against the reference.
void ExpectInt8Step(GradientReducer& red, int rank, int step, Residuals& residual) {
  ASSERT_OK(Backward(red, rank, step));
  const BucketPlan& plan = red.plan();
  const bool whole = red.mode() == ReduceMode::kAllReduce;
  residual.resize(plan.buckets().size());
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bk = plan.buckets()[b];
    const size_t sent = whole ? bk.count : bk.shard_count * kInt8Ranks;
    const size_t first = whole ? 0 : bk.shard_count * rank;
    const size_t count = whole ? bk.count : bk.shard_count;
    residual[b].resize(kInt8Ranks, std::vector<float>(sent, 0.0f));
    std::vector<float> want(count);
    for (int r = 0; r < kInt8Ranks; ++r) {
      std::vector<float> x = BucketOf(plan, b, r, step);
      x.resize(sent);
      const std::vector<float> deq = Int8Reference(x, residual[b][r], kInt8Block);
      for (size_t j = 0; j < count; ++j)
        want[j] = r == 0 ? deq[first + j] : want[j] + deq[first + j];
    }
    for (float& w : want) w = w / static_cast<float>(kInt8Ranks);
    const float* got = static_cast<const float*>(
        whole ? red.GradView(plan.params()[bk.params[0]].id)->data : red.ShardView(b).data);
    if (whole) got -= plan.slot(bk.params[0]).offset;  // the bucket's start
    for (size_t j = 0; j < count; ++j) {
      ASSERT_EQ(got[j], want[j]) << "bucket " << b << " [" << j << "] step " << step;
    }
  }
  ASSERT_OK(red.ZeroGrads());
}

class Int8Test : public ::testing::TestWithParam<ReduceMode> {};

// Three steps (the residuals carry over) at 3 ranks, blocks of 7 straddling parameters.
TEST_P(Int8Test, MatchesSerialReferenceWithErrorFeedback) {
  const ReduceMode mode = GetParam();
  RunRanks(kInt8Ranks, [mode](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config(mode));
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->SetCommHook(*MakeInt8Hook({kInt8Block})));
    Residuals residual;
    for (int step = 0; step < 3; ++step) ExpectInt8Step(**red, g.rank(), step, residual);
  });
}

// A re-plan moves elements between buckets: the residuals start afresh (not applied to other
// parameters' elements).
TEST_P(Int8Test, ReplanDropsTheResiduals) {
  const ReduceMode mode = GetParam();
  RunRanks(kInt8Ranks, [mode](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config(mode));
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->SetCommHook(*MakeInt8Hook({kInt8Block})));
    Residuals residual;
    ExpectInt8Step(**red, g.rank(), 0, residual);
    absl::StatusOr<bool> replanned = (*red)->Replan(size_t{1} << 20, size_t{1} << 20);
    ASSERT_TRUE(replanned.ok() && *replanned) << replanned.status();  // one bucket now
    residual.clear();
    ExpectInt8Step(**red, g.rank(), 1, residual);
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, Int8Test,
                         ::testing::Values(ReduceMode::kAllReduce, ReduceMode::kReduceScatter),
                         [](const auto& info) {
                           return info.param == ReduceMode::kAllReduce ? "allreduce"
                                                                       : "reduce_scatter";
                         });

// A hook that misbehaves in one of several ways (or passes through the default all-reduce).
class BadHook : public CommHook {
 public:
  enum Fault { kNone, kRunFails, kWorkFails, kWrongSize };
  BadHook(std::string name, Fault f) : name_(std::move(name)), fault_(f) {}
  const std::string& name() const override { return name_; }
  absl::StatusOr<CommResult> Run(const CommBucket& b) override {
    if (fault_ == kRunFails) return absl::InternalError("boom at launch");
    if (fault_ == kWorkFails) {
      return CommResult{
          Work::Completed(WorkInfo{"test", "hook", 0, "x"}, absl::DataLossError("boom in flight")),
          nullptr, b.dtype, b.count};
    }
    if (out_.size() <= static_cast<size_t>(b.index)) out_.resize(b.index + 1);
    std::vector<float>& out = out_[b.index];  // per bucket: several are in flight at once
    out.assign(static_cast<const float*>(b.send), static_cast<const float*>(b.send) + b.count);
    ASSIGN_OR_RETURN(WorkPtr w, b.group->AllReduce(out.data(), out.data(), b.count, b.dtype,
                                                   ReduceOp::Avg(), b.options));
    return CommResult{w, out.data(), b.dtype, fault_ == kWrongSize ? b.count - 1 : b.count};
  }

 private:
  const std::string name_;
  const Fault fault_;
  std::vector<std::vector<float>> out_;
};

// A failing hook: an error naming the bucket and the hook on every rank, gradients intact,
// and the same step retried without the hook gives the default result.
TEST(CommHookErrors, FailingHooksNameTheBucketAndKeepTheGradients) {
  struct Case {
    BadHook::Fault fault;
    absl::StatusCode code;
    const char* what;
  };
  for (const Case& c :
       {Case{BadHook::kRunFails, absl::StatusCode::kInternal, "boom at launch"},
        Case{BadHook::kWorkFails, absl::StatusCode::kDataLoss, "boom in flight"},
        Case{BadHook::kWrongSize, absl::StatusCode::kInvalidArgument, "for a result of"}}) {
    RunRanks(2, [&c](Group& g) {
      auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config(ReduceMode::kAllReduce));
      ASSERT_TRUE(red.ok()) << red.status();
      ASSERT_OK((*red)->SetCommHook(std::make_shared<BadHook>("bad_hook", c.fault)));
      ExpectError(Backward(**red, g.rank(), 0), c.code,
                  {"bucket 0", "comm hook 'bad_hook'", "allreduce", c.what});
      // Nothing accumulated was lost: every view still holds this rank's gradient.
      const auto& params = (*red)->plan().params();
      for (size_t i = 0; i < params.size(); ++i) {
        const float* v = static_cast<const float*>((*red)->GradView(params[i].id)->data);
        for (size_t j = 0; j < params[i].count; ++j) {
          ASSERT_EQ(v[j], Grad(g.rank(), static_cast<int>(i), j, 0)) << params[i].name;
        }
      }
      // Retried without the hook (marks only: the views keep the gradients).
      ASSERT_OK((*red)->SetCommHook(nullptr));
      ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
      for (const ParamSpec& p : params) ASSERT_OK((*red)->MarkReady(p.id));
      ASSERT_OK((*red)->FinishBackward());
      ExpectAllReduced(**red, 2, 0, Average);
    });
  }
}

// A hook that fails on one rank only: that rank's error names it; its peer's collective never
// finds a partner and fails at the collective deadline, naming the bucket and the hook there.
TEST(CommHookErrors, OneRankFailingEndsWithinTheDeadlineOnEveryRank) {
  auto backend = CreateBackend(braid::testing::LocalOptions(2, absl::Milliseconds(300)));
  ASSERT_TRUE(backend.ok());
  RunRanks(**backend, [](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config(ReduceMode::kAllReduce));
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->SetCommHook(std::make_shared<BadHook>(
        "bad_hook", g.rank() == 1 ? BadHook::kRunFails : BadHook::kNone)));
    const absl::Status st = Backward(**red, g.rank(), 0);
    if (g.rank() == 1) {
      ExpectError(st, absl::StatusCode::kInternal, {"bucket 0", "comm hook 'bad_hook'", "boom"});
    } else {
      ExpectError(st, absl::StatusCode::kDeadlineExceeded,
                  {"bucket 0", "comm hook 'bad_hook'", "rank(s) 1 did not arrive"});
    }
  });
}

TEST(CommHookErrors, HooksThatDifferAcrossRanksAreRefusedOnEveryRank) {
  RunRanks(2, [](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config(ReduceMode::kAllReduce));
    ASSERT_TRUE(red.ok()) << red.status();
    ExpectError(
        (*red)->SetCommHook(*MakeLowPrecisionHook({g.rank() == 0 ? DType::kBF16 : DType::kF16})),
        absl::StatusCode::kFailedPrecondition,
        {"comm hook differs", "'bf16_compress' on rank 0", "'fp16_compress' on rank 1"});
    ExpectError(
        (*red)->SetCommHook(g.rank() == 0 ? *MakeLowPrecisionHook({DType::kBF16}) : nullptr),
        absl::StatusCode::kFailedPrecondition, {"none on rank 1"});
    ExpectError((*red)->SetCommHook(*MakeLowPrecisionHook({DType::kBF16, g.rank() == 1})),
                absl::StatusCode::kFailedPrecondition, {"'bf16_compress'", "replica_only"});
    // Nothing was registered: the default path.
    ASSERT_OK(Backward(**red, g.rank(), 0));
    ExpectAllReduced(**red, 2, 0, Average);
  });
}

TEST(CommHookErrors, MisuseIsNamed) {
  RunRanks(1, [](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config(ReduceMode::kAllReduce));
    ASSERT_TRUE(red.ok()) << red.status();
    ExpectError((*red)->SetCommHook(*MakeLowPrecisionHook({DType::kBF16, true})),
                absl::StatusCode::kInvalidArgument, {"'bf16_compress'", "hybrid"});
    ExpectError(MakeLowPrecisionHook({DType::kF32}).status(), absl::StatusCode::kInvalidArgument,
                {"f32", "bf16 or f16"});
    ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
    ExpectError((*red)->SetCommHook(nullptr), absl::StatusCode::kFailedPrecondition,
                {"during a backward"});
  });
}

}  // namespace
}  // namespace braid::sched
