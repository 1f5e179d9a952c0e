// The GradientReducer end to end on device buffers of an `nccl` group: gradients produced on a
// "compute stream" and marked ready with events recorded there, results read back to the host
// and compared bit for bit with the serial reference (tests/reducer_reference.h). The same
// driver runs on the fake device (tests/nccl/nccl_reducer_test.cc) and on a real GPU
// (tests/nccl/nccl_reducer_gpu_test.cc).
//
//   RunFakeRanks(gpu, 4, FakeConfig(), [&](NcclGroup& world) {
//     EXPECT_OK(RunDeviceScenario(world, gpu.cuda, sc, ExactGrad, absl::Seconds(60)));
//   });
//
// The framework's side, per parameter mark: the accumulated gradient (kept in a host mirror,
// as Accumulate computes it) is copied host-to-device on the compute stream into the gradient
// (the reducer's view, or the framework's own device buffer with sc.copy_in), an event is
// recorded after the copy, and MarkReady gets it. Nothing on the host waits for the compute
// stream: only the reducer's waits order the copies before the reduction. Each step starts
// with ZeroGradsAsync, whose event the compute stream waits on (bucket views), or ZeroGrads
// (copy-in: no host wait). After a reduce_scatter_only microbatch the reducer zeroed the
// buckets, so the framework's accumulation restarts from zero. With
// `pass_events = false` MarkReady gets no event (a negative control: results are then stale).
#ifndef BRAID_TESTS_NCCL_DEVICE_REDUCER_DRIVER_H_
#define BRAID_TESTS_NCCL_DEVICE_REDUCER_DRIVER_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "backends/nccl/cuda_api.h"
#include "comm/group.h"
#include "tests/reducer_reference.h"

namespace braid::nccl::testing {

// Collective over `world` (an nccl group), like reference::RunScenario: two steps of
// sc.schedule, random readiness order per rank, marks from two threads, CheckStep after each.
absl::Status RunDeviceScenario(Group& world, std::shared_ptr<CudaApi> cuda,
                               const sched::reference::Scenario& sc, sched::reference::GradFn grad,
                               absl::Duration timeout, bool pass_events = true);

// Element i of a gradient: a multiple of 1/8 in [-1, 1], so every sum and power-of-two average
// a backend may compute in its own order is exact (NCCL's order and its ncclAvg premultiply).
double ExactGrad(int rank, int param, int microbatch, int step, size_t i);

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_DEVICE_REDUCER_DRIVER_H_
