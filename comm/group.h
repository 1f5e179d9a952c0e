// Group: a communicator over a subset of ranks, and the backend-facing collective interface.
//
// RANK-ORDER CONTRACT: every rank of a group issues the group's collectives (and Split) in the
// same order, with matching arguments. Ranks match calls by their position in that order
// (the per-group sequence number); there is no coordinator. A violation is a hang on most
// transports; Braid's backends turn it into an error where they can see it (`local` always,
// `mpi` with BRAID_VALIDATE_COLLECTIVES=1) and into a deadline error otherwise. Calls on one
// Group object must not run concurrently: serialize them (the scheduler does).
//
//   ASSIGN_OR_RETURN(WorkPtr w, world->AllReduce(grad, grad, n, DType::kBF16, ReduceOp::Avg()));
//   ASSIGN_OR_RETURN(std::unique_ptr<Group> shard, world->Split(rank / 4, rank % 4, "shard"));
//
// In-place forms follow NCCL: all-reduce when send == recv; reduce-scatter when
// recv == send + rank * recvcount (elements); all-gather when send == recv + rank * sendcount.
// Out-of-place buffers must not overlap. Every call is asynchronous and returns a Work; bad
// arguments return an error status right away and start nothing.
#ifndef BRAID_COMM_GROUP_H_
#define BRAID_COMM_GROUP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/abort_domain.h"
#include "comm/buffer_ops.h"
#include "comm/dtype.h"
#include "comm/flight_recorder.h"
#include "comm/reduce_op.h"
#include "comm/tensor.h"
#include "comm/work.h"

namespace braid {

inline constexpr int kNoColor = -1;  // Split color for "this rank joins no new group"

// What a backend can do. Unsupported operations return Unimplemented, never crash.
struct Capabilities {
  bool host_memory = true;         // buffers in host memory
  bool device_memory = false;      // buffers in device memory
  bool device_events = false;      // honours CollectiveOptions' ready events, sets Work events
  bool native_avg = false;         // avg without a scaling pass
  bool native_premul_sum = false;  // pre-multiplied sum without a scaling pass
  bool native_half = false;        // bf16/f16 reduced without f32 staging
  bool async_progress = true;      // Work completes without anyone polling or waiting
  bool split = true;
  bool deterministic = false;  // bit-identical results whatever the timing
};

struct CollectiveOptions {
  DeviceEvent ready_event;  // device backends wait on it first
  // More events to wait on first, as ready_event (a bucket's several producers). Not owned:
  // valid until the call returns (backends that keep the call copy the handles).
  absl::Span<const DeviceEvent> ready_events;
  absl::Duration timeout = absl::ZeroDuration();  // 0: the group's default (BRAID_TIMEOUT_MS)
  absl::string_view label;                        // names the caller's unit in errors
  // bf16/f16 sum, avg and premul_sum on a backend that stages halves in f32 (mpi, gloo): carry
  // 2 bytes per element instead, each hop widening both operands to f32, adding, rounding back
  // (NCCL's half sum). Every rank must pass the same value. Backends with native_half ignore it.
  bool half_wire = false;
};

enum class CollectiveKind : int { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };
absl::string_view CollectiveName(CollectiveKind k);  // "allreduce", "reduce_scatter", ...

// A validated call, as handed to a backend. `count` is the per-call count in NCCL's terms:
// all-reduce/broadcast: elements of the buffer; reduce-scatter: recvcount; all-gather: sendcount.
struct CollectiveArgs {
  CollectiveKind kind = CollectiveKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op;
  int root = 0;
  bool in_place = false;
  CollectiveOptions options;

  size_t send_count(int group_size) const;  // elements read from `send`
  size_t recv_count(int group_size) const;  // elements written to `recv`
  std::string Describe() const;             // "allreduce count=12 dtype=f32 op=sum"
};

class Group {
 public:
  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;
  virtual absl::string_view backend_name() const = 0;
  virtual Capabilities capabilities() const = 0;
  // Memory operations on buffers this group's collectives use, ordered with its collectives
  // (comm/buffer_ops.h). Default: host memory (HostBufferOps()). Valid for the group's life.
  virtual BufferOps& buffer_ops() { return HostBufferOps(); }
  // Device groups: from now on this group's collectives and buffer operations are queued on
  // `stream`, the caller's (e.g. a framework's prefetch stream, so gathers run on a stream it
  // chose); null: back to the group's own stream. Not owned: it must stay valid while the
  // group may use it, and be on the group's device. Call it when nothing the caller has not
  // waited for is in flight on the group (work already queued stays on its stream; later work
  // is ordered after it only by the stream's own order). Default: Unimplemented naming the
  // group (host groups have no streams).
  virtual absl::Status UseStream(DeviceStream stream);

  absl::StatusOr<WorkPtr> AllReduce(const void* send, void* recv, size_t count, DType dtype,
                                    ReduceOp op, const CollectiveOptions& opts = {});
  // `send` holds size()*recvcount elements; this rank receives block rank() reduced.
  absl::StatusOr<WorkPtr> ReduceScatter(const void* send, void* recv, size_t recvcount, DType dtype,
                                        ReduceOp op, const CollectiveOptions& opts = {});
  // `recv` receives size()*sendcount elements, block r from rank r.
  absl::StatusOr<WorkPtr> AllGather(const void* send, void* recv, size_t sendcount, DType dtype,
                                    const CollectiveOptions& opts = {});
  absl::StatusOr<WorkPtr> Broadcast(void* buf, size_t count, DType dtype, int root,
                                    const CollectiveOptions& opts = {});
  absl::StatusOr<WorkPtr> Barrier(const CollectiveOptions& opts = {});

  // Collective over this group: ranks with the same `color` (>= 0) form a new group, ordered
  // by (key, old rank). kNoColor returns a null group. Any other negative color is an error on
  // that rank, and the other ranks get an error naming it. `name` defaults to
  // "<parent>/<color>".
  absl::StatusOr<std::unique_ptr<Group>> Split(int color, int key, absl::string_view name = {});

  // The job's abort domain (comm/abort_domain.h), shared with every group split from this one;
  // null where the backend has none (plugins). Once it has aborted, every collective and Split
  // on this group is refused with its cause, and the backend fails what was pending.
  AbortDomain* abort_domain() const { return abort_domain_.get(); }
  const std::shared_ptr<AbortDomain>& shared_abort_domain() const { return abort_domain_; }
  // Fails the whole job now, on every rank, with `cause` reported by this group's rank (its
  // world rank where the backend knows it): for failures Braid cannot see, e.g. a framework's
  // step that failed on this rank. FailedPrecondition without a domain; OK (and no effect) if
  // the job had already aborted.
  absl::Status AbortJob(const absl::Status& cause);

  // This rank's flight recorder (comm/flight_recorder.h): every collective of this group is
  // recorded in it. Backend::WorldGroup attaches it to the world group; Split hands it to the
  // child. Null when recording is off.
  FlightRecorder* flight_recorder() const { return flight_recorder_.get(); }
  const std::shared_ptr<FlightRecorder>& shared_flight_recorder() const { return flight_recorder_; }
  // Replaces the recorder (null: stop recording). Call before the group's first collective.
  void AttachFlightRecorder(std::shared_ptr<FlightRecorder> r) { flight_recorder_ = std::move(r); }

 protected:
  // Backends call it in their constructors (children: the parent's domain).
  void SetAbortDomain(std::shared_ptr<AbortDomain> domain) { abort_domain_ = std::move(domain); }
  // The world rank this group's rank reports aborts as; default: rank().
  virtual int world_rank() const { return rank(); }

  // Called with validated arguments; must not block on peers (return a Work).
  virtual absl::StatusOr<WorkPtr> Launch(const CollectiveArgs& args) = 0;
  virtual absl::StatusOr<std::unique_ptr<Group>> DoSplit(int color, int key, std::string name) = 0;

 private:
  absl::StatusOr<WorkPtr> ValidateAndLaunch(CollectiveArgs args);

  std::shared_ptr<AbortDomain> abort_domain_;
  std::shared_ptr<FlightRecorder> flight_recorder_;
};

// Name of a child group as Split builds it when the caller gives none.
std::string DefaultSplitName(absl::string_view parent, int color);

}  // namespace braid

#endif  // BRAID_COMM_GROUP_H_
