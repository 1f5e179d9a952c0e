// ReducePlan: how the mpi backend gets Braid's reduction semantics (comm/reduce_op.h) out of
// MPI's built-in MPI_SUM / MPI_MAX / MPI_MIN. Pure decisions, no MPI calls.
//
//   ReducePlan p = PlanReduce(DType::kBF16, ReduceOp::Avg(), /*group_size=*/4);
//   // p.wire == kF32, p.stage_input, p.narrow_output, p.divide_by == 4: widen the input into
//   // f32 staging, MPI_SUM it as MPI_FLOAT, then narrow once into recv dividing by 4.
//
//   dtype      op          input                      MPI op    finishing step
//   bf16/f16   any         widen to f32 staging (and  sum/max/  narrow f32 -> dtype once,
//                          scale by own scalar if     min       dividing by n for avg
//                          premul)
//   f32/f64    premul_sum  scale into staging         sum       -
//   f32/f64    avg         as is                      sum       divide by n in place
//   any        sum/max/min as is                      same      -
//   bf16/f16   sum/avg/    as is (premul: scaled into  half sum  avg: divide by n in place
//   half_wire  premul      dtype staging)              (own op)
// half_wire (CollectiveOptions): 2 bytes per element on the wire; the backend's half-sum op
// widens each pair to f32, adds and rounds back (RNE) at every hop, in the association MPI's
// algorithm picks (NCCL's half sum). Without it (the default), halves cross as f32 and are
// rounded once. max/min ignore half_wire.
// Staging never touches the caller's send buffer. avg/premul on integers never get here
// (comm/group.cc rejects them).
#ifndef BRAID_BACKENDS_MPI_REDUCE_PLAN_H_
#define BRAID_BACKENDS_MPI_REDUCE_PLAN_H_

#include "comm/dtype.h"
#include "comm/reduce_kernels.h"
#include "comm/reduce_op.h"

namespace braid::mpi {

struct ReducePlan {
  DType wire = DType::kF32;              // what MPI reduces
  ReduceKind mpi_op = ReduceKind::kSum;  // kSum, kMax or kMin: an MPI built-in op
  bool stage_input = false;              // convert / scale the input into an owned buffer
  ScaleSpec input_scale;                 // applied while staging (premul: own scalar)
  bool narrow_output = false;            // result is in wire-typed staging, narrowed to recv
  int divide_by = 0;                     // > 0: divide the result by this (avg)
};

ReducePlan PlanReduce(DType dtype, const ReduceOp& op, int group_size, bool half_wire = false);

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_REDUCE_PLAN_H_
