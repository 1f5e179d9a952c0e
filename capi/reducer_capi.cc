// C API: the gradient reducer.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/convert.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "capi/limits.h"
#include "comm/status_macros.h"

using braid::capi::CheckNotNull;
using braid::capi::Find;
using braid::capi::GroupImpl;
using braid::capi::Guard;
using braid::capi::ReducerImpl;
using braid::capi::Tag;

namespace braid::capi {
namespace {

absl::StatusOr<std::vector<sched::ParamSpec>> ToSpecs(const braid_param_t* params, size_t n,
                                                      Device device, const int* units,
                                                      const int* marks) {
  if (params == nullptr && n > 0) {
    return absl::InvalidArgumentError(absl::StrCat("argument 'params' is NULL with n = ", n));
  }
  std::vector<sched::ParamSpec> specs(n);
  size_t total_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const braid_param_t& p = params[i];
    specs[i].id = p.id;
    specs[i].count = p.count;
    specs[i].name = p.name != nullptr ? p.name : "";
    specs[i].device = device;
    const std::string what = absl::StrCat("params[", i, "] (", specs[i].Label(), "): dtype");
    ASSIGN_OR_RETURN(specs[i].dtype, ToDType(RawEnum(p.dtype), what.c_str()));
    RETURN_IF_ERROR(AddParamBytes(p.count, specs[i].dtype,
                                  absl::StrCat("params[", i, "].count (", specs[i].Label(), ")"),
                                  &total_bytes));
    if (units != nullptr) {
      if (units[i] < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "opts->param_units[", i, "] (", specs[i].Label(), ") must be >= 0, got ", units[i]));
      }
      specs[i].unit = units[i];
    }
    if (marks != nullptr) specs[i].marks = marks[i];  // checked (named) by the reducer
  }
  return specs;
}

absl::StatusOr<sched::ReducerConfig> ToConfig(const braid_reducer_options_t& o) {
  sched::ReducerConfig c;
  switch (RawEnum(o.mode)) {
    case BRAID_MODE_ALLREDUCE:
      c.mode = sched::ReduceMode::kAllReduce;
      break;
    case BRAID_MODE_REDUCE_SCATTER:
      c.mode = sched::ReduceMode::kReduceScatter;
      break;
    case BRAID_MODE_HYBRID:
      c.mode = sched::ReduceMode::kHybrid;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("opts->mode ", RawEnum(o.mode), " is not a braid_reduce_mode_t"));
  }
  if (o.reduce_dtype == BRAID_DTYPE_F32) {
    c.reduce_dtype = DType::kF32;
  } else if (o.reduce_dtype == BRAID_DTYPE_F16) {
    c.reduce_dtype = DType::kF16;
  } else if (o.reduce_dtype != BRAID_REDUCE_DTYPE_NATIVE && o.reduce_dtype != BRAID_DTYPE_BF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "opts->reduce_dtype must be BRAID_REDUCE_DTYPE_NATIVE or BRAID_DTYPE_F32, got ",
        o.reduce_dtype));
  }
  for (const auto& [flag, name] : {std::pair<int, const char*>{o.allow_unused, "allow_unused"},
                                   {o.gradient_as_bucket_view, "gradient_as_bucket_view"},
                                   {o.priorities, "priorities"}}) {
    if (flag != 0 && flag != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("opts->", name, " must be 0 or 1, got ", flag));
    }
  }
  RETURN_IF_ERROR(CheckTimeoutMs(o.timeout_ms, "opts->timeout_ms"));
  if (o.shard_gradients != 0 && o.shard_gradients != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("opts->shard_gradients must be 0 or 1, got ", o.shard_gradients));
  }
  if (o.shard_gradients == 1 && c.mode == sched::ReduceMode::kAllReduce) {
    return absl::InvalidArgumentError(
        "opts->shard_gradients needs BRAID_MODE_REDUCE_SCATTER or BRAID_MODE_HYBRID (all-reduce "
        "mode keeps every full gradient)");
  }
  if (o.agree_unused < BRAID_UNUSED_NONE || o.agree_unused > BRAID_UNUSED_DECLARED_AT_FINISH) {
    return absl::InvalidArgumentError(
        absl::StrCat("opts->agree_unused must be BRAID_UNUSED_NONE, _AT_FINISH, _DECLARED or "
                     "_DECLARED_AT_FINISH, got ",
                     o.agree_unused));
  }
  if (o.static_graph != 0 && o.static_graph != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("opts->static_graph must be 0 or 1, got ", o.static_graph));
  }
  c.agree_unused = static_cast<sched::UnusedAgreement>(o.agree_unused);  // same numbering
  c.static_graph = o.static_graph == 1;
  if (o.device < BRAID_DEVICE_HOST) {
    return absl::InvalidArgumentError(absl::StrCat(
        "opts->device must be BRAID_DEVICE_HOST (-1) or a CUDA device index >= 0, got ", o.device));
  }
  c.bucket_cap_bytes = o.bucket_cap_bytes;
  c.first_bucket_cap_bytes = o.first_bucket_cap_bytes;
  c.allow_unused = o.allow_unused != 0;
  c.gradient_as_bucket_view = o.gradient_as_bucket_view != 0;
  c.shard_gradients = o.shard_gradients == 1;
  // braid_reducer_rebuild_buckets needs the first synced backward's order (n ints).
  c.rebuild_bucket_order = !c.shard_gradients;
  c.timeout = absl::Milliseconds(o.timeout_ms);
  if (o.pool_limit_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "opts->pool_limit_bytes must be 0 (no limit) or positive, got ", o.pool_limit_bytes));
  }
  c.pool_limit_bytes = o.pool_limit_bytes;
  return c;
}

absl::Status NoOptimizer(braid_reducer_t* reducer, const char* instead) {
  if (HandleRegistry::Get().Children(reducer, Tag::kOptimizer) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("an optimizer was built on this reducer and owns its backward: call ", instead));
}

}  // namespace
}  // namespace braid::capi

extern "C" {

void braid_reducer_options_init(braid_reducer_options_t* opts) {
  if (opts == nullptr) return;
  const braid::sched::ReducerConfig d;
  *opts = braid_reducer_options_t{};
  opts->struct_size = sizeof(*opts);
  opts->mode = BRAID_MODE_ALLREDUCE;
  opts->reduce_dtype = BRAID_REDUCE_DTYPE_NATIVE;
  opts->bucket_cap_bytes = d.bucket_cap_bytes;
  opts->first_bucket_cap_bytes = d.first_bucket_cap_bytes;
  opts->allow_unused = d.allow_unused ? 1 : 0;
  opts->gradient_as_bucket_view = d.gradient_as_bucket_view ? 1 : 0;
  opts->timeout_ms = absl::ToInt64Milliseconds(d.timeout);
  opts->device = BRAID_DEVICE_HOST;
}

braid_status_t braid_reducer_create(braid_group_t* shard, braid_group_t* replica,
                                    const braid_param_t* params, size_t n,
                                    const braid_reducer_options_t* opts, braid_reducer_t** out) {
  return Guard("braid_reducer_create", [&]() -> absl::Status {
    auto impl = std::make_shared<ReducerImpl>();
    ASSIGN_OR_RETURN(impl->shard, Find<GroupImpl>(shard, "shard"));
    if (replica != nullptr) {
      ASSIGN_OR_RETURN(impl->replica, Find<GroupImpl>(replica, "replica"));
      if (impl->replica->world != impl->shard->world) {
        return absl::InvalidArgumentError(
            "argument 'replica' belongs to a different world than 'shard' (a handle from "
            "another world)");
      }
      if (replica == shard) {
        return absl::InvalidArgumentError("'replica' and 'shard' are the same group");
      }
    }
    RETURN_IF_ERROR(CheckNotNull(out, "out"));
    braid_reducer_options_t o;
    braid_reducer_options_init(&o);
    // 0.5's struct ended after timeline_prefix, 0.6's after device, 0.7's after shard_gradients,
    // 0.10's after priorities, an earlier 0.11's after param_marks.
    RETURN_IF_ERROR(braid::capi::ReadVersionedOptions(
        opts,
        {offsetof(braid_reducer_options_t, device), offsetof(braid_reducer_options_t, param_units),
         offsetof(braid_reducer_options_t, credit_bytes),
         offsetof(braid_reducer_options_t, agree_unused),
         offsetof(braid_reducer_options_t, pool_limit_bytes)},
        "braid_reducer_options_t", &o));
    ASSIGN_OR_RETURN(braid::sched::ReducerConfig config, braid::capi::ToConfig(o));
    if (replica != nullptr && config.mode != braid::sched::ReduceMode::kHybrid) {
      return absl::InvalidArgumentError(
          "a 'replica' group is used by BRAID_MODE_HYBRID only: pass NULL in this mode");
    }
    const braid::Device device =
        o.device == BRAID_DEVICE_HOST ? braid::Device::Cpu() : braid::Device::Cuda(o.device);
    ASSIGN_OR_RETURN(auto specs,
                     braid::capi::ToSpecs(params, n, device, o.param_units, o.param_marks));
    braid::optim::StackOptions so;
    so.reducer = config;
    if (o.timeline_prefix != nullptr) so.timeline_prefix = o.timeline_prefix;
    so.timeline_rank = impl->shard->world_rank;
    so.launch_scheduler = o.credit_bytes > 0 || o.priorities != 0;  // 0.9
    so.scheduler.credit_bytes = o.credit_bytes;
    so.scheduler.priorities = o.priorities != 0;
    braid::sched::ReducerGroups groups{impl->shard->group.get(),
                                       impl->replica ? impl->replica->group.get() : nullptr};
    {
      braid::capi::GroupLocks locks(*impl);  // Create is collective over the groups
      ASSIGN_OR_RETURN(impl->stack,
                       braid::optim::TrainingStack::Create(std::move(specs), groups, so));
    }
    ASSIGN_OR_RETURN(*out, braid::capi::Register(std::move(impl), {shard, replica}));
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_grad(braid_reducer_t* reducer, int64_t id, void** data,
                                  size_t* count) {
  return Guard("braid_reducer_grad", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(data, "data"));
    RETURN_IF_ERROR(CheckNotNull(count, "count"));
    ASSIGN_OR_RETURN(braid::TensorView v, r->stack->reducer().GradView(id));
    *data = v.data;
    *count = v.count;
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_set_grad_buffer(braid_reducer_t* reducer, int64_t id, void* grad) {
  return Guard("braid_reducer_set_grad_buffer", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    return r->stack->reducer().SetGradBuffer(id, grad);
  });
}

braid_status_t braid_reducer_begin_backward(braid_reducer_t* reducer, braid_sync_mode_t mode) {
  return Guard("braid_reducer_begin_backward", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    ASSIGN_OR_RETURN(auto m, braid::capi::ToSyncMode(braid::capi::RawEnum(mode)));
    RETURN_IF_ERROR(braid::capi::NoOptimizer(reducer, "braid_optimizer_begin_backward"));
    return r->stack->BeginBackward(m);
  });
}

braid_status_t braid_reducer_mark_ready(braid_reducer_t* reducer, int64_t id, void* device_event) {
  return Guard("braid_reducer_mark_ready", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    return r->stack->reducer().MarkReady(id, braid::DeviceEvent{device_event});
  });
}

braid_status_t braid_reducer_mark_ready_grad(braid_reducer_t* reducer, int64_t id, const void* grad,
                                             void* device_event) {
  return Guard("braid_reducer_mark_ready_grad", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(grad, "grad"));
    return r->stack->reducer().MarkReady(id, braid::DeviceEvent{device_event}, grad);
  });
}

braid_status_t braid_reducer_grad_slot(braid_reducer_t* reducer, int64_t id, void** data,
                                       size_t* count) {
  return Guard("braid_reducer_grad_slot", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(data, "data"));
    RETURN_IF_ERROR(CheckNotNull(count, "count"));
    ASSIGN_OR_RETURN(braid::TensorView v, r->stack->reducer().GradSlot(id));
    *data = v.data;
    *count = v.count;
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_finish_backward(braid_reducer_t* reducer) {
  return Guard("braid_reducer_finish_backward", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(braid::capi::NoOptimizer(reducer, "braid_optimizer_finish_backward"));
    return r->stack->FinishBackward();
  });
}

braid_status_t braid_reducer_zero_grads(braid_reducer_t* reducer) {
  return Guard("braid_reducer_zero_grads", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(braid::capi::NoOptimizer(reducer, "nothing: the optimizer zeroes gradients"));
    return r->stack->ZeroGrads();
  });
}

braid_status_t braid_reducer_num_buckets(braid_reducer_t* reducer, int* count) {
  return Guard("braid_reducer_num_buckets", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(count, "count"));
    *count = static_cast<int>(r->stack->reducer().plan().buckets().size());
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_wait_bucket(braid_reducer_t* reducer, int bucket, int64_t timeout_ms) {
  return Guard("braid_reducer_wait_bucket", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    // "No limit" is ten years, as braid_work_wait's.
    const absl::Duration timeout =
        timeout_ms < 0 ? absl::Hours(24 * 365 * 10) : absl::Milliseconds(timeout_ms);
    return r->stack->reducer().WaitBucket(bucket, absl::Now() + timeout);
  });
}

braid_status_t braid_reducer_rebuild_buckets(braid_reducer_t* reducer, int* rebuilt) {
  return Guard("braid_reducer_rebuild_buckets", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(rebuilt, "rebuilt"));
    *rebuilt = 0;
    braid::capi::GroupLocks locks(*r);  // collective on the reducer's groups
    ASSIGN_OR_RETURN(bool done, r->stack->RebuildBuckets());
    *rebuilt = done ? 1 : 0;
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_param_bucket(braid_reducer_t* reducer, int64_t id, int* bucket) {
  return Guard("braid_reducer_param_bucket", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(bucket, "bucket"));
    const braid::sched::BucketPlan& plan = r->stack->reducer().plan();
    ASSIGN_OR_RETURN(int index, plan.IndexOf(id));
    *bucket = plan.slot(index).bucket;
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_shard(braid_reducer_t* reducer, int bucket, void** data,
                                   size_t* count) {
  return Guard("braid_reducer_shard", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(data, "data"));
    RETURN_IF_ERROR(CheckNotNull(count, "count"));
    const int n = static_cast<int>(r->stack->reducer().plan().buckets().size());
    if (bucket < 0 || bucket >= n) {
      return absl::OutOfRangeError(
          absl::StrCat("bucket ", bucket, " is outside [0, ", n, ") (the reducer's buckets)"));
    }
    const braid::TensorView v = r->stack->reducer().ShardView(bucket);
    *data = v.data;
    *count = v.count;
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_grad_shard(braid_reducer_t* reducer, int64_t id, void** data,
                                        size_t* count, size_t* offset) {
  return Guard("braid_reducer_grad_shard", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(data, "data"));
    RETURN_IF_ERROR(CheckNotNull(count, "count"));
    RETURN_IF_ERROR(CheckNotNull(offset, "offset"));
    if (r->stack->reducer().mode() == braid::sched::ReduceMode::kAllReduce) {
      return absl::FailedPreconditionError(
          "braid_reducer_grad_shard: an all-reduce reducer keeps no gradient shards");
    }
    ASSIGN_OR_RETURN(auto piece, r->stack->GradShardPiece(id));
    *data = piece.data;
    *count = piece.count;
    *offset = piece.offset;
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_grad_stream(braid_reducer_t* reducer, void** stream) {
  return Guard("braid_reducer_grad_stream", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(stream, "stream"));
    // MarkReady(id, ready, grad) reads the gradient on the shard group's BufferOps stream.
    *stream = r->stack->reducer().groups().shard->buffer_ops().stream().handle;
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_destroy(braid_reducer_t* reducer) {
  return Guard("braid_reducer_destroy",
               [&] { return braid::capi::Destroy(reducer, Tag::kReducer, "reducer"); });
}

braid_status_t braid_reducer_unit_buckets(braid_reducer_t* reducer, int unit, int* buckets,
                                          int capacity, int* count) {
  return Guard("braid_reducer_unit_buckets", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(count, "count"));
    if (unit < 0) return absl::InvalidArgumentError(absl::StrCat("unit must be >= 0, got ", unit));
    const std::vector<int> mine = r->stack->reducer().plan().UnitBuckets(unit);
    *count = static_cast<int>(mine.size());
    if (buckets == nullptr) return absl::OkStatus();
    if (capacity < *count) {
      return absl::OutOfRangeError(
          absl::StrCat("unit ", unit, " has ", *count, " buckets; capacity is ", capacity));
    }
    std::copy(mine.begin(), mine.end(), buckets);
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_num_units(braid_reducer_t* reducer, int* units) {
  return Guard("braid_reducer_num_units", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(units, "units"));
    *units = r->stack->reducer().plan().num_units();
    return absl::OkStatus();
  });
}

braid_status_t braid_memory_stats(braid_reducer_t* reducer, braid_memory_stats_t* out) {
  return Guard("braid_memory_stats", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(out, "out"));
    if (out->struct_size < offsetof(braid_memory_stats_t, device)) {
      return absl::InvalidArgumentError(
          absl::StrCat("out->struct_size ", out->struct_size,
                       " is too small (set it to sizeof(braid_memory_stats_t), ",
                       sizeof(braid_memory_stats_t), ")"));
    }
    const braid::sched::MemorySnapshot s = r->stack->memory().Snapshot();
    braid_memory_stats_t m;
    std::memset(&m, 0, sizeof m);
    m.struct_size = std::min(out->struct_size, sizeof m);
    m.host = {s.host.current, s.host.peak};
    m.device = {s.device.current, s.device.peak};
    static_assert(BRAID_MEMORY_USES == braid::sched::kMemoryUses,
                  "braid_memory_use_t mirrors MemoryUse");
    for (int u = 0; u < BRAID_MEMORY_USES; ++u)
      m.by_use[u] = {s.by_use[u].current, s.by_use[u].peak};
    m.allocations = s.allocations;
    std::memcpy(out, &m, m.struct_size);
    return absl::OkStatus();
  });
}

braid_status_t braid_memory_reset_peaks(braid_reducer_t* reducer) {
  return Guard("braid_memory_reset_peaks", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    r->stack->memory().ResetPeaks();
    return absl::OkStatus();
  });
}

}  // extern "C"
