// The PowerSGD comm hook (scheduler/hooks/powersgd.h) on an all-reduce GradientReducer, bit for
// bit against a serial reference written here (every rank's error feedback, the shared P and
// Q, the local backend's rank-order sums), over several steps: the uncompressed first steps,
// the first random Q, warm starts, tensors not worth compressing; re-plans inside and after
// the warm-up (the step count carries over, bucket state restarts) and a rebuild into the same
// buckets (nothing restarts); and its bad input.
#include "scheduler/hooks/powersgd.h"

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "backends/local/local_backend.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "tests/multirank.h"
#include "tests/torch_gram_schmidt.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

constexpr int kRanks = 3;

// Shapes (rows x cols): two 16x12 in one bucket (torch groups same shapes), vectors, a 3x3 not
// worth compressing at rank 2, and a 10x40.
struct Shape {
  const char* name;
  int64_t rows, cols;
};
const std::vector<Shape>& Shapes() {
  static const auto* s =
      new std::vector<Shape>{{"a.weight", 16, 12}, {"a.bias", 12, 1}, {"b.weight", 16, 12},
                             {"c.weight", 10, 40}, {"c.bias", 10, 1}, {"d.weight", 3, 3}};
  return *s;
}
std::vector<ParamSpec> Params() {
  std::vector<ParamSpec> p;
  for (size_t i = 0; i < Shapes().size(); ++i) {
    const Shape& s = Shapes()[i];
    p.push_back(ParamSpec{static_cast<ParamId>(i + 1), static_cast<size_t>(s.rows * s.cols),
                          DType::kF32, Device::Cpu(), s.name});
  }
  return p;
}
std::vector<int64_t> Rows() {
  std::vector<int64_t> r;
  for (const Shape& s : Shapes()) r.push_back(s.rows);
  return r;
}
ReducerConfig Config() {
  ReducerConfig cfg;
  cfg.mode = ReduceMode::kAllReduce;
  cfg.first_bucket_cap_bytes = 512;  // d, c.bias: a first bucket with nothing compressed
  cfg.bucket_cap_bytes = 2048;
  cfg.timeout = absl::Seconds(30);
  return cfg;
}

float Grad(int r, int i, size_t j, int step) {
  std::mt19937 gen(static_cast<uint32_t>(((r * 31 + i) * 1009 + j) * 7 + step));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  return u(gen) * (1.0f + static_cast<float>(i));
}

// ---- The serial reference: the algorithm of torch's hook, every rank at once. ----
using Vec = std::vector<float>;
float SumInRankOrder(const std::vector<float>& x) {
  float acc = x[0];
  for (size_t r = 1; r < x.size(); ++r) acc += x[r];
  return acc;
}

struct RefMatrix {
  int param;
  size_t n, k;
  int r;
  size_t q;  // offset in the bucket's Q (torch's layout: grouped by shape)
};
struct RefBucket {
  std::vector<Vec> error;  // per rank
  Vec q;
  bool have_q = false;
};

class Reference {
 public:
  Reference(const BucketPlan& plan, PowerSGDOptions o) : plan_(plan), o_(o) {
    buckets_.resize(plan.buckets().size());
  }
  // Every parameter's averaged gradient after `step` (buckets in order).
  std::vector<Vec> Step(int step) {
    std::vector<Vec> result(plan_.params().size());
    for (size_t b = 0; b < plan_.buckets().size(); ++b)
      RunBucket(static_cast<int>(b), step, result);
    ++iter_;  // torch's state.iter: one per step, whatever the buckets
    return result;
  }
  // New buckets: torch's hook after torch's rebuild (its dicts keyed by the old indices hold
  // nothing a new bucket can use; iter and the generator go on).
  void Replan(const BucketPlan& plan) {
    plan_ = plan;
    buckets_.assign(plan.buckets().size(), RefBucket{});
  }
  int draws() const { return draws_; }

 private:
  void RunBucket(int b, int step, std::vector<Vec>& result) {
    RefBucket& st = buckets_[b];
    const Bucket& bk = plan_.buckets()[b];
    const float d = kRanks;
    // x[r][i]: rank r's gradient of parameter i (+ its error).
    std::map<int, std::vector<Vec>> x;
    for (int i : bk.params) {
      for (int r = 0; r < kRanks; ++r) {
        Vec v(plan_.params()[i].count);
        for (size_t j = 0; j < v.size(); ++j) v[j] = Grad(r, i, j, step);
        x[i].push_back(v);
      }
    }
    if (iter_ < o_.start_iter) {
      for (int i : bk.params) {
        result[i].resize(plan_.params()[i].count);
        for (size_t j = 0; j < result[i].size(); ++j) {
          std::vector<float> e;
          for (int r = 0; r < kRanks; ++r) e.push_back(x[i][r][j] / d);
          result[i][j] = SumInRankOrder(e);
        }
      }
      return;
    }
    if (o_.use_error_feedback && !st.error.empty()) {
      for (int i : bk.params) {
        for (int r = 0; r < kRanks; ++r) {
          for (size_t j = 0; j < x[i][r].size(); ++j) {
            x[i][r][j] += st.error[r][plan_.slot(i).offset + j];
          }
        }
      }
    }
    // Which parameters are compressed, grouped by shape in first-appearance order.
    std::vector<RefMatrix> mats;
    std::vector<std::pair<size_t, size_t>> shapes;
    std::vector<int> plain;
    for (int i : bk.params) {
      const size_t n = o_.rows[i], k = plan_.params()[i].count / n;
      const int r = static_cast<int>(std::min<size_t>({n, k, size_t(o_.rank)}));
      if (double((n + k) * r) * o_.min_compression_rate < double(n * k)) {
        mats.push_back({i, n, k, r, 0});
        if (std::find(shapes.begin(), shapes.end(), std::make_pair(n, k)) == shapes.end())
          shapes.push_back({n, k});
      } else {
        plain.push_back(i);
      }
    }
    std::vector<RefMatrix> ordered;
    size_t qn = 0;
    for (const auto& sh : shapes) {
      for (RefMatrix m : mats) {
        if (std::make_pair(m.n, m.k) != sh) continue;
        m.q = qn;
        qn += m.k * m.r;
        ordered.push_back(m);
      }
    }
    const bool fill = !o_.warm_start || !st.have_q;
    const int init = fill ? draws_++ : 0;
    if (fill) st.q.assign(qn, 0);
    for (int i : plain) {
      result[i].resize(plan_.params()[i].count);
      for (size_t j = 0; j < result[i].size(); ++j) {
        std::vector<float> e;
        for (int r = 0; r < kRanks; ++r) e.push_back(x[i][r][j]);
        result[i][j] = SumInRankOrder(e) / d;
      }
    }
    for (const RefMatrix& m : ordered) {
      float* q = st.q.data() + m.q;
      if (fill) {
        for (size_t t = 0; t < m.k * m.r; ++t)
          q[t] = PowerSGDInitValue(o_.random_seed, b, init, m.q + t);
      }
      testing::TorchGramSchmidt(q, m.k, m.r, o_.orthogonalization_epsilon);
      // P = sum over ranks of M_r Q, then orthogonalized.
      std::vector<Vec> p(kRanks, Vec(m.n * m.r));
      for (int r = 0; r < kRanks; ++r) {
        for (size_t a = 0; a < m.n; ++a)
          for (int c = 0; c < m.r; ++c) {
            float acc = 0;
            for (size_t j = 0; j < m.k; ++j) acc += x[m.param][r][a * m.k + j] * q[j * m.r + c];
            p[r][a * m.r + c] = acc;
          }
      }
      Vec ps(m.n * m.r);
      for (size_t t = 0; t < ps.size(); ++t) {
        std::vector<float> e;
        for (int r = 0; r < kRanks; ++r) e.push_back(p[r][t]);
        ps[t] = SumInRankOrder(e);
      }
      testing::TorchGramSchmidt(ps.data(), m.n, m.r, o_.orthogonalization_epsilon);
      // Q = sum over ranks of M_r^T P, divided by the group size.
      for (size_t j = 0; j < m.k; ++j)
        for (int c = 0; c < m.r; ++c) {
          std::vector<float> e;
          for (int r = 0; r < kRanks; ++r) {
            float acc = 0;
            for (size_t a = 0; a < m.n; ++a) acc += x[m.param][r][a * m.k + j] * ps[a * m.r + c];
            e.push_back(acc);
          }
          q[j * m.r + c] = SumInRankOrder(e) / d;
        }
      Vec& out = result[m.param];
      out.resize(m.n * m.k);
      for (size_t a = 0; a < m.n; ++a)
        for (size_t j = 0; j < m.k; ++j) {
          float acc = 0;
          for (int c = 0; c < m.r; ++c) acc += ps[a * m.r + c] * q[j * m.r + c];
          out[a * m.k + j] = acc;
        }
    }
    st.have_q = o_.warm_start;
    if (o_.use_error_feedback) {
      st.error.assign(kRanks, Vec(bk.padded_count, 0.0f));
      for (int i : bk.params)
        for (int r = 0; r < kRanks; ++r)
          for (size_t j = 0; j < x[i][r].size(); ++j)
            st.error[r][plan_.slot(i).offset + j] = x[i][r][j] - result[i][j];
    }
  }

  BucketPlan plan_;
  const PowerSGDOptions o_;
  std::vector<RefBucket> buckets_;
  int iter_ = 0, draws_ = 0;  // hook-wide
};

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

void CheckAgainstReference(PowerSGDOptions o, int steps) {
  o.rows = Rows();
  RunRanks(kRanks, [o, steps](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config());
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_GE((*red)->plan().buckets().size(), 3u);
    auto hook = MakePowerSGDHook(o);
    ASSERT_TRUE(hook.ok()) << hook.status();
    ASSERT_OK((*red)->SetCommHook(*hook));
    Reference ref((*red)->plan(), o);
    const auto& params = (*red)->plan().params();
    for (int step = 0; step < steps; ++step) {
      ASSERT_OK(Backward(**red, g.rank(), step));
      const std::vector<Vec> want = ref.Step(step);
      for (size_t i = 0; i < params.size(); ++i) {
        const float* got = static_cast<const float*>((*red)->GradView(params[i].id)->data);
        for (size_t j = 0; j < params[i].count; ++j) {
          ASSERT_EQ(got[j], want[i][j]) << params[i].name << "[" << j << "] step " << step;
        }
      }
      ASSERT_OK((*red)->ZeroGrads());
    }
  });
}

TEST(PowerSGDHook, ErrorFeedbackAndWarmStartMatchSerialReference) {
  PowerSGDOptions o;
  o.rank = 2;
  o.start_iter = 2;
  o.random_seed = 7;
  CheckAgainstReference(o, 6);
}

TEST(PowerSGDHook, RankOneWithoutWarmStartOrErrorFeedback) {
  PowerSGDOptions o;
  o.rank = 1;
  o.start_iter = 0;
  o.warm_start = false;
  o.use_error_feedback = false;
  o.orthogonalization_epsilon = 1e-8f;
  CheckAgainstReference(o, 3);
}

TEST(PowerSGDHook, RankAboveEveryShapeIsClamped) {  // r = min(rows, cols, rank), then the test
  PowerSGDOptions o;
  o.rank = 4;
  o.start_iter = 1;
  o.min_compression_rate = 1.0;
  CheckAgainstReference(o, 3);
}

// The approximation is real: the compressed result differs from the plain average, and the
// error feedback carries what it missed (sum over ranks of the errors = the sum of the inputs
// minus size x the result).
TEST(PowerSGDHook, CompressesWhatIsWorthIt) {
  PowerSGDOptions o;
  o.rank = 1;
  o.start_iter = 0;
  o.rows = Rows();
  RunRanks(kRanks, [o](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config());
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->SetCommHook(*MakePowerSGDHook(o)));
    ASSERT_OK(Backward(**red, g.rank(), 0));
    const auto& params = (*red)->plan().params();
    for (size_t i = 0; i < params.size(); ++i) {
      const float* got = static_cast<const float*>((*red)->GradView(params[i].id)->data);
      size_t differ = 0;
      for (size_t j = 0; j < params[i].count; ++j) {
        float acc = 0;
        for (int r = 0; r < kRanks; ++r) acc += Grad(r, static_cast<int>(i), j, 0);
        differ += got[j] != acc / kRanks;
      }
      const bool compressed = Shapes()[i].cols > 1 && Shapes()[i].rows > 3;
      EXPECT_EQ(differ > params[i].count / 2, compressed) << params[i].name;
    }
  });
}

// ---- Re-plans in the middle of training ----

// The caps Replan moves to: fewer, larger buckets than Config()'s (indices and sizes change).
constexpr size_t kNewCap = 4096, kNewFirstCap = 1024;

// Per step, every parameter's reduced gradient; with `replan_before` >= 0, the reducer is
// re-planned to the new caps (GradientReducer::Replan) before that step.
using StepResults = std::vector<std::vector<Vec>>;
void Train(GradientReducer& red, int rank, int steps, int replan_before, StepResults& out) {
  const auto& params = red.plan().params();
  for (int step = 0; step < steps; ++step) {
    if (step == replan_before) {
      const uint64_t before = red.plan().Fingerprint();
      absl::StatusOr<bool> changed = red.Replan(kNewCap, kNewFirstCap);
      ASSERT_TRUE(changed.ok()) << changed.status();
      ASSERT_TRUE(*changed);
      ASSERT_NE(red.plan().Fingerprint(), before);
    }
    ASSERT_OK(Backward(red, rank, step));
    std::vector<Vec> got;
    for (const ParamSpec& p : params) {
      const float* g = static_cast<const float*>(red.GradView(p.id)->data);
      got.emplace_back(g, g + p.count);
    }
    out.push_back(std::move(got));
    ASSERT_OK(red.ZeroGrads());
  }
}

// Rank 0's results of `steps` steps on a reducer created with `caps` and the hook of `o`.
StepResults TrainRanks(PowerSGDOptions o, std::pair<size_t, size_t> caps, int steps,
                       int replan_before) {
  o.rows = Rows();
  std::vector<StepResults> runs(kRanks);
  RunRanks(kRanks, [&](Group& g) {
    ReducerConfig cfg = Config();
    cfg.bucket_cap_bytes = caps.first;
    cfg.first_bucket_cap_bytes = caps.second;
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->SetCommHook(*MakePowerSGDHook(o)));
    Train(**red, g.rank(), steps, replan_before, runs[g.rank()]);
  });
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(runs[r], runs[0]) << "rank " << r;
  return runs[0];
}

BucketPlan PlanWithCaps(size_t cap, size_t first_cap) {  // as GradientReducer::Create
  PlanOptions po;
  po.bucket_cap_bytes = cap;
  po.first_bucket_cap_bytes = first_cap;
  absl::StatusOr<BucketPlan> plan = BucketPlan::Build(Params(), po);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

void ExpectSameRun(const StepResults& got, const StepResults& want, int from, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t step = from; step < got.size(); ++step) {
    for (size_t i = 0; i < got[step].size(); ++i) {
      ASSERT_EQ(got[step][i], want[step][i])
          << what << ": " << Shapes()[i].name << " step " << step;
    }
  }
}

// A re-plan inside the warm-up (before start_powerSGD_iter) changes nothing: every step equals
// the run that had the new buckets from the start (uncompressed steps are bucket-independent
// averages; no bucket state exists yet), so compression starts at step start_iter on time.
TEST(PowerSGDHook, ReplanInsideWarmUpKeepsTheStepCount) {
  PowerSGDOptions o;
  o.rank = 2;
  o.start_iter = 3;
  o.random_seed = 9;
  const int steps = 6;
  const StepResults replanned = TrainRanks(o, {2048, 512}, steps, /*replan_before=*/2);
  const StepResults fresh = TrainRanks(o, {kNewCap, kNewFirstCap}, steps, -1);
  ExpectSameRun(replanned, fresh, 0, "re-planned at step 2 vs new buckets throughout");
  // The serial reference, re-planned at the same step.
  PowerSGDOptions ro = o;
  ro.rows = Rows();
  Reference ref(PlanWithCaps(2048, 512), ro);
  StepResults want;
  for (int step = 0; step < steps; ++step) {
    if (step == 2) ref.Replan(PlanWithCaps(kNewCap, kNewFirstCap));
    want.push_back(ref.Step(step));
  }
  ExpectSameRun(replanned, want, 0, "against the reference");
  // Compressed from step 3 on (else the comparison proves nothing about the count).
  for (int step = 0; step < steps; ++step) {
    float plain = 0.0f;
    for (int r = 0; r < kRanks; ++r) plain += Grad(r, 3, 0, step) / kRanks;
    EXPECT_EQ(replanned[step][3][0] == plain, step < o.start_iter) << "step " << step;
  }
}

// A re-plan after the warm-up: the step count goes on (the next step compresses, no second
// warm-up), error feedback and warm-start Q restart on the new buckets (zero error, a Q from
// the next draw), as the reference re-planned at the same step; and it differs from the run
// that was never re-planned (which keeps its errors and Q), so the re-plan really happened.
TEST(PowerSGDHook, ReplanAfterWarmUpRestartsOnlyBucketState) {
  PowerSGDOptions o;
  o.rank = 1;
  o.start_iter = 2;
  o.random_seed = 4;
  const int steps = 7, at = 4;
  const StepResults replanned = TrainRanks(o, {2048, 512}, steps, at);
  const StepResults kept = TrainRanks(o, {2048, 512}, steps, -1);
  PowerSGDOptions ro = o;
  ro.rows = Rows();
  Reference ref(PlanWithCaps(2048, 512), ro);
  StepResults want;
  int draws_before = 0;
  for (int step = 0; step < steps; ++step) {
    if (step == at) {
      draws_before = ref.draws();
      ref.Replan(PlanWithCaps(kNewCap, kNewFirstCap));
    }
    want.push_back(ref.Step(step));
  }
  EXPECT_GT(draws_before, 0);
  EXPECT_GT(ref.draws(), draws_before);  // the new buckets' Q: fresh draws, not reused ones
  ExpectSameRun(replanned, want, 0, "against the reference re-planned at step 4");
  // Before the re-plan both runs are one; from it on the restarted state shows.
  ASSERT_EQ(kept.size(), replanned.size());
  for (int step = 0; step < steps; ++step) {
    EXPECT_EQ(replanned[step] == kept[step], step < at) << "step " << step;
  }
}

// torch's one-time rebuild that yields the buckets there already were (readiness order = the
// registration order reversed) is no re-plan for the hook: error feedback and Q carry on, and
// the run equals the one without the rebuild bit for bit (dropping them would not).
TEST(PowerSGDHook, RebuildIntoTheSameBucketsKeepsTheState) {
  PowerSGDOptions o;
  o.rank = 1;
  o.start_iter = 0;  // state exists at the rebuild (before step 1)
  o.rows = Rows();
  std::vector<StepResults> runs(2 * kRanks);
  RunRanks(kRanks, [&](Group& g) {
    for (bool rebuild : {false, true}) {
      ReducerConfig cfg = Config();
      cfg.rebuild_bucket_order = rebuild;
      auto red = GradientReducer::Create(Params(), {&g, nullptr}, cfg);
      ASSERT_TRUE(red.ok()) << red.status();
      ASSERT_OK((*red)->SetCommHook(*MakePowerSGDHook(o)));
      const uint64_t plan = (*red)->plan().Fingerprint();
      StepResults& out = runs[g.rank() * 2 + rebuild];
      Train(**red, g.rank(), 1, -1, out);
      absl::StatusOr<bool> rebuilt = (*red)->RebuildBucketsIfPending();
      ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
      ASSERT_EQ(*rebuilt, rebuild);
      ASSERT_EQ((*red)->plan().Fingerprint(), plan);
      StepResults more;
      Train(**red, g.rank(), 3, -1, more);  // steps 0-2 again: other inputs than step 0's
      out.insert(out.end(), more.begin(), more.end());
    }
  });
  for (int r = 0; r < kRanks; ++r) ExpectSameRun(runs[2 * r + 1], runs[2 * r], 0, "rebuilt");
}

TEST(PowerSGDHook, BadInput) {
  EXPECT_FALSE(MakePowerSGDHook(PowerSGDOptions{0}).ok());
  RunRanks(2, [](Group& g) {
    auto red = GradientReducer::Create(Params(), {&g, nullptr}, Config());
    ASSERT_TRUE(red.ok()) << red.status();
    PowerSGDOptions o;
    o.rows = Rows();
    o.rows[3] = 7;  // c.weight: 400 elements are not rows of 7
    ExpectError((*red)->SetCommHook(*MakePowerSGDHook(o)), absl::StatusCode::kInvalidArgument,
                {"c.weight", "rows of 7"});
    o.rows = {16};
    ExpectError((*red)->SetCommHook(*MakePowerSGDHook(o)), absl::StatusCode::kInvalidArgument,
                {"rows has 1 entries for 6 parameters"});
    o.rows = Rows();
    o.rank = 1 + g.rank();  // differs across ranks: refused on every rank
    ExpectError((*red)->SetCommHook(*MakePowerSGDHook(o)), absl::StatusCode::kFailedPrecondition,
                {"matrix_approximation_rank"});
    // Reduce-scatter reducers have no whole parameters to compress.
    ReducerConfig rs = Config();
    rs.mode = ReduceMode::kReduceScatter;
    auto red2 = GradientReducer::Create(Params(), {&g, nullptr}, rs);
    ASSERT_TRUE(red2.ok()) << red2.status();
    o.rank = 1;
    ExpectError((*red2)->SetCommHook(*MakePowerSGDHook(o)), absl::StatusCode::kInvalidArgument,
                {"powersgd", "handles none of the stages"});
  });
}

}  // namespace
}  // namespace braid::sched
