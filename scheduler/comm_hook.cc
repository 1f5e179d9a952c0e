#include "scheduler/comm_hook.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/status_macros.h"

namespace braid::sched {
namespace {

// One rank's hook as all-gathered: its name (truncated, zero-padded) and a hash of all of it.
constexpr size_t kNameBytes = 56;
struct HookRecord {
  char name[kNameBytes];
  uint64_t hash;
};

uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

HookRecord RecordOf(const CommHook* hook) {
  HookRecord r;
  std::memset(&r, 0, sizeof(r));
  const std::string name = hook == nullptr ? "" : hook->name();
  std::memcpy(r.name, name.data(), std::min(name.size(), kNameBytes - 1));
  r.hash = hook == nullptr ? 0 : Fnv1a(name) | 1;  // nonzero: a hook, even an unnamed one
  return r;
}

std::string Shown(const HookRecord& r) {
  return r.hash == 0 ? "none" : absl::StrCat("'", r.name, "'");
}

}  // namespace

absl::string_view CommStageName(CommStage stage) {
  switch (stage) {
    case CommStage::kAllReduce:
      return "allreduce";
    case CommStage::kReduceScatter:
      return "reduce_scatter";
    case CommStage::kReplicaAllReduce:
      return "allreduce (replicas)";
  }
  return "?";
}

absl::Status VerifyCommHookAcrossRanks(const CommHook* hook, Group& group, absl::Duration timeout) {
  const int n = group.size();
  const HookRecord mine = RecordOf(hook);
  std::vector<HookRecord> all(n);
  CollectiveOptions opts;
  opts.label = "comm hook check";
  ASSIGN_OR_RETURN(WorkPtr w,
                   group.AllGather(&mine, all.data(), sizeof(HookRecord), DType::kU8, opts));
  RETURN_IF_ERROR(w->Wait(timeout));
  bool same = true;
  for (const HookRecord& r : all) same = same && r.hash == mine.hash;
  if (!same) {
    std::vector<std::string> each;
    for (int r = 0; r < n && r < 8; ++r)
      each.push_back(absl::StrCat(Shown(all[r]), " on rank ", r));
    return absl::FailedPreconditionError(absl::StrCat(
        "comm hook differs across the ranks of group '", group.name(),
        "': ", absl::StrJoin(each, ", "), n > 8 ? absl::StrCat(" (and ", n - 8, " more)") : "",
        "; register the same hook on every rank"));
  }
  if (hook == nullptr || hook->Options().empty()) return absl::OkStatus();
  return VerifyOptionsAcrossRanks(absl::StrCat("comm hook '", hook->name(), "' options"),
                                  hook->Options(), group, timeout);
}

absl::Status CommHookError(absl::string_view label, const CommHook& hook, CommStage stage,
                           const absl::Status& st) {
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat(label, ": comm hook '", hook.name(), "' (",
                                              CommStageName(stage), "): ", st.message()));
}

}  // namespace braid::sched
