// Operation: one thing the mpi backend has in flight (a collective, a Split's exchange, a
// communicator duplication) as the ProgressEngine drives it.
//
//   class Bcast : public Operation {
//     absl::Status Start() override {           // issue the first MPI call into request()
//       return MpiStatus(MPI_Ibcast(buf, n, MPI_BYTE, 0, comm, &request()), "MPI_Ibcast");
//     }
//     absl::StatusOr<Progress> Advance() override { return Progress::kDone; }
//   };
//   RETURN_IF_ERROR(engine.Submit(std::make_unique<Bcast>(...)));
//
// Life cycle. Start() and Advance() run under the MPI lock; the engine calls Advance() each
// time request() is MPI_REQUEST_NULL again (the last MPI call completed, or the operation is
// waiting for its turn), and it either issues the next call (kRunning) or reports kDone. The
// thread that sees kDone then runs Finish() once, outside the lock (the host-side finishing
// step: unstage, divide), and completes the Work. An error from Start/Advance, a failed MPI
// request or a passed deadline completes the Work with that error instead; if MPI still owns
// the operation's buffers then, the engine keeps the operation (and so its buffers) alive
// until the request completes, because MPI cannot cancel a collective.
#ifndef BRAID_BACKENDS_MPI_OPERATION_H_
#define BRAID_BACKENDS_MPI_OPERATION_H_

#include <mpi.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/mpi/group_state.h"
#include "comm/work.h"

namespace braid::mpi {

class Operation {
 public:
  enum class Progress { kRunning, kDone };

  // `group` is null for operations that belong to no group yet (creating one).
  Operation(std::shared_ptr<GroupState> group, WorkPtr work, absl::Time deadline,
            absl::Duration timeout)
      : group_(std::move(group)), work_(std::move(work)), deadline_(deadline), timeout_(timeout) {}
  virtual ~Operation() = default;
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

  // Under the MPI lock: issues the first MPI call.
  virtual absl::Status Start() = 0;
  // Under the MPI lock, whenever request() is MPI_REQUEST_NULL: issue the next call or finish.
  virtual absl::StatusOr<Progress> Advance() = 0;
  // Outside the lock, exactly once, after Advance() returned kDone.
  virtual void Finish() {}

  GroupState* group() const { return group_.get(); }
  const WorkPtr& work() const { return work_; }
  absl::Time deadline() const { return deadline_; }
  absl::Duration timeout() const { return timeout_; }
  MPI_Request& request() { return request_; }

 private:
  const std::shared_ptr<GroupState> group_;
  const WorkPtr work_;
  const absl::Time deadline_;
  const absl::Duration timeout_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_OPERATION_H_
