// hsdp_hosts: does HSDP pay across a slow inter-host link? Step time of the gradient reduction,
// per mode, in one run, on the `mpi` backend under mpirun (meant for the 2 hosts x 2 ranks test
// bed of tools/hosts/, where the world's ranks {0,1} and {2,3} share a host).
//
//   tools/hosts/up.sh -p braid -n 2 -r 200mbit -s 2
//   tools/hosts/mpirun.sh -p braid -np 4 bazel-bin/bench/hsdp_hosts --link=eth0
//   tools/hosts/down.sh -p braid
//
// Flags (defaults): --scale=0.0625 (of GPT-2 small's 124M f32 parameters: 7.8M, 31 MB of
// gradients)  --blocks=12  --iters=7  --warmup=1  --link=<interface> (none)  --csv.
// Buckets: DDP's 25 MiB / 1 MiB caps times --scale (as bench/overlap), so the scaled model
// has as many buckets as the real one.
//
// Two reducers over the same parameters: flat reduce-scatter over the whole world, and hybrid
// on MakeMesh(world, world/2, 2): shard group = ranks {2k, 2k+1} (one host on the bed: the
// reduce-scatter stays inside it), replica group = one rank per host (the all-reduce of each
// shard crosses the link). One step is one accumulation window of microbatches, each a
// BeginBackward, MarkReady of every parameter in backward order, FinishBackward; S = sync,
// N = no_sync, R = reduce_scatter_only:
//   flat_rs S       reduce-scatter over 4 ranks, one microbatch
//   hybrid S        reduce-scatter in the host, all-reduce of the shard across hosts
//   flat_rs NNNS    4 microbatches accumulated locally, reduced once (full-size gradients kept)
//   hybrid NNNS     the same with hybrid
//   flat_rs SSSS    4 microbatches, each reduce-scattered over 4 ranks: the only way to keep
//                   accumulated gradients sharded without a mesh (the caller sums the shards)
//   hybrid RRRS     4 microbatches reduce-scattered in the host, shards accumulated, one
//                   all-reduce across hosts after the last (reduce_scatter_only)
//   flat_rs+ag S    flat_rs S, then every bucket's shard all-gathered over the 4 ranks: the
//                   full step of flat sharding (a sharded optimizer gathers its updated
//                   parameters, the same bytes as the gradient shard; here the shard itself)
//   hybrid+ag S     hybrid S, then the all-gather inside the host (the shard group)
// The modes are interleaved (the order rotates every iteration) so machine noise hits them
// alike. Communication only: no compute, no gradient writes in the timed steps (the content
// does not change what goes over the wire). A step's time is the slowest rank's, from a common
// start (a world barrier) to its last FinishBackward; reported: median, min, max over --iters.
// link_MB (with --link=eth0, the bed's host interface): bytes world rank 0's host sent plus
// received on that interface per step (/sys/class/net/<dev>/statistics in its namespace, read
// by rank 0 around the step between barriers); "-" without --link.
// After the timed iterations every mode runs one step with known gradients ((i & 7) + rank +
// microbatch, added per microbatch as autograd accumulates) and every rank checks its shard
// exactly against the average over ranks of the window's sum; any wrong element fails the run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_flags.h"
#include "bench/hosts_common.h"
#include "bench/overlap_model.h"
#include "comm/backend.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "scheduler/gradient_reducer.h"

namespace braid::bench {
namespace {

using sched::GradientReducer;
using sched::ReduceMode;
using sched::SyncMode;
using Clock = std::chrono::steady_clock;

struct Row {
  const char* name;
  bool hybrid;
  const char* schedule;  // one letter per microbatch: S, N, R
  bool gather = false;   // then all-gather every bucket's shard in the shard group
};
constexpr Row kRows[] = {
    {"flat_rs", false, "S"},          {"hybrid", true, "S"},          {"flat_rs", false, "NNNS"},
    {"hybrid", true, "NNNS"},         {"flat_rs", false, "SSSS"},     {"hybrid", true, "RRRS"},
    {"flat_rs+ag", false, "S", true}, {"hybrid+ag", true, "S", true},
};
constexpr int kNumRows = sizeof(kRows) / sizeof(kRows[0]);

SyncMode ToSync(char c) {
  return c == 'N' ? SyncMode::kNoSync : c == 'R' ? SyncMode::kReduceScatterOnly : SyncMode::kSync;
}

// Per reducer: every bucket's gathered buffer (padded_count f32), the all-gather's output.
using Gathered = std::vector<std::vector<float>>;

Gathered MakeGathered(const GradientReducer& r) {
  Gathered out;
  for (const sched::Bucket& b : r.plan().buckets()) out.emplace_back(b.padded_count);
  return out;
}

// All-gathers every bucket's reduced shard in the reducer's shard group (what a sharded
// optimizer does with the updated parameters after the step; here with the gradient shard,
// the same bytes): all launched, then all waited.
absl::Status GatherShards(GradientReducer& r, Gathered& out) {
  Group& g = *r.groups().shard;
  std::vector<WorkPtr> works;
  for (size_t b = 0; b < out.size(); ++b) {
    const TensorView shard = r.ShardView(static_cast<int>(b));
    ASSIGN_OR_RETURN(WorkPtr w, g.AllGather(shard.data, out[b].data(), shard.count, DType::kF32));
    works.push_back(std::move(w));
  }
  for (const WorkPtr& w : works) RETURN_IF_ERROR(w->Wait(kHostsTimeout));
  return absl::OkStatus();
}

// One accumulation window. With `values`, every microbatch first adds its known gradient
// ((i & 7) + rank + microbatch) into every parameter's view, ZeroGrads() opening each window.
absl::Status Step(GradientReducer& r, const std::string& schedule, int rank, bool values) {
  const auto& params = r.plan().params();
  for (size_t m = 0; m < schedule.size(); ++m) {
    const bool opens_window = m == 0 || schedule[m - 1] == 'S';
    if (values && opens_window) RETURN_IF_ERROR(r.ZeroGrads());
    RETURN_IF_ERROR(r.BeginBackward(ToSync(schedule[m])));
    for (size_t k = params.size(); k-- > 0;) {
      if (values) {
        ASSIGN_OR_RETURN(TensorView g, r.GradView(params[k].id));
        float* d = static_cast<float*>(g.data);
        for (size_t i = 0; i < params[k].count; ++i) d[i] += static_cast<float>((i & 7) + rank + m);
      }
      RETURN_IF_ERROR(r.MarkReady(params[k].id));
    }
    RETURN_IF_ERROR(r.FinishBackward());
  }
  return absl::OkStatus();
}

// Wrong elements in this rank's shard after Step(values) (with `gathered`: in the whole
// gathered bucket): the average over `world` ranks of the last window's sum (the microbatches
// after the last S before the final one).
int64_t CountWrong(const GradientReducer& r, const std::string& schedule, int shard_rank, int world,
                   const Gathered* gathered) {
  size_t first = schedule.size() - 1;
  while (first > 0 && schedule[first - 1] != 'S') --first;
  const sched::BucketPlan& plan = r.plan();
  int64_t wrong = 0;
  for (size_t k = 0; k < plan.params().size(); ++k) {
    const sched::ParamSpec& p = plan.params()[k];
    const sched::ParamSlot& slot = plan.slot(static_cast<int>(k));
    const sched::Bucket& bk = plan.buckets()[slot.bucket];
    size_t lo = static_cast<size_t>(shard_rank) * bk.shard_count, hi = lo + bk.shard_count;
    const float* g = static_cast<const float*>(r.GradView(p.id)->data);
    if (gathered != nullptr) {
      lo = 0;
      hi = bk.padded_count;
      g = (*gathered)[slot.bucket].data() + slot.offset;
    }
    for (size_t i = 0; i < p.count; ++i) {
      if (slot.offset + i < lo || slot.offset + i >= hi) continue;
      double sum = 0;
      for (size_t m = first; m < schedule.size(); ++m) {
        for (int q = 0; q < world; ++q) sum += static_cast<double>((i & 7) + q + m);
      }
      wrong += g[i] != static_cast<float>(sum / world);
    }
  }
  return wrong;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr char kUsage[] =
    R"(hsdp_hosts: step time of the gradient reduction, flat reduce-scatter vs hybrid (HSDP)
and their accumulation schedules, on the mpi backend under mpirun (2 hosts x 2 ranks).

usage: mpirun -np 4 hsdp_hosts [flags]
  --scale=0.0625  fraction of GPT-2 small's 124M f32 parameters, in (0, 1]
  --blocks=12     transformer blocks
  --iters=7       timed steps per mode
  --warmup=1      untimed steps first
  --link=         network interface whose link rate is reported (none)
  --csv           CSV only
)";

absl::Status Run(int argc, char** argv) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(argc, argv));
  if (PrintHelp(f, kUsage)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const HostsFlags hf, HostsFlags::Read(f, /*default_iters=*/7));
  if (!f.Unused().empty())
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", f.Unused()[0]));
  const double scale = hf.scale;
  const int64_t blocks = hf.blocks, iters = hf.iters, warmup = hf.warmup;
  const bool csv = hf.csv;
  const std::string& link_dev = hf.link;

  ASSIGN_OR_RETURN(HostsWorld hosts, OpenMpiWorld());
  std::unique_ptr<Group>& world = hosts.world;
  const int n = world->size(), rank = world->rank();
  if (n % 2 != 0 || n < 4)
    return absl::InvalidArgumentError(absl::StrCat("needs an even world of >= 4 ranks, got ", n));

  const OverlapModel model = Gpt2LikeModel(static_cast<int>(blocks), scale);
  sched::ReducerConfig rc;
  rc.timeout = kHostsTimeout;
  rc.bucket_cap_bytes = std::max<size_t>(64, static_cast<size_t>((25 << 20) * scale) / 64 * 64);
  rc.first_bucket_cap_bytes =
      std::max<size_t>(64, static_cast<size_t>((1 << 20) * scale) / 64 * 64);
  rc.mode = ReduceMode::kReduceScatter;
  ASSIGN_OR_RETURN(auto flat, GradientReducer::Create(model.params, {world.get(), nullptr}, rc));
  ASSIGN_OR_RETURN(Mesh mesh, MakeMesh(*world, n / 2, 2));
  rc.mode = ReduceMode::kHybrid;
  ASSIGN_OR_RETURN(auto hybrid, GradientReducer::Create(
                                    model.params, {mesh.shard.get(), mesh.replica.get()}, rc));

  Gathered flat_gathered = MakeGathered(*flat), hybrid_gathered = MakeGathered(*hybrid);
  const bool on_bed = rank == 0 && !link_dev.empty() && LinkBytes(link_dev) >= 0;
  if (rank == 0 && !link_dev.empty() && !on_bed) {
    return absl::NotFoundError(
        absl::StrCat("--link=", link_dev, ": no such interface (statistics) here"));
  }
  if (rank == 0) {
    std::fprintf(
        stderr,
        "[hsdp_hosts] %d ranks, %zu f32 parameters (%.1f MB of gradients), %zu buckets, %s\n", n,
        model.elems(), model.elems() * 4 / 1e6, flat->plan().buckets().size(),
        on_bed ? "link bytes measured" : "link bytes not measured (no --link)");
  }

  // times[row][iter]: this rank's step time; link[row]: host 0's bytes over the timed steps.
  std::vector<std::vector<double>> times(kNumRows);
  std::vector<int64_t> link(kNumRows, 0);
  for (int64_t it = 0; it < warmup + iters; ++it) {
    for (int j = 0; j < kNumRows; ++j) {
      const Row& row = kRows[(j + it) % kNumRows];
      const int idx = static_cast<int>(&row - kRows);
      RETURN_IF_ERROR(HostsBarrier(*world));
      const int64_t b0 = on_bed ? LinkBytes(link_dev) : 0;
      RETURN_IF_ERROR(HostsBarrier(*world));
      const auto t0 = Clock::now();
      RETURN_IF_ERROR(Step(row.hybrid ? *hybrid : *flat, row.schedule, rank, false));
      if (row.gather)
        RETURN_IF_ERROR(GatherShards(row.hybrid ? *hybrid : *flat,
                                     row.hybrid ? hybrid_gathered : flat_gathered));
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      RETURN_IF_ERROR(HostsBarrier(*world));
      if (it >= warmup) {
        times[idx].push_back(ms);
        if (on_bed) link[idx] += LinkBytes(link_dev) - b0;
      }
    }
    if (rank == 0)
      std::fprintf(stderr, "[hsdp_hosts] iteration %lld/%lld\n", static_cast<long long>(it + 1),
                   static_cast<long long>(warmup + iters));
  }

  // The slowest rank's time per step: one max all-reduce over every row and iteration.
  std::vector<double> flat_times;
  for (const auto& v : times) flat_times.insert(flat_times.end(), v.begin(), v.end());
  ASSIGN_OR_RETURN(WorkPtr w, world->AllReduce(flat_times.data(), flat_times.data(),
                                               flat_times.size(), DType::kF64, ReduceOp::Max()));
  RETURN_IF_ERROR(w->Wait(kHostsTimeout));

  // The check: every mode once with known gradients, every rank its own shard.
  int64_t wrong = 0;
  for (const Row& row : kRows) {
    GradientReducer& r = row.hybrid ? *hybrid : *flat;
    Gathered& gathered = row.hybrid ? hybrid_gathered : flat_gathered;
    RETURN_IF_ERROR(Step(r, row.schedule, rank, true));
    if (row.gather) {
      for (auto& b : gathered) std::fill(b.begin(), b.end(), -1.0f);
      RETURN_IF_ERROR(GatherShards(r, gathered));
    }
    const int64_t bad = CountWrong(r, row.schedule, row.hybrid ? mesh.shard->rank() : rank, n,
                                   row.gather ? &gathered : nullptr);
    if (bad != 0)
      std::fprintf(stderr, "[hsdp_hosts] rank %d: %s %s: %lld wrong elements\n", rank, row.name,
                   row.schedule, static_cast<long long>(bad));
    wrong += bad;
  }
  ASSIGN_OR_RETURN(WorkPtr wc, world->AllReduce(&wrong, &wrong, 1, DType::kI64, ReduceOp::Sum()));
  RETURN_IF_ERROR(wc->Wait(kHostsTimeout));
  if (wrong != 0)
    return absl::InternalError(absl::StrCat(wrong, " wrong gradient elements over all ranks"));

  if (rank == 0) {
    if (!csv) {
      std::printf(
          "hsdp_hosts: %d ranks, %zu f32 params (%.1f MB gradients), %zu buckets, %lld "
          "iterations\n",
          n, model.elems(), model.elems() * 4 / 1e6, flat->plan().buckets().size(),
          static_cast<long long>(iters));
      std::printf("%-10s %-6s %10s %10s %10s %10s\n", "mode", "sched", "step_ms", "min_ms",
                  "max_ms", "link_MB");
    } else {
      std::printf("mode,schedule,step_ms,min_ms,max_ms,link_MB\n");
    }
    size_t pos = 0;
    for (int j = 0; j < kNumRows; ++j) {
      std::vector<double> v(flat_times.begin() + pos, flat_times.begin() + pos + times[j].size());
      pos += times[j].size();
      const double mn = *std::min_element(v.begin(), v.end()),
                   mx = *std::max_element(v.begin(), v.end());
      const std::string mb = on_bed ? absl::StrCat(absl::SixDigits(link[j] / 1e6 / iters)) : "-";
      if (csv) {
        std::printf("%s,%s,%.1f,%.1f,%.1f,%s\n", kRows[j].name, kRows[j].schedule, Median(v), mn,
                    mx, mb.c_str());
      } else {
        std::printf("%-10s %-6s %10.1f %10.1f %10.1f %10s\n", kRows[j].name, kRows[j].schedule,
                    Median(v), mn, mx, mb.c_str());
      }
    }
    std::printf("results checked: every mode's shards exact on every rank\n");
  }
  flat.reset();
  hybrid.reset();
  mesh = {};
  hosts.backend.reset();  // before the world group: the last group finalizes MPI
  world.reset();
  return absl::OkStatus();
}

}  // namespace
}  // namespace braid::bench

int main(int argc, char** argv) {
  const absl::Status s = braid::bench::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "hsdp_hosts: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
