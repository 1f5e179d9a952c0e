// C API: collectives on a group, and the works they return.
#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "capi/braid.h"
#include "capi/convert.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/status_macros.h"

using braid::capi::CheckNotNull;
using braid::capi::Find;
using braid::capi::GroupImpl;
using braid::capi::Guard;
using braid::capi::Tag;
using braid::capi::WorkImpl;

namespace braid::capi {
namespace {

struct Call {
  std::shared_ptr<GroupImpl> group;
  CollectiveOptions options;
  std::string label;  // owns what options.label views
  double premul_scalar = 1.0;
};

// Checks the group, the output pointer and the options shared by every collective.
absl::StatusOr<Call> Prepare(braid_group_t* group, const braid_collective_options_t* opts,
                             braid_work_t** out) {
  Call c;
  ASSIGN_OR_RETURN(c.group, Find<GroupImpl>(group, "group"));
  RETURN_IF_ERROR(CheckNotNull(out, "out"));
  braid_collective_options_t o;
  braid_collective_options_init(&o);
  RETURN_IF_ERROR(ReadOptions(opts, "braid_collective_options_t", &o));
  RETURN_IF_ERROR(CheckTimeoutMs(o.timeout_ms, "opts->timeout_ms"));
  c.options.timeout = absl::Milliseconds(o.timeout_ms);
  c.options.ready_event = DeviceEvent{o.ready_event};
  if (o.label != nullptr) c.label = o.label;
  c.premul_scalar = o.premul_scalar;
  return c;
}

absl::StatusOr<ReduceOp> ToOp(int op, double scalar) {
  switch (op) {
    case BRAID_OP_SUM:
      return ReduceOp::Sum();
    case BRAID_OP_AVG:
      return ReduceOp::Avg();
    case BRAID_OP_PREMUL_SUM:
      return ReduceOp::PreMulSum(scalar);
    case BRAID_OP_MAX:
      return ReduceOp::Max();
    case BRAID_OP_MIN:
      return ReduceOp::Min();
  }
  return absl::InvalidArgumentError(absl::StrCat("op ", op, " is not a braid_reduce_op_t"));
}

// Launches `launch` (Group& -> StatusOr<WorkPtr>) under the group's lock and wraps the work.
template <typename Launch>
absl::Status Start(Call& c, braid_group_t* group, braid_work_t** out, Launch&& launch) {
  c.options.label = c.label;
  WorkPtr work;
  {
    std::lock_guard<std::mutex> lock(c.group->mu);
    ASSIGN_OR_RETURN(work, launch(*c.group->group, c.options));
  }
  auto impl = std::make_shared<WorkImpl>();
  impl->group = c.group;
  impl->work = std::move(work);
  ASSIGN_OR_RETURN(*out, Register(std::move(impl), {group}));
  return absl::OkStatus();
}

}  // namespace
}  // namespace braid::capi

using braid::capi::Call;
using braid::capi::Prepare;
using braid::capi::RawEnum;
using braid::capi::Start;
using braid::capi::ToDType;
using braid::capi::ToOp;

extern "C" {

void braid_collective_options_init(braid_collective_options_t* opts) {
  if (opts == nullptr) return;
  *opts = braid_collective_options_t{};
  opts->struct_size = sizeof(*opts);
  opts->premul_scalar = 1.0;
}

braid_status_t braid_allreduce(braid_group_t* group, const void* send, void* recv, size_t count,
                               braid_dtype_t dtype, braid_reduce_op_t op,
                               const braid_collective_options_t* opts, braid_work_t** out) {
  return Guard("braid_allreduce", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Call c, Prepare(group, opts, out));
    ASSIGN_OR_RETURN(braid::DType t, ToDType(RawEnum(dtype), "dtype"));
    ASSIGN_OR_RETURN(braid::ReduceOp o, ToOp(RawEnum(op), c.premul_scalar));
    return Start(c, group, out, [&](braid::Group& g, const braid::CollectiveOptions& co) {
      return g.AllReduce(send, recv, count, t, o, co);
    });
  });
}

braid_status_t braid_reduce_scatter(braid_group_t* group, const void* send, void* recv,
                                    size_t recvcount, braid_dtype_t dtype, braid_reduce_op_t op,
                                    const braid_collective_options_t* opts, braid_work_t** out) {
  return Guard("braid_reduce_scatter", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Call c, Prepare(group, opts, out));
    ASSIGN_OR_RETURN(braid::DType t, ToDType(RawEnum(dtype), "dtype"));
    ASSIGN_OR_RETURN(braid::ReduceOp o, ToOp(RawEnum(op), c.premul_scalar));
    return Start(c, group, out, [&](braid::Group& g, const braid::CollectiveOptions& co) {
      return g.ReduceScatter(send, recv, recvcount, t, o, co);
    });
  });
}

braid_status_t braid_allgather(braid_group_t* group, const void* send, void* recv, size_t sendcount,
                               braid_dtype_t dtype, const braid_collective_options_t* opts,
                               braid_work_t** out) {
  return Guard("braid_allgather", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Call c, Prepare(group, opts, out));
    ASSIGN_OR_RETURN(braid::DType t, ToDType(RawEnum(dtype), "dtype"));
    return Start(c, group, out, [&](braid::Group& g, const braid::CollectiveOptions& co) {
      return g.AllGather(send, recv, sendcount, t, co);
    });
  });
}

braid_status_t braid_broadcast(braid_group_t* group, void* buf, size_t count, braid_dtype_t dtype,
                               int root, const braid_collective_options_t* opts,
                               braid_work_t** out) {
  return Guard("braid_broadcast", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Call c, Prepare(group, opts, out));
    ASSIGN_OR_RETURN(braid::DType t, ToDType(RawEnum(dtype), "dtype"));
    return Start(c, group, out, [&](braid::Group& g, const braid::CollectiveOptions& co) {
      return g.Broadcast(buf, count, t, root, co);
    });
  });
}

braid_status_t braid_barrier(braid_group_t* group, const braid_collective_options_t* opts,
                             braid_work_t** out) {
  return Guard("braid_barrier", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Call c, Prepare(group, opts, out));
    return Start(c, group, out, [&](braid::Group& g, const braid::CollectiveOptions& co) {
      return g.Barrier(co);
    });
  });
}

braid_status_t braid_work_wait(braid_work_t* work, int64_t timeout_ms) {
  return Guard("braid_work_wait", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto w, Find<WorkImpl>(work, "work"));
    // "No limit" is ten years: a finite deadline keeps clock conversions away from overflow.
    const absl::Duration timeout =
        timeout_ms < 0 ? absl::Hours(24 * 365 * 10) : absl::Milliseconds(timeout_ms);
    return w->work->Wait(timeout);
  });
}

braid_status_t braid_work_test(braid_work_t* work, int* done) {
  bool running = false;
  const braid_status_t code = Guard("braid_work_test", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto w, Find<WorkImpl>(work, "work"));
    RETURN_IF_ERROR(CheckNotNull(done, "done"));
    running = !w->work->Done();
    *done = running ? 0 : 1;
    return running ? absl::OkStatus() : w->work->status();
  });
  return running ? BRAID_IN_PROGRESS : code;
}

braid_status_t braid_work_device_event(braid_work_t* work, void** event) {
  return Guard("braid_work_device_event", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto w, Find<WorkImpl>(work, "work"));
    RETURN_IF_ERROR(CheckNotNull(event, "event"));
    *event = w->work->device_event().handle;
    return absl::OkStatus();
  });
}

braid_status_t braid_work_destroy(braid_work_t* work) {
  return Guard("braid_work_destroy",
               [&] { return braid::capi::Destroy(work, Tag::kWork, "work"); });
}

}  // extern "C"
