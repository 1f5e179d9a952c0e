#include "bench/raw_baselines.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::bench {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Mean seconds per call of `body` over `iters` calls after a barrier, the slowest rank's.
template <typename Body>
double TimeLoop(MPI_Comm comm, int iters, Body body) {
  MPI_Barrier(comm);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) body();
  double t = (MPI_Wtime() - t0) / iters;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
  return t;
}

// RAII dup of MPI_COMM_WORLD, so raw loops never share a communicator with the backend.
class DupComm {
 public:
  DupComm() { MPI_Comm_dup(MPI_COMM_WORLD, &comm_); }
  ~DupComm() { MPI_Comm_free(&comm_); }
  DupComm(const DupComm&) = delete;
  DupComm& operator=(const DupComm&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_;
};

}  // namespace

RawRow MemcpyRow(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // fault pages in
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const auto t1 = std::chrono::steady_clock::now();
    asm volatile("" : : "r"(dst.data()) : "memory");
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return RawRow{"memcpy", bytes, best * 1e6};
}

absl::Status CompareWithRawMpi(Group& world, const std::vector<size_t>& sizes, int rounds,
                               int iters_8b, std::vector<MpiCompareRow>* rows) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    return absl::FailedPreconditionError("raw MPI baseline: MPI is not initialized");
  DupComm raw;
  absl::Status braid_status;
  for (size_t bytes : sizes) {
    const size_t count = bytes / sizeof(float);
    if (count == 0) continue;
    std::vector<float> buf(count, 1.0f);
    const int iters = std::max(10, static_cast<int>(iters_8b / (1 + bytes / 8192)));
    const int n = static_cast<int>(count);
    auto raw_wait = [&] {
      MPI_Request req;
      MPI_Iallreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, raw.get(), &req);
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    };
    auto raw_test = [&] {
      MPI_Request req;
      MPI_Iallreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, raw.get(), &req);
      for (int done = 0; !done;) MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    };
    auto raw_blocking = [&] {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, raw.get());
    };
    auto braid_loop = [&] {
      auto w = world.AllReduce(buf.data(), buf.data(), count, DType::kF32, ReduceOp::Sum());
      absl::Status s = w.ok() ? (*w)->Wait(absl::Seconds(300)) : w.status();
      if (!s.ok() && braid_status.ok()) braid_status = s;
    };
    std::vector<double> t[4];
    for (int round = 0; round < rounds; ++round) {
      for (int k = 0; k < 4; ++k) {
        const int which = (round + k) % 4;
        switch (which) {
          case 0:
            t[0].push_back(TimeLoop(raw.get(), iters, raw_wait));
            break;
          case 1:
            t[1].push_back(TimeLoop(raw.get(), iters, raw_test));
            break;
          case 2:
            t[2].push_back(TimeLoop(raw.get(), iters, raw_blocking));
            break;
          case 3:
            t[3].push_back(TimeLoop(raw.get(), iters, braid_loop));
            break;
        }
      }
      std::fill(buf.begin(), buf.end(), 1.0f);  // keep the values finite
    }
    RETURN_IF_ERROR(braid_status);
    rows->push_back(MpiCompareRow{bytes, Median(t[0]) * 1e6, Median(t[1]) * 1e6, Median(t[2]) * 1e6,
                                  Median(t[3]) * 1e6});
  }
  return absl::OkStatus();
}

}  // namespace braid::bench
