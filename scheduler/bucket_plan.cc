#include "scheduler/bucket_plan.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::sched {
namespace {

size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

uint64_t Mix(uint64_t h, uint64_t v) {
  // FNV-1a over the 8 bytes of v: stable across processes and builds.
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xffu;
    h *= 1099511628211ull;
  }
  return h;
}

constexpr uint64_t kFnvBasis = 14695981039346656037ull;

}  // namespace

std::string ParamSpec::Label() const {
  if (name.empty()) return absl::StrCat("id ", id);
  return absl::StrCat("'", name, "' (id ", id, ")");
}

uint64_t BucketPlan::ParamHash(const ParamSpec& p) {
  uint64_t h = kFnvBasis;
  h = Mix(h, static_cast<uint64_t>(p.id));
  h = Mix(h, p.count);
  h = Mix(h, static_cast<uint64_t>(p.dtype));
  h = Mix(h, static_cast<uint64_t>(p.device.type));
  h = Mix(h, static_cast<uint64_t>(p.device.index));
  // Unit 0 adds nothing, so plans (and state files) from before units hash as they did.
  return p.unit == 0 ? h : Mix(h, static_cast<uint64_t>(p.unit) + 0x756e6974ull);
}

absl::StatusOr<BucketPlan> BucketPlan::Build(std::vector<ParamSpec> params, const PlanOptions& o) {
  std::vector<int> order(params.size());
  for (size_t i = 0; i < params.size(); ++i) order[i] = static_cast<int>(params.size() - 1 - i);
  return BuildInOrder(std::move(params), order, o);
}

absl::StatusOr<BucketPlan> BucketPlan::BuildInOrder(std::vector<ParamSpec> params,
                                                    const std::vector<int>& order,
                                                    const PlanOptions& o) {
  if (o.shards < 1)
    return absl::InvalidArgumentError(absl::StrCat("shards must be >= 1, got ", o.shards));
  if (o.bucket_cap_bytes == 0 || o.first_bucket_cap_bytes == 0) {
    return absl::InvalidArgumentError("bucket caps must be > 0 bytes");
  }
  if (o.align_bytes == 0 || (o.align_bytes & (o.align_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("align_bytes must be a power of two, got ", o.align_bytes));
  }
  BucketPlan plan;
  plan.options_ = o;
  plan.params_ = std::move(params);
  const int n = static_cast<int>(plan.params_.size());
  size_t total_bytes = 0;
  for (int i = 0; i < n; ++i) {
    const ParamSpec& p = plan.params_[i];
    if (!IsValidDType(static_cast<int>(p.dtype))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", p.Label(), ": invalid dtype value ", static_cast<int>(p.dtype)));
    }
    const size_t es = DTypeSize(p.dtype);
    if (p.count > (kMaxPlanBytes - total_bytes) / es) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p.Label(), ": ", p.count, " elements of ", es,
                       " bytes take the parameters past 2^60 bytes (", total_bytes, " before it)"));
    }
    total_bytes += p.count * es;
    if (p.unit < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p.Label(), ": unit must be >= 0, got ", p.unit));
    }
    plan.num_units_ = std::max(plan.num_units_, p.unit + 1);
    if (!plan.index_.emplace(p.id, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", p.Label(),
                                                     " is registered twice (also as parameter #",
                                                     plan.index_[p.id], ")"));
    }
  }
  if (static_cast<int>(order.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket order lists ", order.size(), " parameters, ", n, " are registered"));
  }
  std::vector<char> seen(n, 0);
  for (int i : order) {
    if (i < 0 || i >= n || seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket order is not a permutation (index ", i, ")"));
    }
    seen[i] = 1;
  }
  plan.slots_.assign(n, ParamSlot{});
  // Open bucket per (dtype, device, unit): index into buckets_; buckets made per (dtype, device)
  // (the first one has the smaller cap).
  std::map<std::tuple<int, int, int, int>, int> open;
  std::map<std::tuple<int, int, int>, int> made;
  for (int i : order) {
    const ParamSpec& p = plan.params_[i];
    const auto kind =
        std::make_tuple(static_cast<int>(p.dtype), static_cast<int>(p.device.type), p.device.index);
    const auto key = std::tuple_cat(kind, std::make_tuple(p.unit));
    const size_t es = DTypeSize(p.dtype);
    const size_t align = std::max<size_t>(1, o.align_bytes / es);
    auto it = open.find(key);
    if (it != open.end()) {
      Bucket& b = plan.buckets_[it->second];
      const size_t cap = b.first ? o.first_bucket_cap_bytes : o.bucket_cap_bytes;
      if ((RoundUp(b.count, align) + p.count) * es > cap) open.erase(it);  // closes it
    }
    it = open.find(key);
    if (it == open.end()) {
      Bucket b;
      b.dtype = p.dtype;
      b.device = p.device;
      b.unit = p.unit;
      b.first = made[kind]++ == 0;
      plan.buckets_.push_back(b);
      it = open.emplace(key, static_cast<int>(plan.buckets_.size()) - 1).first;
    }
    Bucket& b = plan.buckets_[it->second];
    const size_t offset = RoundUp(b.count, align);
    plan.slots_[i] = ParamSlot{it->second, offset};
    b.params.push_back(i);
    b.count = offset + p.count;
  }
  for (Bucket& b : plan.buckets_) {
    const size_t align = std::max<size_t>(1, o.align_bytes / DTypeSize(b.dtype));
    b.padded_count = RoundUp(std::max<size_t>(b.count, 1), align * static_cast<size_t>(o.shards));
    b.shard_count = b.padded_count / static_cast<size_t>(o.shards);
  }
  return plan;
}

std::vector<int> BucketPlan::UnitBuckets(int u) const {
  std::vector<int> out;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].unit == u) out.push_back(static_cast<int>(b));
  }
  return out;
}

absl::StatusOr<int> BucketPlan::IndexOf(ParamId id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return absl::NotFoundError(absl::StrCat("unknown parameter id ", id));
  return it->second;
}

uint64_t BucketPlan::Fingerprint() const { return HashLayout(nullptr); }

uint64_t BucketPlan::FingerprintOn(Device device) const { return HashLayout(&device); }

uint64_t BucketPlan::HashLayout(const Device* device) const {
  uint64_t h = kFnvBasis;
  h = Mix(h, params_.size());
  for (ParamSpec p : params_) {
    if (device != nullptr) p.device = *device;
    h = Mix(h, ParamHash(p));
  }
  for (const ParamSlot& s : slots_) h = Mix(Mix(h, static_cast<uint64_t>(s.bucket)), s.offset);
  for (const Bucket& b : buckets_) h = Mix(Mix(h, b.padded_count), b.shard_count);
  return h;
}

}  // namespace braid::sched
