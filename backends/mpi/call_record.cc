#include "backends/mpi/call_record.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::mpi {
namespace {

bool Reduces(int64_t kind) {
  return kind == static_cast<int64_t>(CollectiveKind::kAllReduce) ||
         kind == static_cast<int64_t>(CollectiveKind::kReduceScatter);
}

bool SameCall(const CallRecord& a, const CallRecord& b) {
  if (a.tag != b.tag) return false;
  if (a.tag == CallRecord::kSplit) return true;
  return a.kind == b.kind && a.count == b.count && a.dtype == b.dtype && a.op == b.op &&
         a.root == b.root && a.half_wire == b.half_wire;
}

}  // namespace

CallRecord CollectiveRecord(const CollectiveArgs& args, int world_rank) {
  CallRecord r;
  r.tag = CallRecord::kCollective;
  r.world_rank = world_rank;
  r.kind = static_cast<int64_t>(args.kind);
  if (args.kind == CollectiveKind::kBarrier) return r;
  r.count = static_cast<int64_t>(args.count);
  r.dtype = static_cast<int64_t>(args.dtype);
  if (Reduces(r.kind)) {
    r.op = static_cast<int64_t>(args.op.kind);
    r.half_wire = IsHalf(args.dtype) && args.options.half_wire ? 1 : 0;
  }
  if (args.kind == CollectiveKind::kBroadcast) r.root = args.root;
  return r;
}

CallRecord SplitRecord(int color, int key, int world_rank) {
  CallRecord r;
  r.tag = CallRecord::kSplit;
  r.world_rank = world_rank;
  r.color = color;
  r.key = key;
  return r;
}

std::string DescribeRecord(const CallRecord& r) {
  if (r.tag == CallRecord::kSplit) return absl::StrCat("split color=", r.color, " key=", r.key);
  if (r.tag != CallRecord::kCollective) return absl::StrCat("unknown call (tag ", r.tag, ")");
  const auto kind = static_cast<CollectiveKind>(r.kind);
  std::string s(CollectiveName(kind));
  if (kind == CollectiveKind::kBarrier) return s;
  absl::StrAppend(&s, " count=", r.count, " dtype=");
  if (IsValidDType(static_cast<int>(r.dtype))) {
    absl::StrAppend(&s, DTypeName(static_cast<DType>(r.dtype)));
  } else {
    absl::StrAppend(&s, "?", r.dtype);
  }
  if (Reduces(r.kind)) absl::StrAppend(&s, " op=", ReduceKindName(static_cast<ReduceKind>(r.op)));
  if (r.half_wire != 0) absl::StrAppend(&s, " half_wire");
  if (kind == CollectiveKind::kBroadcast) absl::StrAppend(&s, " root=", r.root);
  return s;
}

absl::Status CheckSameCall(const std::vector<CallRecord>& table, absl::string_view what) {
  if (table.empty()) return absl::OkStatus();
  bool same = true;
  for (const CallRecord& r : table) same = same && SameCall(table.front(), r);
  if (same) return absl::OkStatus();
  std::vector<std::string> calls;
  for (const CallRecord& r : table) {
    calls.push_back(absl::StrCat("rank ", r.world_rank, ": ", DescribeRecord(r)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what,
                   ": ranks called different collectives (the rank-order contract was broken or "
                   "arguments differ): ",
                   absl::StrJoin(calls, "; ")));
}

absl::Status CheckSplitColors(const std::vector<CallRecord>& table, absl::string_view group) {
  for (const CallRecord& r : table) {
    if (r.color < kNoColor) {
      return absl::InvalidArgumentError(
          absl::StrCat("split of group '", group, "': rank ", r.world_rank, " passed color ",
                       r.color, "; a color must be >= 0, or kNoColor (-1) to join no group"));
    }
  }
  return absl::OkStatus();
}

}  // namespace braid::mpi
