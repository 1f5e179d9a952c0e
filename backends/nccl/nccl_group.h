// The `nccl` backend's Group: collectives on device buffers, stream-ordered, with device
// readiness and completion events and host futures.
//
//   ASSIGN_OR_RETURN(WorkPtr w, group->AllReduce(d_grad, d_grad, n, DType::kBF16,
//                                                ReduceOp::Avg(), {ready_event, {}, "bucket 3"}));
//   cudaStreamWaitEvent(consumer, static_cast<cudaEvent_t>(w->device_event().handle), 0);
//   w->OnComplete([](const absl::Status& s) { ... });   // host side, from the poller thread
//
//   group->StartCoalescing();                           // one bucket, one ncclGroupStart/End
//   ASSIGN_OR_RETURN(WorkPtr a, group->ReduceScatter(...));
//   ASSIGN_OR_RETURN(WorkPtr b, group->ReduceScatter(...));
//   ASSIGN_OR_RETURN(WorkPtr bucket, group->EndCoalescing("bucket 3"));
//
// RANK-ORDER CONTRACT (see comm/group.h): every rank issues this group's collectives, coalesced
// buckets and Splits in the same order with matching arguments; NCCL cannot see a mismatch (it
// hangs, and the deadline turns the hang into an error). Calls on one NcclGroup must not run
// concurrently (the scheduler serializes them).
//
// Each launch runs on the group's own stream: it waits on the ready events (the host never
// blocks), issues the call(s), and records a completion event (Work::device_event(), valid
// while the Work is held) that the CompletionPoller turns into the host future, or fails at
// the deadline. A failure after arguments were accepted aborts the communicator: the group
// fails for good. Buffers are device pointers the caller keeps alive until the Work completes;
// buffer_ops() works on them on the same stream. Details: docs/design/backends.md.
#ifndef BRAID_BACKENDS_NCCL_NCCL_GROUP_H_
#define BRAID_BACKENDS_NCCL_NCCL_GROUP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/nccl/abort_hub.h"
#include "backends/nccl/completion_poller.h"
#include "backends/nccl/cuda_handles.h"
#include "backends/nccl/nccl_api.h"
#include "backends/nccl/nccl_buffer_ops.h"
#include "backends/nccl/nccl_comm.h"
#include "comm/group.h"
#include "comm/work_pool.h"

namespace braid::nccl {

// What a world group and every group split from it share.
struct NcclContext {
  NcclApis apis;
  std::shared_ptr<CompletionPoller> poller;
  absl::Duration timeout = absl::Seconds(300);  // default deadline of every call
  absl::Duration spin = absl::Microseconds(20);
  bool blocking = true;                  // communicator mode (children inherit it)
  int device = 0;                        // this rank's CUDA device
  std::shared_ptr<CommAbortHub> aborts;  // the job's abort domain, every communicator in it
};

class NcclGroup final : public Group {
 public:
  // A group over `comm` (ready); creates the group's stream and small buffers.
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(std::shared_ptr<const NcclContext> ctx,
                                                           std::shared_ptr<NcclComm> comm,
                                                           std::string name);
  ~NcclGroup() override;

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  const std::string& name() const override { return name_; }
  absl::string_view backend_name() const override { return "nccl"; }
  Capabilities capabilities() const override { return NcclCapabilities(); }
  static Capabilities NcclCapabilities();
  BufferOps& buffer_ops() override { return *ops_; }

  // Coalescing: collectives issued between StartCoalescing and EndCoalescing are validated and
  // queued (each returns its own Work at once, sequence numbers assigned in call order), then
  // EndCoalescing issues them in one ncclGroupStart/End with one completion event and returns a
  // Work for the whole bucket; the members complete with it (their device_event() is set when
  // EndCoalescing returns). Barrier is not allowed inside. EndCoalescing with nothing queued
  // returns a completed Work.
  absl::Status StartCoalescing();
  absl::StatusOr<WorkPtr> EndCoalescing(absl::string_view label = {});

  // Where the group's work is queued now: its own stream, or the one UseStream named.
  DeviceStream stream() const { return DeviceStream{resources_->Stream()}; }
  absl::Status UseStream(DeviceStream stream) override;
  const NcclComm& comm() const { return *comm_; }

 protected:
  absl::StatusOr<WorkPtr> Launch(const CollectiveArgs& args) override;
  absl::StatusOr<std::unique_ptr<Group>> DoSplit(int color, int key, std::string name) override;
  int world_rank() const override {
    return ctx_->aborts != nullptr ? ctx_->aborts->world_rank() : rank();
  }

 private:
  struct Resources {
    CudaStream stream;                            // the group's own
    std::atomic<cudaStream_t> external{nullptr};  // UseStream's, not owned
    cudaStream_t Stream() const {
      cudaStream_t e = external.load();
      return e != nullptr ? e : stream.get();
    }
    DeviceBuffer scratch;  // barrier and split exchange: 8 bytes per rank
    DeviceBuffer pinned;   // host side of the split exchange: 4 bytes per rank
  };
  struct Call {
    CollectiveArgs args;  // args.options.ready_events is not used after Launch returns
    WorkPtr work;
    absl::InlinedVector<void*, 4> ready;  // the events to wait on, copied at Launch
  };

  NcclGroup(std::shared_ptr<const NcclContext> ctx, std::shared_ptr<NcclComm> comm,
            std::string name, std::shared_ptr<Resources> resources);
  WorkPtr NewWork(CollectiveKind kind, absl::string_view label);
  static Call MakeCall(const CollectiveArgs& args, WorkPtr work);
  absl::Duration TimeoutOf(const CollectiveOptions& o) const;
  // Issues `calls` in one group bracket; `launch` is the Work the poller completes (calls'
  // own Works complete with it).
  absl::Status Issue(const std::vector<Call>& calls, const WorkPtr& launch, absl::Duration timeout);
  absl::Status IssueLocked(const std::vector<Call>& calls, const WorkPtr& launch,
                           absl::Time deadline, absl::Duration timeout);
  absl::Status EnqueueLocked(const CollectiveArgs& a, ncclRedOp_t op);
  absl::StatusOr<std::vector<int32_t>> ExchangeColors(int color, absl::Time deadline);

  const std::shared_ptr<const NcclContext> ctx_;
  const std::shared_ptr<NcclComm> comm_;
  const std::string name_;
  const std::shared_ptr<Resources> resources_;  // in-flight entries keep it alive
  WorkPool works_;
  std::unique_ptr<NcclBufferOps> ops_;  // on resources_->stream
  uint64_t next_seq_ = 0;               // collectives and splits; identical on every rank
  bool coalescing_ = false;
  std::vector<Call> coalesced_;
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_NCCL_GROUP_H_
