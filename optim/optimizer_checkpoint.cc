#include "optim/optimizer_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/host_values.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"
#include "optim/checkpoint_layout.h"

namespace braid::optim {
namespace {

constexpr const char* kAdamWNames[] = {"lr", "beta1", "beta2", "eps", "weight_decay"};
constexpr const char* kSgdNames[] = {"lr", "momentum", "weight_decay", "nesterov"};

std::vector<double> HyperValues(const GroupHyper& h, OptimizerKind kind) {
  if (kind == OptimizerKind::kAdamW) {
    const AdamWHyper& a = h.adamw;
    return {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay};
  }
  const SgdHyper& s = h.sgd;
  return {s.lr, s.momentum, s.weight_decay, s.nesterov ? 1.0 : 0.0};
}

GroupHyper HyperFrom(const std::vector<double>& v, OptimizerKind kind, GroupHyper h) {
  if (kind == OptimizerKind::kAdamW) {
    h.adamw = AdamWHyper{v[0], v[1], v[2], v[3], v[4]};
  } else {
    h.sgd = SgdHyper{v[0], v[1], v[2], v[3] != 0};
  }
  return h;
}

std::string HyperName(size_t g, size_t k, OptimizerKind kind) {
  return absl::StrCat("g", g, "/", kind == OptimizerKind::kAdamW ? kAdamWNames[k] : kSgdNames[k]);
}

std::vector<std::string> StateNames(OptimizerKind kind) {
  return kind == OptimizerKind::kAdamW ? std::vector<std::string>{"master", "exp_avg", "exp_avg_sq"}
                                       : std::vector<std::string>{"master", "momentum"};
}

}  // namespace

StateHeader OptimizerIdentity(sched::GradientReducer& reducer, OptimizerKind kind) {
  const Group& shard = *reducer.groups().shard;
  const Group* replica = reducer.groups().replica;
  StateHeader h;
  h.kind = kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
  h.plan_fingerprint = reducer.plan().FingerprintOn(Device::Cpu());
  h.shard_group_size = shard.size();
  h.replica_group_size = replica != nullptr ? replica->size() : 1;
  h.world_size = h.shard_group_size * h.replica_group_size;
  h.rank = (replica != nullptr ? replica->rank() : 0) * shard.size() + shard.rank();
  return h;
}

StateHeader SavedHeader(StateHeader identity, int64_t rounds, const std::vector<GroupHyper>& groups,
                        OptimizerKind kind) {
  StateHeader h = std::move(identity);
  h.step = rounds;
  h.scalars.emplace_back("groups", static_cast<double>(groups.size()));
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<double> v = HyperValues(groups[g], kind);
    for (size_t k = 0; k < v.size(); ++k) h.scalars.emplace_back(HyperName(g, k, kind), v[k]);
  }
  return h;
}

Checkpoint EmptyCheckpoint(StateHeader header, const sched::BucketPlan& plan, OptimizerKind kind) {
  Checkpoint c{std::move(header), plan, {}, {}, {}};
  c.state_names = StateNames(kind);
  const auto& params = c.plan.params();
  c.values.assign(c.state_names.size(), std::vector<std::vector<float>>(params.size()));
  c.steps.assign(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    for (auto& v : c.values) v[i].resize(params[i].count);
  }
  return c;
}

absl::Status GatherShardState(const std::vector<OptimizerShard>& shards, Group& shard_group,
                              const ShardMemory& mem, absl::Time deadline, Checkpoint* c) {
  const auto& params = c->plan.params();
  const auto& buckets = c->plan.buckets();
  for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
    const std::vector<int>& in_bucket = buckets[b].params;
    for (size_t k = 0; k < in_bucket.size(); ++k) {  // torch's per-parameter count
      c->steps[in_bucket[k]] = shards[b].skips.StepsOf(static_cast<int>(k), shards[b].steps);
    }
  }
  std::vector<float> mine, full;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const OptimizerShard& s = shards[b];
    const FloatBuffer* state[] = {&s.master, &s.m, &s.v};
    full.resize(s.n * static_cast<size_t>(shard_group.size()));
    for (size_t k = 0; k < c->state_names.size(); ++k) {
      const float* src = state[k]->get();
      if (mem.on_device && !mem.offload) {  // device state: a host copy first
        mine.resize(s.n);
        RETURN_IF_ERROR(mem.ops->Copy(mine.data(), src, s.n * sizeof(float)));
        RETURN_IF_ERROR(mem.ops->Synchronize(deadline));
        src = mine.data();
      }
      // The bucket's full padded state: every shard rank's part, in rank order.
      const std::string what = absl::StrCat("optimizer state of ", s.label);
      RETURN_IF_ERROR(AllGatherHostValues(shard_group, src, full.data(), s.n, DType::kF32,
                                          what.c_str(), deadline));
      for (int i : buckets[b].params) {
        const size_t off = c->plan.slot(i).offset;
        std::memcpy(c->values[k][i].data(), full.data() + off, params[i].count * sizeof(float));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SaveShards(const std::string& path, const StateHeader& header,
                        const std::vector<OptimizerShard>& shards, const sched::BucketPlan& plan,
                        OptimizerKind kind, const ShardMemory& mem) {
  std::vector<int64_t> steps;
  std::vector<StateSection> sections;
  for (const OptimizerShard& s : shards) {
    if (s.skips.any()) {  // one count per bucket in the file: it would lose the skips
      return absl::FailedPreconditionError(absl::StrCat(
          "optimizer save(", path, "): ", s.label,
          " holds parameters whose steps were skipped (no rank used them), so their step counts "
          "differ; the per-rank file keeps one count per bucket: use the whole state "
          "(braid_optimizer_get_state, or state_dict() in Python) instead"));
    }
    steps.push_back(s.steps);
  }
  sections.push_back(StateSection{"bucket_steps", static_cast<int32_t>(DType::kI64), steps.size(),
                                  steps.data(), steps.size() * sizeof(int64_t)});
  const int32_t f32 = static_cast<int32_t>(DType::kF32);
  // Device: host copies of the f32 buffers (the host's are written in place).
  std::vector<std::vector<float>> staged;
  staged.reserve(shards.size() * 3);
  auto host_view = [&](const FloatBuffer& f, size_t n) -> absl::StatusOr<const float*> {
    if (!mem.on_device || mem.offload) return f.get();  // host state
    staged.emplace_back(n);
    RETURN_IF_ERROR(mem.ops->Copy(staged.back().data(), f.get(), n * sizeof(float)));
    return staged.back().data();
  };
  for (size_t b = 0; b < shards.size(); ++b) {
    const OptimizerShard& s = shards[b];
    const size_t bytes = s.n * sizeof(float);
    auto add = [&](const char* name, const FloatBuffer& f) -> absl::Status {
      ASSIGN_OR_RETURN(const float* data, host_view(f, s.n));
      sections.push_back(StateSection{absl::StrCat("bucket", b, "/", name), f32, s.n, data, bytes});
      return absl::OkStatus();
    };
    absl::Status st = add("master", s.master);
    if (st.ok() && kind == OptimizerKind::kAdamW) {
      st = add("exp_avg", s.m);
      if (st.ok()) st = add("exp_avg_sq", s.v);
    } else if (st.ok()) {
      st = add("momentum", s.m);
    }
    if (st.ok() && mem.on_device && b + 1 == shards.size())
      st = mem.ops->Synchronize(absl::Now() + mem.timeout);
    if (!st.ok()) {
      // Queued copies into `staged` must have run (or failed) before it goes away.
      if (mem.on_device) mem.ops->Synchronize(absl::Now() + mem.timeout).IgnoreError();
      return absl::Status(st.code(),
                          absl::StrCat("optimizer save(", path, "): copying the state of ", s.label,
                                       " to the host: ", st.message()));
    }
  }
  if (mem.on_device && shards.empty())
    RETURN_IF_ERROR(mem.ops->Synchronize(absl::Now() + mem.timeout));
  // The plan itself, so that the checkpoint can be re-sharded (optim/reshard.h).
  const LayoutSections layout(plan);
  for (const StateSection& l : layout.sections()) sections.push_back(l);
  return WriteStateFile(path, header, sections);
}

absl::Status ValidateState(absl::StatusOr<LoadedState> source, const std::string& path,
                           const StateHeader& identity, const sched::BucketPlan& plan,
                           const std::vector<GroupHyper>& groups, OptimizerKind kind,
                           const std::vector<OptimizerShard>& shards, ValidatedState* out) {
  out->hyper = groups;
  out->found.assign(shards.size(), {});
  LoadedState& file = out->file;
  ASSIGN_OR_RETURN(file, std::move(source));
  if (HasLayout(file)) {
    // Name the first parameter that differs, rather than only "another plan".
    ASSIGN_OR_RETURN(const sched::BucketPlan saved, ReadLayout(file));
    RETURN_IF_ERROR(CheckSameParams(saved.params(), plan.params(), path));
  }
  RETURN_IF_ERROR(CheckCompatible(file.header(), identity, path));
  ASSIGN_OR_RETURN(double n_groups, file.Scalar("groups"));
  if (n_groups != static_cast<double>(groups.size())) {
    return absl::FailedPreconditionError(absl::StrCat("state file ", path, " has ", n_groups,
                                                      " parameter groups, this optimizer has ",
                                                      groups.size()));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<double> v = HyperValues(groups[g], kind);
    for (size_t k = 0; k < v.size(); ++k) {
      ASSIGN_OR_RETURN(v[k], file.Scalar(HyperName(g, k, kind)));
    }
    out->hyper[g] = HyperFrom(v, kind, out->hyper[g]);
    absl::Status bad = CheckHyper(out->hyper[g], kind, static_cast<int>(g));
    if (!bad.ok())
      return absl::DataLossError(absl::StrCat("state file ", path, ": ", bad.message()));
  }
  ASSIGN_OR_RETURN(out->steps, file.Find("bucket_steps", DType::kI64, shards.size()));
  for (size_t b = 0; b < shards.size(); ++b) {
    if (static_cast<const int64_t*>(out->steps->data())[b] < 0) {
      return absl::DataLossError(
          absl::StrCat("state file ", path, ": negative step count for bucket ", b));
    }
  }
  for (size_t b = 0; b < shards.size(); ++b) {
    for (const std::string& name : StateNames(kind)) {
      ASSIGN_OR_RETURN(const LoadedSection* sec,
                       file.Find(absl::StrCat("bucket", b, "/", name), DType::kF32, shards[b].n));
      out->found[b].push_back(sec);
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyState(const ValidatedState& state, std::vector<OptimizerShard>& shards,
                        sched::ParamGatherer& gatherer, const sched::BucketPlan& plan,
                        OptimizerKind kind, const ShardMemory& mem, const std::string& path,
                        int* applied) {
  *applied = 0;
  const auto* step_values = static_cast<const int64_t*>(state.steps->data());
  const auto& found = state.found;
  if (mem.offload) {
    // The last step's copies out of the host parameter staging buffers may still be queued on
    // the stream (a step is published once they are queued); they must have read the buffers
    // before the loop below rewrites them. One host wait per Load.
    const absl::Status st = mem.ops->Synchronize(absl::Now() + mem.timeout);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("optimizer load(", path,
                                                  "): waiting for the last step's "
                                                  "copies to the device: ",
                                                  st.message(), " (no bucket state was loaded)"));
    }
  }
  for (size_t b = 0; b < shards.size(); ++b) {
    OptimizerShard& s = shards[b];
    const size_t bytes = s.n * sizeof(float);
    s.steps = step_values[b];
    s.skips.Reset();
    const sched::Bucket& bk = plan.buckets()[b];
    char* out = static_cast<char*>(gatherer.ShardView(static_cast<int>(b))->data);
    if (mem.offload) {
      // Host state; the model-dtype shard is rounded on the host and copied to the device.
      std::memcpy(s.master.get(), found[b][0]->data(), bytes);
      std::memcpy(s.m.get(), found[b][1]->data(), bytes);
      if (kind == OptimizerKind::kAdamW) std::memcpy(s.v.get(), found[b][2]->data(), bytes);
      char* staged = s.param_host.get();
      for (const Segment& seg : s.segments) {
        CastScale(s.master.get() + seg.lo, DType::kF32, staged + seg.lo * DTypeSize(bk.dtype),
                  bk.dtype, seg.hi - seg.lo, ScaleSpec{});
      }
      absl::Status st = mem.ops->Copy(out, staged, s.n * DTypeSize(bk.dtype));
      if (st.ok() && b + 1 == shards.size()) st = mem.ops->Synchronize(absl::Now() + mem.timeout);
      if (!st.ok()) {
        mem.ops->Synchronize(absl::Now() + mem.timeout).IgnoreError();
        return absl::Status(st.code(), absl::StrCat("optimizer load(", path, "): copying ", s.label,
                                                    "'s parameters to the device: ", st.message(),
                                                    " (the optimizer state is now partly loaded)"));
      }
    } else if (mem.on_device) {
      // Host -> device on the shard group's stream, then the model-dtype shard from the master
      // weights there; `state.file` (the source) outlives the Synchronize below.
      absl::Status st = mem.ops->Copy(s.master.get(), found[b][0]->data(), bytes);
      if (st.ok()) st = mem.ops->Copy(s.m.get(), found[b][1]->data(), bytes);
      if (st.ok() && kind == OptimizerKind::kAdamW)
        st = mem.ops->Copy(s.v.get(), found[b][2]->data(), bytes);
      for (size_t k = 0; k < s.segments.size() && st.ok(); ++k) {
        const Segment& seg = s.segments[k];
        st = mem.ops->CastScale(s.master.get() + seg.lo, DType::kF32,
                                out + seg.lo * DTypeSize(bk.dtype), bk.dtype, seg.hi - seg.lo,
                                ScaleSpec{});
      }
      if (st.ok() && b + 1 == shards.size()) st = mem.ops->Synchronize(absl::Now() + mem.timeout);
      if (!st.ok()) {
        mem.ops->Synchronize(absl::Now() + mem.timeout).IgnoreError();  // nothing reads the file
        return absl::Status(
            st.code(), absl::StrCat("optimizer load(", path, "): copying the state of ", s.label,
                                    " to the device: ", st.message(),
                                    " (the optimizer state is now partly loaded)"));
      }
    } else {
      std::memcpy(s.master.get(), found[b][0]->data(), bytes);
      std::memcpy(s.m.get(), found[b][1]->data(), bytes);
      if (kind == OptimizerKind::kAdamW) std::memcpy(s.v.get(), found[b][2]->data(), bytes);
      for (const Segment& seg : s.segments) {
        CastScale(s.master.get() + seg.lo, DType::kF32, out + seg.lo * DTypeSize(bk.dtype),
                  bk.dtype, seg.hi - seg.lo, ScaleSpec{});
      }
    }
    *applied = static_cast<int>(b) + 1;
  }
  return absl::OkStatus();
}

absl::Status WriteParamShard(const sched::BucketPlan& plan, int index, const void* values, int rank,
                             OptimizerShard& s, void* shard_view, const ShardMemory& mem) {
  const sched::ParamSpec& p = plan.params()[index];
  const size_t start = static_cast<size_t>(rank) * s.n;
  const size_t off = plan.slot(index).offset;
  const size_t lo = std::max(off, start), hi = std::min(off + p.count, start + s.n);
  if (lo >= hi) return absl::OkStatus();
  const size_t es = DTypeSize(p.dtype);
  const char* src = static_cast<const char*>(values) + (lo - off) * es;
  char* out = static_cast<char*>(shard_view) + (lo - start) * es;
  if (!mem.on_device) {
    CastScale(src, p.dtype, s.master.get() + (lo - start), DType::kF32, hi - lo, ScaleSpec{});
    std::memcpy(out, src, (hi - lo) * es);
    return absl::OkStatus();
  }
  // Host values -> the model-dtype shard (device), widened from there into the master
  // weights (offload: on the host); the host waits, as `values` is the caller's.
  BufferOps& ops = *mem.ops;
  absl::Status st = ops.Copy(out, src, (hi - lo) * es);
  if (st.ok() && mem.offload) {
    CastScale(src, p.dtype, s.master.get() + (lo - start), DType::kF32, hi - lo, ScaleSpec{});
  } else if (st.ok()) {
    st = ops.CastScale(out, p.dtype, s.master.get() + (lo - start), DType::kF32, hi - lo,
                       ScaleSpec{});
  }
  if (st.ok()) st = ops.Synchronize(absl::Now() + mem.timeout);
  if (!st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("optimizer set_param(", p.Label(), "): ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status AdoptParamShard(const sched::BucketPlan& plan, int index, int rank, OptimizerShard& s,
                             const void* shard_view, const ShardMemory& mem) {
  const sched::ParamSpec& p = plan.params()[index];
  const size_t start = static_cast<size_t>(rank) * s.n;
  const size_t off = plan.slot(index).offset;
  const size_t lo = std::max(off, start), hi = std::min(off + p.count, start + s.n);
  if (lo >= hi) return absl::OkStatus();  // none of it is this rank's
  const size_t es = DTypeSize(p.dtype);
  // ZeRO-2's shard is this rank's range of the gathered buffer: what the framework wrote.
  const char* written = static_cast<const char*>(shard_view) + (lo - start) * es;
  float* master = s.master.get() + (lo - start);
  if (!mem.on_device) {
    CastScale(written, p.dtype, master, DType::kF32, hi - lo, ScaleSpec{});
    return absl::OkStatus();
  }
  BufferOps& ops = *mem.ops;
  absl::Status st;
  if (mem.offload) {
    // Master weights in host memory: the written shard comes down through the staging buffer.
    char* staging = static_cast<char*>(s.param_host.get()) + (lo - start) * es;
    st = ops.Copy(staging, written, (hi - lo) * es);
    if (st.ok()) st = ops.Synchronize(absl::Now() + mem.timeout);
    if (st.ok()) CastScale(staging, p.dtype, master, DType::kF32, hi - lo, ScaleSpec{});
  } else {
    st = ops.CastScale(written, p.dtype, master, DType::kF32, hi - lo, ScaleSpec{});
    if (st.ok()) st = ops.Synchronize(absl::Now() + mem.timeout);
  }
  if (!st.ok())
    return absl::Status(st.code(),
                        absl::StrCat("optimizer adopt_param(", p.Label(), "): ", st.message()));
  return absl::OkStatus();
}

}  // namespace braid::optim
