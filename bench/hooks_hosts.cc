// hooks_hosts: what each communication hook buys across a slow inter-host link. Step time of
// an all-reduce (DDP) gradient reduction of a GPT-2-like model and the bytes on the link, per
// hook: none, bf16 (2-byte wire, and the f32 wire), fp16, int8, PowerSGD rank 1 and 4 (issue
// 20, item 3); and the fully sharded unit gathers of the same model, exact and quantized (qwZ,
// issue 20 item 2; docs/performance.md).
//
//   tools/hosts/up.sh -p braid -n 2 -r 200mbit -s 2
//   tools/hosts/mpirun.sh -p braid -np 4 bazel-bin/bench/hooks_hosts --link=eth0
//
// Flags: --scale=0.0625 (fraction of GPT-2 small's 124M parameters)  --blocks=12  --iters=3
// --warmup=1  --link=<interface> (none)  --csv  --rows=<names> (all).
//
// Gather rows (gather_exact, gather_int8, gather_fp8): a fully sharded ParamGatherer over the
// world (the model's buckets sharded 4 ways, GathererConfig::quant int8 / fp8 with 4096-element
// scales); a step gathers every bucket in order (the forward) and again in reverse (the
// backward), prefetching one ahead and releasing each after the next is started, as a fully
// sharded unit does with prefetch 1. vs_base: against gather_exact (hook rows: against none).
//
// One reducer per hook (their state survives steps: error feedback, warm start), rows
// interleaved per iteration. step_ms: the slowest rank's BeginBackward..FinishBackward (every
// parameter marked at once: the reduction alone, no compute to overlap), median over
// iterations. link_MB: bytes host 0's interface sent plus received per step. PowerSGD views
// every matrix as (shape[0], -1) as torch does (see Rows); vectors go uncompressed. PowerSGD
// starts at once (start_powerSGD_iter 0).
// Beside it: the loss after N steps per hook (train_gpt.py --comm-hook), torch DDP's own
// hooks on the same model and link (hooks_torch.py).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_flags.h"
#include "bench/hosts_common.h"
#include "bench/overlap_model.h"
#include "comm/backend.h"
#include "comm/status_macros.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/hooks/int8.h"
#include "scheduler/hooks/low_precision.h"
#include "scheduler/hooks/powersgd.h"
#include "scheduler/param_gatherer.h"

namespace braid::bench {
namespace {

using sched::GradientReducer;
using Clock = std::chrono::steady_clock;
constexpr const char* kRows[] = {"none",        "bf16",        "bf16_f32wire", "fp16",
                                 "int8",        "powersgd_r1", "powersgd_r4",  "gather_exact",
                                 "gather_int8", "gather_fp8"};
constexpr int kNumRows = 10;
constexpr int kFirstGather = 7;  // rows from here on are gatherers, not hooks

// The divisor of c nearest to `target` (ties: the smaller).
int64_t NearestDivisor(int64_t c, double target) {
  int64_t best = 1;
  for (int64_t r = 1; r * r <= c; ++r) {
    if (c % r != 0) continue;
    for (int64_t v : {r, c / r})
      if (std::abs(v - target) < std::abs(best - target) ||
          (std::abs(v - target) == std::abs(best - target) && v < best))
        best = v;
  }
  return best;
}

// Rows per parameter, as torch's PowerSGD views a gradient: (shape[0], -1) for every tensor of
// 2 or more dimensions. GPT-2's matrices are (d, k) (Conv1D weights) and (vocab or positions,
// d) (wte, wpe); the scaled counts are no longer exact products, so each matrix gets the
// divisor of its count nearest its scaled shape[0] (wte at scale 0.0625: 13864 x 174 for
// 12564.25 x 192). Vectors (biases, layer norms) stay uncompressed.
std::vector<int64_t> Rows(const std::vector<sched::ParamSpec>& params, double scale) {
  const double d = std::max(1.0, 768 * std::sqrt(scale));
  std::vector<int64_t> rows;
  for (const auto& p : params) {
    const bool matrix = absl::EndsWith(p.name, "weight") && !absl::StrContains(p.name, "ln_");
    const bool embedding = p.name == "wte" || p.name == "wpe";
    const int64_t c = static_cast<int64_t>(p.count);
    const int64_t r = NearestDivisor(c, embedding ? c / d : d);
    rows.push_back((matrix || embedding) && r > 1 && r < c ? r : std::max<int64_t>(1, c));
  }
  return rows;
}

absl::StatusOr<std::shared_ptr<sched::CommHook>> Hook(int row, std::vector<int64_t> rows) {
  switch (row) {
    case 0:
      return nullptr;
    case 1:
      return sched::MakeLowPrecisionHook({DType::kBF16});
    case 2:  // the f32 wire of mpi/gloo: bf16 values, 4 bytes each on the link
      return sched::MakeLowPrecisionHook({DType::kBF16, false, /*half_wire=*/false});
    case 3:
      return sched::MakeLowPrecisionHook({DType::kF16});
    case 4:
      return sched::MakeInt8Hook({256});
    default: {
      sched::PowerSGDOptions o;
      o.rank = row == 5 ? 1 : 4;
      o.start_iter = 0;
      o.rows = std::move(rows);
      return sched::MakePowerSGDHook(o);
    }
  }
}

// A fully sharded gatherer over the model, its shards filled once (values the quantizer sees
// as gradients' would be: varied magnitudes within a block).
absl::StatusOr<std::unique_ptr<sched::ParamGatherer>> Gatherer(int row, const OverlapModel& model,
                                                               Group* group, size_t cap,
                                                               size_t first_cap) {
  sched::PlanOptions po;
  po.bucket_cap_bytes = cap;
  po.first_bucket_cap_bytes = first_cap;
  po.shards = group->size();
  ASSIGN_OR_RETURN(sched::BucketPlan plan, sched::BucketPlan::Build(model.params, po));
  sched::GathererConfig gc;
  gc.timeout = kHostsTimeout;
  gc.fully_sharded = true;
  if (row != kFirstGather) {
    gc.quant.dtype =
        row == kFirstGather + 1 ? sched::GatherDType::kInt8 : sched::GatherDType::kFp8E4M3;
  }
  ASSIGN_OR_RETURN(auto g, sched::ParamGatherer::Create(plan, group, gc));
  for (int b = 0; b < g->num_buckets(); ++b) {
    ASSIGN_OR_RETURN(TensorView shard, g->ShardView(b));
    float* v = static_cast<float*>(shard.data);
    for (size_t i = 0; i < shard.count; ++i)
      v[i] = (static_cast<float>((i * 2654435761u + b * 97) % 1024) / 512.0f - 1.0f) *
             (1.0f + static_cast<float>(i % 7));
  }
  return g;
}

// Every bucket gathered in order, then in reverse; prefetch one ahead, release behind.
absl::Status GatherStep(sched::ParamGatherer& g, double* ms) {
  const int nb = g.num_buckets();
  const auto t0 = Clock::now();
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < nb; ++i) {
      const int b = pass == 0 ? i : nb - 1 - i;
      RETURN_IF_ERROR(g.WaitParams(b));
      if (i + 1 < nb) RETURN_IF_ERROR(g.Prefetch(pass == 0 ? b + 1 : b - 1));
      RETURN_IF_ERROR(g.Release(b));
    }
  }
  *ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return absl::OkStatus();
}

// Gradients that change every step (untimed, before the barrier that starts the step).
absl::Status FillGrads(GradientReducer& r, int rank, int64_t it) {
  for (const auto& p : r.plan().params()) {
    ASSIGN_OR_RETURN(TensorView g, r.GradView(p.id));
    float* v = static_cast<float*>(g.data);
    for (size_t i = 0; i < p.count; ++i)
      v[i] = static_cast<float>(((i * 2654435761u + p.id * 97 + it) % 1024)) / 512.0f - 1.0f +
             0.01f * static_cast<float>(rank);
  }
  return absl::OkStatus();
}

absl::Status Step(GradientReducer& r, double* ms) {
  const auto& params = r.plan().params();
  const auto t0 = Clock::now();
  RETURN_IF_ERROR(r.BeginBackward(sched::SyncMode::kSync));
  for (size_t k = params.size(); k-- > 0;) RETURN_IF_ERROR(r.MarkReady(params[k].id));
  RETURN_IF_ERROR(r.FinishBackward());
  *ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return absl::OkStatus();
}

constexpr char kUsage[] =
    R"(hooks_hosts: step time of an all-reduce gradient reduction and the bytes on the link per
communication hook (none, bf16, bf16 on the f32 wire, fp16, int8, PowerSGD r=1 and r=4), and of
fully sharded unit gathers (exact, int8, fp8: qwZ), on the mpi backend under mpirun
(2 hosts x 2 ranks: tools/hosts/).

usage: mpirun -np 4 hooks_hosts [flags]
  --scale=0.0625  fraction of GPT-2 small's 124M f32 parameters, in (0, 1]
  --blocks=12     transformer blocks
  --iters=3       timed steps per hook
  --warmup=1      untimed steps first
  --link=         network interface whose bytes are counted (none)
  --backend=mpi   or gloo (torchrun's environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
  --csv           CSV only
  --rows=         comma-separated rows to run (all): none,bf16,bf16_f32wire,fp16,int8,
                  powersgd_r1,powersgd_r4,gather_exact,gather_int8,gather_fp8
)";

absl::Status Run(int argc, char** argv) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(argc, argv));
  if (PrintHelp(f, kUsage)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const HostsFlags hf, HostsFlags::Read(f, /*default_iters=*/3));
  const std::string backend = f.Str("backend", "mpi");
  std::vector<int> run;  // the selected rows, in kRows order
  {
    const std::string names = f.Str("rows", "");
    const std::vector<std::string> want = absl::StrSplit(names, ',', absl::SkipEmpty());
    for (const std::string& w : want) {
      if (std::find_if(std::begin(kRows), std::end(kRows), [&](const char* r) { return w == r; }) ==
          std::end(kRows))
        return absl::InvalidArgumentError(absl::StrCat("--rows: no row '", w, "'"));
    }
    for (int j = 0; j < kNumRows; ++j)
      if (want.empty() || std::find(want.begin(), want.end(), kRows[j]) != want.end())
        run.push_back(j);
  }
  if (!f.Unused().empty())
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", f.Unused()[0]));
  const double scale = hf.scale;
  const int64_t blocks = hf.blocks, iters = hf.iters, warmup = hf.warmup;
  const bool csv = hf.csv;
  const std::string& link_dev = hf.link;

  ASSIGN_OR_RETURN(HostsWorld hosts, OpenMpiWorld(backend));
  std::unique_ptr<Group>& world = hosts.world;
  const int n = world->size(), rank = world->rank();
  const OverlapModel model = Gpt2LikeModel(static_cast<int>(blocks), scale);
  sched::ReducerConfig rc;
  rc.timeout = kHostsTimeout;
  rc.bucket_cap_bytes = std::max<size_t>(64, static_cast<size_t>((25 << 20) * scale) / 64 * 64);
  rc.first_bucket_cap_bytes =
      std::max<size_t>(64, static_cast<size_t>((1 << 20) * scale) / 64 * 64);
  const std::vector<int64_t> rows = Rows(model.params, scale);
  size_t compressible = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < static_cast<int64_t>(model.params[i].count))
      compressible += model.params[i].count;
  std::vector<std::unique_ptr<GradientReducer>> reducers(kNumRows);
  std::vector<std::unique_ptr<sched::ParamGatherer>> gatherers(kNumRows);
  std::unique_ptr<Group> gather_group;  // the gatherers' own (used by one row at a time)
  for (int j : run) {
    if (j >= kFirstGather) {
      if (gather_group == nullptr) {
        ASSIGN_OR_RETURN(gather_group, world->Split(0, rank, "gather"));
      }
      ASSIGN_OR_RETURN(gatherers[j], Gatherer(j, model, gather_group.get(), rc.bucket_cap_bytes,
                                              rc.first_bucket_cap_bytes));
      continue;
    }
    ASSIGN_OR_RETURN(auto r, GradientReducer::Create(model.params, {world.get(), nullptr}, rc));
    ASSIGN_OR_RETURN(auto hook, Hook(j, rows));
    RETURN_IF_ERROR(r->SetCommHook(hook));
    reducers[j] = std::move(r);
  }
  const bool on_bed = rank == 0 && !link_dev.empty() && LinkBytes(link_dev) >= 0;
  if (rank == 0 && !link_dev.empty() && !on_bed)
    return absl::NotFoundError(absl::StrCat("--link=", link_dev, ": no such interface here"));
  if (rank == 0) {
    std::fprintf(stderr, "[hooks_hosts] %d ranks, %.1f MB of f32 gradients (%.0f%% in matrices)\n",
                 n, model.elems() * 4 / 1e6, 100.0 * compressible / model.elems());
  }
  std::vector<std::vector<double>> times(kNumRows);
  std::vector<int64_t> link(kNumRows, 0);
  for (int64_t it = 0; it < warmup + iters; ++it) {
    for (int j : run) {
      // The fill before the barrier: no rank's step includes a peer's fill.
      if (j < kFirstGather) RETURN_IF_ERROR(FillGrads(*reducers[j], rank, it));
      RETURN_IF_ERROR(HostsBarrier(*world));
      const int64_t b0 = on_bed ? LinkBytes(link_dev) : 0;
      double ms = 0;
      if (j >= kFirstGather) {
        RETURN_IF_ERROR(GatherStep(*gatherers[j], &ms));
      } else {
        RETURN_IF_ERROR(Step(*reducers[j], &ms));
      }
      RETURN_IF_ERROR(HostsBarrier(*world));
      if (it >= warmup) {
        times[j].push_back(ms);
        if (on_bed) link[j] += LinkBytes(link_dev) - b0;
      }
    }
  }
  std::vector<double> all;
  for (int j : run) all.insert(all.end(), times[j].begin(), times[j].end());
  ASSIGN_OR_RETURN(WorkPtr w, world->AllReduce(all.data(), all.data(), all.size(), DType::kF64,
                                               ReduceOp::Max()));
  RETURN_IF_ERROR(w->Wait(kHostsTimeout));
  if (rank == 0) {
    std::printf(
        csv ? "row,step_ms,min_ms,max_ms,vs_base,link_MB\n" : "%-13s %10s %10s %10s %8s %10s\n",
        "row", "step_ms", "min_ms", "max_ms", "vs_base", "link_MB");
    double base[2] = {0, 0};  // none, gather_exact (0: not run)
    for (size_t x = 0; x < run.size(); ++x) {
      const int j = run[x];
      std::vector<double> v(all.begin() + x * iters, all.begin() + (x + 1) * iters);
      std::sort(v.begin(), v.end());
      const double med = v[v.size() / 2];
      if (j == 0 || j == kFirstGather) base[j == 0 ? 0 : 1] = med;
      const double b = base[j >= kFirstGather ? 1 : 0];
      const std::string mb = on_bed ? absl::StrCat(absl::SixDigits(link[j] / 1e6 / iters)) : "-";
      const std::string vs = b > 0 ? absl::StrFormat("%.2fx", b / med) : "-";
      std::printf(csv ? "%s,%.1f,%.1f,%.1f,%s,%s\n" : "%-13s %10.1f %10.1f %10.1f %8s %10s\n",
                  kRows[j], med, v.front(), v.back(), vs.c_str(), mb.c_str());
    }
  }
  reducers.clear();
  gatherers.clear();
  gather_group.reset();
  hosts.backend.reset();  // before the world group: the last group finalizes MPI
  world.reset();
  return absl::OkStatus();
}

}  // namespace
}  // namespace braid::bench

int main(int argc, char** argv) {
  const absl::Status s = braid::bench::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "hooks_hosts: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
