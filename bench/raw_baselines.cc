#include "bench/raw_baselines.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace braid::bench {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int ItersFor(int base, size_t bytes, int floor) {
  const size_t mib = size_t{1} << 20;
  if (bytes <= mib) return base;
  return std::max<int>(floor, static_cast<int>(base * static_cast<double>(mib) / bytes));
}

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
    best = std::min(best, Seconds(t0, t1));
  }
  return RawRow{"memcpy", bytes, best * 1e6};
}

absl::Status RawMpiAllReduceRows(int64_t minbytes, int64_t maxbytes, int64_t step, int iters,
                                 int warmup, std::vector<RawRow>* rows) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return absl::FailedPreconditionError("raw MPI baseline: MPI is not initialized");
  std::vector<float> send(static_cast<size_t>(maxbytes / 4) + 1, 1.0f), recv(send.size());
  for (int blocking = 0; blocking < 2; ++blocking) {
    for (int64_t bytes = minbytes; bytes <= maxbytes; bytes *= step) {
      const int count = static_cast<int>(bytes / 4);
      if (count == 0) continue;
      const int n_iter = ItersFor(iters, bytes, 3), n_warm = ItersFor(warmup, bytes, 1);
      auto once = [&] {
        if (blocking) {
          return MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        MPI_Request req;
        int rc = MPI_Iallreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        if (rc != MPI_SUCCESS) return rc;
        return MPI_Wait(&req, MPI_STATUS_IGNORE);
      };
      for (int i = 0; i < n_warm; ++i) {
        if (once() != MPI_SUCCESS) return absl::InternalError("raw MPI all-reduce failed");
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n_iter; ++i) once();
      double us = Seconds(t0, std::chrono::steady_clock::now()) * 1e6 / n_iter;
      MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      rows->push_back(RawRow{blocking ? "raw_mpi_allreduce" : "raw_mpi_iallreduce",
                             static_cast<size_t>(count) * 4, us});
    }
  }
  return absl::OkStatus();
}

}  // namespace braid::bench
