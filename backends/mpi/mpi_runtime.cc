#include "backends/mpi/mpi_runtime.h"

#include <mpi.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "backends/mpi/mpi_errors.h"
#include "comm/logging.h"

namespace braid::mpi {
namespace {

absl::string_view ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown thread level";
}

struct MpiInit {
  bool owns = false;  // we called MPI_Init_thread, so we finalize
  int thread_level = MPI_THREAD_SINGLE;
};

// Initializes MPI if needed (see mpi_runtime.h for the thread levels accepted and the error
// handlers set).
absl::StatusOr<MpiInit> InitMpi() {
  int finalized = 0;
  RETURN_IF_MPI_ERROR(MPI_Finalized(&finalized));
  if (finalized) {
    return absl::FailedPreconditionError(
        "mpi backend: MPI was already finalized in this process and cannot be initialized "
        "again; keep one mpi backend (or one of its groups) alive for the process lifetime");
  }
  int initialized = 0;
  RETURN_IF_MPI_ERROR(MPI_Initialized(&initialized));
  MpiInit init;
  if (initialized) {
    // The host's MPI: its threads may call MPI while the progress thread does, and they do
    // not take our lock, so only MPI_THREAD_MULTIPLE is safe. Its error handlers are its own.
    RETURN_IF_MPI_ERROR(MPI_Query_thread(&init.thread_level));
    if (init.thread_level < MPI_THREAD_MULTIPLE) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mpi backend: the application initialized MPI with ", ThreadLevelName(init.thread_level),
          ", but the backend calls MPI from its progress thread concurrently with the "
          "application's own MPI calls, which needs MPI_THREAD_MULTIPLE; initialize MPI with "
          "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...), or let the backend initialize it"));
    }
    return init;
  }
  RETURN_IF_MPI_ERROR(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &init.thread_level));
  init.owns = true;
  absl::Status s;
  if (init.thread_level < MPI_THREAD_SERIALIZED) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "mpi backend: MPI provides ", ThreadLevelName(init.thread_level),
        " but the backend needs at least MPI_THREAD_SERIALIZED (it calls MPI from a progress "
        "thread and from waiting threads, one at a time)"));
  }
  // Errors of request completion (MPI_Testsome, MPI_Test) and of calls on no communicator of
  // ours are raised on these; the default MPI_ERRORS_ARE_FATAL would kill the job.
  if (s.ok()) {
    s = MpiStatus(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                  "MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)");
  }
  if (s.ok()) {
    s = MpiStatus(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN),
                  "MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN)");
  }
  if (!s.ok()) {
    MPI_Finalize();
    return s;
  }
  if (init.thread_level < MPI_THREAD_MULTIPLE) {
    Log().warn(
        "mpi backend: MPI provides only {}: the backend serializes its own MPI calls, "
        "so it must be this process's only MPI user (no MPI calls from the "
        "application)",
        std::string(ThreadLevelName(init.thread_level)));
  }
  return init;
}

// The process's live runtime. Once the last holder lets go, `finalizing` makes any later
// Acquire() fail cleanly instead of joining an MPI that is being (or was) finalized.
struct LiveRuntime {
  std::mutex mu;
  std::weak_ptr<MpiRuntime> runtime;  // guarded by mu
  bool finalizing = false;            // guarded by mu
};

LiveRuntime& Live() {
  static LiveRuntime* live = new LiveRuntime;
  return *live;
}

// At process exit with the runtime still alive (the program never destroyed its world): tell
// the peers this rank left, as a shutdown would (progress_engine.h, LeaveAtExit). Registered
// once, by the first runtime.
void LeaveAtExit() {
  std::shared_ptr<MpiRuntime> rt;
  {
    std::lock_guard<std::mutex> lock(Live().mu);
    rt = Live().runtime.lock();
  }
  if (rt != nullptr) rt->engine().LeaveAtExit();
  // Dropping `rt` cannot destroy the runtime here: its backend and groups, never destroyed,
  // still hold it.
}

}  // namespace

absl::StatusOr<std::shared_ptr<MpiRuntime>> MpiRuntime::Acquire() {
  LiveRuntime& live = Live();
  std::lock_guard<std::mutex> lock(live.mu);
  if (std::shared_ptr<MpiRuntime> rt = live.runtime.lock()) return rt;
  if (live.finalizing) {
    return absl::FailedPreconditionError(
        "mpi backend: MPI was finalized when the last mpi backend and its groups were destroyed, "
        "and cannot be initialized again in this process; keep one of them alive for the "
        "process lifetime");
  }
  ASSIGN_OR_RETURN(const MpiInit init, InitMpi());
  const bool owns = init.owns;
  int rank = 0;
  int size = 0;
  absl::Status s = MpiStatus(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  if (s.ok()) s = MpiStatus(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  absl::StatusOr<std::unique_ptr<MpiOps>> ops = MpiOps::Create();
  if (s.ok()) s = ops.status();
  absl::StatusOr<std::shared_ptr<ProgressEngine>> engine = absl::UnknownError("not started");
  if (s.ok()) engine = ProgressEngine::Create();
  if (s.ok()) s = engine.status();
  if (!s.ok()) {
    if (ops.ok()) ops->reset();
    if (owns) MPI_Finalize();
    return s;
  }
  std::shared_ptr<MpiRuntime> rt(
      new MpiRuntime(*std::move(engine), owns, init.thread_level, rank, size, std::move(*ops)));
  live.runtime = rt;
  static const bool registered = std::atexit(&LeaveAtExit) == 0;
  (void)registered;
  return rt;
}

MpiRuntime::MpiRuntime(std::shared_ptr<ProgressEngine> engine, bool owns_mpi, int thread_level,
                       int world_rank, int world_size, std::unique_ptr<MpiOps> ops)
    : owns_mpi_(owns_mpi),
      thread_multiple_(thread_level >= MPI_THREAD_MULTIPLE),
      world_rank_(world_rank),
      world_size_(world_size),
      ops_(std::move(ops)),
      abort_domain_(AbortDomain::Create()),
      engine_(std::move(engine)) {}

MpiRuntime::~MpiRuntime() {
  if (owns_mpi_) {
    std::lock_guard<std::mutex> lock(Live().mu);
    Live().finalizing = true;
  }
  const bool quiescent = engine_->Shutdown();
  if (!quiescent) {
    ops_.release();  // NOLINT: an operation MPI still runs may use it
  } else {
    std::lock_guard<std::mutex> lock(engine_->mu());
    ops_.reset();
  }
  if (!owns_mpi_) return;
  std::lock_guard<std::mutex> lock(Live().mu);
  // Stays set: MPI cannot be initialized again after MPI_Finalize (or when it was skipped).
  if (!quiescent) {
    Log().error(
        "mpi backend: not calling MPI_Finalize: MPI still owns buffers of operations "
        "that missed their deadline");
    return;
  }
  const absl::Status s = MpiStatus(MPI_Finalize(), "MPI_Finalize");
  if (!s.ok()) Log().error("mpi backend: {}", s.ToString());
}

}  // namespace braid::mpi
