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

absl::Status SyncStream(const std::shared_ptr<CudaApi>& cuda, cudaStream_t stream,
                        absl::Duration timeout) {
  absl::Status s = WaitForStream(cuda, stream, absl::Now() + timeout);
  if (absl::IsDeadlineExceeded(s)) return absl::DeadlineExceededError("compute stream sync");
  return s;
}

// Queues copies of every parameter (model dtype) into `got` on `stream`; the caller syncs.
absl::Status QueueParamCopies(RankStack& st, const std::shared_ptr<CudaApi>& cuda,
                              const OptScenario& s, cudaStream_t stream,
                              std::vector<std::vector<uint8_t>>* got) {
  got->assign(s.counts.size(), {});
  for (size_t i = 0; i < s.counts.size(); ++i) {
    ASSIGN_OR_RETURN(TensorView v, st.gatherer->ParamView(static_cast<sched::ParamId>(i)));
    (*got)[i].assign(v.count * DTypeSize(s.dtype), 0);
    RETURN_IF_ERROR(CudaStatus(*cuda,
                               cuda->MemcpyAsync((*got)[i].data(), v.data, (*got)[i].size(),
                                                 cudaMemcpyDeviceToHost, stream),
                               "cudaMemcpyAsync (parameters to host)"));
  }
  return absl::OkStatus();
}

absl::Status Compare(int r, int steps, const OptScenario& s,
                     const std::vector<std::vector<uint8_t>>& got) {
  const size_t es = DTypeSize(s.dtype);
  const auto want = ReferenceParams(s, steps);
  for (size_t i = 0; i < s.counts.size(); ++i) {
    if (got[i] == want[i]) continue;
    size_t j = 0;
    while (j + 1 < s.counts[i] && std::memcmp(&got[i][j * es], &want[i][j * es], es) == 0) ++j;
    return absl::InternalError(absl::StrCat(
        "rank ", r, ": parameter ", i, " differs from the reference after ", steps,
        " steps, first at element ", j, ": got ", LoadElement(got[i].data(), s.dtype, j), ", want ",
        LoadElement(want[i].data(), s.dtype, j)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankStack>> BuildDeviceStack(
    Group& world, std::shared_ptr<optim::DeviceStepKernels> kernels, const OptScenario& s,
    absl::Duration timeout) {
  if (world.size() != s.replicas * s.shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("the scenario needs ", s.replicas * s.shards, " ranks"));
  }
  return optim::testing::BuildStack(world, s,
                                    {Device{DeviceType::kCuda, 0}, std::move(kernels), timeout});
}

absl::StatusOr<std::vector<std::vector<uint8_t>>> DeviceParams(RankStack& st,
                                                               std::shared_ptr<CudaApi> cuda,
                                                               const OptScenario& s,
                                                               absl::Duration timeout) {
  std::vector<std::vector<uint8_t>> got;
  ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(cuda, "parameter read-back"));
  absl::Status queued = QueueParamCopies(st, cuda, s, stream.get(), &got);
  absl::Status synced = SyncStream(cuda, stream.get(), timeout);  // also after a failed queue
  RETURN_IF_ERROR(queued);
  RETURN_IF_ERROR(synced);
  return got;
}

absl::Status RunDeviceSteps(RankStack& st, std::shared_ptr<CudaApi> cuda, const OptScenario& s,
                            int first, int last, absl::Duration timeout, bool pass_events,
                            bool compare) {
  const int r = st.world_rank;
  const int P = static_cast<int>(s.counts.size());
  const size_t es = DTypeSize(s.dtype);
  // The framework's gradients: a host mirror of what the compute stream wrote.
  std::vector<std::vector<uint8_t>> mirror(P);
  // Declared after the buffers its queued copies touch: destroyed (and drained) first.
  ASSIGN_OR_RETURN(CudaStream compute, CudaStream::Create(cuda, "compute stream"));
  for (int t = first; t < last; ++t) {
    for (int i = 0; i < P; ++i) mirror[i].assign(s.counts[i] * es, 0);  // zeroed by the last step
    // What each queued copy reads: never written after its copy is queued (stable addresses);
    // drained by the sync at the end of the step.
    std::deque<std::vector<uint8_t>> step_snaps;
    for (int u = 0; u < static_cast<int>(s.schedule.size()); ++u) {
      RETURN_IF_ERROR(st.opt->BeginBackward(s.schedule[u]));
      std::vector<CudaEvent> events(P);
      for (auto& e : events) {
        ASSIGN_OR_RETURN(e, CudaEvent::Create(cuda));
      }
      std::vector<int> order(P);
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 rng(static_cast<uint32_t>(r * 1000 + t * 10 + u));
      std::shuffle(order.begin(), order.end(), rng);
      // Divergent scenarios (s.agree): this rank's unused parameters, declared or left unmarked.
      std::vector<sched::ParamId> unused;
      for (int i = 0; i < P; ++i) {
        if (!optim::testing::UsedIn(r, t, u, i, s)) unused.push_back(i);
      }
      if (s.agree == sched::UnusedAgreement::kDeclared) {
        RETURN_IF_ERROR(st.reducer->DeclareUnused(unused));
      }
      for (int i : order) {
        if (!optim::testing::UsedIn(r, t, u, i, s)) continue;
        ASSIGN_OR_RETURN(TensorView g, st.reducer->GradView(i));
        for (size_t j = 0; j < g.count; ++j) {
          StoreElement(mirror[i].data(), s.dtype, j,
                       static_cast<float>(LoadElement(mirror[i].data(), s.dtype, j)) +
                           Grad(r, t, u, i, j, s));
        }
        // As RunSteps (tests/optim): the last rank's bad gradient element at s.inf_step.
        if (t == s.inf_step && r == st.world_size - 1 &&
            u + 1 == static_cast<int>(s.schedule.size()) && i == 0) {
          StoreElement(mirror[i].data(), s.dtype, 0, s.bad_value);
        }
        step_snaps.push_back(mirror[i]);
        RETURN_IF_ERROR(
            CudaStatus(*cuda,
                       cuda->MemcpyAsync(g.data, step_snaps.back().data(), mirror[i].size(),
                                         cudaMemcpyHostToDevice, compute.get()),
                       "cudaMemcpyAsync (gradient)"));
        RETURN_IF_ERROR(CudaStatus(*cuda, cuda->EventRecord(events[i].get(), compute.get()),
                                   "cudaEventRecord"));
        RETURN_IF_ERROR(
            st.reducer->MarkReady(i, pass_events ? DeviceEvent{events[i].get()} : DeviceEvent{}));
      }
      RETURN_IF_ERROR(st.opt->FinishBackward());
      // A reduce_scatter_only microbatch consumed the gradients (its shard is kept as a
      // partial sum) and the views start from zero again, as in RunSteps (tests/optim).
      if (s.schedule[u] == optim::testing::SyncMode::kReduceScatterOnly) {
        for (int i = 0; i < P; ++i) mirror[i].assign(s.counts[i] * es, 0);
      }
    }
    if (!s.opt.overlap) RETURN_IF_ERROR(st.opt->Step());
    RETURN_IF_ERROR(st.opt->WaitAllParams());
    std::vector<std::vector<uint8_t>> got;
    absl::Status queued =
        compare ? QueueParamCopies(st, cuda, s, compute.get(), &got) : absl::OkStatus();
    RETURN_IF_ERROR(SyncStream(cuda, compute.get(), timeout));  // also drains the gradient copies
    RETURN_IF_ERROR(queued);
    if (compare) RETURN_IF_ERROR(Compare(r, t + 1, s, got));
  }
  return absl::OkStatus();
}

absl::Status RunDeviceOptimizer(Group& world, std::shared_ptr<CudaApi> cuda,
                                std::shared_ptr<optim::DeviceStepKernels> kernels,
                                const OptScenario& s, absl::Duration timeout, bool pass_events) {
  ASSIGN_OR_RETURN(std::unique_ptr<RankStack> st,
                   BuildDeviceStack(world, std::move(kernels), s, timeout));
  RETURN_IF_ERROR(RunDeviceSteps(*st, cuda, s, 0, s.steps, timeout, pass_events));
  return optim::testing::CheckReport(*st, s);
}

}  // namespace braid::nccl::testing
