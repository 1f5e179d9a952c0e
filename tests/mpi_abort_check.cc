// One job-abort scenario on the `mpi` backend, run by tests/mpi_abort_test.sh under mpirun with
// 4 processes (a 2x2 mesh: shard groups {0,1} {2,3}, replica groups {0,2} {1,3}; deadline 60 s):
//
//   deadline   rank 1 stalls; rank 0's shard all-reduce misses its 300 ms per-call deadline;
//              ranks 2 and 3, waiting on the replica group, must stop within 2 s after that,
//              told that rank 0 reported a deadline on 'world/shard'; rank 1's next call is
//              refused with the same cause.
//   abort_job  rank 3's framework step fails (AbortJob); ranks 0-2, blocked in a world
//              all-reduce, must stop within 2 s, naming rank 3 and its cause.
//   die        rank 1's process is killed (SIGKILL) while the others wait in a world all-reduce:
//              mpirun must end the job within 2 s (the script measures it; no rank can report).
//
// Each rank prints one line "ABORT-CHECK rank=R ok=0|1 ms=T what=..." (T: from the failure to
// this rank's error) and leaves with _exit(0): after an abort MPI still owns the requests of
// the collectives peers never joined, so MPI_Finalize would hang; mpirun then reports that the
// processes exited without finalizing, which the script expects.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/backend.h"
#include "comm/group.h"

namespace braid {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(60);
constexpr absl::Duration kPrompt = absl::Seconds(2);

// The verdict goes to stdout and to $ABORT_CHECK_DIR/rank<R>; a rank leaves only once every
// rank's verdict is written (bounded): the first process to exit without MPI_Finalize makes
// mpirun kill the others, which could cut a slower rank's report.
void Report(int rank, bool ok, absl::Duration took, const std::string& what) {
  const std::string line =
      absl::StrCat("ABORT-CHECK rank=", rank, " ok=", ok ? 1 : 0,
                   " ms=", absl::ToInt64Milliseconds(took), " what=", what, "\n");
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
  const char* dir = std::getenv("ABORT_CHECK_DIR");
  if (dir == nullptr) return;
  const std::string path = absl::StrCat(dir, "/rank", rank);
  if (FILE* f = std::fopen((path + ".tmp").c_str(), "w")) {
    std::fputs(line.c_str(), f);
    std::fclose(f);
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
}

void WaitForEveryVerdict(int n) {
  const char* dir = std::getenv("ABORT_CHECK_DIR");
  if (dir == nullptr) return;
  const absl::Time end = absl::Now() + absl::Seconds(10);
  for (int r = 0; r < n && absl::Now() < end;) {
    if (std::FILE* f = std::fopen(absl::StrCat(dir, "/rank", r).c_str(), "r")) {
      std::fclose(f);
      ++r;
    } else {
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
}

absl::Status Outcome(absl::StatusOr<WorkPtr> w) {
  return w.ok() ? (*w)->Wait(kDeadline + absl::Seconds(10)) : w.status();
}

bool Has(const absl::Status& s, std::initializer_list<absl::string_view> parts) {
  if (s.ok()) return false;
  for (absl::string_view p : parts) {
    if (!absl::StrContains(s.message(), p)) return false;
  }
  return true;
}

int Run(const std::string& scenario) {
  Options options;
  options.backend = "mpi";
  options.timeout = kDeadline;
  // mpi_abort_test.sh runs every scenario with both engines (backends/mpi/comm_thread.h): the
  // collectives here are small, so `auto` sends them to the nonblocking engine.
  if (const char* engine = std::getenv("ABORT_CHECK_MPI_ENGINE")) options.mpi_engine = engine;
  auto backend = CreateBackend(options);
  if (!backend.ok()) {
    std::fprintf(stderr, "creating the mpi backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  const int rank = (*backend)->local_ranks().at(0);
  auto world_or = (*backend)->WorldGroup(rank);
  if (!world_or.ok()) {
    std::fprintf(stderr, "world: %s\n", world_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<Group> world = std::move(*world_or);
  if (world->size() != 4) {
    std::fprintf(stderr, "run with 4 processes\n");
    return 1;
  }
  auto shard = world->Split(rank / 2, rank, "world/shard");
  auto replica = world->Split(rank % 2, rank, "world/replica");
  if (!shard.ok() || !replica.ok()) {
    std::fprintf(stderr, "split failed\n");
    return 1;
  }
  float buf[64] = {};
  // Everyone is set up before the failure starts.
  if (!Outcome(world->Barrier()).ok()) return 1;
  const absl::Time start = absl::Now();
  AbortDomain* domain = world->abort_domain();

  if (scenario == "deadline") {
    if (rank == 0) {
      CollectiveOptions o;
      o.timeout = absl::Milliseconds(300);
      const absl::Status s =
          Outcome((*shard)->AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum(), o));
      Report(rank, s.code() == absl::StatusCode::kDeadlineExceeded, absl::Now() - start,
             s.ToString());
    } else if (rank == 1) {
      while (!domain->aborted() && absl::Now() - start < kDeadline) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      const absl::Duration took = absl::Now() - start;
      const absl::Status s = world->Barrier().status();
      Report(rank,
             Has(s, {"refuses new calls", "rank 0 reported", "world/shard"}) &&
                 took < absl::Milliseconds(300) + kPrompt,
             took, s.ToString());
    } else {
      const absl::Status s =
          Outcome((*replica)->AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum()));
      const absl::Duration took = absl::Now() - start;
      Report(rank,
             Has(s, {"job aborted: rank 0 reported", "world/shard", "deadline"}) &&
                 took < absl::Milliseconds(300) + kPrompt,
             took, s.ToString());
    }
  } else if (scenario == "abort_job") {
    if (rank == 3) {
      absl::SleepFor(absl::Milliseconds(100));  // the others are blocked by now
      const absl::Status a = world->AbortJob(absl::InternalError("step 7: loss is NaN"));
      Report(rank, a.ok() && domain->aborted(), absl::Now() - start, a.ToString());
    } else {
      const absl::Status s = Outcome(world->AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum()));
      const absl::Duration took = absl::Now() - start;
      Report(rank,
             Has(s, {"job aborted: rank 3 reported", "step 7: loss is NaN"}) &&
                 took < absl::Milliseconds(100) + kPrompt,
             took - absl::Milliseconds(100), s.ToString());
    }
  } else if (scenario == "die") {
    if (rank == 1) {
      std::printf("ABORT-CHECK rank=1 dies_at_ms=%lld\n",
                  static_cast<long long>(absl::ToUnixMillis(absl::Now())));
      std::fflush(stdout);
      absl::SleepFor(absl::Milliseconds(50));
      raise(SIGKILL);
    }
    const absl::Status s = Outcome(world->AllReduce(buf, buf, 64, DType::kF32, ReduceOp::Sum()));
    // Only reached if mpirun did not kill this process: that is the failure.
    Report(rank, false, absl::Now() - start,
           absl::StrCat("survived the peer's death: ", s.ToString()));
  } else {
    std::fprintf(stderr, "unknown scenario '%s' (deadline, abort_job, die)\n", scenario.c_str());
    return 2;
  }
  WaitForEveryVerdict(world->size());
  _exit(0);
}

}  // namespace
}  // namespace braid

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s deadline|abort_job|die\n", argv[0]);
    return 2;
  }
  return braid::Run(argv[1]);
}
