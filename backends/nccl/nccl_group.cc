#include "backends/nccl/nccl_group.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/nccl_types.h"
#include "backends/nccl/poll.h"
#include "comm/status_macros.h"

namespace braid::nccl {
Capabilities NcclGroup::NcclCapabilities() {
  Capabilities c;
  c.host_memory = false;
  c.device_memory = true;
  c.device_events = true;
  c.native_avg = true;
  c.native_premul_sum = true;
  c.native_half = true;
  c.async_progress = true;
  c.split = true;
  c.deterministic = false;
  return c;
}

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Create(std::shared_ptr<const NcclContext> ctx,
                                                             std::shared_ptr<NcclComm> comm,
                                                             std::string name) {
  const std::string what = absl::StrCat("group '", name, "'");
  CudaApi& cuda = *ctx->apis.cuda;
  RETURN_IF_ERROR(
      WithContext(CudaStatus(cuda, cuda.SetDevice(ctx->device), "cudaSetDevice"), what));
  auto res = std::make_shared<Resources>();
  const size_t n = static_cast<size_t>(comm->size());
  ASSIGN_OR_RETURN(res->stream, CudaStream::Create(ctx->apis.cuda, what));
  ASSIGN_OR_RETURN(res->scratch,
                   DeviceBuffer::Allocate(ctx->apis.cuda, 8 * n, absl::StrCat(what, " (scratch)")));
  ASSIGN_OR_RETURN(
      res->pinned,
      DeviceBuffer::Allocate(ctx->apis.cuda, 4 * n, absl::StrCat(what, " (split exchange)"), true));
  return std::unique_ptr<NcclGroup>(
      new NcclGroup(std::move(ctx), std::move(comm), std::move(name), std::move(res)));
}

NcclGroup::NcclGroup(std::shared_ptr<const NcclContext> ctx, std::shared_ptr<NcclComm> comm,
                     std::string name, std::shared_ptr<Resources> resources)
    : ctx_(std::move(ctx)),
      comm_(std::move(comm)),
      name_(std::move(name)),
      resources_(std::move(resources)) {
  NcclBufferOpsConfig c;
  c.apis = ctx_->apis;
  c.poller = ctx_->poller;
  c.comm = comm_;
  c.stream = resources_->stream.get();
  c.keep_alive = resources_;
  c.device = ctx_->device;
  c.group_name = name_;
  ops_ = std::make_unique<NcclBufferOps>(std::move(c));
  if (ctx_->aborts != nullptr) {
    SetAbortDomain(ctx_->aborts->domain());
    ctx_->aborts->Register(comm_);
  }
}

absl::Status NcclGroup::UseStream(DeviceStream stream) {
  resources_->external.store(static_cast<cudaStream_t>(stream.handle));
  ops_->SetStream(resources_->Stream());
  return absl::OkStatus();
}

NcclGroup::~NcclGroup() {
  for (Call& c : coalesced_) {
    c.work->Complete(absl::CancelledError(absl::StrCat(
        c.work->info().Describe(), ": the group was destroyed before EndCoalescing issued it")));
  }
}

NcclGroup::Call NcclGroup::MakeCall(const CollectiveArgs& args, WorkPtr work) {
  Call c{args, std::move(work), {}};
  c.args.options.ready_events = {};
  if (args.options.ready_event) c.ready.push_back(args.options.ready_event.handle);
  for (const DeviceEvent& e : args.options.ready_events) {
    if (e) c.ready.push_back(e.handle);
  }
  return c;
}

absl::Duration NcclGroup::TimeoutOf(const CollectiveOptions& o) const {
  return o.timeout > absl::ZeroDuration() ? o.timeout : ctx_->timeout;
}

WorkPtr NcclGroup::NewWork(CollectiveKind kind, absl::string_view label) {
  return works_.Create(
      WorkInfo{name_, std::string(CollectiveName(kind)), next_seq_++, std::string(label)},
      ctx_->spin);
}

absl::StatusOr<WorkPtr> NcclGroup::Launch(const CollectiveArgs& args) {
  if (comm_->failed()) {
    return absl::FailedPreconditionError(
        absl::StrCat(CollectiveName(args.kind), " on group '", name_,
                     "': the group failed earlier: ", comm_->failure().message()));
  }
  if (coalescing_) {
    if (args.kind == CollectiveKind::kBarrier) {
      return absl::InvalidArgumentError(absl::StrCat(
          "barrier on group '", name_,
          "': not allowed while coalescing (between StartCoalescing and EndCoalescing)"));
    }
    WorkPtr w = NewWork(args.kind, args.options.label);
    coalesced_.push_back(MakeCall(args, w));
    return w;
  }
  WorkPtr w = NewWork(args.kind, args.options.label);
  RETURN_IF_ERROR(Issue({MakeCall(args, w)}, w, TimeoutOf(args.options)));
  return w;
}

absl::Status NcclGroup::StartCoalescing() {
  if (coalescing_) {
    return absl::FailedPreconditionError(
        absl::StrCat("StartCoalescing on group '", name_, "': already coalescing"));
  }
  coalescing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<WorkPtr> NcclGroup::EndCoalescing(absl::string_view label) {
  if (!coalescing_) {
    return absl::FailedPreconditionError(
        absl::StrCat("EndCoalescing on group '", name_, "' without StartCoalescing"));
  }
  coalescing_ = false;
  std::vector<Call> calls;
  calls.swap(coalesced_);
  if (calls.empty()) {
    return Work::Completed(WorkInfo{name_, "coalesced(0 calls)", next_seq_, std::string(label)},
                           absl::OkStatus());
  }
  absl::Duration timeout = absl::ZeroDuration();
  for (const Call& c : calls) timeout = std::max(timeout, TimeoutOf(c.args.options));
  WorkPtr launch =
      works_.Create(WorkInfo{name_, absl::StrCat("coalesced(", calls.size(), " calls)"),
                             calls.front().work->info().seq, std::string(label)},
                    ctx_->spin);
  const absl::Status s = Issue(calls, launch, timeout);
  if (!s.ok()) {
    for (Call& c : calls) {
      c.work->Complete(
          absl::Status(s.code(), absl::StrCat(c.work->info().Describe(), ": ", s.message())));
    }
    return s;
  }
  return launch;
}

absl::Status NcclGroup::Issue(const std::vector<Call>& calls, const WorkPtr& launch,
                              absl::Duration timeout) {
  const std::string what = launch->info().Describe();
  if (comm_->failed()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the group failed earlier: ", comm_->failure().message()));
  }
  absl::Status s;
  {
    std::unique_lock<std::mutex> lock = comm_->Lock();
    s = IssueLocked(calls, launch, absl::Now() + timeout, timeout);
  }
  if (!s.ok()) {
    // Peers may have issued these calls: this communicator's order can no longer be trusted.
    s = absl::Status(s.code(), absl::StrCat(what, ": ", s.message(),
                                            "; the NCCL communicator was "
                                            "aborted, so group '",
                                            name_, "' is failed"));
    comm_->Abort(s);
  }
  return s;
}

absl::Status NcclGroup::IssueLocked(const std::vector<Call>& calls, const WorkPtr& launch,
                                    absl::Time deadline, absl::Duration timeout) {
  CudaApi& cuda = *ctx_->apis.cuda;
  NcclApi& nccl = *ctx_->apis.nccl;
  const cudaStream_t stream = resources_->Stream();
  RETURN_IF_ERROR(CudaStatus(cuda, cuda.SetDevice(ctx_->device), "cudaSetDevice"));
  RETURN_IF_ERROR(comm_->ReadyLocked(deadline));
  // 1. Readiness: the comm stream waits for each producer; the host does not.
  absl::InlinedVector<void*, 4> waited;
  for (const Call& c : calls) {
    for (void* ev : c.ready) {
      if (std::find(waited.begin(), waited.end(), ev) != waited.end()) continue;
      waited.push_back(ev);
      RETURN_IF_ERROR(CudaStatus(
          cuda, cuda.StreamWaitEvent(stream, static_cast<cudaEvent_t>(ev)),
          absl::StrCat("cudaStreamWaitEvent on a ready event of ", c.work->info().Describe())));
    }
  }
  // 2. Reduction ops (pre-mul-sum ops live until the calls using them returned), the bracket.
  std::vector<PreMulSumOp> premul;
  std::vector<ncclRedOp_t> ops(calls.size(), ncclSum);
  for (size_t i = 0; i < calls.size(); ++i) {
    const CollectiveArgs& a = calls[i].args;
    if (a.kind != CollectiveKind::kAllReduce && a.kind != CollectiveKind::kReduceScatter) continue;
    ASSIGN_OR_RETURN(const ReductionChoice choice, ChooseReduction(a.op, a.dtype, size()));
    if (!choice.premul) {
      ops[i] = choice.builtin;
      continue;
    }
    ASSIGN_OR_RETURN(PreMulSumOp op,
                     PreMulSumOp::CreateLocked(*comm_, choice.scalar, a.dtype, deadline));
    ops[i] = op.op();
    premul.push_back(std::move(op));
  }
  RETURN_IF_ERROR(NcclStatus(nccl, nccl.GroupStart(), "ncclGroupStart"));
  absl::Status s;
  for (size_t i = 0; i < calls.size() && s.ok(); ++i) {
    s = WithContext(EnqueueLocked(calls[i].args, ops[i]), calls[i].work->info().Describe());
  }
  const absl::Status end = comm_->AfterCallLocked(nccl.GroupEnd(), "ncclGroupEnd");
  if (s.ok()) s = end;
  // Nonblocking: the calls are enqueued on the stream only once the state leaves ncclInProgress.
  if (s.ok()) s = comm_->ReadyLocked(deadline);
  RETURN_IF_ERROR(s);
  premul.clear();
  // 3. Completion: an event after the bracket, for consumer streams and the poller.
  ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::Create(ctx_->apis.cuda));
  RETURN_IF_ERROR(CudaStatus(cuda, cuda.EventRecord(done.get(), stream),
                             "cudaEventRecord of the completion event"));
  const DeviceEvent device_event{done.get()};
  CompletionPoller::Tracked t;
  t.works.push_back(launch);
  launch->set_device_event(device_event);
  for (const Call& c : calls) {
    if (c.work == launch) continue;
    c.work->set_device_event(device_event);
    t.works.push_back(c.work);
  }
  t.event = std::move(done);
  t.comm = comm_;
  t.deadline = deadline;
  t.timeout = timeout;
  t.keep_alive = resources_;
  ctx_->poller->Track(std::move(t));
  return absl::OkStatus();
}

absl::Status NcclGroup::EnqueueLocked(const CollectiveArgs& a, ncclRedOp_t op) {
  NcclApi& nccl = *ctx_->apis.nccl;
  const ncclComm_t h = comm_->handle();
  const cudaStream_t stream = resources_->Stream();
  const ncclDataType_t type = ToNcclType(a.dtype);
  switch (a.kind) {
    case CollectiveKind::kAllReduce:
      return comm_->AfterCallLocked(nccl.AllReduce(a.send, a.recv, a.count, type, op, h, stream),
                                    "ncclAllReduce");
    case CollectiveKind::kReduceScatter:
      return comm_->AfterCallLocked(
          nccl.ReduceScatter(a.send, a.recv, a.count, type, op, h, stream), "ncclReduceScatter");
    case CollectiveKind::kAllGather:
      return comm_->AfterCallLocked(nccl.AllGather(a.send, a.recv, a.count, type, h, stream),
                                    "ncclAllGather");
    case CollectiveKind::kBroadcast:
      return comm_->AfterCallLocked(
          nccl.Broadcast(a.send, a.recv, a.count, type, a.root, h, stream), "ncclBroadcast");
    case CollectiveKind::kBarrier: {
      void* scratch = resources_->scratch.get();
      return comm_->AfterCallLocked(
          nccl.AllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, h, stream),
          "ncclAllReduce (barrier)");
    }
  }
  return absl::InvalidArgumentError("unknown collective kind");
}

absl::StatusOr<std::vector<int32_t>> NcclGroup::ExchangeColors(int color, absl::Time deadline) {
  CudaApi& cuda = *ctx_->apis.cuda;
  NcclApi& nccl = *ctx_->apis.nccl;
  const cudaStream_t stream = resources_->Stream();
  const int n = size();
  const int r = rank();
  auto* host = static_cast<int32_t*>(resources_->pinned.get());
  auto* dev = static_cast<int32_t*>(resources_->scratch.get());
  CudaEvent done;
  {
    std::unique_lock<std::mutex> lock = comm_->Lock();
    RETURN_IF_ERROR(CudaStatus(cuda, cuda.SetDevice(ctx_->device), "cudaSetDevice"));
    RETURN_IF_ERROR(comm_->ReadyLocked(deadline));
    host[r] = color;
    RETURN_IF_ERROR(CudaStatus(
        cuda, cuda.MemcpyAsync(dev + r, host + r, sizeof(int32_t), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (color to device)"));
    RETURN_IF_ERROR(comm_->AfterCallLocked(
        nccl.AllGather(dev + r, dev, 1, ncclInt32, comm_->handle(), stream), "ncclAllGather"));
    RETURN_IF_ERROR(comm_->ReadyLocked(deadline));
    RETURN_IF_ERROR(CudaStatus(
        cuda, cuda.MemcpyAsync(host, dev, sizeof(int32_t) * n, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (colors to host)"));
    ASSIGN_OR_RETURN(done, CudaEvent::Create(ctx_->apis.cuda));
    RETURN_IF_ERROR(CudaStatus(cuda, cuda.EventRecord(done.get(), stream), "cudaEventRecord"));
  }
  absl::Status s = PollUntil(deadline, [&]() -> std::optional<absl::Status> {
    const cudaError_t q = cuda.EventQuery(done.get());
    if (q == cudaErrorNotReady) return std::nullopt;
    return CudaStatus(cuda, q, "cudaEventQuery");
  });
  if (absl::IsDeadlineExceeded(s)) {
    s = absl::DeadlineExceededError(
        "the exchange of colors (an all-gather) was not complete at the deadline; a rank may "
        "have stopped or called something else");
  }
  RETURN_IF_ERROR(s);
  return std::vector<int32_t>(host, host + n);
}

absl::StatusOr<std::unique_ptr<Group>> NcclGroup::DoSplit(int color, int key, std::string name) {
  if (comm_->failed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "split of group '", name_, "': the group failed earlier: ", comm_->failure().message()));
  }
  if (coalescing_) {
    return absl::FailedPreconditionError(
        absl::StrCat("split of group '", name_, "': not allowed while coalescing"));
  }
  const uint64_t seq = next_seq_++;
  const std::string what =
      absl::StrCat("split #", seq, " of group '", name_, "' into '", name, "'");
  const absl::Time deadline = absl::Now() + ctx_->timeout;
  absl::StatusOr<std::vector<int32_t>> colors = ExchangeColors(color, deadline);
  if (!colors.ok()) {
    const absl::Status s = WithContext(colors.status(), what);
    comm_->Abort(s);
    return s;
  }
  std::vector<std::string> bad;
  for (size_t r = 0; r < colors->size(); ++r) {
    const int c = (*colors)[r];
    if (c < 0 && c != kNoColor) bad.push_back(absl::StrCat("rank ", r, " passed color ", c));
  }
  if (!bad.empty()) {
    // Every rank saw the same table: all fail here, and the group stays usable.
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", absl::StrJoin(bad, ", "),
                     " (a color must be >= 0, or kNoColor to join no group)"));
  }
  NcclComm::Config child{name, ctx_->blocking, ctx_->device, ctx_->timeout};
  ASSIGN_OR_RETURN(std::shared_ptr<NcclComm> comm,
                   comm_->Split(color, key, std::move(child), deadline));
  if (comm == nullptr) return std::unique_ptr<Group>();
  ASSIGN_OR_RETURN(std::unique_ptr<NcclGroup> g, NcclGroup::Create(ctx_, std::move(comm), name));
  return std::unique_ptr<Group>(std::move(g));
}

}  // namespace braid::nccl
