// collective_latency: an nccl-tests-style table for every collective on any Braid backend.
//
//   tools/bazelw run //bench:collective_latency                      # local, 4 ranks, 8 B..64 MiB
//   tools/bazelw run //bench:collective_latency -- --backend=mpi --ranks=2   # relaunches under
//   mpirun tools/bazelw run //bench:collective_latency -- --backend=nccl   # 1 rank on GPU 0, no
//   mpirun bazel-bin/bench/collective_latency --ranks=2 --minbytes=64M --csv
//
// Columns follow nccl-tests: size is the bytes nccl-tests counts (the full array for
// reduce-scatter and all-gather), algbw = size / time, busbw = algbw x 2(n-1)/n for
// all-reduce, x (n-1)/n for reduce-scatter and all-gather, x 1 for broadcast. Time is the
// mean of issue + Wait per op (the slowest rank's), after warm-up; iterations scale down above
// 1 MiB (never below 3). Before timing, each op runs once on exact data and #wrong counts
// elements that differ from the expected result, summed over ranks (premul_sum uses the scalar
// 0.5 on every rank, so its check is exact too). The count column is NCCL's per-call count.
// Progress goes to stderr: one updating line on a terminal, one line per collective otherwise.
// Buffers live in the group's memory (device memory on nccl; see bench/collective_table.h).
// Baselines measured in the same run: a copy in that memory (row "memcpy": one host thread;
// "d2d_copy": device to device on nccl) and, on the mpi
// backend, raw OpenMPI all-reduce loops interleaved round by round with Braid's (rows
// "raw_mpi_iallreduce" = MPI_Iallreduce+MPI_Wait, "raw_mpi_iallreduce_test" (MPI_Test spin),
// "raw_mpi_allreduce" (blocking), "braid_allreduce_interleaved"; medians over --compare_rounds)
// at 8 B, 4 KiB, 64 KiB, 1 MiB and 16 MiB when inside the size range, plus a summary table.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_flags.h"
#include "bench/collective_table.h"
#include "bench/overlap_mpi.h"
#include "bench/raw_baselines.h"
#include "comm/backend.h"
#include "comm/status_macros.h"

namespace braid::bench {
namespace {

using Config = CollectiveConfig;
using Row = CollectiveRow;

absl::StatusOr<Config> ParseConfig(const Flags& f, const Options& env) {
  Config c;
  c.backend = f.Str("backend", env.backend);
  // nccl: one rank per GPU, so one rank unless told otherwise.
  ASSIGN_OR_RETURN(int64_t ranks, f.Int("ranks", c.backend == "nccl" ? 1 : 4));
  c.ranks = static_cast<int>(ranks);
  ASSIGN_OR_RETURN(c.minbytes, f.Int("minbytes", 8));
  ASSIGN_OR_RETURN(c.maxbytes, f.Int("maxbytes", int64_t{64} << 20));
  ASSIGN_OR_RETURN(c.step, f.Int("stepfactor", 2));
  ASSIGN_OR_RETURN(int64_t iters, f.Int("iters", 20));
  ASSIGN_OR_RETURN(int64_t warmup, f.Int("warmup", 5));
  c.iters = static_cast<int>(iters);
  c.warmup = static_cast<int>(warmup);
  ASSIGN_OR_RETURN(c.dtype, ParseDType(f.Str("dtype", "f32")));
  ASSIGN_OR_RETURN(c.redop, ParseReduceKind(f.Str("redop", "sum")));
  c.csv = f.Bool("csv", false);
  c.check = f.Bool("check", true);
  c.in_place = f.Bool("inplace", false);
  ASSIGN_OR_RETURN(int64_t rounds, f.Int("compare_rounds", 9));
  c.compare_rounds = static_cast<int>(std::max<int64_t>(1, rounds));
  const std::string ops = f.Str("ops", "allreduce,reduce_scatter,allgather,broadcast,barrier");
  for (absl::string_view name : absl::StrSplit(ops, ',')) {
    bool found = false;
    for (CollectiveKind k :
         {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllGather,
          CollectiveKind::kBroadcast, CollectiveKind::kBarrier}) {
      if (CollectiveName(k) == name) {
        c.ops.push_back(k);
        found = true;
      }
    }
    if (!found)
      return absl::InvalidArgumentError(absl::StrCat("--ops: unknown collective '", name, "'"));
  }
  for (const auto& [bad, what] : std::vector<std::pair<bool, const char*>>{
           {c.ranks < 1, "--ranks must be >= 1"},
           {c.minbytes < 1, "--minbytes must be >= 1"},
           {c.maxbytes < c.minbytes, "--maxbytes must be >= --minbytes"},
           {c.step < 2, "--stepfactor must be >= 2"},
           {c.iters < 1, "--iters must be >= 1"},
           {c.warmup < 0, "--warmup must be >= 0"}}) {
    if (bad) return absl::InvalidArgumentError(what);
  }
  RETURN_IF_ERROR(ValidateReduceOp(ReduceOp{c.redop, 1.0}, c.dtype));
  for (const std::string& u : f.Unused()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", u));
  }
  return c;
}

// Under `bazel run` the mpi backend, and nccl with more than one rank (it bootstraps its unique
// id over MPI), need a launcher: re-exec this binary under mpirun. One nccl rank runs without.
void RelaunchUnderMpirunIfNeeded(const Config& c, int argc, char** argv) {
  const bool needs_mpirun = c.backend == "mpi" || (c.backend == "nccl" && c.ranks > 1);
  if (needs_mpirun) RelaunchUnderMpirun("collective_latency", c.ranks, argc, argv);
}

constexpr char kUsage[] =
    R"(collective_latency: an nccl-tests-style table (time, algbw, busbw, #wrong) of every
collective on any Braid backend, with same-run memcpy and raw-MPI baselines.

usage: collective_latency [flags]
  --backend=$BRAID_BACKEND  local | mpi | nccl | gloo | a plugin (mpi relaunches under mpirun)
  --ranks=4                 ranks (nccl: 1)
  --minbytes=8              smallest size (K/M/G suffixes)
  --maxbytes=64M            largest size
  --stepfactor=2            size multiplier between rows
  --iters=20                timed iterations per size (fewer above 1 MiB, never below 3)
  --warmup=5                untimed iterations first
  --dtype=f32               element type
  --redop=sum               sum | avg | premul_sum | max | min
  --ops=allreduce,reduce_scatter,allgather,broadcast,barrier
  --check=true              check each op once on exact data (#wrong)
  --inplace=false           in-place buffers
  --compare_rounds=9        rounds of the raw-MPI comparison (mpi)
  --csv                     CSV only
)";

absl::Status Main(int argc, char** argv) {
  ASSIGN_OR_RETURN(Flags flags, Flags::Parse(argc, argv));
  if (PrintHelp(flags, kUsage)) return absl::OkStatus();
  ASSIGN_OR_RETURN(Options env, Options::FromEnv());
  ASSIGN_OR_RETURN(Config c, ParseConfig(flags, env));
  RelaunchUnderMpirunIfNeeded(c, argc, argv);
  Options o = env;
  o.backend = c.backend;
  o.local_ranks = c.ranks;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(o));
  std::vector<std::unique_ptr<Group>> groups;
  for (int r : backend->local_ranks()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Group> g, backend->WorldGroup(r));
    groups.push_back(std::move(g));
  }
  const bool leader = groups.front()->rank() == 0;
  std::vector<Row> rows;
  std::vector<absl::Status> status(groups.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < groups.size(); ++i) {
    threads.emplace_back([&, i] {
      const bool lead = groups[i]->rank() == 0;
      status[i] = RunCollectiveSweep(*groups[i], c, lead ? &rows : nullptr, lead);
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  // Baselines in the same run.
  std::vector<MpiCompareRow> mpi_compare;
  if (c.backend == "mpi") {
    std::vector<size_t> sizes;
    for (size_t b : {size_t{8}, size_t{512}, size_t{4096}, size_t{16384}, size_t{65536},
                     size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
      if (b >= static_cast<size_t>(c.minbytes) && b <= static_cast<size_t>(c.maxbytes))
        sizes.push_back(b);
    }
    if (isatty(2) && leader)
      std::fprintf(stderr, "[collective_latency] braid vs raw MPI, interleaved rounds...\n");
    RETURN_IF_ERROR(
        CompareWithRawMpi(*groups.front(), sizes, c.compare_rounds, 20000, &mpi_compare));
    const int n = groups.front()->size();
    for (const MpiCompareRow& m : mpi_compare) {
      for (const auto& [name, us] :
           {std::pair<const char*, double>{"raw_mpi_iallreduce", m.raw_wait_us},
            {"raw_mpi_iallreduce_test", m.raw_test_us},
            {"raw_mpi_allreduce", m.raw_blocking_us},
            {"braid_allreduce_interleaved", m.braid_us}}) {
        const double algbw = m.bytes / (us * 1e-6) / 1e9;
        rows.push_back(Row{name, m.bytes, m.bytes / 4, "f32", "sum", us, algbw,
                           algbw * BusFactor(CollectiveKind::kAllReduce, n), 0});
      }
    }
  }
  if (leader) {
    // The copy bandwidth of the memory the collectives used (host memcpy or device d2d).
    ASSIGN_OR_RETURN(Row copy, CopyBaselineRow(*groups.front(), static_cast<size_t>(c.maxbytes)));
    rows.push_back(copy);
    PrintCollectiveTable(c, groups.front()->size(), rows);
    if (!c.csv && !mpi_compare.empty()) {
      std::printf(
          "#\n# mpi backend vs raw OpenMPI (in-place f32 sum, median of %d interleaved rounds)\n",
          c.compare_rounds);
      // Issue 14 item 5 compares against blocking MPI_Allreduce; the nonblocking columns
      // are against the faster of the two MPI_Iallreduce loops.
      std::printf("# %10s %12s %12s %12s %10s %12s %10s %10s\n", "bytes", "raw_wait_us",
                  "raw_test_us", "raw_block_us", "braid_us", "braid-blk_us", "braid/blk",
                  "braid/nb");
      for (const MpiCompareRow& m : mpi_compare) {
        const double nb = std::min(m.raw_wait_us, m.raw_test_us);
        std::printf("  %10zu %12.2f %12.2f %12.2f %10.2f %12.2f %10.3f %10.3f\n", m.bytes,
                    m.raw_wait_us, m.raw_test_us, m.raw_blocking_us, m.braid_us,
                    m.braid_us - m.raw_blocking_us, m.braid_us / m.raw_blocking_us,
                    m.braid_us / nb);
      }
    }
    int64_t wrong = 0;
    for (const Row& r : rows) wrong += r.wrong;
    if (wrong != 0) return absl::DataLossError(absl::StrCat(wrong, " wrong elements"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace braid::bench

int main(int argc, char** argv) {
  absl::Status s = braid::bench::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "collective_latency: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
