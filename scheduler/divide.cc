#include "scheduler/divide.h"

namespace braid::sched {

int PreDivideFactor(int n) {
  int factor = 1;
  while (n % factor == 0 && n / factor > factor) factor *= 2;  // FSDP's rule
  while (n % factor != 0) factor /= 2;  // pre * post must be exactly n (FSDP: 6 -> 4)
  return factor;
}

ReduceStep StepFor(DType dtype, int group_size) {
  if (group_size <= 1) return {ReduceOp::Sum(), 1};
  if (dtype == DType::kF16) {
    const int pre = PreDivideFactor(group_size);
    return {pre > 1 ? ReduceOp::PreMulSum(1.0 / pre) : ReduceOp::Sum(), group_size / pre};
  }
  return {ReduceOp::Avg(), 1};
}

ReduceStep StepForContributors(int contributors, int stage) {
  if (stage != 0 || contributors <= 1) return {ReduceOp::Sum(), 1};
  return {ReduceOp::PreMulSum(1.0 / contributors), 1};
}

}  // namespace braid::sched
