// AbortChannel: how the mpi backend's processes tell each other that the job aborted
// (comm/abort_domain.h), so a rank waiting on any group stops within milliseconds of a peer's
// failure instead of at its own deadline.
//
// A private duplicate of MPI_COMM_WORLD carries only abort messages: every process keeps one
// receive posted on it (any source, one tag, a fixed-size buffer); an abort is one short
// message to every other process: [int32 status code][cause text, truncated to fit]. The
// sender's rank on the duplicate is its world rank, so the receiver names it. A process that
// shuts its world down while the job has not aborted sends a leave notice instead (code
// kLeftCode): the peers fail what still needs it, after a grace for operations it completed.
//
//   // under the MPI lock (ProgressEngine::mu()):
//   ASSIGN_OR_RETURN(auto ch, AbortChannel::Open(dup_of_world));   // posts the receive
//   ch->Send(absl::InternalError("allreduce #3 on group 'world': ..."));
//   if (std::optional<PeerAbort> a = ch->Poll()) domain->AbortFromPeer(a->rank, a->cause, a->code);
//   ch->Close();   // before MPI_Finalize: cancels the receive, frees the communicator
//
// Every method must be called with the MPI lock held. Nothing here blocks on a peer: sends are
// nonblocking and small (eager), their requests are tested in Poll and released at Close.
// A peer that is already gone never answers; its messages are simply lost.
#ifndef BRAID_BACKENDS_MPI_ABORT_CHANNEL_H_
#define BRAID_BACKENDS_MPI_ABORT_CHANNEL_H_

#include <mpi.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace braid::mpi {

struct PeerAbort {
  int rank = -1;  // world rank of the sender
  absl::StatusCode code = absl::StatusCode::kAborted;
  std::string cause;
  bool left = false;  // a leave notice (SendLeft), not a failure
};

class AbortChannel {
 public:
  static constexpr int kTag = 7001;
  static constexpr size_t kMessageBytes = 2048;  // code + text; longer causes are truncated
  static constexpr int32_t kLeftCode = -1;       // the wire code of a leave notice

  // Takes ownership of `comm` (a duplicate of MPI_COMM_WORLD on every process) and posts the
  // receive.
  static absl::StatusOr<std::unique_ptr<AbortChannel>> Open(MPI_Comm comm);
  ~AbortChannel();  // Close()
  AbortChannel(const AbortChannel&) = delete;
  AbortChannel& operator=(const AbortChannel&) = delete;

  // Sends `cause` to every other process. Once per process (later calls do nothing).
  void Send(const absl::Status& cause);
  // This process leaves the job (`why` names it): a leave notice to every other process, under
  // Send's once-per-process budget.
  void SendLeft(absl::string_view why);
  // Waits (testing, never blocking on a peer) until the sends completed or `deadline`.
  void FlushSends(absl::Time deadline);
  // A peer's abort, if one arrived (then the receive is not re-posted: one is enough).
  std::optional<PeerAbort> Poll();
  // Cancels the posted receive, releases the sends, frees the communicator. Idempotent.
  void Close();

 private:
  explicit AbortChannel(MPI_Comm comm) : comm_(comm) {}
  void SendToAll(int32_t code, absl::string_view text);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  MPI_Request recv_ = MPI_REQUEST_NULL;
  std::array<char, kMessageBytes> in_{};
  std::vector<char> out_;  // the one message this process sends
  std::vector<MPI_Request> sends_;
  bool sent_ = false;
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_ABORT_CHANNEL_H_
