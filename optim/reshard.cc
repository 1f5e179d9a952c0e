// Checkpoint re-sharding; see reshard.h.
#include "optim/reshard.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "optim/checkpoint_layout.h"

namespace braid::optim {
namespace {

constexpr int32_t kF32 = static_cast<int32_t>(DType::kF32);
constexpr int32_t kI64 = static_cast<int32_t>(DType::kI64);

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

absl::Status Mismatch(const std::string& path, const std::string& first, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "state file ", path, " is not part of the same checkpoint as ", first, ": ", what));
}

// Everything but the rank must match rank 0's file.
absl::Status CheckSameRun(const LoadedState& f, const LoadedState& first) {
  const StateHeader &a = f.header(), &b = first.header();
  if (a.kind != b.kind)
    return Mismatch(f.path(), first.path(), absl::StrCat("kind ", a.kind, " vs ", b.kind));
  if (a.world_size != b.world_size || a.shard_group_size != b.shard_group_size ||
      a.replica_group_size != b.replica_group_size) {
    return Mismatch(f.path(), first.path(),
                    absl::StrCat("world ", a.replica_group_size, "x", a.shard_group_size, " vs ",
                                 b.replica_group_size, "x", b.shard_group_size));
  }
  if (a.step != b.step)
    return Mismatch(f.path(), first.path(), absl::StrCat("saved at step ", a.step, " vs ", b.step));
  if (a.plan_fingerprint != b.plan_fingerprint) {
    // Name the parameter when both layouts can be read.
    absl::StatusOr<sched::BucketPlan> pa = ReadLayout(f), pb = ReadLayout(first);
    if (pa.ok() && pb.ok()) RETURN_IF_ERROR(CheckSameParams(pa->params(), pb->params(), f.path()));
    return Mismatch(f.path(), first.path(), "a different bucket plan");
  }
  bool same = a.scalars.size() == b.scalars.size();
  for (size_t i = 0; same && i < a.scalars.size(); ++i) {
    same = a.scalars[i].first == b.scalars[i].first &&
           SameBits(a.scalars[i].second, b.scalars[i].second);
  }
  if (!same) return Mismatch(f.path(), first.path(), "different hyper-parameters");
  return absl::OkStatus();
}

absl::StatusOr<const int64_t*> BucketSteps(const LoadedState& f, size_t buckets) {
  ASSIGN_OR_RETURN(const LoadedSection* s, f.Find("bucket_steps", DType::kI64, buckets));
  return static_cast<const int64_t*>(s->data());
}

}  // namespace

absl::StatusOr<std::vector<std::string>> StateNames(const std::string& kind) {
  if (kind == "adamw") return std::vector<std::string>{"master", "exp_avg", "exp_avg_sq"};
  if (kind == "sgd") return std::vector<std::string>{"master", "momentum"};
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer kind \"", kind, "\""));
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::vector<std::string>& paths) {
  if (paths.empty()) return absl::InvalidArgumentError("no state files given");
  std::vector<LoadedState> files;
  for (const std::string& p : paths) {
    ASSIGN_OR_RETURN(LoadedState f, ReadStateFile(p));
    files.push_back(std::move(f));
  }
  // Order by rank: each of 0..N-1 exactly once.
  std::sort(files.begin(), files.end(), [](const LoadedState& a, const LoadedState& b) {
    return a.header().rank < b.header().rank;
  });
  const int n = static_cast<int>(files.size());
  for (int r = 0; r < n; ++r) {
    const StateHeader& h = files[r].header();
    if (h.world_size != n) {
      return absl::FailedPreconditionError(absl::StrCat("state file ", files[r].path(),
                                                        " belongs to a world of ", h.world_size,
                                                        " ranks, but ", n, " files were given"));
    }
    if (h.rank != r) {
      return absl::FailedPreconditionError(
          absl::StrCat("state file ", files[r].path(), " is rank ", h.rank,
                       ": the files given do not hold every rank of 0..", n - 1,
                       " exactly once (rank ", r, " is missing)"));
    }
    if (r > 0) RETURN_IF_ERROR(CheckSameRun(files[r], files[0]));
  }
  Checkpoint c;
  c.header = files[0].header();
  ASSIGN_OR_RETURN(c.state_names, StateNames(c.header.kind));
  ASSIGN_OR_RETURN(c.plan, ReadLayout(files[0]));
  const int shards = c.header.shard_group_size;
  if (c.plan.options().shards != shards) {
    return absl::DataLossError(absl::StrCat("state file ", files[0].path(), ": its layout has ",
                                            c.plan.options().shards,
                                            " shards, its header a shard group of ", shards));
  }
  const auto& buckets = c.plan.buckets();
  ASSIGN_OR_RETURN(const int64_t* steps0, BucketSteps(files[0], buckets.size()));
  for (const LoadedState& f : files) {
    ASSIGN_OR_RETURN(const int64_t* steps, BucketSteps(f, buckets.size()));
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (steps[b] != steps0[b] || steps[b] < 0) {
        return absl::DataLossError(absl::StrCat("state file ", f.path(), ": bucket ", b,
                                                " has step count ", steps[b], ", ", files[0].path(),
                                                " has ", steps0[b]));
      }
    }
  }
  const auto& params = c.plan.params();
  c.values.assign(c.state_names.size(), std::vector<std::vector<float>>(params.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    c.steps.push_back(steps0[c.plan.slot(static_cast<int>(i)).bucket]);
    for (auto& v : c.values) v[i].resize(params[i].count);
  }
  for (size_t k = 0; k < c.state_names.size(); ++k) {
    for (size_t b = 0; b < buckets.size(); ++b) {
      const size_t sc = buckets[b].shard_count;
      const std::string name = absl::StrCat("bucket", b, "/", c.state_names[k]);
      // The bucket's full padded state from replica 0's shard ranks; other replicas must agree.
      std::vector<float> full(buckets[b].padded_count);
      for (int r = 0; r < n; ++r) {
        ASSIGN_OR_RETURN(const LoadedSection* s, files[r].Find(name, DType::kF32, sc));
        float* dst = full.data() + static_cast<size_t>(r % shards) * sc;
        if (r < shards) {
          std::memcpy(dst, s->data(), sc * sizeof(float));
        } else if (std::memcmp(dst, s->data(), sc * sizeof(float)) != 0) {
          return absl::DataLossError(
              absl::StrCat("state files ", files[r].path(), " and ", files[r % shards].path(),
                           " are replicas of the same shard but their \"", name, "\" differ"));
        }
      }
      for (int i : buckets[b].params) {
        const size_t off = c.plan.slot(i).offset;
        std::memcpy(c.values[k][i].data(), full.data() + off, params[i].count * sizeof(float));
      }
    }
  }
  return c;
}

absl::StatusOr<std::vector<std::string>> WriteCheckpoint(const Checkpoint& c, int ranks, int shards,
                                                         const std::string& prefix) {
  if (ranks < 1 || shards < 1 || ranks % shards != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot re-shard for ", ranks, " ranks in shard groups of ", shards,
                     ": the shard group size must divide the number of ranks"));
  }
  sched::PlanOptions o = c.plan.options();
  o.shards = shards;
  ASSIGN_OR_RETURN(sched::BucketPlan plan, sched::BucketPlan::Build(c.plan.params(), o));
  std::vector<std::string> out;
  for (int r = 0; r < ranks; ++r) {
    const std::string path = absl::StrCat(prefix, r, ".braid");
    RETURN_IF_ERROR(WriteCheckpointRank(c, plan, r, ranks, path));
    out.push_back(path);
  }
  return out;
}

absl::StatusOr<LoadedState> CheckpointRank(const Checkpoint& c, const sched::BucketPlan& plan,
                                           int rank, int ranks, const std::string& name) {
  const int shards = plan.options().shards;
  if (ranks < 1 || shards < 1 || ranks % shards != 0 || rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(absl::StrCat("cannot lay out rank ", rank, " of ", ranks,
                                                   " ranks in shard groups of ", shards));
  }
  RETURN_IF_ERROR(CheckSameParams(plan.params(), c.plan.params(), name));
  const auto& buckets = plan.buckets();
  std::vector<int64_t> steps(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int first = buckets[b].params.front();
    steps[b] = c.steps[first];
    for (int i : buckets[b].params) {
      if (c.steps[i] != steps[b]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot re-shard: parameters ", plan.params()[first].Label(), " and ",
            plan.params()[i].Label(), " share bucket ", b, " of the target plan but were stepped ",
            steps[b], " and ", c.steps[i], " times (one step count per bucket)"));
      }
    }
  }
  const size_t s = static_cast<size_t>(rank % shards);
  StateHeader h = c.header;
  h.plan_fingerprint = plan.FingerprintOn(Device::Cpu());  // files are laid out as on the CPU
  h.world_size = ranks;
  h.rank = rank;
  h.shard_group_size = shards;
  h.replica_group_size = ranks / shards;
  std::vector<LoadedSection> sections;
  auto add = [&sections](std::string section, int32_t dtype, uint64_t count,
                         size_t bytes) -> unsigned char* {
    LoadedSection& l = sections.emplace_back();
    l.name = std::move(section);
    l.dtype = dtype;
    l.count = count;
    l.bytes = bytes;
    if (bytes > 0)
      l.storage = std::make_unique<unsigned char[]>(bytes);  // value-initialized: zero padding
    return l.storage.get();
  };
  if (unsigned char* d = add("bucket_steps", kI64, steps.size(), steps.size() * sizeof(int64_t))) {
    std::memcpy(d, steps.data(), steps.size() * sizeof(int64_t));
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    const size_t sc = buckets[b].shard_count, lo = s * sc, hi = lo + sc;
    for (size_t k = 0; k < c.state_names.size(); ++k) {
      auto* shard = reinterpret_cast<float*>(
          add(absl::StrCat("bucket", b, "/", c.state_names[k]), kF32, sc, sc * sizeof(float)));
      for (int i : buckets[b].params) {
        const size_t off = plan.slot(i).offset, end = off + plan.params()[i].count;
        const size_t from = std::max(off, lo), to = std::min(end, hi);
        if (from < to)
          std::memcpy(&shard[from - lo], &c.values[k][i][from - off], (to - from) * sizeof(float));
      }
    }
  }
  const LayoutSections layout(plan);
  for (const StateSection& l : layout.sections()) {
    if (unsigned char* d = add(l.name, l.dtype, l.count, l.bytes)) std::memcpy(d, l.data, l.bytes);
  }
  return LoadedState(name, std::move(h), std::move(sections));
}

absl::Status WriteCheckpointRank(const Checkpoint& c, const sched::BucketPlan& plan, int rank,
                                 int ranks, const std::string& path) {
  ASSIGN_OR_RETURN(const LoadedState state, CheckpointRank(c, plan, rank, ranks, path));
  std::vector<StateSection> sections;
  for (const LoadedSection& l : state.sections()) {
    sections.push_back(StateSection{l.name, l.dtype, l.count, l.data(), l.bytes});
  }
  return WriteStateFile(path, state.header(), sections);
}

}  // namespace braid::optim
