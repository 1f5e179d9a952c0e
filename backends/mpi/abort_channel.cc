#include "backends/mpi/abort_channel.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/mpi/mpi_errors.h"
#include "comm/logging.h"

namespace braid::mpi {

absl::StatusOr<std::unique_ptr<AbortChannel>> AbortChannel::Open(MPI_Comm comm) {
  std::unique_ptr<AbortChannel> ch(new AbortChannel(comm));
  RETURN_IF_MPI_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  RETURN_IF_MPI_ERROR(MPI_Comm_rank(comm, &ch->rank_));
  RETURN_IF_MPI_ERROR(MPI_Comm_size(comm, &ch->size_));
  RETURN_IF_MPI_ERROR(MPI_Irecv(ch->in_.data(), static_cast<int>(ch->in_.size()), MPI_CHAR,
                                MPI_ANY_SOURCE, kTag, comm, &ch->recv_));
  return ch;
}

AbortChannel::~AbortChannel() { Close(); }

void AbortChannel::Send(const absl::Status& cause) {
  if (cause.ok()) return;
  SendToAll(static_cast<int32_t>(cause.code()), cause.message());
}

void AbortChannel::SendLeft(absl::string_view why) { SendToAll(kLeftCode, why); }

void AbortChannel::SendToAll(int32_t code, absl::string_view message) {
  if (sent_ || comm_ == MPI_COMM_NULL) return;
  sent_ = true;
  const size_t text = std::min(message.size(), kMessageBytes - sizeof(code));
  out_.resize(sizeof(code) + text);
  std::memcpy(out_.data(), &code, sizeof(code));
  std::memcpy(out_.data() + sizeof(code), message.data(), text);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc =
        MPI_Isend(out_.data(), static_cast<int>(out_.size()), MPI_CHAR, r, kTag, comm_, &req);
    if (rc != MPI_SUCCESS) {
      Log().warn("mpi backend: could not tell rank {} of the abort: {}", r,
                 MpiStatus(rc, "MPI_Isend").ToString());
      continue;
    }
    sends_.push_back(req);
  }
}

void AbortChannel::FlushSends(absl::Time deadline) {
  while (!sends_.empty() && absl::Now() < deadline) {
    int done = 0;
    if (MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE) !=
        MPI_SUCCESS) {
      return;
    }
    if (done) {
      sends_.clear();
      return;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

std::optional<PeerAbort> AbortChannel::Poll() {
  if (!sends_.empty()) {
    int done = 0;
    // Completed sends become MPI_REQUEST_NULL; drop them.
    if (MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE) ==
            MPI_SUCCESS &&
        done) {
      sends_.clear();
    }
  }
  if (recv_ == MPI_REQUEST_NULL) return std::nullopt;
  int flag = 0;
  MPI_Status status;
  if (MPI_Test(&recv_, &flag, &status) != MPI_SUCCESS || !flag) return std::nullopt;
  int bytes = 0;
  MPI_Get_count(&status, MPI_CHAR, &bytes);
  PeerAbort a;
  a.rank = status.MPI_SOURCE;
  int32_t code = static_cast<int32_t>(absl::StatusCode::kAborted);
  if (bytes >= static_cast<int>(sizeof(code))) {
    std::memcpy(&code, in_.data(), sizeof(code));
    a.cause.assign(in_.data() + sizeof(code), static_cast<size_t>(bytes) - sizeof(code));
  }
  a.left = code == kLeftCode;
  a.code = a.left ? absl::StatusCode::kUnavailable
           : code > 0 && code <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated)
               ? static_cast<absl::StatusCode>(code)
               : absl::StatusCode::kAborted;
  return a;
}

void AbortChannel::Close() {
  if (comm_ == MPI_COMM_NULL) return;
  if (recv_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&recv_);
    MPI_Wait(&recv_, MPI_STATUS_IGNORE);  // a cancelled receive completes locally
  }
  // Sends still in flight complete in the background (small, eager); never wait on a peer.
  bool released = false;
  for (MPI_Request& r : sends_) {
    if (r != MPI_REQUEST_NULL) {
      MPI_Request_free(&r);
      released = true;
    }
  }
  sends_.clear();
  // MPI may still read the message after Request_free: it must outlive us (a deliberate,
  // one-message leak, as for operations MPI still owns).
  if (released) new std::vector<char>(std::move(out_));  // NOLINT
  MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

}  // namespace braid::mpi
