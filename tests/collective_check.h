// One collective, run as one rank and checked against a serial reference.
//
// Every rank can regenerate every other rank's input from (seed, rank), so a rank checks its
// own output without exchanging data: the same check serves threads on `local`, processes
// under mpirun, and plugins.
//
//   CollectiveCase c{CollectiveKind::kAllReduce, ReduceKind::kAvg, DType::kBF16, 37,
//                    /*in_place=*/true};
//   EXPECT_OK(RunAndCheck(group, c));   // a mismatch names the first differing element
//
// The reference follows the semantics in comm/reduce_op.h in plain scalar code: inputs in
// rank order 0..n-1, f32 accumulation for bf16/f16, one rounding at the end. Backends with a
// fixed order must match it bit for bit. With `exact_data` the inputs are small multiples of
// 1/4 (and premul scalars powers of two) so every partial sum is exact and any reduction order
// gives the same bits: that is how transports with their own order (MPI) are held to bit
// equality too.
#ifndef BRAID_TESTS_COLLECTIVE_CHECK_H_
#define BRAID_TESTS_COLLECTIVE_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/group.h"

namespace braid::testing {

// The first axis of every backend's test matrix: each collective, and each reduce op of the
// reducing ones.
struct CollectiveVariant {
  CollectiveKind kind;
  ReduceKind op;
};
inline constexpr CollectiveVariant kCollectiveVariants[] = {
    {CollectiveKind::kAllReduce, ReduceKind::kSum},
    {CollectiveKind::kAllReduce, ReduceKind::kAvg},
    {CollectiveKind::kAllReduce, ReduceKind::kPreMulSum},
    {CollectiveKind::kAllReduce, ReduceKind::kMax},
    {CollectiveKind::kAllReduce, ReduceKind::kMin},
    {CollectiveKind::kReduceScatter, ReduceKind::kSum},
    {CollectiveKind::kReduceScatter, ReduceKind::kAvg},
    {CollectiveKind::kReduceScatter, ReduceKind::kPreMulSum},
    {CollectiveKind::kReduceScatter, ReduceKind::kMax},
    {CollectiveKind::kReduceScatter, ReduceKind::kMin},
    {CollectiveKind::kAllGather, ReduceKind::kSum},
    {CollectiveKind::kBroadcast, ReduceKind::kSum},
    {CollectiveKind::kBarrier, ReduceKind::kSum},
};
// Element counts every backend is checked at: none, one, odd, and large (not a multiple of any
// chunk alignment).
inline constexpr size_t kCheckSizes[] = {0, 1, 37, 65536 + 13};

inline bool Reduces(CollectiveKind k) {
  return k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduceScatter;
}

struct CollectiveCase {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  ReduceKind op = ReduceKind::kSum;
  DType dtype = DType::kF32;
  size_t count = 0;  // NCCL's count: recvcount for reduce-scatter, sendcount for all-gather
  bool in_place = false;
  bool exact_data = false;
  uint64_t seed = 1;
  int root = 0;  // broadcast
  // The reference computes NCCL's arithmetic instead (rank order still): avg as a sum
  // pre-multiplied by 1/n in the dtype, pre-mul-sum scalars in the dtype, bf16/f16 rounded
  // after every multiply and add (the fake NCCL does the same: tests/nccl/fake_nccl_reduce.h).
  bool nccl_arithmetic = false;
};

std::string CaseName(const CollectiveCase& c);

// Input of `rank` for element count `elems`.
std::vector<uint8_t> MakeInput(DType dtype, size_t elems, int rank, uint64_t seed, bool exact);
// Premul scalar used by `rank` (NCCL's premul scalar is per rank).
double PremulScalar(int rank, bool exact);

// Serial reference: what `rank` must hold after the collective, for a group of `n`.
std::vector<uint8_t> ReferenceOutput(const CollectiveCase& c, int n, int rank);

// Launches `kind` with reduce op `op` on a few elements of `dtype` and returns the launch's
// status only (nothing is waited for): for checking that bad combinations are refused up front.
absl::Status LaunchStatus(Group& g, CollectiveKind kind, DType dtype, ReduceKind op);

// Why a matrix cell (variant x dtype x in-place) does not exist, or nullptr if it does:
// broadcast and barrier have a single form, and a barrier has no dtype.
const char* MatrixSkipReason(const CollectiveVariant& k, DType dtype, bool in_place);
// avg and premul_sum on integer dtypes: refused up front (see LaunchStatus).
bool RefusedUpFront(const CollectiveVariant& k, DType dtype);

// One matrix cell (variant x dtype x in-place) at every kCheckSizes count, on `g`, with the
// broadcast root at the last rank; the first failure is returned.
absl::Status CheckAllSizes(Group& g, const CollectiveVariant& k, DType dtype, bool in_place);
// "allreduce_avg_bf16_r4_inplace": a gtest name for a matrix cell on `ranks` ranks.
std::string MatrixCaseName(const CollectiveVariant& k, DType dtype, int ranks, bool in_place);

// Runs `c` on `g` as rank g.rank(), waits (up to `timeout`), and compares. Also checks that an
// out-of-place call left its send buffer untouched.
absl::Status RunAndCheck(Group& g, const CollectiveCase& c,
                         absl::Duration timeout = absl::Seconds(60));

}  // namespace braid::testing

#endif  // BRAID_TESTS_COLLECTIVE_CHECK_H_
