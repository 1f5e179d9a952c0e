// CallRecord: what one rank says it is calling on a group, gathered from every rank to catch
// calls that do not match (BRAID_VALIDATE_COLLECTIVES) and to carry Split's (color, key).
//
//   CallRecord mine = CollectiveRecord(args, world_rank);
//   std::vector<CallRecord> table(group_size);
//   MPI_Iallgather(&mine, CallRecord::kWords, MPI_INT64_T,
//                  table.data(), CallRecord::kWords, MPI_INT64_T, comm, &request);
//   ... once complete:
//   RETURN_IF_ERROR(CheckSameCall(table, "reduce_scatter #4 on group 'world'"));
//
// Every field is an int64 so a record travels as kWords MPI_INT64_T. Fields that do not apply
// to a call are zero (op is -1 outside reductions), so records compare field by field.
#ifndef BRAID_BACKENDS_MPI_CALL_RECORD_H_
#define BRAID_BACKENDS_MPI_CALL_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "comm/group.h"

namespace braid::mpi {

struct CallRecord {
  static constexpr int kWords = 10;
  static constexpr int64_t kCollective = 1;
  static constexpr int64_t kSplit = 2;

  int64_t tag = 0;  // kCollective or kSplit
  int64_t world_rank = 0;
  int64_t kind = 0;   // CollectiveKind
  int64_t count = 0;  // CollectiveArgs::count
  int64_t dtype = 0;
  int64_t op = -1;        // ReduceKind for all-reduce / reduce-scatter
  int64_t root = 0;       // broadcast
  int64_t color = 0;      // split
  int64_t key = 0;        // split
  int64_t half_wire = 0;  // 1: a bf16/f16 reduction on the 2-byte wire (CollectiveOptions)
};
static_assert(sizeof(CallRecord) == CallRecord::kWords * sizeof(int64_t), "no padding");

CallRecord CollectiveRecord(const CollectiveArgs& args, int world_rank);
CallRecord SplitRecord(int color, int key, int world_rank);

// "reduce_scatter count=37 dtype=f32 op=sum", "split color=1 key=0".
std::string DescribeRecord(const CallRecord& r);

// OK when every rank made the same call (splits may differ in color and key); otherwise
// InvalidArgument naming `what` and every rank's call.
absl::Status CheckSameCall(const std::vector<CallRecord>& table, absl::string_view what);

// OK when every color is >= 0 or kNoColor; otherwise InvalidArgument naming the first rank
// (world rank) with a bad color, and the color. Identical on every rank.
absl::Status CheckSplitColors(const std::vector<CallRecord>& table, absl::string_view group);

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_CALL_RECORD_H_
