#include "comm/group.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid {

absl::string_view CollectiveName(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce:
      return "allreduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "allgather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "invalid-collective";
}

absl::Status Group::UseStream(DeviceStream stream) {
  return absl::UnimplementedError(absl::StrCat("a stream for group '", name(), "' (backend ",
                                               backend_name(),
                                               "): its collectives run on no stream"));
}

size_t CollectiveArgs::send_count(int n) const {
  switch (kind) {
    case CollectiveKind::kReduceScatter:
      return count * static_cast<size_t>(n);
    case CollectiveKind::kBarrier:
      return 0;
    default:
      return count;
  }
}

size_t CollectiveArgs::recv_count(int n) const {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return count * static_cast<size_t>(n);
    case CollectiveKind::kBarrier:
      return 0;
    default:
      return count;
  }
}

std::string CollectiveArgs::Describe() const {
  std::string s = absl::StrCat(CollectiveName(kind));
  if (kind == CollectiveKind::kBarrier) return s;
  absl::StrAppend(&s, " count=", count, " dtype=", DTypeName(dtype));
  if (kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter) {
    absl::StrAppend(&s, " op=", ReduceOpName(op));
  }
  if (kind == CollectiveKind::kBroadcast) absl::StrAppend(&s, " root=", root);
  if (in_place) absl::StrAppend(&s, " in-place");
  return s;
}

std::string DefaultSplitName(absl::string_view parent, int color) {
  return absl::StrCat(parent, "/", color);
}

namespace {

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace

absl::StatusOr<WorkPtr> Group::ValidateAndLaunch(CollectiveArgs a) {
  // Error text is built only on the error path: this runs for every collective.
  auto what = [&] { return absl::StrCat(CollectiveName(a.kind), " on group '", name(), "'"); };
  if (a.kind != CollectiveKind::kBarrier) {
    if (!IsValidDType(static_cast<int>(a.dtype))) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), ": invalid dtype value ", static_cast<int>(a.dtype)));
    }
    const int n = size();
    const size_t esize = DTypeSize(a.dtype);
    const size_t max_elems = std::numeric_limits<size_t>::max() / esize / static_cast<size_t>(n);
    if (a.count > max_elems) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), ": count ", a.count, " overflows the buffer size"));
    }
    const size_t send_elems = a.send_count(n);
    const size_t recv_elems = a.recv_count(n);
    if (send_elems > 0 && a.send == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), ": send buffer is null with ", send_elems, " elements to send"));
    }
    if (recv_elems > 0 && a.recv == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), ": recv buffer is null with ", recv_elems, " elements to receive"));
    }
    if (a.kind == CollectiveKind::kAllReduce || a.kind == CollectiveKind::kReduceScatter) {
      absl::Status s = ValidateReduceOp(a.op, a.dtype);
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(what(), ": ", s.message()));
    }
    if (a.kind == CollectiveKind::kBroadcast && (a.root < 0 || a.root >= n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), ": root ", a.root, " is not a rank of this group of size ", n));
    }
    // In-place detection with NCCL's conventions; anything else must not overlap.
    const char* s8 = static_cast<const char*>(a.send);
    char* r8 = static_cast<char*>(a.recv);
    switch (a.kind) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kBroadcast:
        a.in_place = a.send == a.recv;
        break;
      case CollectiveKind::kReduceScatter:
        a.in_place = a.count > 0 && r8 == s8 + static_cast<size_t>(rank()) * a.count * esize;
        break;
      case CollectiveKind::kAllGather:
        a.in_place = a.count > 0 && s8 == r8 + static_cast<size_t>(rank()) * a.count * esize;
        break;
      default:
        break;
    }
    if (!a.in_place && Overlaps(a.send, send_elems * esize, a.recv, recv_elems * esize)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), ": send and recv buffers overlap but are not the in-place form (",
                       a.kind == CollectiveKind::kReduceScatter ? "recv == send + rank*recvcount"
                       : a.kind == CollectiveKind::kAllGather   ? "send == recv + rank*sendcount"
                                                                : "send == recv",
                       ")"));
    }
  }
  if (a.options.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": negative timeout"));
  }
  if (abort_domain_ != nullptr && abort_domain_->aborted()) {
    return abort_domain_->RefusalFor(name());
  }
  if (flight_recorder_ == nullptr) return Launch(a);
  const int64_t issued_ns = FlightRecorder::NowNs();
  ASSIGN_OR_RETURN(WorkPtr w, Launch(a));
  if (w != nullptr) flight_recorder_->Record(a, rank(), size(), *w, issued_ns);
  return w;
}

absl::StatusOr<WorkPtr> Group::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                                         ReduceOp op, const CollectiveOptions& opts) {
  CollectiveArgs a;
  a.kind = CollectiveKind::kAllReduce;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.options = opts;
  return ValidateAndLaunch(a);
}

absl::StatusOr<WorkPtr> Group::ReduceScatter(const void* send, void* recv, size_t recvcount,
                                             DType dtype, ReduceOp op,
                                             const CollectiveOptions& opts) {
  CollectiveArgs a;
  a.kind = CollectiveKind::kReduceScatter;
  a.send = send;
  a.recv = recv;
  a.count = recvcount;
  a.dtype = dtype;
  a.op = op;
  a.options = opts;
  return ValidateAndLaunch(a);
}

absl::StatusOr<WorkPtr> Group::AllGather(const void* send, void* recv, size_t sendcount,
                                         DType dtype, const CollectiveOptions& opts) {
  CollectiveArgs a;
  a.kind = CollectiveKind::kAllGather;
  a.send = send;
  a.recv = recv;
  a.count = sendcount;
  a.dtype = dtype;
  a.options = opts;
  return ValidateAndLaunch(a);
}

absl::StatusOr<WorkPtr> Group::Broadcast(void* buf, size_t count, DType dtype, int root,
                                         const CollectiveOptions& opts) {
  CollectiveArgs a;
  a.kind = CollectiveKind::kBroadcast;
  a.send = buf;
  a.recv = buf;
  a.count = count;
  a.dtype = dtype;
  a.root = root;
  a.options = opts;
  return ValidateAndLaunch(a);
}

absl::StatusOr<WorkPtr> Group::Barrier(const CollectiveOptions& opts) {
  CollectiveArgs a;
  a.kind = CollectiveKind::kBarrier;
  a.options = opts;
  return ValidateAndLaunch(a);
}

absl::StatusOr<std::unique_ptr<Group>> Group::Split(int color, int key, absl::string_view name) {
  // A negative color other than kNoColor is still passed to the backend so the other ranks
  // learn of it (and fail naming this rank) instead of waiting for a rank that left.
  std::string child = name.empty() ? DefaultSplitName(this->name(), color) : std::string(name);
  if (abort_domain_ != nullptr && abort_domain_->aborted()) {
    return abort_domain_->RefusalFor(this->name());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Group> g, DoSplit(color, key, std::move(child)));
  if (g != nullptr && g->flight_recorder_ == nullptr) g->flight_recorder_ = flight_recorder_;
  return g;
}

absl::Status Group::AbortJob(const absl::Status& cause) {
  if (abort_domain_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("aborting the job from group '", name(),
                                                      "': backend ", backend_name(),
                                                      " has no abort domain"));
  }
  if (cause.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("aborting the job from group '", name(), "': the cause must be an error"));
  }
  abort_domain_->Abort(world_rank(), cause);
  return absl::OkStatus();
}

}  // namespace braid
