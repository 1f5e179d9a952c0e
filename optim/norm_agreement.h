// NormAgreement: the global gradient norm of a sharded step and the ranks' agreement on it.
// Each rank sums its shards' squared norms (host: HostSquaredNorm; device: block sums queued on
// the shard group's stream, fetched with one host wait), then one all-reduce of 2 doubles
// {sum of squares, ranks that failed} over the optimizer's own split of the shard group gives
// every rank the same norm and the same decision (clip, skip a non-finite step, drop a failed
// one). Load uses the same all-reduce to agree on its files.
//
//   ASSIGN_OR_RETURN(auto agree, NormAgreement::Create(shard_group, on_device, clipping,
//                                                      shards, memory));
//   double sumsq = ..., failed = 0;
//   RETURN_IF_ERROR(agree->Sum2(agree->group(), &sumsq, &failed, deadline));
//   const double scale = NormAgreement::ClipScale(max_grad_norm, std::sqrt(sumsq));
//
// Contract: Create is collective over the shard group (one Split). Sum2 is collective over `g`
// and not thread-safe (one step or Load at a time). The all-reduce's buffer outlives the
// group, so one that outlived its wait never writes freed memory. Device block sums are bit
// for bit the host's SquaredNormF64 blocks (optim/norm_math.h).
#ifndef BRAID_OPTIM_NORM_AGREEMENT_H_
#define BRAID_OPTIM_NORM_AGREEMENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/buffer_ops.h"
#include "comm/group.h"
#include "optim/optimizer_shard.h"
#include "optim/step_kernels.h"
#include "scheduler/memory_stats.h"

namespace braid::optim {

class NormAgreement {
 public:
  // `device_norms` (device parameters with clipping or skip_nonfinite): sets each shard's
  // norm_offset and allocates the block sums of every shard.
  static absl::StatusOr<std::unique_ptr<NormAgreement>> Create(Group& shard, bool on_device,
                                                               bool device_norms,
                                                               std::vector<OptimizerShard>& shards,
                                                               sched::MemoryStats* memory);
  NormAgreement(const NormAgreement&) = delete;
  NormAgreement& operator=(const NormAgreement&) = delete;

  // The optimizer's split of the shard group (its all-reduces never interleave the reducer's).
  Group& group() const { return *group_; }

  // Sums *x and *y over `g` (group(), or the replica group) in place; waits until `deadline`.
  // On device the sum runs in device memory (copied in and out on g's stream).
  absl::Status Sum2(Group& g, double* x, double* y, absl::Time deadline);

  // Device: queues the block sums of `shard`'s gradient `grad` (bucket dtype) on `ops`' stream
  // after a wait on `reduced`; the error names the bucket and `group_name`.
  absl::Status QueueDeviceNorm(DeviceStepKernels& kernels, const OptimizerShard& shard, DType dtype,
                               const char* grad, BufferOps& ops, DeviceEvent reduced,
                               const std::string& group_name);
  // Device: copies every block sum to the host and waits for `ops`' stream (the one host wait
  // of a clipped device step).
  absl::Status FetchDeviceNorms(BufferOps& ops, absl::Time deadline);
  // Device, after FetchDeviceNorms: the shard's squared norm, its segments' block sums added
  // in the host's order (the same bits as HostSquaredNorm).
  double DeviceSquaredNorm(const OptimizerShard& shard) const;

  // As torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), clamped to 1.
  static double ClipScale(double max_norm, double norm);

 private:
  NormAgreement() = default;

  bool on_device_ = false;
  // Declared before group_: destroyed after it.
  std::unique_ptr<double[]> stats_;  // the all-reduce's 2 doubles (host)
  OwnedBuffer stats_dev_;            // device: the all-reduce's 2 doubles
  OwnedBuffer norm_dev_;             // device: every shard's norm block sums
  std::vector<double> norm_host_;    // their host copy (FetchDeviceNorms)
  std::unique_ptr<Group> group_;
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_NORM_AGREEMENT_H_
