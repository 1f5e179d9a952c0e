// collective_latency: an nccl-tests-style table for every collective on any Braid backend.
//
//   tools/bazelw run //bench:collective_latency                      # local, 4 ranks, 8 B..64 MiB
//   tools/bazelw run //bench:collective_latency -- --backend=mpi --ranks=2   # relaunches under mpirun
//   bazel-bin/bench/collective_latency --ranks=2 --minbytes=64M --csv
//
// Columns follow nccl-tests: size is the bytes nccl-tests counts (the full array for
// reduce-scatter and all-gather), algbw = size / time, busbw = algbw x 2(n-1)/n for
// all-reduce, x (n-1)/n for reduce-scatter and all-gather, x 1 for broadcast. Time is the
// mean of issue + Wait per op (the slowest rank's), after warm-up; iterations scale down above
// 1 MiB (never below 3). Before timing, each op runs once on exact data and #wrong counts
// elements that differ from the expected result, summed over ranks (premul_sum uses the scalar
// 0.5 on every rank, so its check is exact too). The count column is NCCL's per-call count.
// Progress goes to stderr: one updating line on a terminal, one line per collective otherwise.
// Baselines measured in the same run: single-thread memcpy (row "memcpy") and, on the mpi
// backend, raw OpenMPI all-reduce loops interleaved round by round with Braid's (rows
// "raw_mpi_iallreduce" = MPI_Iallreduce+MPI_Wait, "raw_mpi_iallreduce_test" (MPI_Test spin),
// "raw_mpi_allreduce" (blocking), "braid_allreduce_interleaved"; medians over --compare_rounds)
// at 8 B, 4 KiB, 64 KiB, 1 MiB and 16 MiB when inside the size range, plus a summary table.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_flags.h"
#include "bench/raw_baselines.h"
#include "comm/backend.h"
#include "comm/element.h"
#include "comm/half.h"
#include "comm/status_macros.h"

namespace braid::bench {
namespace {

struct Config {
  std::string backend;
  int ranks = 4;
  int64_t minbytes = 8, maxbytes = int64_t{64} << 20, step = 2;
  int iters = 20, warmup = 5;
  std::vector<CollectiveKind> ops;
  DType dtype = DType::kF32;
  ReduceKind redop = ReduceKind::kSum;
  bool csv = false, check = true, in_place = false;
  int compare_rounds = 9;  // mpi: rounds of the interleaved raw-MPI comparison
};

struct Row {
  std::string op;
  size_t bytes = 0, count = 0;
  std::string dtype, redop;
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
};

double BusFactor(CollectiveKind k, int n) {
  switch (k) {
    case CollectiveKind::kAllReduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather: return static_cast<double>(n - 1) / n;
    case CollectiveKind::kBroadcast: return 1.0;
    default: return 0.0;
  }
}

// --- exact check data: small integers, exact in every dtype and any reduction order -------
double Pattern(size_t i, int rank) { return static_cast<double>((i * 3 + rank * 5) % 13); }

// The value `v` as the dtype stores it (so avg's rounding is compared like for like).
double Rounded(DType t, double v) {
  unsigned char tmp[8];
  StoreElement(tmp, t, 0, v);
  return LoadElement(tmp, t, 0);
}

// premul_sum's scalar: a power of two, so products and sums stay exact in any order.
constexpr double kPremulScalar = 0.5;

double Expected(ReduceKind op, DType t, size_t i, int n) {
  const double s = op == ReduceKind::kPreMulSum ? kPremulScalar : 1.0;
  double acc = s * Pattern(i, 0);
  for (int r = 1; r < n; ++r) {
    const double v = s * Pattern(i, r);
    if (op == ReduceKind::kMax) acc = std::max(acc, v);
    else if (op == ReduceKind::kMin) acc = std::min(acc, v);
    else acc += v;
  }
  if (op == ReduceKind::kAvg) {
    acc = t == DType::kF64 ? acc / n : static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
  }
  return Rounded(t, acc);
}

// Buffers of one rank, sized for the largest message.
struct Buffers {
  std::vector<unsigned char> send, recv;
};

struct Shape {
  size_t count = 0;      // NCCL-style count passed to the call
  size_t send_elems = 0, recv_elems = 0;
};

Shape ShapeFor(CollectiveKind k, size_t bytes, DType t, int n) {
  const size_t es = DTypeSize(t);
  Shape s;
  switch (k) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
      s.count = bytes / es;
      s.send_elems = s.recv_elems = s.count;
      break;
    case CollectiveKind::kReduceScatter:
      s.count = bytes / es / n;
      s.send_elems = s.count * n;
      s.recv_elems = s.count;
      break;
    case CollectiveKind::kAllGather:
      s.count = bytes / es / n;
      s.send_elems = s.count;
      s.recv_elems = s.count * n;
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  return s;
}

absl::StatusOr<WorkPtr> Issue(Group& g, const Config& c, CollectiveKind k, const Shape& s,
                              Buffers& b) {
  const size_t es = DTypeSize(c.dtype);
  unsigned char* send = b.send.data();
  unsigned char* recv = b.recv.data();
  const ReduceOp op{c.redop, kPremulScalar};
  switch (k) {
    case CollectiveKind::kAllReduce:
      return g.AllReduce(send, c.in_place ? send : recv, s.count, c.dtype, op);
    case CollectiveKind::kReduceScatter:
      return g.ReduceScatter(send, c.in_place ? send + g.rank() * s.count * es : recv, s.count,
                             c.dtype, op);
    case CollectiveKind::kAllGather:
      return g.AllGather(c.in_place ? recv + g.rank() * s.count * es : send, recv, s.count,
                         c.dtype);
    case CollectiveKind::kBroadcast:
      return g.Broadcast(send, s.count, c.dtype, 0);
    case CollectiveKind::kBarrier:
      return g.Barrier();
  }
  return absl::InternalError("unreachable");
}

// Runs op `k` once on exact data; returns this rank's wrong-element count.
absl::StatusOr<int64_t> CheckOnce(Group& g, const Config& c, CollectiveKind k, const Shape& s,
                                  Buffers& b) {
  const int n = g.size(), r = g.rank();
  const size_t es = DTypeSize(c.dtype);
  if (k == CollectiveKind::kBarrier) return 0;
  // Fill this rank's input where the call reads it.
  unsigned char* in = b.send.data();
  size_t in_elems = s.send_elems, base = 0;
  if (k == CollectiveKind::kAllGather) {
    if (c.in_place) in = b.recv.data() + r * s.count * es;
  }
  for (size_t i = 0; i < in_elems; ++i) StoreElement(in, c.dtype, i, Pattern(base + i, r));
  ASSIGN_OR_RETURN(WorkPtr w, Issue(g, c, k, s, b));
  RETURN_IF_ERROR(w->Wait(absl::Seconds(300)));
  int64_t wrong = 0;
  switch (k) {
    case CollectiveKind::kAllReduce: {
      const unsigned char* out = c.in_place ? b.send.data() : b.recv.data();
      for (size_t i = 0; i < s.count; ++i) wrong += LoadElement(out, c.dtype, i) != Expected(c.redop, c.dtype, i, n);
      break;
    }
    case CollectiveKind::kReduceScatter: {
      const unsigned char* out = c.in_place ? b.send.data() + r * s.count * es : b.recv.data();
      for (size_t i = 0; i < s.count; ++i) {
        wrong += LoadElement(out, c.dtype, i) != Expected(c.redop, c.dtype, r * s.count + i, n);
      }
      break;
    }
    case CollectiveKind::kAllGather:
      for (int k2 = 0; k2 < n; ++k2) {
        for (size_t i = 0; i < s.count; ++i) {
          wrong += LoadElement(b.recv.data(), c.dtype, k2 * s.count + i) != Rounded(c.dtype, Pattern(i, k2));
        }
      }
      break;
    case CollectiveKind::kBroadcast:
      for (size_t i = 0; i < s.count; ++i) wrong += LoadElement(b.send.data(), c.dtype, i) != Rounded(c.dtype, Pattern(i, 0));
      break;
    default:
      break;
  }
  return wrong;
}

// Sum (or max) of a scalar over the group, through the group itself.
absl::StatusOr<double> GroupReduce(Group& g, double v, ReduceOp op) {
  ASSIGN_OR_RETURN(WorkPtr w, g.AllReduce(&v, &v, 1, DType::kF64, op));
  RETURN_IF_ERROR(w->Wait(absl::Seconds(300)));
  return v;
}

int ItersFor(int base, size_t bytes, int floor) {
  const size_t mib = size_t{1} << 20;
  if (bytes <= mib) return base;
  return std::max<int>(floor, static_cast<int>(base * static_cast<double>(mib) / bytes));
}

absl::Status RunRank(Group& g, const Config& c, std::vector<Row>* rows, bool progress) {
  const bool tty = isatty(2);
  const int n = g.size();
  Buffers b;
  const size_t cap = static_cast<size_t>(c.maxbytes) + 64;
  b.send.assign(cap, 0);
  b.recv.assign(cap, 0);
  std::vector<size_t> sizes;
  for (int64_t s = c.minbytes; s <= c.maxbytes; s *= c.step) sizes.push_back(static_cast<size_t>(s));
  size_t done = 0;
  const size_t total = sizes.size() * c.ops.size();
  for (CollectiveKind k : c.ops) {
    for (size_t bytes : (k == CollectiveKind::kBarrier ? std::vector<size_t>{0} : sizes)) {
      const Shape s = ShapeFor(k, bytes, c.dtype, n);
      if (k != CollectiveKind::kBarrier && s.count == 0) continue;
      ++done;
      if (progress && tty) {
        std::fprintf(stderr, "\r[collective_latency] %-14s %10zu B  (%zu/%zu)   ",
                     std::string(CollectiveName(k)).c_str(), bytes, done, total);
      } else if (progress && (bytes == sizes.front() || k == CollectiveKind::kBarrier)) {
        std::fprintf(stderr, "[collective_latency] %s ...\n", std::string(CollectiveName(k)).c_str());
      }
      int64_t wrong = 0;
      if (c.check) {
        ASSIGN_OR_RETURN(int64_t my_wrong, CheckOnce(g, c, k, s, b));
        ASSIGN_OR_RETURN(double all_wrong, GroupReduce(g, static_cast<double>(my_wrong), ReduceOp::Sum()));
        wrong = static_cast<int64_t>(all_wrong);
      }
      const int iters = ItersFor(c.iters, bytes, 3);
      const int warmup = ItersFor(c.warmup, bytes, 1);
      for (int i = 0; i < warmup; ++i) {
        ASSIGN_OR_RETURN(WorkPtr w, Issue(g, c, k, s, b));
        RETURN_IF_ERROR(w->Wait(absl::Seconds(300)));
      }
      ASSIGN_OR_RETURN(WorkPtr sync, g.Barrier());
      RETURN_IF_ERROR(sync->Wait(absl::Seconds(300)));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        ASSIGN_OR_RETURN(WorkPtr w, Issue(g, c, k, s, b));
        RETURN_IF_ERROR(w->Wait(absl::Seconds(300)));
      }
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
      ASSIGN_OR_RETURN(double slowest, GroupReduce(g, us, ReduceOp::Max()));
      if (rows != nullptr) {
        Row row;
        row.op = std::string(CollectiveName(k));
        const size_t es = DTypeSize(c.dtype);
        // As nccl-tests: bytes of the larger buffer, and NCCL's per-call count (recvcount for
        // reduce-scatter, sendcount for all-gather).
        row.bytes = k == CollectiveKind::kBarrier ? 0 : std::max(s.send_elems, s.recv_elems) * es;
        row.count = s.count;
        row.dtype = std::string(DTypeName(c.dtype));
        row.redop = (k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduceScatter)
                        ? std::string(ReduceKindName(c.redop)) : "none";
        row.time_us = slowest;
        row.algbw = row.bytes / (slowest * 1e-6) / 1e9;
        row.busbw = row.algbw * BusFactor(k, n);
        row.wrong = wrong;
        rows->push_back(row);
      }
    }
  }
  if (progress && tty) std::fprintf(stderr, "\r%80s\r", "");
  return absl::OkStatus();
}

void PrintTable(const Config& c, int n, const std::vector<Row>& rows) {
  if (c.csv) {
    std::printf("op,bytes,count,dtype,time_us,algbw_gbps,busbw_gbps,wrong\n");
    for (const Row& r : rows) {
      std::printf("%s,%zu,%zu,%s,%.3f,%.4f,%.4f,%lld\n", r.op.c_str(), r.bytes, r.count,
                  r.dtype.c_str(), r.time_us, r.algbw, r.busbw, static_cast<long long>(r.wrong));
    }
    return;
  }
  std::printf("# Braid collective_latency: backend=%s ranks=%d dtype=%s redop=%s iters=%d warmup=%d %s\n",
              c.backend.c_str(), n, std::string(DTypeName(c.dtype)).c_str(),
              std::string(ReduceKindName(c.redop)).c_str(), c.iters, c.warmup,
              c.in_place ? "in-place" : "out-of-place");
  std::printf("# time = mean issue+wait per op of the slowest rank; busbw factors as nccl-tests\n#\n");
  std::printf("# %-28s %12s %12s %6s %6s %11s %12s %12s %7s\n", "op", "size(B)", "count", "type",
              "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  for (const Row& r : rows) {
    std::printf("  %-28s %12zu %12zu %6s %6s %11.2f %12.3f %12.3f %7lld\n", r.op.c_str(), r.bytes,
                r.count, r.dtype.c_str(), r.redop.c_str(), r.time_us, r.algbw, r.busbw,
                static_cast<long long>(r.wrong));
  }
}

absl::StatusOr<Config> ParseConfig(const Flags& f, const Options& env) {
  Config c;
  c.backend = f.Str("backend", env.backend);
  ASSIGN_OR_RETURN(int64_t ranks, f.Int("ranks", 4));
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
    for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                             CollectiveKind::kAllGather, CollectiveKind::kBroadcast,
                             CollectiveKind::kBarrier}) {
      if (CollectiveName(k) == name) {
        c.ops.push_back(k);
        found = true;
      }
    }
    if (!found) return absl::InvalidArgumentError(absl::StrCat("--ops: unknown collective '", name, "'"));
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

// Under `bazel run` the mpi backend needs a launcher: re-exec this binary under mpirun.
void RelaunchUnderMpirunIfNeeded(const Config& c, int argc, char** argv) {
  if (c.backend != "mpi" || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return;
  std::vector<std::string> args = {"mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "pml",
                                   "ob1", "--mca", "btl", "self,vader", "--mca",
                                   "oob_tcp_if_include", "lo", "-np", std::to_string(c.ranks),
                                   "/proc/self/exe"};
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    args.back() = exe;
  }
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fprintf(stderr, "[collective_latency] relaunching under mpirun -np %d\n", c.ranks);
  execvp("mpirun", cargs.data());
  std::perror("execvp mpirun");
  std::exit(1);
}

absl::Status Main(int argc, char** argv) {
  ASSIGN_OR_RETURN(Flags flags, Flags::Parse(argc, argv));
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
      status[i] = RunRank(*groups[i], c, lead ? &rows : nullptr, lead);
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  // Baselines in the same run.
  std::vector<MpiCompareRow> mpi_compare;
  if (c.backend == "mpi") {
    std::vector<size_t> sizes;
    for (size_t b : {size_t{8}, size_t{4096}, size_t{65536}, size_t{1} << 20, size_t{16} << 20}) {
      if (b >= static_cast<size_t>(c.minbytes) && b <= static_cast<size_t>(c.maxbytes)) sizes.push_back(b);
    }
    if (isatty(2) && leader) std::fprintf(stderr, "[collective_latency] braid vs raw MPI, interleaved rounds...\n");
    RETURN_IF_ERROR(CompareWithRawMpi(*groups.front(), sizes, c.compare_rounds, 20000, &mpi_compare));
    const int n = groups.front()->size();
    for (const MpiCompareRow& m : mpi_compare) {
      for (const auto& [name, us] : {std::pair<const char*, double>{"raw_mpi_iallreduce", m.raw_wait_us},
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
    const RawRow m = MemcpyRow(static_cast<size_t>(c.maxbytes));
    rows.push_back(Row{m.op, m.bytes, m.bytes, "u8", "none", m.time_us,
                       m.bytes / (m.time_us * 1e-6) / 1e9, m.bytes / (m.time_us * 1e-6) / 1e9, 0});
    PrintTable(c, groups.front()->size(), rows);
    if (!c.csv && !mpi_compare.empty()) {
      std::printf("#\n# mpi backend vs raw OpenMPI (in-place f32 sum, median of %d interleaved rounds)\n",
                  c.compare_rounds);
      std::printf("# %10s %14s %14s %14s %10s %12s %10s\n", "bytes", "raw_wait_us", "raw_test_us",
                  "raw_block_us", "braid_us", "braid-raw_us", "braid/raw");
      for (const MpiCompareRow& m : mpi_compare) {
        const double raw = std::min(m.raw_wait_us, m.raw_test_us);
        std::printf("  %10zu %14.2f %14.2f %14.2f %10.2f %12.2f %10.3f\n", m.bytes, m.raw_wait_us,
                    m.raw_test_us, m.raw_blocking_us, m.braid_us, m.braid_us - raw, m.braid_us / raw);
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
