#include "tests/nccl/device_reducer_driver.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/nccl/cuda_handles.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/poll.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/op_scheduler.h"

namespace braid::nccl::testing {

using sched::GradientReducer;
using sched::ReduceMode;
using sched::ReducerConfig;
using sched::ReducerGroups;
using sched::reference::Scenario;

double ExactGrad(int r, int p, int m, int s, size_t i) {
  uint64_t z =
      ((((static_cast<uint64_t>(r) * 131 + p) * 17 + m) * 7 + s) << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (static_cast<int>(z % 17) - 8) / 8.0;
}

namespace {

// Waits (deadline-bounded) for everything queued on `stream` so far.
absl::Status SyncStream(const std::shared_ptr<CudaApi>& cuda, cudaStream_t stream,
                        absl::Duration timeout) {
  absl::Status s = WaitForStream(cuda, stream, absl::Now() + timeout);
  if (absl::IsDeadlineExceeded(s)) return absl::DeadlineExceededError("compute stream sync");
  return s;
}

}  // namespace

absl::Status RunDeviceScenario(Group& world, std::shared_ptr<CudaApi> cuda, const Scenario& sc,
                               sched::reference::GradFn grad, absl::Duration timeout,
                               bool pass_events) {
  using sched::reference::Accumulate;
  using sched::reference::CheckStep;
  using sched::reference::MakeParams;
  using sched::reference::SyncModeOf;
  if (world.size() != sc.replicas * sc.shards) {
    return absl::InvalidArgumentError(absl::StrCat(sched::reference::ScenarioName(sc), " needs ",
                                                   sc.replicas * sc.shards, " ranks"));
  }
  const int r = world.rank();
  Mesh mesh;
  ReducerGroups groups{&world, nullptr};
  if (sc.mode == ReduceMode::kHybrid) {
    ASSIGN_OR_RETURN(mesh, MakeMesh(world, sc.replicas, sc.shards));
    groups = {mesh.shard.get(), mesh.replica.get()};
  }
  ReducerConfig cfg;
  cfg.mode = sc.mode;
  cfg.first_bucket_cap_bytes = 256;
  cfg.bucket_cap_bytes = 4096;
  cfg.timeout = timeout;
  cfg.gradient_as_bucket_view = !sc.copy_in;
  if (sc.reduce_f32) cfg.reduce_dtype = DType::kF32;
  cfg.shard_gradients = sc.shard_gradients;
  const bool values = sc.values || sc.shard_gradients;
  std::vector<sched::ParamSpec> params = MakeParams(sc.dtypes);
  for (auto& p : params) p.device = Device{DeviceType::kCuda, 0};
  std::unique_ptr<sched::OpScheduler> scheduler;  // outlives the reducer (declared first)
  if (sc.credit > 0) {  // partitions on the device (scheduler/op_scheduler.h)
    sched::OpSchedulerConfig oc;
    oc.credit_bytes = sc.credit;
    oc.timeout = timeout;
    ASSIGN_OR_RETURN(scheduler, sched::OpScheduler::Create(oc, &world));
    cfg.scheduler = scheduler.get();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GradientReducer> red,
                   GradientReducer::Create(params, groups, cfg));
  const size_t n = params.size();
  std::vector<DeviceBuffer> own(n);  // copy-in: the framework's device gradients
  std::vector<std::vector<char>> mirror(n);
  for (size_t p = 0; p < n; ++p) {
    const size_t bytes = params[p].count * DTypeSize(params[p].dtype);
    mirror[p].assign(bytes, 0);
    if (sc.copy_in) {
      ASSIGN_OR_RETURN(own[p], DeviceBuffer::Allocate(cuda, bytes, params[p].Label()));
      RETURN_IF_ERROR(red->SetGradBuffer(params[p].id, own[p].get()));
    }
  }
  const int mbs = static_cast<int>(std::strlen(sc.schedule));
  // What each queued copy reads: a snapshot of the mirror per (step, microbatch, parameter),
  // never written after its copy is queued (the fake device copies when it gets there).
  std::vector<std::vector<char>> snapshots(static_cast<size_t>(2 * mbs) * n);
  // values: the framework's gradient of each (step, microbatch, parameter), on the device; the
  // reducer reads it on its comm stream, so it stays until the end (a synced FinishBackward
  // would do).
  std::vector<DeviceBuffer> passed(static_cast<size_t>(2 * mbs) * n);
  // Declared after the buffers the queued copies touch: destroyed (and drained) first.
  // ZeroGradsAsync's Works, held while the compute stream may wait on their events.
  std::vector<WorkPtr> zero_works;
  ASSIGN_OR_RETURN(CudaStream compute, CudaStream::Create(cuda, "compute stream"));
  std::mt19937 order_rng(1234 + 77 * r);
  for (int step = 0; step < 2; ++step) {
    if (sc.copy_in) {
      // Returns without a host wait: only the comm stream writes the buckets.
      RETURN_IF_ERROR(red->ZeroGrads());
    } else {
      // The framework's stream waits for the zeroing before writing into the views (no host
      // wait: ZeroGradsAsync's event).
      ASSIGN_OR_RETURN(WorkPtr zeroed, red->ZeroGradsAsync());
      if (zeroed->device_event()) {
        RETURN_IF_ERROR(
            CudaStatus(*cuda,
                       cuda->StreamWaitEvent(
                           compute.get(), static_cast<cudaEvent_t>(zeroed->device_event().handle)),
                       "cudaStreamWaitEvent (zeroed gradients)"));
      }
      zero_works.push_back(std::move(zeroed));  // keeps its event valid while waited on
    }
    for (size_t p = 0; p < n; ++p) {
      std::fill(mirror[p].begin(), mirror[p].end(), 0);  // the framework's zero_grad
      if (sc.copy_in) {
        RETURN_IF_ERROR(
            CudaStatus(*cuda, cuda->MemsetAsync(own[p].get(), 0, mirror[p].size(), compute.get()),
                       "cudaMemsetAsync"));
      }
    }
    for (int m = 0; m < mbs; ++m) {
      RETURN_IF_ERROR(red->BeginBackward(SyncModeOf(sc.schedule[m])));
      std::vector<CudaEvent> events(n);
      for (auto& e : events) {
        ASSIGN_OR_RETURN(e, CudaEvent::Create(cuda));
      }
      std::vector<int> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), order_rng);
      auto mark_range = [&](size_t from, size_t to) -> absl::Status {
        for (size_t k = from; k < to; ++k) {
          const int p = order[k];
          void* target = own[p].get();
          const size_t at = (static_cast<size_t>(step) * mbs + m) * n + p;
          if (values) {
            ASSIGN_OR_RETURN(passed[at],
                             DeviceBuffer::Allocate(cuda, mirror[p].size(), params[p].Label()));
            target = passed[at].get();
            std::fill(mirror[p].begin(), mirror[p].end(), 0);  // this microbatch's gradient only
          } else if (!sc.copy_in) {
            ASSIGN_OR_RETURN(TensorView v, red->GradView(params[p].id));
            target = v.data;
          }
          Accumulate(TensorView{mirror[p].data(), params[p].count, params[p].dtype, Device{}}, grad,
                     r, p, m, step);
          // The producer: its write is queued on the compute stream, the event after it.
          std::vector<char>& snap = snapshots[(static_cast<size_t>(step) * mbs + m) * n + p];
          snap = mirror[p];
          RETURN_IF_ERROR(CudaStatus(*cuda,
                                     cuda->MemcpyAsync(target, snap.data(), snap.size(),
                                                       cudaMemcpyHostToDevice, compute.get()),
                                     "cudaMemcpyAsync (gradient)"));
          RETURN_IF_ERROR(CudaStatus(*cuda, cuda->EventRecord(events[p].get(), compute.get()),
                                     "cudaEventRecord"));
          const DeviceEvent ready = pass_events ? DeviceEvent{events[p].get()} : DeviceEvent{};
          if (values) {
            RETURN_IF_ERROR(red->MarkReady(params[p].id, ready, target));
          } else {
            RETURN_IF_ERROR(red->MarkReady(params[p].id, ready));
          }
        }
        return absl::OkStatus();
      };
      absl::Status other_status;
      std::thread other([&] { other_status = mark_range(n / 2, n); });
      const absl::Status mine = mark_range(0, n / 2);
      other.join();
      RETURN_IF_ERROR(mine);
      RETURN_IF_ERROR(other_status);
      RETURN_IF_ERROR(red->FinishBackward());
      if (sc.schedule[m] == 'R') {
        // reduce_scatter_only consumed the microbatch's gradients and zeroed the buckets: the
        // framework accumulates from zero again (its host mirror follows).
        for (auto& g : mirror) std::fill(g.begin(), g.end(), 0);
      }
    }
    // Read the results back (the reduction is complete: FinishBackward returned).
    const sched::BucketPlan& plan = red->plan();
    std::vector<std::vector<char>> buckets(plan.buckets().size());
    for (size_t b = 0; b < buckets.size(); ++b) {
      const sched::Bucket& bk = plan.buckets()[b];
      const int first = bk.params[0];
      if (sc.shard_gradients) {  // the kept shard, placed where it lies in the bucket
        const size_t es = DTypeSize(bk.dtype);
        const size_t lo = static_cast<size_t>(r % sc.shards) * bk.shard_count;
        buckets[b].assign(bk.bytes(), 0);
        RETURN_IF_ERROR(CudaStatus(
            *cuda,
            cuda->MemcpyAsync(buckets[b].data() + lo * es, red->ShardView(static_cast<int>(b)).data,
                              bk.shard_count * es, cudaMemcpyDeviceToHost, compute.get()),
            "cudaMemcpyAsync (kept shard to host)"));
        continue;
      }
      ASSIGN_OR_RETURN(TensorView v, red->GradView(plan.params()[first].id));
      const char* base =
          static_cast<const char*>(v.data) - plan.slot(first).offset * DTypeSize(bk.dtype);
      buckets[b].assign(bk.bytes(), 0);
      RETURN_IF_ERROR(CudaStatus(*cuda,
                                 cuda->MemcpyAsync(buckets[b].data(), base, bk.bytes(),
                                                   cudaMemcpyDeviceToHost, compute.get()),
                                 "cudaMemcpyAsync (bucket to host)"));
    }
    std::vector<std::vector<char>> grads(n);
    for (size_t p = 0; sc.copy_in && p < n; ++p) {
      grads[p].assign(mirror[p].size(), 0);
      RETURN_IF_ERROR(CudaStatus(*cuda,
                                 cuda->MemcpyAsync(grads[p].data(), own[p].get(), grads[p].size(),
                                                   cudaMemcpyDeviceToHost, compute.get()),
                                 "cudaMemcpyAsync (gradient to host)"));
    }
    RETURN_IF_ERROR(SyncStream(cuda, compute.get(), timeout));
    RETURN_IF_ERROR(CheckStep(sc, *red, r, step, grad, &grads, &buckets));
  }
  return absl::OkStatus();
}

}  // namespace braid::nccl::testing
