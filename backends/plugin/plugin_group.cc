#include "backends/plugin/plugin_group.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/plugin/abi_convert.h"

namespace braid::plugin {
namespace {

// A launch's `done_arg`: owned by the plugin from a successful launch until its callback.
struct Pending {
  WorkPtr work;
  // Outlives the callback: comm_destroy runs every pending callback before it returns, and
  // the comm holds the library.
  const PluginLibrary* lib;
  std::shared_ptr<AbortDomain> domain;
  int world_rank;
  bool abort_on_failure;
};

// The completion callback handed to every launch. The first failure of the job is the
// plugin's own error, and aborts the job (abort_on_failure); a failure once the job has
// aborted (the aborter destroyed the comm, or the plugin failed it because a peer's comm went)
// reports the abort's cause, as the built-in backends' pending Works do.
extern "C" void BraidPluginDone(void* arg, int status, const char* message) {
  std::unique_ptr<Pending> p(static_cast<Pending*>(arg));
  if (status == BRAID_BACKEND_OK) {
    p->work->Complete(absl::OkStatus());
    return;
  }
  const absl::Status own = PluginError(*p->lib, p->work->info().Describe(), status, message);
  const bool first = p->abort_on_failure && p->domain->Abort(p->world_rank, own);
  if (first || !p->domain->aborted()) {
    p->work->Complete(own);
    return;
  }
  p->work->Complete(absl::AbortedError(
      absl::StrCat("plugin '", p->lib->name(), "': ", p->work->info().Describe(), ": ",
                   p->domain->status().message(), " (the plugin reported: ",
                   message == nullptr || message[0] == '\0' ? "no message" : message, ")")));
}

// The table entry that runs `k`, by its field name.
const char* EntryName(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

bool HasEntry(const braid_backend_v1& t, CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce:
      return t.all_reduce != nullptr;
    case CollectiveKind::kReduceScatter:
      return t.reduce_scatter != nullptr;
    case CollectiveKind::kAllGather:
      return t.all_gather != nullptr;
    case CollectiveKind::kBroadcast:
      return t.broadcast != nullptr;
    case CollectiveKind::kBarrier:
      return t.barrier != nullptr;
  }
  return false;
}

absl::Status MissingEntry(const PluginLibrary& lib, const char* entry, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat("plugin '", lib.name(), "' does not implement ",
                                               entry, " (its braid_backend_v1.", entry,
                                               " is NULL): ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Group>> PluginGroup::Create(PluginComm comm, std::string name,
                                                           Capabilities caps, absl::Duration spin,
                                                           GroupAbort abort) {
  const PluginLibrary& lib = comm.context().library();
  braid_backend_error_v1 err;
  err.message[0] = '\0';
  int rank = -1;
  int size = 0;
  const int rc = comm.context().table().comm_info(comm.handle(), &rank, &size, &err);
  if (rc != BRAID_BACKEND_OK) {
    return PluginError(lib, absl::StrCat("comm_info of group '", name, "'"), rc, err);
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InternalError(absl::StrCat("plugin '", lib.name(), "': comm_info of group '", name,
                                            "' reported rank ", rank, " of size ", size));
  }
  if (!abort.aborter->Register(comm.shared_gate())) {
    return abort.aborter->domain()->RefusalFor(name);  // ~PluginComm destroys the comm
  }
  return std::unique_ptr<Group>(
      new PluginGroup(std::move(comm), std::move(name), rank, size, caps, spin, std::move(abort)));
}

PluginGroup::PluginGroup(PluginComm comm, std::string name, int rank, int size, Capabilities caps,
                         absl::Duration spin, GroupAbort abort)
    : comm_(std::move(comm)),
      name_(std::move(name)),
      rank_(rank),
      size_(size),
      caps_(caps),
      spin_(spin),
      abort_(std::move(abort)) {
  SetAbortDomain(abort_.aborter->domain());
}

absl::StatusOr<WorkPtr> PluginGroup::Launch(const CollectiveArgs& a) {
  const braid_backend_v1& t = table();
  WorkPtr work = Work::Create(
      WorkInfo{name_, std::string(CollectiveName(a.kind)), next_seq_, std::string(a.options.label)},
      spin_);
  if (!HasEntry(t, a.kind)) {
    return MissingEntry(library(), EntryName(a.kind), work->info().Describe());
  }
  auto pending = std::make_unique<Pending>(Pending{work, &library(), abort_.aborter->domain(),
                                                   abort_.world_rank, abort_.abort_on_failure});
  // The job aborted since Group checked: the aborter has closed (or is destroying) the comm.
  if (!comm_.gate().Enter()) return abort_domain()->RefusalFor(name_);
  void* comm = comm_.handle();
  const int dtype = ToAbiDType(a.dtype);
  const int op = ToAbiReduceKind(a.op.kind);
  braid_backend_error_v1 err;
  err.message[0] = '\0';
  int rc = BRAID_BACKEND_OK;
  switch (a.kind) {
    case CollectiveKind::kAllReduce:
      rc = t.all_reduce(comm, a.send, a.recv, a.count, dtype, op, a.op.scalar, &BraidPluginDone,
                        pending.get(), &err);
      break;
    case CollectiveKind::kReduceScatter:
      rc = t.reduce_scatter(comm, a.send, a.recv, a.count, dtype, op, a.op.scalar, &BraidPluginDone,
                            pending.get(), &err);
      break;
    case CollectiveKind::kAllGather:
      rc =
          t.all_gather(comm, a.send, a.recv, a.count, dtype, &BraidPluginDone, pending.get(), &err);
      break;
    case CollectiveKind::kBroadcast:
      rc = t.broadcast(comm, a.send, a.recv, a.count, dtype, a.root, &BraidPluginDone,
                       pending.get(), &err);
      break;
    case CollectiveKind::kBarrier:
      rc = t.barrier(comm, &BraidPluginDone, pending.get(), &err);
      break;
  }
  comm_.gate().Leave();
  if (rc != BRAID_BACKEND_OK) {
    // Nothing started: the callback will never run, `pending` is still ours.
    return PluginError(library(), work->info().Describe(), rc, err);
  }
  pending.release();  // the callback owns it now, and may already have run
  ++next_seq_;
  return work;
}

absl::StatusOr<std::unique_ptr<Group>> PluginGroup::DoSplit(int color, int key, std::string name) {
  const std::string what =
      absl::StrCat("split of group '", name_, "' (color ", color, ", key ", key, ")");
  if (table().comm_split == nullptr) return MissingEntry(library(), "comm_split", what);
  braid_backend_error_v1 err;
  err.message[0] = '\0';
  void* child = nullptr;
  if (!comm_.gate().Enter()) return abort_domain()->RefusalFor(name_);
  const int rc = table().comm_split(comm_.handle(), color, key, &child, &err);
  comm_.gate().Leave();
  if (rc != BRAID_BACKEND_OK) return PluginError(library(), what, rc, err);
  if (child == nullptr) {
    if (color == kNoColor) return std::unique_ptr<Group>();
    return absl::InternalError(
        absl::StrCat("plugin '", library().name(), "': ", what, " succeeded but returned no comm"));
  }
  PluginComm owned(comm_.shared_context(), child);
  if (color == kNoColor) {
    return absl::InternalError(absl::StrCat("plugin '", library().name(), "': ", what,
                                            " returned a comm for color -1 (no group)"));
  }
  return Create(std::move(owned), std::move(name), caps_, spin_, abort_);
}

}  // namespace braid::plugin
