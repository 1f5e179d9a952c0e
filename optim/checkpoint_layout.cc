// Layout sections of optimizer state files; see checkpoint_layout.h.
#include "optim/checkpoint_layout.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::optim {
namespace {

constexpr int32_t kI64 = static_cast<int32_t>(DType::kI64);
constexpr int32_t kU8 = static_cast<int32_t>(DType::kU8);

absl::Status Malformed(const std::string& path, absl::string_view section, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("state file ", path, ": section \"", section, "\" ", what));
}

// The section's i64 values; NotFound when missing, DataLoss when not i64.
absl::StatusOr<std::vector<int64_t>> Ints(const LoadedState& file, const char* name) {
  ASSIGN_OR_RETURN(const LoadedSection* s, file.Find(name));
  if (s->dtype != kI64) return Malformed(file.path(), name, "is not i64");
  std::vector<int64_t> v(s->count);
  if (s->count > 0) std::memcpy(v.data(), s->data(), s->bytes);
  return v;
}

std::string Describe(const sched::ParamSpec& p) {
  return absl::StrCat(p.count, " ", DTypeName(p.dtype), " elements");
}

}  // namespace

LayoutSections::LayoutSections(const sched::BucketPlan& plan) {
  const auto& params = plan.params();
  std::vector<int> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  // Bucket-fill order: by bucket, then by offset (BuildInOrder of this order is the plan).
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const sched::ParamSlot &x = plan.slot(a), &y = plan.slot(b);
    return std::make_pair(x.bucket, x.offset) < std::make_pair(y.bucket, y.offset);
  });
  const bool units = std::any_of(params.begin(), params.end(),
                                 [](const sched::ParamSpec& p) { return p.unit != 0; });
  for (const sched::ParamSpec& p : params) {
    if (units) units_.push_back(p.unit);
    params_.insert(params_.end(),
                   {p.id, static_cast<int64_t>(p.count), static_cast<int64_t>(p.dtype)});
    names_.append(p.name);
    names_.push_back('\0');
  }
  order_.assign(order.begin(), order.end());
  const sched::PlanOptions& o = plan.options();
  options_ = {static_cast<int64_t>(o.bucket_cap_bytes),
              static_cast<int64_t>(o.first_bucket_cap_bytes), o.shards,
              static_cast<int64_t>(o.align_bytes)};
}

std::vector<StateSection> LayoutSections::sections() const {
  auto ints = [](const char* name, const std::vector<int64_t>& v) {
    return StateSection{name, kI64, v.size(), v.data(), v.size() * sizeof(int64_t)};
  };
  std::vector<StateSection> out = {
      ints(kLayoutParams, params_), ints(kLayoutOrder, order_), ints(kLayoutOptions, options_),
      StateSection{kLayoutNames, kU8, names_.size(), names_.data(), names_.size()}};
  if (!units_.empty()) out.push_back(ints(kLayoutUnits, units_));
  return out;
}

bool HasLayout(const LoadedState& file) { return file.Find(kLayoutParams).ok(); }

absl::StatusOr<sched::BucketPlan> ReadLayout(const LoadedState& file) {
  const std::string& path = file.path();
  if (!HasLayout(file)) {
    return absl::NotFoundError(absl::StrCat(
        "state file ", path, " records no bucket layout (", kLayoutParams,
        "): it was written by a Braid older than resharding and can only be loaded on the "
        "world it was saved on"));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> raw, Ints(file, kLayoutParams));
  ASSIGN_OR_RETURN(std::vector<int64_t> order64, Ints(file, kLayoutOrder));
  ASSIGN_OR_RETURN(std::vector<int64_t> opt, Ints(file, kLayoutOptions));
  ASSIGN_OR_RETURN(const LoadedSection* names, file.Find(kLayoutNames));
  if (raw.size() % 3 != 0) return Malformed(path, kLayoutParams, "is not 3 values per parameter");
  const size_t n = raw.size() / 3;
  if (order64.size() != n)
    return Malformed(path, kLayoutOrder, absl::StrCat("does not list ", n, " parameters"));
  if (opt.size() != 4 || opt[0] <= 0 || opt[1] <= 0 || opt[2] < 1 || opt[2] > (1 << 20) ||
      opt[3] < 1 || opt[3] > (1 << 20)) {
    return Malformed(path, kLayoutOptions, "is not 4 valid plan options");
  }
  const char* text = static_cast<const char*>(names->data());
  std::vector<std::string> labels;
  for (size_t at = 0; at < names->bytes && names->dtype == kU8;) {
    const char* end = static_cast<const char*>(std::memchr(text + at, '\0', names->bytes - at));
    if (end == nullptr) break;
    labels.emplace_back(text + at, end);
    at = static_cast<size_t>(end - text) + 1;
  }
  if (labels.size() != n)
    return Malformed(path, kLayoutNames, absl::StrCat("does not hold ", n, " names"));
  std::vector<sched::ParamSpec> params(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t count = raw[3 * i + 1], dtype = raw[3 * i + 2];
    if (count < 0 || !IsValidDType(static_cast<int>(dtype)) || dtype != static_cast<int>(dtype)) {
      return Malformed(path, kLayoutParams,
                       absl::StrCat("has an invalid count or dtype for parameter #", i));
    }
    params[i] = sched::ParamSpec{raw[3 * i], static_cast<size_t>(count), static_cast<DType>(dtype),
                                 Device::Cpu(), std::move(labels[i])};
  }
  if (file.Find(kLayoutUnits).ok()) {
    ASSIGN_OR_RETURN(std::vector<int64_t> units, Ints(file, kLayoutUnits));
    if (units.size() != n)
      return Malformed(path, kLayoutUnits, absl::StrCat("does not list ", n, " units"));
    for (size_t i = 0; i < n; ++i) {
      if (units[i] < 0 || units[i] > (1 << 30)) {
        return Malformed(path, kLayoutUnits,
                         absl::StrCat("has an invalid unit for parameter #", i));
      }
      params[i].unit = static_cast<int>(units[i]);
    }
  }
  std::vector<int> order(n);
  for (size_t i = 0; i < n; ++i) {
    if (order64[i] < 0 || order64[i] >= static_cast<int64_t>(n)) {
      return Malformed(path, kLayoutOrder, absl::StrCat("lists parameter index ", order64[i]));
    }
    order[i] = static_cast<int>(order64[i]);
  }
  sched::PlanOptions o;
  o.bucket_cap_bytes = static_cast<size_t>(opt[0]);
  o.first_bucket_cap_bytes = static_cast<size_t>(opt[1]);
  o.shards = static_cast<int>(opt[2]);
  o.align_bytes = static_cast<size_t>(opt[3]);
  absl::StatusOr<sched::BucketPlan> plan =
      sched::BucketPlan::BuildInOrder(std::move(params), order, o);
  if (!plan.ok())
    return Malformed(path, kLayoutParams,
                     absl::StrCat("describes no valid plan: ", plan.status().message()));
  if (plan->Fingerprint() != file.header().plan_fingerprint) {
    return absl::DataLossError(absl::StrCat("state file ", path,
                                            ": the layout sections do not reproduce the plan "
                                            "fingerprint of its header (corrupt, or edited)"));
  }
  return plan;
}

absl::Status CheckSameParams(const std::vector<sched::ParamSpec>& have,
                             const std::vector<sched::ParamSpec>& want, const std::string& path) {
  const size_t n = std::min(have.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    const sched::ParamSpec &a = have[i], &b = want[i];
    if (a.id != b.id) {
      return absl::FailedPreconditionError(absl::StrCat("state file ", path, ": parameter #", i,
                                                        " is ", a.Label(), " in the file, ",
                                                        b.Label(), " here"));
    }
    if (a.count != b.count || a.dtype != b.dtype) {
      return absl::FailedPreconditionError(absl::StrCat("state file ", path, ": parameter #", i,
                                                        " ", b.Label(), " has ", Describe(a),
                                                        " in the file, ", Describe(b), " here"));
    }
  }
  if (have.size() != want.size()) {
    const bool file_longer = have.size() > want.size();
    return absl::FailedPreconditionError(absl::StrCat(
        "state file ", path, ": it holds ", have.size(), " parameters, here there are ",
        want.size(), " (parameter ", (file_longer ? have : want)[n].Label(), " is only ",
        file_longer ? "in the file" : "here", ")"));
  }
  return absl::OkStatus();
}

}  // namespace braid::optim
