#include "bench/overlap_mpi.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace braid::bench {

void RelaunchUnderMpirun(const char* tag, int ranks, int argc, char** argv) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return;
  std::vector<std::string> args = {"mpirun",
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "--mca",
                                   "pml",
                                   "ob1",
                                   "--mca",
                                   "btl",
                                   "self,vader",
                                   "--mca",
                                   "oob_tcp_if_include",
                                   "lo",
                                   "-np",
                                   std::to_string(ranks),
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
  std::fprintf(stderr, "[%s] relaunching under mpirun -np %d\n", tag, ranks);
  execvp("mpirun", cargs.data());
  std::perror("execvp mpirun");
  std::exit(1);
}

ProcessSync::ProcessSync() {
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

ProcessSync::~ProcessSync() { MPI_Comm_free(&comm_); }

void ProcessSync::Barrier() { MPI_Barrier(comm_); }

void ProcessSync::AllGather(const int64_t* mine, size_t n, int64_t* all) {
  MPI_Allgather(mine, static_cast<int>(n), MPI_INT64_T, all, static_cast<int>(n), MPI_INT64_T,
                comm_);
}

double ProcessSync::Broadcast(double v) {
  MPI_Bcast(&v, 1, MPI_DOUBLE, 0, comm_);
  return v;
}

}  // namespace braid::bench
