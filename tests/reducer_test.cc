// GradientReducer on the local backend against a serial reference: every mode (all-reduce,
// reduce-scatter, hybrid) x dtype (f32, bf16, f16, mixed) x world/mesh shape x random
// readiness orders (different on every rank) x no_sync accumulation, with odd parameter sizes
// that straddle shards and several buckets per dtype. Bit-exact: the local backend reduces in
// group-rank order, and the reference replays each stage's arithmetic (divide rule in
// scheduler/divide.h) in that order.
#include "scheduler/gradient_reducer.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "comm/half.h"
#include "gtest/gtest.h"
#include "scheduler/mesh.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::LocalOptions;
using braid::testing::RunRanks;

// ---- values in any floating dtype, held as float/double ----------------------------------
double Load(DType t, const char* p) {
  switch (t) {
    case DType::kF32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::kF64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::kBF16: { BF16 v; std::memcpy(&v, p, 2); return ToFloat(v); }
    case DType::kF16: { F16 v; std::memcpy(&v, p, 2); return ToFloat(v); }
    default: return 0;
  }
}
void Store(DType t, char* p, double v) {
  switch (t) {
    case DType::kF32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    case DType::kF64: std::memcpy(p, &v, 8); break;
    case DType::kBF16: { BF16 h = ToBF16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::kF16: { F16 h = ToF16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    default: break;
  }
}
// Arithmetic in the accumulation type: f64 for f64, else f32.
double Add(DType t, double a, double b) {
  return t == DType::kF64 ? a + b : static_cast<double>(static_cast<float>(a) + static_cast<float>(b));
}
double Mul(DType t, double s, double x) {
  return t == DType::kF64 ? s * x : static_cast<double>(static_cast<float>(s) * static_cast<float>(x));
}
double Div(DType t, double a, int n) {
  return t == DType::kF64 ? a / n : static_cast<double>(static_cast<float>(a) / static_cast<float>(n));
}

// One reduction stage over `inputs` (group-rank order), as the local backend and the post
// divide compute it; returns the stored value.
// The divide rule, written out independently of scheduler/divide.cc: average over the group
// (plain sum for a group of one); f16 scales by 1/pre before the sum and divides by post after,
// with FSDP's factors for the group sizes used here.
struct Expected {
  double premul = 0;  // 0: none
  int divide = 1;     // divide the sum by this (avg)
  int post = 1;       // f16: divide the stored result by this
};
Expected RuleFor(DType t, int n) {
  if (n == 1) return {};
  if (t != DType::kF16) return {0, n, 1};
  switch (n) {
    case 2: return {1.0 / 2, 1, 1};
    case 3: return {0, 1, 3};  // no power of two divides 3: plain sum, then divide by 3
    case 4: return {1.0 / 2, 1, 2};
    case 8: return {1.0 / 4, 1, 2};
  }
  ADD_FAILURE() << "no f16 rule for group size " << n;
  return {};
}

double ReduceStage(DType t, const std::vector<double>& inputs) {
  const int n = static_cast<int>(inputs.size());
  const Expected e = RuleFor(t, n);
  double acc = 0;
  for (int k = 0; k < n; ++k) {
    const double v = e.premul != 0 ? Mul(t, e.premul, inputs[k]) : inputs[k];
    acc = k == 0 ? v : Add(t, acc, v);
  }
  if (e.divide > 1) acc = Div(t, acc, e.divide);
  char buf[8];
  Store(t, buf, acc);
  double out = Load(t, buf);
  if (e.post > 1) {
    Store(t, buf, Div(t, out, e.post));
    out = Load(t, buf);
  }
  return out;
}

TEST(DivideRule, PreDivideFactorsAreFsdps) {
  EXPECT_EQ(PreDivideFactor(1), 1);
  EXPECT_EQ(PreDivideFactor(2), 2);
  EXPECT_EQ(PreDivideFactor(4), 2);
  EXPECT_EQ(PreDivideFactor(8), 4);
  EXPECT_EQ(PreDivideFactor(32), 8);
  EXPECT_EQ(PreDivideFactor(6), 2);  // FSDP says 4, which does not divide 6
  EXPECT_EQ(PreDivideFactor(3), 1);
  EXPECT_EQ(StepFor(DType::kF16, 6).post_divide, 3);
  EXPECT_EQ(StepFor(DType::kF16, 32).post_divide, 4);
  EXPECT_EQ(StepFor(DType::kBF16, 32).op.kind, ReduceKind::kAvg);
  EXPECT_EQ(StepFor(DType::kF32, 1).op.kind, ReduceKind::kSum);
}

// ---- the scenario -------------------------------------------------------------------------
struct Scenario {
  ReduceMode mode;
  int replicas, shards;  // world = replicas * shards; all-reduce/reduce-scatter use replicas = 1
  int dtypes;            // 0 f32, 1 bf16, 2 f16, 3 mixed
  const char* schedule;  // one letter per microbatch: N no_sync, R reduce_scatter_only, S sync
  bool copy_in = false;  // framework-owned gradient buffers instead of bucket views
};

SyncMode ModeOf(char c) {
  return c == 'N' ? SyncMode::kNoSync : c == 'R' ? SyncMode::kReduceScatterOnly : SyncMode::kSync;
}

std::vector<ParamSpec> MakeParams(int dtypes) {
  const size_t sizes[] = {1, 37, 300, 1025, 64, 13, 4099, 7};
  const DType pick[] = {DType::kF32, DType::kBF16, DType::kF16};
  std::vector<ParamSpec> ps;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    const DType t = dtypes < 3 ? pick[dtypes] : pick[i % 3];
    ps.push_back(ParamSpec{static_cast<ParamId>(1000 + 7 * i), sizes[i], t, Device::Cpu(),
                           absl::StrCat("layer", i, ".weight")});
  }
  return ps;
}

// Gradient element i of parameter p on rank r in microbatch m of step s.
double Grad(int r, int p, int m, int s, size_t i) {
  uint64_t z = ((((static_cast<uint64_t>(r) * 131 + p) * 17 + m) * 7 + s) << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;  // [-1, 1)
}

// What the framework does in backward: grad += g, in the gradient's dtype.
void Accumulate(const TensorView& v, int r, int p, int m, int s) {
  const size_t es = DTypeSize(v.dtype);
  char* base = static_cast<char*>(v.data);
  for (size_t i = 0; i < v.count; ++i) {
    Store(v.dtype, base + i * es, Add(v.dtype, Load(v.dtype, base + i * es), Grad(r, p, m, s, i)));
  }
}

// Rank r's local bucket contents holding microbatches [m0, m1) of step s (padding zero).
std::vector<char> LocalBucket(const BucketPlan& plan, int b, int r, int m0, int m1, int s) {
  const Bucket& bk = plan.buckets()[b];
  std::vector<char> buf(bk.bytes(), 0);
  for (int p : bk.params) {
    const ParamSpec& ps = plan.params()[p];
    TensorView v{buf.data() + plan.slot(p).offset * DTypeSize(ps.dtype), ps.count, ps.dtype, ps.device};
    for (int m = m0; m < m1; ++m) Accumulate(v, r, p, m, s);
  }
  return buf;
}

// The serial reference for element e of bucket b on rank r after one step's schedule: each
// reduction point (R or S) reduces the window of microbatches since the previous one; R adds
// the shard-reduced value into a per-replica partial; S adds the partial to its own shard
// reduction, then reduces across replicas.
double ReferenceElement(const Scenario& sc, const BucketPlan& plan, int b, size_t e, int step,
                        const std::vector<std::vector<std::vector<char>>>& windows) {
  const Bucket& bk = plan.buckets()[b];
  const size_t es = DTypeSize(bk.dtype);
  const int world = sc.replicas * sc.shards;
  const int reps = sc.mode == ReduceMode::kHybrid ? sc.replicas : 1;
  const int per_rep = sc.mode == ReduceMode::kHybrid ? sc.shards : world;
  std::vector<double> partial(reps, 0);
  std::vector<bool> has(reps, false);
  size_t w = 0;  // index of the window (reduction point)
  for (const char* c = sc.schedule; *c; ++c) {
    if (*c == 'N') continue;
    std::vector<double> stage1(reps);
    for (int rep = 0; rep < reps; ++rep) {
      std::vector<double> in;
      for (int k = 0; k < per_rep; ++k) in.push_back(Load(bk.dtype, windows[w][rep * per_rep + k].data() + e * es));
      stage1[rep] = ReduceStage(bk.dtype, in);
      if (has[rep]) {
        char buf[8];
        Store(bk.dtype, buf, Add(bk.dtype, partial[rep], stage1[rep]));
        stage1[rep] = Load(bk.dtype, buf);
      }
    }
    ++w;
    if (*c == 'R') {
      for (int rep = 0; rep < reps; ++rep) {
        partial[rep] = stage1[rep];
        has[rep] = true;
      }
      continue;
    }
    return sc.mode == ReduceMode::kHybrid ? ReduceStage(bk.dtype, stage1) : stage1[0];
  }
  ADD_FAILURE() << "schedule " << sc.schedule << " does not end with S";
  return 0;
}

bool InsideAParam(const BucketPlan& plan, int b, size_t e) {
  for (int p : plan.buckets()[b].params) {
    if (e >= plan.slot(p).offset && e < plan.slot(p).offset + plan.params()[p].count) return true;
  }
  return false;
}

class ReducerVsReference : public ::testing::TestWithParam<Scenario> {};

TEST_P(ReducerVsReference, BitExact) {
  const Scenario sc = GetParam();
  const int world = sc.replicas * sc.shards;
  RunRanks(world, [&](Group& g) {
    const int r = g.rank();
    Mesh mesh;
    ReducerGroups groups{&g, nullptr};
    if (sc.mode == ReduceMode::kHybrid) {
      auto m = MakeMesh(g, sc.replicas, sc.shards);
      ASSERT_TRUE(m.ok()) << m.status();
      mesh = std::move(*m);
      groups = {mesh.shard.get(), mesh.replica.get()};
    }
    ReducerConfig cfg;
    cfg.mode = sc.mode;
    cfg.first_bucket_cap_bytes = 256;  // several buckets per dtype
    cfg.bucket_cap_bytes = 4096;
    cfg.timeout = absl::Seconds(60);
    cfg.gradient_as_bucket_view = !sc.copy_in;
    auto params = MakeParams(sc.dtypes);
    auto reducer = GradientReducer::Create(params, groups, cfg);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    GradientReducer& red = **reducer;
    const BucketPlan& plan = red.plan();
    // Copy-in path: the framework's own gradient buffers.
    std::vector<std::vector<char>> own(params.size());
    for (size_t p = 0; p < params.size(); ++p) {
      own[p].assign(params[p].count * DTypeSize(params[p].dtype), 0);
      if (sc.copy_in) ASSERT_OK(red.SetGradBuffer(params[p].id, own[p].data()));
    }
    auto grad_of = [&](int p) -> TensorView {
      if (sc.copy_in) return TensorView{own[p].data(), params[p].count, params[p].dtype, params[p].device};
      return *red.GradView(params[p].id);
    };
    std::mt19937 order_rng(1234 + 77 * r);
    const int mbs = static_cast<int>(std::strlen(sc.schedule));
    for (int step = 0; step < 2; ++step) {
      red.ZeroGrads();
      for (auto& o : own) std::fill(o.begin(), o.end(), 0);  // the framework's zero_grad
      for (int m = 0; m < mbs; ++m) {
        ASSERT_OK(red.BeginBackward(ModeOf(sc.schedule[m])));
        std::vector<int> order(params.size());
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), order_rng);  // a different order on every rank
        // Marks come from two threads, as autograd's may.
        auto mark_half = [&](size_t from, size_t to) {
          for (size_t k = from; k < to; ++k) {
            const int p = order[k];
            Accumulate(grad_of(p), r, p, m, step);
            ASSERT_OK(red.MarkReady(params[p].id));
          }
        };
        std::thread other([&] { mark_half(order.size() / 2, order.size()); });
        mark_half(0, order.size() / 2);
        other.join();
        ASSERT_OK(red.FinishBackward());
      }
      // Check against the reference.
      for (size_t b = 0; b < plan.buckets().size(); ++b) {
        const Bucket& bk = plan.buckets()[b];
        const size_t es = DTypeSize(bk.dtype);
        // windows[w][rank]: the microbatches each reduction point reduces.
        std::vector<std::vector<std::vector<char>>> windows;
        for (int m = 0, start = 0; m < mbs; ++m) {
          if (sc.schedule[m] == 'N') continue;
          windows.emplace_back();
          for (int k = 0; k < world; ++k) windows.back().push_back(LocalBucket(plan, b, k, start, m + 1, step));
          start = m + 1;
        }
        size_t lo = 0, hi = bk.count;
        // All-reduce mode: the gradients themselves (views, or the framework's buffers after
        // unpacking), gathered back into bucket layout.
        std::vector<char> gathered(bk.bytes(), 0);
        for (int p : bk.params) {
          std::memcpy(gathered.data() + plan.slot(p).offset * es, grad_of(p).data, params[p].count * es);
        }
        const char* got = gathered.data();
        if (sc.mode != ReduceMode::kAllReduce) {
          const TensorView sv = red.ShardView(static_cast<int>(b));
          const int shard_rank = r % sc.shards;
          lo = shard_rank * bk.shard_count;
          hi = lo + bk.shard_count;
          got = static_cast<const char*>(sv.data) - lo * es;
        }
        for (size_t e = lo; e < hi; ++e) {
          if (sc.mode == ReduceMode::kAllReduce && !InsideAParam(plan, static_cast<int>(b), e)) continue;
          const double want = ReferenceElement(sc, plan, static_cast<int>(b), e, step, windows);
          char wb[8];
          Store(bk.dtype, wb, want);
          ASSERT_EQ(std::memcmp(got + e * es, wb, es), 0)
              << "rank " << r << " step " << step << " bucket " << b << " (" << DTypeName(bk.dtype)
              << ") element " << e << ": got " << Load(bk.dtype, got + e * es) << " want " << want;
        }
      }
    }
  });
}

std::string Name(const ::testing::TestParamInfo<Scenario>& i) {
  const Scenario& s = i.param;
  const char* mode = s.mode == ReduceMode::kAllReduce ? "allreduce" : s.mode == ReduceMode::kReduceScatter ? "reducescatter" : "hybrid";
  const char* dt[] = {"f32", "bf16", "f16", "mixed"};
  return absl::StrCat(mode, "_", s.replicas, "x", s.shards, "_", dt[s.dtypes], "_", s.schedule,
                      s.copy_in ? "_copyin" : "");
}

std::vector<Scenario> AllScenarios() {
  std::vector<Scenario> out;
  for (int dt = 0; dt < 4; ++dt) {
    for (const char* sched : {"S", "NNS"}) {
      for (int w : {1, 2, 4, 8}) {
        out.push_back({ReduceMode::kAllReduce, 1, w, dt, sched});
        out.push_back({ReduceMode::kReduceScatter, 1, w, dt, sched});
      }
    }
    for (const char* sched : {"S", "NNS", "RRS", "NRNS", "RNRS"}) {
      out.push_back({ReduceMode::kHybrid, 2, 2, dt, sched});
      out.push_back({ReduceMode::kHybrid, 2, 4, dt, sched});
    }
    for (const char* sched : {"S", "NNS"}) {  // copy-in path
      out.push_back({ReduceMode::kAllReduce, 1, 3, dt, sched, true});
      out.push_back({ReduceMode::kReduceScatter, 1, 4, dt, sched, true});
      out.push_back({ReduceMode::kHybrid, 2, 2, dt, sched, true});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, ReducerVsReference, ::testing::ValuesIn(AllScenarios()), Name);

}  // namespace
}  // namespace braid::sched
