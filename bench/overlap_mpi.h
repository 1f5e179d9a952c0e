// bench/overlap --backend=mpi: one rank per process under mpirun. What the local run does with
// threads of one process (a start line outside Braid, the step times collected in one place)
// is done here with raw MPI on a private duplicate of MPI_COMM_WORLD, never on Braid's
// communicators, so `compute_only` still touches no Braid code.
//
//   RelaunchUnderMpirun("overlap", 2, argc, argv);   // re-execs itself unless under mpirun
//   ... create the mpi backend (it initializes MPI) ...
//   ProcessSync procs;                               // MPI is initialized from here on
//   procs.Barrier();                                 // every process's start line
//   procs.AllGather(mine.data(), mine.size(), all.data());
#ifndef BRAID_BENCH_OVERLAP_MPI_H_
#define BRAID_BENCH_OVERLAP_MPI_H_

#include <mpi.h>

#include <cstddef>
#include <cstdint>

namespace braid::bench {

// Re-execs this binary as `ranks` processes of mpirun (the project's flags: shared memory,
// oversubscribed) unless it already runs under mpirun. Returns only in the latter case.
void RelaunchUnderMpirun(const char* tag, int ranks, int argc, char** argv);

class ProcessSync {
 public:
  ProcessSync();  // MPI must be initialized (by the mpi backend)
  ~ProcessSync();
  ProcessSync(const ProcessSync&) = delete;
  ProcessSync& operator=(const ProcessSync&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  void Barrier();
  // all[r * n + i] = rank r's mine[i].
  void AllGather(const int64_t* mine, size_t n, int64_t* all);
  // Rank 0's value on every rank.
  double Broadcast(double v);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace braid::bench

#endif  // BRAID_BENCH_OVERLAP_MPI_H_
