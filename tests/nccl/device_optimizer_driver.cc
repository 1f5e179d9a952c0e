#include "tests/nccl/device_optimizer_driver.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/nccl/cuda_handles.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/poll.h"
#include "comm/element.h"
#include "comm/status_macros.h"

namespace braid::nccl::testing {

using optim::testing::Grad;
using optim::testing::InitialValue;
using optim::testing::OptScenario;
using optim::testing::RankStack;
using optim::testing::ReferenceParams;

namespace {

absl::Status SyncStream(const std::shared_ptr<CudaApi>& cuda, cudaStream_t stream, absl::Duration timeout) {
  absl::Status s = WaitForStream(cuda, stream, absl::Now() + timeout);
  if (absl::IsDeadlineExceeded(s)) return absl::DeadlineExceededError("compute stream sync");
  return s;
}

}  // namespace

absl::Status RunDeviceOptimizer(Group& world, std::shared_ptr<CudaApi> cuda,
                                std::shared_ptr<optim::DeviceStepKernels> kernels, const OptScenario& s,
                                absl::Duration timeout, bool pass_events) {
  if (world.size() != s.replicas * s.shards) {
    return absl::InvalidArgumentError(absl::StrCat("the scenario needs ", s.replicas * s.shards, " ranks"));
  }
  const int r = world.rank();
  const int P = static_cast<int>(s.counts.size());
  const size_t es = DTypeSize(s.dtype);
  ASSIGN_OR_RETURN(std::unique_ptr<RankStack> st,
                   optim::testing::BuildStack(world, s, {Device{DeviceType::kCuda, 0}, std::move(kernels), timeout}));
  // The framework's gradients: a host mirror of what the compute stream wrote.
  std::vector<std::vector<uint8_t>> mirror(P);
  // Declared after the buffers its queued copies touch: destroyed (and drained) first.
  ASSIGN_OR_RETURN(CudaStream compute, CudaStream::Create(cuda, "compute stream"));
  for (int t = 0; t < s.steps; ++t) {
    for (int i = 0; i < P; ++i) mirror[i].assign(s.counts[i] * es, 0);  // zeroed by the last step
    // What each queued copy reads: never written after its copy is queued (stable addresses);
    // drained by the sync at the end of the step.
    std::deque<std::vector<uint8_t>> step_snaps;
    for (int u = 0; u < static_cast<int>(s.schedule.size()); ++u) {
      RETURN_IF_ERROR(st->opt->BeginBackward(s.schedule[u]));
      std::vector<CudaEvent> events(P);
      for (auto& e : events) {
        ASSIGN_OR_RETURN(e, CudaEvent::Create(cuda));
      }
      std::vector<int> order(P);
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 rng(static_cast<uint32_t>(r * 1000 + t * 10 + u));
      std::shuffle(order.begin(), order.end(), rng);
      for (int i : order) {
        ASSIGN_OR_RETURN(TensorView g, st->reducer->GradView(i));
        for (size_t j = 0; j < g.count; ++j) {
          StoreElement(mirror[i].data(), s.dtype, j,
                       static_cast<float>(LoadElement(mirror[i].data(), s.dtype, j)) + Grad(r, t, u, i, j, s));
        }
        step_snaps.push_back(mirror[i]);
        RETURN_IF_ERROR(CudaStatus(*cuda, cuda->MemcpyAsync(g.data, step_snaps.back().data(), mirror[i].size(),
                                                            cudaMemcpyHostToDevice, compute.get()),
                                   "cudaMemcpyAsync (gradient)"));
        RETURN_IF_ERROR(CudaStatus(*cuda, cuda->EventRecord(events[i].get(), compute.get()), "cudaEventRecord"));
        RETURN_IF_ERROR(st->reducer->MarkReady(i, pass_events ? DeviceEvent{events[i].get()} : DeviceEvent{}));
      }
      RETURN_IF_ERROR(st->opt->FinishBackward());
    }
    if (!s.opt.overlap) RETURN_IF_ERROR(st->opt->Step());
    RETURN_IF_ERROR(st->opt->WaitAllParams());
    std::vector<std::vector<uint8_t>> got(P);
    for (int i = 0; i < P; ++i) {
      ASSIGN_OR_RETURN(TensorView v, st->gatherer->ParamView(i));
      got[i].assign(v.count * es, 0);
      RETURN_IF_ERROR(CudaStatus(*cuda, cuda->MemcpyAsync(got[i].data(), v.data, got[i].size(),
                                                          cudaMemcpyDeviceToHost, compute.get()),
                                 "cudaMemcpyAsync (parameters to host)"));
    }
    RETURN_IF_ERROR(SyncStream(cuda, compute.get(), timeout));  // also drains the gradient copies
    const auto want = ReferenceParams(s, t + 1);
    for (int i = 0; i < P; ++i) {
      if (got[i] == want[i]) continue;
      size_t j = 0;
      while (j + 1 < s.counts[i] && std::memcmp(&got[i][j * es], &want[i][j * es], es) == 0) ++j;
      return absl::InternalError(absl::StrCat("rank ", r, ": parameter ", i, " differs from the reference after ",
                                              t + 1, " steps, first at element ", j, ": got ",
                                              LoadElement(got[i].data(), s.dtype, j), ", want ",
                                              LoadElement(want[i].data(), s.dtype, j)));
    }
  }
  const optim::StepReport rep = st->opt->last_step();
  if (rep.rounds != s.steps) return absl::InternalError(absl::StrCat("rounds ", rep.rounds, ", want ", s.steps));
  RETURN_IF_ERROR(rep.error);
  return absl::OkStatus();
}

}  // namespace braid::nccl::testing
