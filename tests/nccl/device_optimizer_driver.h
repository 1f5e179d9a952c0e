// The ShardedOptimizer end to end on device buffers of an `nccl` group: reducer (reduce-scatter
// or hybrid), gatherer and optimizer on CUDA parameters, gradients produced on a "compute
// stream" and marked ready with events recorded there, the step queued on the shard group's
// stream by the optimizer's device kernels, parameters read back after every step and compared
// bit for bit with the serial unsharded reference of the CPU optimizer tests
// (tests/optim/optimizer_harness.h: Grad, InitialValue, ReferenceParams). The same driver runs
// on the fake device (nccl_optimizer_test.cc) and on a real GPU (nccl_optimizer_gpu_test.cc).
//
//   RunFakeRanks(gpu, 4, FakeConfig(), [&](NcclGroup& world) {
//     EXPECT_OK(RunDeviceOptimizer(world, gpu.cuda, kernels, TwoGroupScenario(2, 2)));
//   });
//
// With `pass_events = false` MarkReady gets no events (a control: the reductions then read
// gradients the compute stream has not written yet, and the comparison fails).
#ifndef BRAID_TESTS_NCCL_DEVICE_OPTIMIZER_DRIVER_H_
#define BRAID_TESTS_NCCL_DEVICE_OPTIMIZER_DRIVER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "backends/nccl/cuda_api.h"
#include "comm/group.h"
#include "optim/step_kernels.h"
#include "tests/optim/optimizer_harness.h"

namespace braid::nccl::testing {

// The stack of tests/optim/optimizer_harness.h on device parameters (collective over `world`,
// an nccl group of s.replicas * s.shards ranks), initial values set and gathered.
absl::StatusOr<std::unique_ptr<optim::testing::RankStack>> BuildDeviceStack(
    Group& world, std::shared_ptr<optim::DeviceStepKernels> kernels,
    const optim::testing::OptScenario& s, absl::Duration timeout = absl::Seconds(60));

// Steps [first, last) of `s` on `st` (gradients written on a compute stream, the last rank's
// bad value at s.inf_step as in RunSteps); with `compare`, the parameters after each step are
// compared with ReferenceParams bit for bit (the error names rank, step, parameter, element).
absl::Status RunDeviceSteps(optim::testing::RankStack& st, std::shared_ptr<CudaApi> cuda,
                            const optim::testing::OptScenario& s, int first, int last,
                            absl::Duration timeout = absl::Seconds(60), bool pass_events = true,
                            bool compare = true);

// Every parameter's model-dtype bytes, copied to the host.
absl::StatusOr<std::vector<std::vector<uint8_t>>> DeviceParams(
    optim::testing::RankStack& st, std::shared_ptr<CudaApi> cuda,
    const optim::testing::OptScenario& s, absl::Duration timeout = absl::Seconds(60));

// BuildDeviceStack, RunDeviceSteps over every step of `s`, then CheckReport (tests/optim).
// Collective over `world`. The error names the rank, step and parameter that differ.
absl::Status RunDeviceOptimizer(Group& world, std::shared_ptr<CudaApi> cuda,
                                std::shared_ptr<optim::DeviceStepKernels> kernels,
                                const optim::testing::OptScenario& s,
                                absl::Duration timeout = absl::Seconds(60),
                                bool pass_events = true);

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_DEVICE_OPTIMIZER_DRIVER_H_
