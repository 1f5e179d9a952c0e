#include "tests/reducer_reference.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "comm/half.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "scheduler/memory_stats.h"

namespace braid::sched::reference {
namespace {

// Rounds v to dtype t and back.
double Round(DType t, double v) {
  char buf[8];
  StoreElement(buf, t, 0, v);
  return LoadElement(buf, t, 0);
}
// Arithmetic in the accumulation type: f64 for f64, else f32.
double Add(DType t, double a, double b) {
  return t == DType::kF64 ? a + b
                          : static_cast<double>(static_cast<float>(a) + static_cast<float>(b));
}
double Mul(DType t, double s, double x) {
  return t == DType::kF64 ? s * x
                          : static_cast<double>(static_cast<float>(s) * static_cast<float>(x));
}
double Div(DType t, double a, int n) {
  return t == DType::kF64 ? a / n
                          : static_cast<double>(static_cast<float>(a) / static_cast<float>(n));
}

// The divide rule, written out independently of scheduler/divide.cc: average over the group
// (plain sum for a group of one); f16 scales each input by 1/pre before the sum and divides
// the stored result by post after it, with FSDP's factors (pre * post = n, pre ~ sqrt n).
struct Rule {
  double premul = 0;  // 0: none
  int divide = 1;     // divide the sum by this (avg)
  int post = 1;       // f16: divide the stored result by this
};
bool HasRule(int n) { return n == 1 || n == 2 || n == 3 || n == 4 || n == 8; }
Rule RuleFor(DType t, int n) {
  if (n == 1) return {};
  if (t != DType::kF16) return {0, n, 1};
  switch (n) {
    case 2:
      return {1.0 / 2, 1, 1};
    case 3:
      return {0, 1, 3};  // no power of two divides 3: plain sum, then divide by 3
    case 4:
      return {1.0 / 2, 1, 2};
    default:
      return {1.0 / 4, 1, 2};  // 8
  }
}

// One reduction stage over `inputs` (group-rank order): the stored value.
double ReduceStage(DType t, const std::vector<double>& inputs) {
  const Rule rule = RuleFor(t, static_cast<int>(inputs.size()));
  double acc = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const double v = rule.premul != 0 ? Mul(t, rule.premul, inputs[k]) : inputs[k];
    acc = k == 0 ? v : Add(t, acc, v);
  }
  if (rule.divide > 1) acc = Div(t, acc, rule.divide);
  double out = Round(t, acc);
  if (rule.post > 1) out = Round(t, Div(t, out, rule.post));
  return out;
}

// Rank r's local contents of bucket b holding microbatches [m0, m1) of step s (padding zero).
std::vector<char> LocalBucket(const BucketPlan& plan, int b, int r, int m0, int m1, int s,
                              GradFn grad) {
  const Bucket& bk = plan.buckets()[b];
  std::vector<char> buf(bk.bytes(), 0);
  for (int p : bk.params) {
    const ParamSpec& ps = plan.params()[p];
    TensorView v{buf.data() + plan.slot(p).offset * DTypeSize(ps.dtype), ps.count, ps.dtype,
                 ps.device};
    for (int m = m0; m < m1; ++m) Accumulate(v, grad, r, p, m, s);
  }
  return buf;
}

// Element e of bucket b after the schedule. windows[w][world rank] is the bucket each rank
// holds at the w-th reduction point (R or S): the microbatches since the previous one. R adds
// the shard-reduced value into a per-replica partial; S adds the partial to its own shard
// reduction, then reduces across replicas (hybrid).
// `t`: the gradient dtype (how windows are stored); every stage computes and stores in `a`
// (the reduce dtype: t itself, or f32 for half gradients with reduce_f32).
double ReferenceElement(const Scenario& sc, DType t, DType a, size_t e,
                        const std::vector<std::vector<std::vector<char>>>& windows) {
  const bool hybrid = sc.mode == ReduceMode::kHybrid;
  const int reps = hybrid ? sc.replicas : 1;
  const int per_rep = hybrid ? sc.shards : sc.replicas * sc.shards;
  std::vector<double> partial(reps, 0);
  std::vector<bool> has(reps, false);
  size_t w = 0;
  for (const char* c = sc.schedule; *c != '\0'; ++c) {
    if (*c == 'N') continue;
    std::vector<double> stage1(reps);
    for (int rep = 0; rep < reps; ++rep) {
      std::vector<double> in;
      for (int k = 0; k < per_rep; ++k)
        in.push_back(LoadElement(windows[w][rep * per_rep + k].data(), t, e));
      stage1[rep] = ReduceStage(a, in);
      if (has[rep]) stage1[rep] = Round(a, Add(a, partial[rep], stage1[rep]));
    }
    ++w;
    if (*c == 'R') {
      partial = stage1;
      has.assign(reps, true);
      continue;
    }
    return Round(t, hybrid ? ReduceStage(a, stage1) : stage1[0]);
  }
  return 0;  // CheckStep rejects schedules that do not end with S
}

}  // namespace

std::string ScenarioName(const Scenario& sc) {
  const char* mode = sc.mode == ReduceMode::kAllReduce       ? "allreduce"
                     : sc.mode == ReduceMode::kReduceScatter ? "reducescatter"
                                                             : "hybrid";
  const char* dtypes[] = {"f32", "bf16", "f16", "mixed"};
  return absl::StrCat(mode, "_", sc.replicas, "x", sc.shards, "_", dtypes[sc.dtypes], "_",
                      sc.schedule, sc.copy_in ? "_copyin" : "", sc.reduce_f32 ? "_f32reduce" : "",
                      sc.shard_gradients ? "_kept"
                      : sc.values        ? "_values"
                                         : "",
                      sc.credit > 0 ? absl::StrCat("_credit", sc.credit) : "");
}

SyncMode SyncModeOf(char letter) {
  return letter == 'N'   ? SyncMode::kNoSync
         : letter == 'R' ? SyncMode::kReduceScatterOnly
                         : SyncMode::kSync;
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

void Accumulate(const TensorView& view, GradFn grad, int rank, int param, int microbatch,
                int step) {
  char* base = static_cast<char*>(view.data);
  for (size_t i = 0; i < view.count; ++i) {
    StoreElement(
        base, view.dtype, i,
        Add(view.dtype, LoadElement(base, view.dtype, i), grad(rank, param, microbatch, step, i)));
  }
}

absl::Status CheckStep(const Scenario& sc, const GradientReducer& reducer, int rank, int step,
                       GradFn grad, const std::vector<std::vector<char>>* copy_in_grads,
                       const std::vector<std::vector<char>>* bucket_copies) {
  const std::string schedule = sc.schedule;
  if (schedule.empty() || schedule.back() != 'S' || schedule.find('S') != schedule.size() - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule ", schedule, " must end with its only S"));
  }
  const int world = sc.replicas * sc.shards;
  if (!HasRule(world) || !HasRule(sc.replicas) || !HasRule(sc.shards)) {
    return absl::InvalidArgumentError(
        absl::StrCat("no reference divide rule for ", ScenarioName(sc)));
  }
  const BucketPlan& plan = reducer.plan();
  const int mbs = static_cast<int>(schedule.size());
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bk = plan.buckets()[b];
    const size_t es = DTypeSize(bk.dtype);
    std::vector<std::vector<std::vector<char>>> windows;
    for (int m = 0, start = 0; m < mbs; ++m) {
      if (schedule[m] == 'N') continue;
      windows.emplace_back();
      for (int k = 0; k < world; ++k) {
        windows.back().push_back(
            LocalBucket(plan, static_cast<int>(b), k, start, m + 1, step, grad));
      }
      start = m + 1;
    }
    // All-reduce mode: the whole bucket, through the first parameter's view. Otherwise: this
    // rank's shard, indexed as if it were the whole bucket.
    const int first = bk.params[0];
    const char* bucket_base =
        bucket_copies != nullptr ? (*bucket_copies)[b].data()
        : sc.mode != ReduceMode::kAllReduce
            ? nullptr  // read through ShardView below (shard_gradients has no GradView)
            : static_cast<const char*>(reducer.GradView(plan.params()[first].id)->data) -
                  plan.slot(first).offset * es;
    const char* got = bucket_base;
    std::vector<char> gathered;  // copy-in: the framework's buffers, laid out as the bucket
    if (sc.copy_in && sc.mode == ReduceMode::kAllReduce && copy_in_grads != nullptr) {
      gathered.assign(bk.bytes(), 0);
      for (int p : bk.params) {
        std::memcpy(gathered.data() + plan.slot(p).offset * es, (*copy_in_grads)[p].data(),
                    plan.params()[p].count * es);
      }
      got = gathered.data();
    }
    size_t lo = 0, hi = bk.count;
    if (sc.mode != ReduceMode::kAllReduce) {
      lo = static_cast<size_t>(rank % sc.shards) * bk.shard_count;
      hi = lo + bk.shard_count;
      got = bucket_copies != nullptr
                ? bucket_base
                : static_cast<const char*>(reducer.ShardView(static_cast<int>(b)).data) - lo * es;
    }
    for (size_t e = lo; e < hi; ++e) {
      const DType arith = sc.reduce_f32 && IsHalf(bk.dtype) ? DType::kF32 : bk.dtype;
      const double want = ReferenceElement(sc, bk.dtype, arith, e, windows);
      char want_bytes[8];
      StoreElement(want_bytes, bk.dtype, 0, want);
      if (std::memcmp(got + e * es, want_bytes, es) != 0) {
        return absl::InternalError(absl::StrCat(ScenarioName(sc), ": rank ", rank, " step ", step,
                                                " bucket ", b, " (", DTypeName(bk.dtype),
                                                ") element ", e, ": got ",
                                                LoadElement(got, bk.dtype, e), " want ", want));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RunScenario(Group& world, const Scenario& sc, GradFn grad, absl::Duration timeout) {
  if (world.size() != sc.replicas * sc.shards) {
    return absl::InvalidArgumentError(absl::StrCat(ScenarioName(sc), " needs ",
                                                   sc.replicas * sc.shards,
                                                   " ranks, the group has ", world.size()));
  }
  const int r = world.rank();
  Mesh mesh;
  ReducerGroups groups{&world, nullptr};
  if (sc.mode == ReduceMode::kHybrid) {
    ASSIGN_OR_RETURN(mesh, MakeMesh(world, sc.replicas, sc.shards));
    groups = {mesh.shard.get(), mesh.replica.get()};
  }
  ReducerConfig cfg;
  cfg.mode = sc.mode;
  cfg.first_bucket_cap_bytes = 256;
  cfg.bucket_cap_bytes = 4096;
  cfg.timeout = timeout;
  cfg.gradient_as_bucket_view = !sc.copy_in;
  if (sc.reduce_f32) cfg.reduce_dtype = DType::kF32;
  cfg.shard_gradients = sc.shard_gradients;
  MemoryStats memory;
  cfg.memory = &memory;
  const bool values = sc.values || sc.shard_gradients;
  const std::vector<ParamSpec> params = MakeParams(sc.dtypes);
  std::unique_ptr<OpScheduler> scheduler;  // outlives the reducer (declared first)
  if (sc.credit > 0) {
    OpSchedulerConfig oc;
    oc.credit_bytes = sc.credit;
    oc.timeout = timeout;
    ASSIGN_OR_RETURN(scheduler, OpScheduler::Create(oc, &world));
    cfg.scheduler = scheduler.get();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GradientReducer> red,
                   GradientReducer::Create(params, groups, cfg));
  // Copy-in path: the framework's own gradient buffers.
  std::vector<std::vector<char>> own(params.size());
  for (size_t p = 0; p < params.size(); ++p) {
    own[p].assign(params[p].count * DTypeSize(params[p].dtype), 0);
    if (sc.copy_in) RETURN_IF_ERROR(red->SetGradBuffer(params[p].id, own[p].data()));
  }
  auto grad_of = [&](int p) -> absl::StatusOr<TensorView> {
    if (sc.copy_in || values)
      return TensorView{own[p].data(), params[p].count, params[p].dtype, params[p].device};
    return red->GradView(params[p].id);
  };
  std::mt19937 order_rng(1234 + 77 * r);
  const int mbs = static_cast<int>(std::strlen(sc.schedule));
  for (int step = 0; step < 2; ++step) {
    RETURN_IF_ERROR(red->ZeroGrads());
    for (auto& o : own) std::fill(o.begin(), o.end(), 0);  // the framework's zero_grad
    for (int m = 0; m < mbs; ++m) {
      // values: each microbatch's own gradient (the framework's fresh .grad), passed at the mark.
      if (values)
        for (auto& o : own) std::fill(o.begin(), o.end(), 0);
      RETURN_IF_ERROR(red->BeginBackward(SyncModeOf(sc.schedule[m])));
      std::vector<int> order(params.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), order_rng);  // a different order on every rank
      // Marks come from two threads, as autograd's may; buckets still launch in bucket order.
      auto mark_range = [&](size_t from, size_t to) -> absl::Status {
        for (size_t k = from; k < to; ++k) {
          const int p = order[k];
          ASSIGN_OR_RETURN(TensorView v, grad_of(p));
          Accumulate(v, grad, r, p, m, step);
          if (values) {
            RETURN_IF_ERROR(red->MarkReady(params[p].id, DeviceEvent{}, v.data));
          } else {
            RETURN_IF_ERROR(red->MarkReady(params[p].id));
          }
        }
        return absl::OkStatus();
      };
      absl::Status other_status;
      std::thread other([&] { other_status = mark_range(order.size() / 2, order.size()); });
      const absl::Status mine = mark_range(0, order.size() / 2);
      other.join();
      RETURN_IF_ERROR(mine);
      RETURN_IF_ERROR(other_status);
      RETURN_IF_ERROR(red->FinishBackward());
    }
    RETURN_IF_ERROR(CheckStep(sc, *red, r, step, grad, values ? nullptr : &own));
    if (sc.shard_gradients) {
      int64_t shards = 0, storage = 0;
      for (const Bucket& bk : red->plan().buckets()) {
        const bool staged = sc.reduce_f32 && IsHalf(bk.dtype);
        shards += static_cast<int64_t>(bk.shard_count * DTypeSize(bk.dtype));
        if (staged && sc.mode == ReduceMode::kHybrid)
          shards += static_cast<int64_t>(bk.shard_count * 4);
        storage += static_cast<int64_t>((bk.bytes() + 63) / 64 * 64);
        if (staged) storage += static_cast<int64_t>(bk.padded_count * 4 + 63) / 64 * 64;
      }
      const MemorySnapshot mem = memory.Snapshot();
      const MemoryCounter& kept = mem.by_use[static_cast<int>(MemoryUse::kGradShards)];
      const MemoryCounter& pool = mem.by_use[static_cast<int>(MemoryUse::kGradBuckets)];
      if (kept.current != shards || pool.current > storage || pool.current <= 0) {
        return absl::InternalError(absl::StrCat(
            ScenarioName(sc), ": rank ", r, " step ", step, ": kGradShards ", kept.current,
            " (want ", shards, "), kGradBuckets ", pool.current, " (want 1..", storage, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace braid::sched::reference
