// ShardedOptimizer::Save / Load: the per-rank state file (optim/state_file.h).
//
// Sections: "bucket_steps" (i64 per bucket), and per bucket b "bucket<b>/master" plus
// "bucket<b>/exp_avg" and "bucket<b>/exp_avg_sq" (AdamW) or "bucket<b>/momentum" (SGD), each
// shard_count f32. Scalars: "groups" and per group "g<k>/<name>" hyper-parameters. The plan
// fingerprint is the layout's on the CPU (FingerprintOn), the same for host and device runs.
//
// Device parameters: Save copies the f32 buffers device -> host through the shard group's
// BufferOps and waits (Synchronize, timeout) before writing; Load validates everything on the
// host first, then copies host -> device, narrows the master weights into the model-dtype
// shards on the stream (BufferOps::CastScale, bit for bit with the host's) and waits before
// gathering.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/host_values.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"
#include "optim/checkpoint_layout.h"
#include "optim/optimizer_bucket.h"
#include "optim/reshard.h"
#include "optim/sharded_optimizer.h"

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

}  // namespace

StateHeader ShardedOptimizer::Identity() const {
  const Group& shard = *reducer_->groups().shard;
  const Group* replica = reducer_->groups().replica;
  StateHeader h;
  h.kind = config_.kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
  h.plan_fingerprint = reducer_->plan().FingerprintOn(Device::Cpu());
  h.shard_group_size = shard.size();
  h.replica_group_size = replica != nullptr ? replica->size() : 1;
  h.world_size = h.shard_group_size * h.replica_group_size;
  h.rank = (replica != nullptr ? replica->rank() : 0) * shard.size() + shard.rank();
  return h;
}

StateHeader ShardedOptimizer::SavedHeader() const {
  StateHeader h = Identity();
  std::lock_guard<std::mutex> lock(mu_);
  h.step = report_.rounds;
  h.scalars.emplace_back("groups", static_cast<double>(groups_.size()));
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<double> v = HyperValues(groups_[g], config_.kind);
    for (size_t k = 0; k < v.size(); ++k) {
      h.scalars.emplace_back(
          absl::StrCat("g", g, "/",
                       config_.kind == OptimizerKind::kAdamW ? kAdamWNames[k] : kSgdNames[k]),
          v[k]);
    }
  }
  return h;
}

Checkpoint ShardedOptimizer::EmptyCheckpoint() const {
  Checkpoint c{SavedHeader(), reducer_->plan(), {}, {}, {}};
  c.state_names = config_.kind == OptimizerKind::kAdamW
                      ? std::vector<std::string>{"master", "exp_avg", "exp_avg_sq"}
                      : std::vector<std::string>{"master", "momentum"};
  const auto& params = c.plan.params();
  c.values.assign(c.state_names.size(), std::vector<std::vector<float>>(params.size()));
  c.steps.assign(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    for (auto& v : c.values) v[i].resize(params[i].count);
  }
  return c;
}

absl::StatusOr<Checkpoint> ShardedOptimizer::GatherCheckpoint() {
  RETURN_IF_ERROR(WaitBetweenSteps("GatherCheckpoint"));
  Checkpoint c = EmptyCheckpoint();
  Group& shard = *reducer_->groups().shard;
  const absl::Time deadline = absl::Now() + config_.timeout;
  const auto& params = c.plan.params();
  const auto& buckets = c.plan.buckets();
  for (size_t i = 0; i < params.size(); ++i) {
    c.steps[i] = buckets_[c.plan.slot(static_cast<int>(i)).bucket]->steps;
  }
  std::vector<float> mine, full;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const BucketState& s = *buckets_[b];
    const FloatBuffer* state[] = {&s.master, &s.m, &s.v};
    full.resize(s.n * static_cast<size_t>(shard.size()));
    for (size_t k = 0; k < c.state_names.size(); ++k) {
      const float* src = state[k]->get();
      if (on_device_ && !offload_) {  // device state: a host copy first
        mine.resize(s.n);
        RETURN_IF_ERROR(ops().Copy(mine.data(), src, s.n * sizeof(float)));
        RETURN_IF_ERROR(ops().Synchronize(deadline));
        src = mine.data();
      }
      // The bucket's full padded state: every shard rank's part, in rank order.
      const std::string what = absl::StrCat("optimizer state of ", s.label);
      RETURN_IF_ERROR(
          AllGatherHostValues(shard, src, full.data(), s.n, DType::kF32, what.c_str(), deadline));
      for (int i : buckets[b].params) {
        const size_t off = c.plan.slot(i).offset;
        std::memcpy(c.values[k][i].data(), full.data() + off, params[i].count * sizeof(float));
      }
    }
  }
  return c;
}

absl::Status ShardedOptimizer::Save(const std::string& path) {
  RETURN_IF_ERROR(WaitBetweenSteps("Save"));
  StateHeader h = SavedHeader();
  std::vector<int64_t> steps;
  std::vector<StateSection> sections;
  for (const auto& s : buckets_) steps.push_back(s->steps);
  sections.push_back(StateSection{"bucket_steps", static_cast<int32_t>(DType::kI64), steps.size(),
                                  steps.data(), steps.size() * sizeof(int64_t)});
  const int32_t f32 = static_cast<int32_t>(DType::kF32);
  // Device: host copies of the f32 buffers (the host's are written in place).
  std::vector<std::vector<float>> staged;
  staged.reserve(buckets_.size() * 3);
  auto host_view = [&](const FloatBuffer& f, size_t n) -> absl::StatusOr<const float*> {
    if (!on_device_ || offload_) return f.get();  // host state
    staged.emplace_back(n);
    RETURN_IF_ERROR(ops().Copy(staged.back().data(), f.get(), n * sizeof(float)));
    return staged.back().data();
  };
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const BucketState& s = *buckets_[b];
    const size_t bytes = s.n * sizeof(float);
    auto add = [&](const char* name, const FloatBuffer& f) -> absl::Status {
      ASSIGN_OR_RETURN(const float* data, host_view(f, s.n));
      sections.push_back(StateSection{absl::StrCat("bucket", b, "/", name), f32, s.n, data, bytes});
      return absl::OkStatus();
    };
    absl::Status st = add("master", s.master);
    if (st.ok() && config_.kind == OptimizerKind::kAdamW) {
      st = add("exp_avg", s.m);
      if (st.ok()) st = add("exp_avg_sq", s.v);
    } else if (st.ok()) {
      st = add("momentum", s.m);
    }
    if (st.ok() && on_device_ && b + 1 == buckets_.size())
      st = ops().Synchronize(absl::Now() + config_.timeout);
    if (!st.ok()) {
      // Queued copies into `staged` must have run (or failed) before it goes away.
      if (on_device_) ops().Synchronize(absl::Now() + config_.timeout).IgnoreError();
      return absl::Status(st.code(),
                          absl::StrCat("optimizer Save(", path, "): copying the state of ", s.label,
                                       " to the host: ", st.message()));
    }
  }
  if (on_device_ && buckets_.empty())
    RETURN_IF_ERROR(ops().Synchronize(absl::Now() + config_.timeout));
  // The plan itself, so that the checkpoint can be re-sharded (optim/reshard.h).
  const LayoutSections layout(reducer_->plan());
  for (const StateSection& l : layout.sections()) sections.push_back(l);
  return WriteStateFile(path, h, sections);
}

absl::Status ShardedOptimizer::Load(const std::string& path) {
  return LoadState(ReadStateFile(path), path);
}

absl::Status ShardedOptimizer::LoadState(absl::StatusOr<LoadedState> source,
                                         const std::string& path) {
  RETURN_IF_ERROR(WaitBetweenSteps("Load"));
  // Phase 1: read and validate everything; nothing changes yet.
  LoadedState file;
  std::vector<GroupHyper> hyper = groups_;
  std::vector<std::vector<const LoadedSection*>> found(buckets_.size());
  const LoadedSection* steps = nullptr;
  absl::Status mine = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(file, std::move(source));
    if (HasLayout(file)) {
      // Name the first parameter that differs, rather than only "another plan".
      ASSIGN_OR_RETURN(const sched::BucketPlan saved, ReadLayout(file));
      RETURN_IF_ERROR(CheckSameParams(saved.params(), reducer_->plan().params(), path));
    }
    RETURN_IF_ERROR(CheckCompatible(file.header(), Identity(), path));
    ASSIGN_OR_RETURN(double groups, file.Scalar("groups"));
    if (groups != static_cast<double>(groups_.size())) {
      return absl::FailedPreconditionError(absl::StrCat("state file ", path, " has ", groups,
                                                        " parameter groups, this optimizer has ",
                                                        groups_.size()));
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<double> v = HyperValues(groups_[g], config_.kind);
      for (size_t k = 0; k < v.size(); ++k) {
        ASSIGN_OR_RETURN(
            v[k], file.Scalar(absl::StrCat(
                      "g", g, "/",
                      config_.kind == OptimizerKind::kAdamW ? kAdamWNames[k] : kSgdNames[k])));
      }
      hyper[g] = HyperFrom(v, config_.kind, hyper[g]);
      absl::Status bad = CheckHyper(hyper[g], config_.kind, static_cast<int>(g));
      if (!bad.ok())
        return absl::DataLossError(absl::StrCat("state file ", path, ": ", bad.message()));
    }
    ASSIGN_OR_RETURN(steps, file.Find("bucket_steps", DType::kI64, buckets_.size()));
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (static_cast<const int64_t*>(steps->data())[b] < 0) {
        return absl::DataLossError(
            absl::StrCat("state file ", path, ": negative step count for bucket ", b));
      }
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const size_t n = buckets_[b]->n;
      const std::vector<std::string> names =
          config_.kind == OptimizerKind::kAdamW
              ? std::vector<std::string>{"master", "exp_avg", "exp_avg_sq"}
              : std::vector<std::string>{"master", "momentum"};
      for (const std::string& name : names) {
        ASSIGN_OR_RETURN(const LoadedSection* sec,
                         file.Find(absl::StrCat("bucket", b, "/", name), DType::kF32, n));
        found[b].push_back(sec);
      }
    }
    return absl::OkStatus();
  }();
  // Every rank loads or none does (the re-gather below is collective), and all from the same
  // step: {failed ranks, sum of steps, sum of squared steps} over the shard group, then over the
  // replica group (hybrid); equal steps <=> sum^2 == n * sum of squares.
  const double step = mine.ok() ? static_cast<double>(file.header().step) : 0.0;
  double failed = mine.ok() ? 0.0 : 1.0, sum = step, sumsq = step * step, n = 1;
  // Sums two values over `g` in the step's all-reduce buffer (idle between steps).
  auto sum2 = [this](Group* g, double* x, double* y) -> absl::Status {
    stats_[0] = *x;
    stats_[1] = *y;
    RETURN_IF_ERROR(SumStats(*g, absl::Now() + config_.timeout));
    *x = stats_[0];
    *y = stats_[1];
    return absl::OkStatus();
  };
  for (Group* g : {stats_group_.get(), reducer_->groups().replica}) {
    if (g == nullptr) continue;
    double unused = 0;
    RETURN_IF_ERROR(sum2(g, &failed, &sum));
    RETURN_IF_ERROR(sum2(g, &sumsq, &unused));
    n *= g->size();
  }
  if (!mine.ok()) return mine;
  if (failed > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer Load(", path, "): ", failed,
                     " other rank(s) could not load their state files; nothing was loaded"));
  }
  if (sum * sum != n * sumsq) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer Load(", path,
                     "): the ranks' state files were saved at different steps (this one at ", step,
                     "); nothing was loaded"));
  }
  // Phase 2: apply, write the model-dtype shards, and gather every bucket.
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups_ = hyper;
    report_ = StepReport{};
    report_.rounds = file.header().step;
  }
  const auto* step_values = static_cast<const int64_t*>(steps->data());
  absl::Status applied;  // device only: a copy to the device that failed on this rank
  if (offload_) {
    // The last step's copies out of the host parameter staging buffers may still be queued on
    // the stream (a step is published once they are queued); they must have read the buffers
    // before the loop below rewrites them. One host wait per Load.
    const absl::Status st = ops().Synchronize(absl::Now() + config_.timeout);
    if (!st.ok()) {
      applied =
          absl::Status(st.code(), absl::StrCat("optimizer Load(", path,
                                               "): waiting for the last step's "
                                               "copies to the device: ",
                                               st.message(), " (no bucket state was loaded)"));
    }
  }
  for (size_t b = 0; b < buckets_.size() && applied.ok(); ++b) {
    BucketState& s = *buckets_[b];
    const size_t bytes = s.n * sizeof(float);
    s.steps = step_values[b];
    const sched::Bucket& bk = reducer_->plan().buckets()[b];
    char* out = static_cast<char*>(gatherer_->ShardView(static_cast<int>(b))->data);
    if (offload_) {
      // Host state; the model-dtype shard is rounded on the host and copied to the device.
      BufferOps& mem = ops();
      std::memcpy(s.master.get(), found[b][0]->data(), bytes);
      std::memcpy(s.m.get(), found[b][1]->data(), bytes);
      if (config_.kind == OptimizerKind::kAdamW) std::memcpy(s.v.get(), found[b][2]->data(), bytes);
      char* staged = s.param_host.get();
      for (const Segment& seg : s.segments) {
        CastScale(s.master.get() + seg.lo, DType::kF32, staged + seg.lo * DTypeSize(bk.dtype),
                  bk.dtype, seg.hi - seg.lo, ScaleSpec{});
      }
      absl::Status st = mem.Copy(out, staged, s.n * DTypeSize(bk.dtype));
      if (st.ok() && b + 1 == buckets_.size()) st = mem.Synchronize(absl::Now() + config_.timeout);
      if (!st.ok()) {
        mem.Synchronize(absl::Now() + config_.timeout).IgnoreError();
        applied =
            absl::Status(st.code(), absl::StrCat("optimizer Load(", path, "): copying ", s.label,
                                                 "'s parameters to the device: ", st.message(),
                                                 " (the optimizer state is now partly loaded)"));
        break;
      }
    } else if (on_device_) {
      // Host -> device on the shard group's stream, then the model-dtype shard from the master
      // weights there; `file` (the source) outlives the Synchronize below.
      BufferOps& mem = ops();
      absl::Status st = mem.Copy(s.master.get(), found[b][0]->data(), bytes);
      if (st.ok()) st = mem.Copy(s.m.get(), found[b][1]->data(), bytes);
      if (st.ok() && config_.kind == OptimizerKind::kAdamW)
        st = mem.Copy(s.v.get(), found[b][2]->data(), bytes);
      for (size_t k = 0; k < s.segments.size() && st.ok(); ++k) {
        const Segment& seg = s.segments[k];
        st = mem.CastScale(s.master.get() + seg.lo, DType::kF32, out + seg.lo * DTypeSize(bk.dtype),
                           bk.dtype, seg.hi - seg.lo, ScaleSpec{});
      }
      if (st.ok() && b + 1 == buckets_.size()) st = mem.Synchronize(absl::Now() + config_.timeout);
      if (!st.ok()) {
        mem.Synchronize(absl::Now() + config_.timeout)
            .IgnoreError();  // nothing reads `file` after return
        applied = absl::Status(
            st.code(), absl::StrCat("optimizer Load(", path, "): copying the state of ", s.label,
                                    " to the device: ", st.message(),
                                    " (the optimizer state is now partly loaded)"));
        break;
      }
    } else {
      std::memcpy(s.master.get(), found[b][0]->data(), bytes);
      std::memcpy(s.m.get(), found[b][1]->data(), bytes);
      if (config_.kind == OptimizerKind::kAdamW) std::memcpy(s.v.get(), found[b][2]->data(), bytes);
      for (const Segment& seg : s.segments) {
        CastScale(s.master.get() + seg.lo, DType::kF32, out + seg.lo * DTypeSize(bk.dtype),
                  bk.dtype, seg.hi - seg.lo, ScaleSpec{});
      }
    }
    s.dirty = true;  // cleared by each successful re-gather
  }
  if (on_device_) {
    // The re-gather is collective: a rank whose device copies failed must not skip it alone.
    // Agree on failures first; if any rank failed, no rank gathers and every rank says why.
    double copy_failed = applied.ok() ? 0.0 : 1.0, unused = 0;
    for (Group* g : {stats_group_.get(), reducer_->groups().replica}) {
      if (g == nullptr) continue;
      RETURN_IF_ERROR(sum2(g, &copy_failed, &unused));
    }
    if (!applied.ok()) return applied;
    if (copy_failed > 0) {
      return absl::AbortedError(
          absl::StrCat("optimizer Load(", path, "): ", copy_failed,
                       " other rank(s) failed to copy their state to the "
                       "device (their state is partly loaded); no parameters were re-gathered"));
    }
  }
  if (!config_.gather_after_step) return absl::OkStatus();  // each bucket's next gather reads it
  for (size_t b = 0; b < buckets_.size(); ++b) RETURN_IF_ERROR(Regather(static_cast<int>(b)));
  return absl::OkStatus();
}

}  // namespace braid::optim
