// Braid's element types and reduction kinds as MPI handles.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<MpiOps> ops, MpiOps::Create());   // once, after MPI_Init
//   MPI_Iallreduce(s, r, n, MpiDatatype(DType::kI64), ops->For(ReduceKind::kMax, DType::kI64),
//                  comm, &request);
//
// bf16/f16 map to MPI_UINT16_T: MPI moves their bits (broadcast, all-gather); their sums go
// through f32 staging, or with CollectiveOptions::half_wire through a half-sum op of our own
// (each pair widened to f32, added, rounded back; see reduce_plan.h).
//
// u8 sums use an op of our own: Open MPI 4.1.0-4.1.4's AVX op component (the one Debian
// ships) saturates 8-bit MPI_SUM instead of wrapping, which breaks Braid's "integer sums
// wrap" rule (200 + 200 gives 255, not 144).
#ifndef BRAID_BACKENDS_MPI_MPI_TYPES_H_
#define BRAID_BACKENDS_MPI_MPI_TYPES_H_

#include <mpi.h>

#include <memory>

#include "absl/status/statusor.h"
#include "comm/dtype.h"
#include "comm/reduce_op.h"

namespace braid::mpi {

MPI_Datatype MpiDatatype(DType t);

// The MPI ops of the backend; the user-defined ones are freed with this object (before
// MPI_Finalize). Create and destroy it under the MPI lock, or before other threads call MPI.
class MpiOps {
 public:
  static absl::StatusOr<std::unique_ptr<MpiOps>> Create();
  ~MpiOps();
  MpiOps(const MpiOps&) = delete;
  MpiOps& operator=(const MpiOps&) = delete;

  // The op reducing `wire` elements for kSum, kMax or kMin (avg and premul are planned onto
  // kSum, see reduce_plan.h).
  MPI_Op For(ReduceKind k, DType wire) const;

 private:
  MpiOps() = default;
  MPI_Op wrapping_u8_sum_ = MPI_OP_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  MPI_Op f16_sum_ = MPI_OP_NULL;
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_MPI_TYPES_H_
