// C API: the sharded optimizer: the parameter side of its reducer's training stack
// (optim/training_stack.h), with the gather group, gatherer and units it needs.
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/convert.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "capi/limits.h"
#include "capi/optimizer_create.h"
#include "comm/status_macros.h"
#include "optim/cuda_step_kernels.h"

using braid::capi::CheckNotNull;
using braid::capi::Find;
using braid::capi::Guard;
using braid::capi::OptimizerImpl;
using braid::capi::ReducerImpl;
using braid::capi::Tag;

namespace braid::capi {
namespace {

absl::Status CheckFlag(int v, const char* name) {
  if (v == 0 || v == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("opts->", name, " must be 0 or 1, got ", v));
}

absl::StatusOr<optim::OptimizerConfig> ToConfig(const braid_optimizer_options_t& o) {
  optim::OptimizerConfig c;
  switch (RawEnum(o.kind)) {
    case BRAID_OPTIMIZER_ADAMW:
      c.kind = optim::OptimizerKind::kAdamW;
      break;
    case BRAID_OPTIMIZER_SGD:
      c.kind = optim::OptimizerKind::kSgd;
      break;
    case BRAID_OPTIMIZER_NONE:  // gather only: braid_optimizer_create installs no optimizer
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("opts->kind ", RawEnum(o.kind), " is not a braid_optimizer_kind_t"));
  }
  RETURN_IF_ERROR(CheckFlag(o.nesterov, "nesterov"));
  RETURN_IF_ERROR(CheckFlag(o.skip_nonfinite, "skip_nonfinite"));
  RETURN_IF_ERROR(CheckFlag(o.overlap, "overlap"));
  RETURN_IF_ERROR(CheckFlag(o.fully_sharded, "fully_sharded"));
  RETURN_IF_ERROR(CheckFlag(o.reshard_after_forward, "reshard_after_forward"));
  RETURN_IF_ERROR(CheckFlag(o.offload, "offload"));
  RETURN_IF_ERROR(CheckFlag(o.track_grad_norm, "track_grad_norm"));  // 0.10
  if (o.prefetch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("opts->prefetch must be >= 0, got ", o.prefetch));
  }
  if (o.max_live_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("opts->max_live_bytes must be >= 0, got ", o.max_live_bytes));
  }
  RETURN_IF_ERROR(CheckTimeoutMs(o.timeout_ms, "opts->timeout_ms"));
  optim::GroupHyper h;
  h.adamw = optim::AdamWHyper{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  h.sgd = optim::SgdHyper{o.lr, o.momentum, o.weight_decay, o.nesterov != 0};
  if (RawEnum(o.kind) != BRAID_OPTIMIZER_NONE) {  // gather only: hyper-parameters are ignored
    RETURN_IF_ERROR(CheckHyperFinite(h, c.kind, "opts->"));
  }
  if (std::isnan(o.max_grad_norm)) {
    return absl::InvalidArgumentError("opts->max_grad_norm is NaN (> 0 clips, <= 0 is off)");
  }
  if (o.num_groups < 1 || o.num_groups > kMaxParamGroups) {
    return absl::InvalidArgumentError(
        absl::StrCat("opts->num_groups must be in [1, ", kMaxParamGroups, "], got ", o.num_groups));
  }
  if (o.threads < 1 || o.threads > kMaxOptimizerThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("opts->threads must be in [1, ", kMaxOptimizerThreads, "], got ", o.threads));
  }
  c.groups.assign(static_cast<size_t>(o.num_groups), h);
  c.overlap = o.overlap != 0;
  c.max_grad_norm = o.max_grad_norm;
  c.skip_nonfinite = o.skip_nonfinite != 0;
  c.track_grad_norm = o.track_grad_norm != 0;  // 0.10
  c.threads = o.threads;
  c.timeout = absl::Milliseconds(o.timeout_ms);
  return c;
}

// 0.11's gather_dtype / gather_block.
absl::StatusOr<sched::GatherQuant> ToGatherQuant(const braid_optimizer_options_t& o) {
  sched::GatherQuant q;
  switch (RawEnum(o.gather_dtype)) {
    case BRAID_GATHER_EXACT:
      return q;
    case BRAID_GATHER_INT8:
      q.dtype = sched::GatherDType::kInt8;
      break;
    case BRAID_GATHER_FP8_E4M3:
      q.dtype = sched::GatherDType::kFp8E4M3;
      break;
    case BRAID_GATHER_BF16:
      q.dtype = sched::GatherDType::kBF16;
      break;
    case BRAID_GATHER_F16:
      q.dtype = sched::GatherDType::kF16;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "opts->gather_dtype is ", RawEnum(o.gather_dtype),
          "; BRAID_GATHER_EXACT, BRAID_GATHER_INT8, BRAID_GATHER_FP8_E4M3, BRAID_GATHER_BF16 or "
          "BRAID_GATHER_F16"));
  }
  if (o.fully_sharded != 1) {
    return absl::InvalidArgumentError(
        "opts->gather_dtype (quantized gathers) needs opts->fully_sharded = 1: without it the "
        "gathered buffer is where the optimizer steps the master weights");
  }
  if (o.gather_block < 1 || o.gather_block > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("opts->gather_block must be in [1, 2^30], got ", o.gather_block));
  }
  q.block = static_cast<int>(o.gather_block);
  return q;
}

}  // namespace

absl::StatusOr<optim::ParamOptions> ToParamOptions(optim::TrainingStack& stack,
                                                   const braid_optimizer_options_t* opts,
                                                   optim::OptimizerKind* kind) {
  braid_optimizer_options_t o;
  braid_optimizer_options_init(&o);
  // 0.5 and 0.6's struct ended after timeout_ms, 0.7's after gather_stream, 0.8's after
  // param_groups, 0.10's after track_grad_norm (gather_block is 8-aligned: 0.10's sizeof).
  RETURN_IF_ERROR(ReadVersionedOptions(opts,
                                       {offsetof(braid_optimizer_options_t, fully_sharded),
                                        offsetof(braid_optimizer_options_t, num_groups),
                                        offsetof(braid_optimizer_options_t, track_grad_norm),
                                        offsetof(braid_optimizer_options_t, gather_block)},
                                       "braid_optimizer_options_t", &o));
  ASSIGN_OR_RETURN(optim::OptimizerConfig config, ToConfig(o));
  *kind = config.kind;
  if (o.param_groups != nullptr) {
    const auto& params = stack.reducer().plan().params();  // registration order
    for (size_t i = 0; i < params.size(); ++i) {
      const int g = o.param_groups[i];
      if (g < 0 || g >= o.num_groups) {
        return absl::InvalidArgumentError(absl::StrCat("opts->param_groups[", i, "] (",
                                                       params[i].Label(), ") is ", g,
                                                       "; num_groups is ", o.num_groups));
      }
      if (g != 0) config.group_of[params[i].id] = g;
    }
  }
  // Device parameters: the fused CUDA kernels, queued on the shard group's comm stream.
  if (stack.on_device()) config.device_kernels = optim::CudaStepKernels();
  config.offload = o.offload == 1;
  if (!stack.on_device() && (o.offload == 1 || o.gather_stream != nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("opts->", o.offload == 1 ? "offload" : "gather_stream",
                     " is for device reducers (this reducer's parameters are in host memory)"));
  }
  const bool none = RawEnum(o.kind) == BRAID_OPTIMIZER_NONE;
  if (none && o.fully_sharded != 1) {
    return absl::InvalidArgumentError(
        "opts->kind BRAID_OPTIMIZER_NONE (gather only) needs opts->fully_sharded = 1 (without "
        "units nothing would gather the framework's updated shards)");
  }
  optim::ParamOptions po;
  if (!none) po.optimizer = config;
  po.fully_sharded = o.fully_sharded == 1;
  po.timeout = config.timeout;
  po.gather_stream = braid::DeviceStream{o.gather_stream};
  po.units.timeout = config.timeout;
  po.units.prefetch = o.prefetch;
  po.units.reshard_after_forward = o.reshard_after_forward == 1;
  po.units.max_live_bytes = static_cast<size_t>(o.max_live_bytes);
  ASSIGN_OR_RETURN(po.gather_quant, ToGatherQuant(o));  // 0.11
  return po;
}

}  // namespace braid::capi

extern "C" {

void braid_optimizer_options_init(braid_optimizer_options_t* opts) {
  if (opts == nullptr) return;
  const braid::optim::AdamWHyper a;
  const braid::optim::SgdHyper s;
  const braid::optim::OptimizerConfig c;
  *opts = braid_optimizer_options_t{};
  opts->struct_size = sizeof(*opts);
  opts->kind = BRAID_OPTIMIZER_ADAMW;
  opts->threads = c.threads;
  opts->lr = a.lr;
  opts->beta1 = a.beta1;
  opts->beta2 = a.beta2;
  opts->eps = a.eps;
  opts->weight_decay = a.weight_decay;
  opts->momentum = s.momentum;
  opts->nesterov = s.nesterov ? 1 : 0;
  opts->skip_nonfinite = c.skip_nonfinite ? 1 : 0;
  opts->max_grad_norm = c.max_grad_norm;
  opts->overlap = c.overlap ? 1 : 0;
  opts->timeout_ms = absl::ToInt64Milliseconds(c.timeout);
  opts->fully_sharded = 0;
  opts->reshard_after_forward = 1;
  opts->prefetch = 1;
  opts->max_live_bytes = 0;
  opts->offload = 0;
  opts->gather_stream = nullptr;
  opts->num_groups = 1;
  opts->param_groups = nullptr;
  opts->track_grad_norm = 0;                               // 0.10
  opts->gather_block = braid::sched::GatherQuant{}.block;  // 0.11
  opts->gather_dtype = BRAID_GATHER_EXACT;
}

braid_status_t braid_optimizer_create(braid_reducer_t* reducer,
                                      const braid_optimizer_options_t* opts,
                                      braid_optimizer_t** out) {
  return Guard("braid_optimizer_create", [&]() -> absl::Status {
    auto impl = std::make_shared<OptimizerImpl>();
    ASSIGN_OR_RETURN(impl->reducer, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(out, "out"));
    if (braid::capi::HandleRegistry::Get().Children(reducer, Tag::kOptimizer) > 0) {
      return absl::FailedPreconditionError("this reducer already has an optimizer");
    }
    braid::optim::TrainingStack& stack = impl->stack();
    if (stack.in_backward()) {
      return absl::FailedPreconditionError("the reducer is inside a backward (finish it first)");
    }
    if (stack.reducer().mode() == braid::sched::ReduceMode::kAllReduce) {
      return absl::InvalidArgumentError(
          "the reducer is in all-reduce mode; the sharded optimizer needs reduce-scatter or "
          "hybrid mode (each rank steps only its shard)");
    }
    ASSIGN_OR_RETURN(braid::optim::ParamOptions po,
                     braid::capi::ToParamOptions(stack, opts, &impl->kind));
    {
      braid::capi::GroupLocks locks(*impl->reducer);  // collective over the shard group
      RETURN_IF_ERROR(stack.AddParamSide(po));
    }
    impl->attached = true;
    ASSIGN_OR_RETURN(*out, braid::capi::Register(std::move(impl), {reducer}));
    return absl::OkStatus();
  });
}

braid_status_t braid_optimizer_set_param(braid_optimizer_t* opt, int64_t id, const void* values) {
  return Guard("braid_optimizer_set_param", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    RETURN_IF_ERROR(CheckNotNull(values, "values"));
    return o->opt().SetParam(id, values);
  });
}

braid_status_t braid_optimizer_param(braid_optimizer_t* opt, int64_t id, void** data,
                                     size_t* count) {
  return Guard("braid_optimizer_param", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindParamSide(opt));
    RETURN_IF_ERROR(CheckNotNull(data, "data"));
    RETURN_IF_ERROR(CheckNotNull(count, "count"));
    ASSIGN_OR_RETURN(braid::TensorView v, o->stack().gatherer()->ParamView(id));
    *data = v.data;
    *count = v.count;
    return absl::OkStatus();
  });
}

braid_status_t braid_optimizer_begin_backward(braid_optimizer_t* opt, braid_sync_mode_t mode) {
  return Guard("braid_optimizer_begin_backward", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindParamSide(opt));
    ASSIGN_OR_RETURN(auto m, braid::capi::ToSyncMode(braid::capi::RawEnum(mode)));
    return o->stack().BeginBackward(m);
  });
}

braid_status_t braid_optimizer_finish_backward(braid_optimizer_t* opt) {
  return Guard("braid_optimizer_finish_backward", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindParamSide(opt));
    return o->stack().FinishBackward();
  });
}

braid_status_t braid_optimizer_step(braid_optimizer_t* opt) {
  return Guard("braid_optimizer_step", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    return o->opt().Step();
  });
}

braid_status_t braid_optimizer_wait_params(braid_optimizer_t* opt, int bucket) {
  return Guard("braid_optimizer_wait_params", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    return o->opt().WaitParams(bucket);
  });
}

braid_status_t braid_optimizer_wait_all_params(braid_optimizer_t* opt) {
  return Guard("braid_optimizer_wait_all_params", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    return o->opt().WaitAllParams();
  });
}

braid_status_t braid_optimizer_set_lr(braid_optimizer_t* opt, double lr) {
  return Guard("braid_optimizer_set_lr", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    braid::optim::GroupHyper h = o->opt().hyper(0);
    h.adamw.lr = lr;
    h.sgd.lr = lr;
    RETURN_IF_ERROR(braid::capi::CheckHyperFinite(h, o->kind, ""));
    return o->opt().SetHyper(0, h);  // InvalidArgument "... lr must be >= 0"
  });
}

braid_status_t braid_optimizer_set_hyper(braid_optimizer_t* opt, int group,
                                         const braid_optimizer_hyper_t* hyper) {
  return Guard("braid_optimizer_set_hyper", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    RETURN_IF_ERROR(CheckNotNull(hyper, "hyper"));
    braid_optimizer_hyper_t in{};
    RETURN_IF_ERROR(braid::capi::ReadOptions(hyper, "braid_optimizer_hyper_t", &in));
    if (in.nesterov != 0 && in.nesterov != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("hyper->nesterov must be 0 or 1, got ", in.nesterov));
    }
    braid::optim::GroupHyper h;
    h.adamw = braid::optim::AdamWHyper{in.lr, in.beta1, in.beta2, in.eps, in.weight_decay};
    h.sgd = braid::optim::SgdHyper{in.lr, in.momentum, in.weight_decay, in.nesterov != 0};
    RETURN_IF_ERROR(braid::capi::CheckHyperFinite(h, o->kind, "hyper->"));
    return o->opt().SetHyper(group, h);  // OutOfRange / InvalidArgument naming the group
  });
}

braid_status_t braid_optimizer_save(braid_optimizer_t* opt, const char* path) {
  return Guard("braid_optimizer_save", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    RETURN_IF_ERROR(CheckNotNull(path, "path"));
    return o->opt().Save(path);
  });
}

braid_status_t braid_optimizer_load(braid_optimizer_t* opt, const char* path) {
  return Guard("braid_optimizer_load", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    RETURN_IF_ERROR(CheckNotNull(path, "path"));
    return o->opt().Load(path);
  });
}

braid_status_t braid_optimizer_last_step(braid_optimizer_t* opt, int64_t* rounds, int* skipped,
                                         double* grad_norm) {
  return Guard("braid_optimizer_last_step", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    const braid::optim::StepReport r = o->opt().last_step();
    if (rounds != nullptr) *rounds = r.rounds;
    if (skipped != nullptr) *skipped = r.skipped ? 1 : 0;
    if (grad_norm != nullptr) *grad_norm = r.grad_norm;
    return absl::OkStatus();
  });
}

// ---- 0.10: parameters written by the framework ---------------------------------------------

braid_status_t braid_optimizer_adopt_param(braid_optimizer_t* opt, int64_t id) {
  return Guard("braid_optimizer_adopt_param", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    return o->opt().AdoptParam(id);
  });
}

braid_status_t braid_optimizer_gather_event(braid_optimizer_t* opt, int bucket, void** event) {
  return Guard("braid_optimizer_gather_event", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindParamSide(opt));
    RETURN_IF_ERROR(CheckNotNull(event, "event"));
    if (bucket < 0 || bucket >= o->stack().gatherer()->num_buckets()) {
      return absl::OutOfRangeError(absl::StrCat("bucket ", bucket, " is outside [0, ",
                                                o->stack().gatherer()->num_buckets(), ")"));
    }
    braid::WorkPtr w = o->stack().gatherer()->GatherWork(bucket);
    *event = w != nullptr ? w->device_event().handle : nullptr;
    return absl::OkStatus();
  });
}

braid_status_t braid_optimizer_param_shard(braid_optimizer_t* opt, int64_t id, void** data,
                                           size_t* count, size_t* offset) {
  return Guard("braid_optimizer_param_shard", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindParamSide(opt));
    RETURN_IF_ERROR(CheckNotNull(data, "data"));
    RETURN_IF_ERROR(CheckNotNull(count, "count"));
    RETURN_IF_ERROR(CheckNotNull(offset, "offset"));
    ASSIGN_OR_RETURN(auto piece, o->stack().ParamShardPiece(id));
    *data = piece.data;
    *count = piece.count;
    *offset = piece.offset;
    return absl::OkStatus();
  });
}

braid_status_t braid_optimizer_destroy(braid_optimizer_t* opt) {
  return Guard("braid_optimizer_destroy",
               [&] { return braid::capi::Destroy(opt, Tag::kOptimizer, "opt"); });
}

}  // extern "C"
