// hooks_hosts: what each communication hook buys across a slow inter-host link. Step time of
// an all-reduce (DDP) gradient reduction of a GPT-2-like model and the bytes on the link, per
// hook: none, bf16 (2-byte wire, and the f32 wire), fp16, int8, PowerSGD rank 1 and 4 (issue
// 20, item 3; docs/performance.md).
//
//   tools/hosts/up.sh -p braid -n 2 -r 200mbit -s 2
//   tools/hosts/mpirun.sh -p braid -np 4 bazel-bin/bench/hooks_hosts --link=eth0
//
// Flags: --scale=0.0625 (fraction of GPT-2 small's 124M parameters)  --blocks=12  --iters=3
// --warmup=1  --link=<interface> (none)  --csv.
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
#include "bench/bench_flags.h"
#include "bench/hosts_common.h"
#include "bench/overlap_model.h"
#include "comm/backend.h"
#include "comm/status_macros.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/hooks/int8.h"
#include "scheduler/hooks/low_precision.h"
#include "scheduler/hooks/powersgd.h"

namespace braid::bench {
namespace {

using sched::GradientReducer;
using Clock = std::chrono::steady_clock;
constexpr const char* kRows[] = {"none", "bf16",        "bf16_f32wire", "fp16",
                                 "int8", "powersgd_r1", "powersgd_r4"};
constexpr int kNumRows = 7;

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

absl::Status Step(GradientReducer& r, int rank, int64_t it, double* ms) {
  const auto& params = r.plan().params();
  for (const auto& p : params) {  // gradients that change every step (untimed)
    ASSIGN_OR_RETURN(TensorView g, r.GradView(p.id));
    float* v = static_cast<float*>(g.data);
    for (size_t i = 0; i < p.count; ++i)
      v[i] = static_cast<float>(((i * 2654435761u + p.id * 97 + it) % 1024)) / 512.0f - 1.0f +
             0.01f * static_cast<float>(rank);
  }
  const auto t0 = Clock::now();
  RETURN_IF_ERROR(r.BeginBackward(sched::SyncMode::kSync));
  for (size_t k = params.size(); k-- > 0;) RETURN_IF_ERROR(r.MarkReady(params[k].id));
  RETURN_IF_ERROR(r.FinishBackward());
  *ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return absl::OkStatus();
}

constexpr char kUsage[] =
    R"(hooks_hosts: step time of an all-reduce gradient reduction and the bytes on the link per
communication hook (none, bf16, bf16 on the f32 wire, fp16, int8, PowerSGD r=1 and r=4), on
the mpi backend under mpirun
(2 hosts x 2 ranks: tools/hosts/).

usage: mpirun -np 4 hooks_hosts [flags]
  --scale=0.0625  fraction of GPT-2 small's 124M f32 parameters, in (0, 1]
  --blocks=12     transformer blocks
  --iters=3       timed steps per hook
  --warmup=1      untimed steps first
  --link=         network interface whose bytes are counted (none)
  --backend=mpi   or gloo (torchrun's environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
  --csv           CSV only
)";

absl::Status Run(int argc, char** argv) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(argc, argv));
  if (PrintHelp(f, kUsage)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const HostsFlags hf, HostsFlags::Read(f, /*default_iters=*/3));
  const std::string backend = f.Str("backend", "mpi");
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
  std::vector<std::unique_ptr<GradientReducer>> reducers;
  for (int j = 0; j < kNumRows; ++j) {
    ASSIGN_OR_RETURN(auto r, GradientReducer::Create(model.params, {world.get(), nullptr}, rc));
    ASSIGN_OR_RETURN(auto hook, Hook(j, rows));
    RETURN_IF_ERROR(r->SetCommHook(hook));
    reducers.push_back(std::move(r));
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
    for (int j = 0; j < kNumRows; ++j) {
      RETURN_IF_ERROR(HostsBarrier(*world));
      const int64_t b0 = on_bed ? LinkBytes(link_dev) : 0;
      double ms = 0;
      RETURN_IF_ERROR(Step(*reducers[j], rank, it, &ms));
      RETURN_IF_ERROR(HostsBarrier(*world));
      if (it >= warmup) {
        times[j].push_back(ms);
        if (on_bed) link[j] += LinkBytes(link_dev) - b0;
      }
    }
  }
  std::vector<double> all;
  for (const auto& v : times) all.insert(all.end(), v.begin(), v.end());
  ASSIGN_OR_RETURN(WorkPtr w, world->AllReduce(all.data(), all.data(), all.size(), DType::kF64,
                                               ReduceOp::Max()));
  RETURN_IF_ERROR(w->Wait(kHostsTimeout));
  if (rank == 0) {
    std::printf(csv ? "hook,step_ms,vs_none,link_MB\n" : "%-13s %10s %8s %10s\n", "hook", "step_ms",
                "vs_none", "link_MB");
    double none = 0;
    for (int j = 0; j < kNumRows; ++j) {
      std::vector<double> v(all.begin() + j * iters, all.begin() + (j + 1) * iters);
      std::sort(v.begin(), v.end());
      const double med = v[v.size() / 2];
      if (j == 0) none = med;
      const std::string mb = on_bed ? absl::StrCat(absl::SixDigits(link[j] / 1e6 / iters)) : "-";
      std::printf(csv ? "%s,%.1f,%.2f,%s\n" : "%-13s %10.1f %7.2fx %10s\n", kRows[j], med,
                  none / med, mb.c_str());
    }
  }
  reducers.clear();
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
