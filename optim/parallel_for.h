// A small persistent thread pool for element-wise kernels over large optimizer shards.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<KernelPool> pool, KernelPool::Create(2));  // caller + 1
//   pool->ParallelFor(n, /*grain=*/1 << 16, [&](size_t lo, size_t hi) {
//     AdamWRange(s, p + lo, m + lo, v + lo, g + lo, DType::kF32, hi - lo);
//   });
//
// Why a pool of our own: an optimizer step touches one bucket shard at a time, so the per-call
// cost matters (a thread per call costs ~50 us). Workers persist, spin briefly for the next
// call (a sleeping hand-off costs ~40 us on small VMs), then sleep on a condition variable.
// ParallelFor allocates nothing.
//
// Partitioning is static and deterministic: [0, n) is cut into at most `threads` contiguous
// chunks whose boundaries are multiples of kKernelAlign (16 elements = one 64-byte line of
// f32), so no two threads write the same cache line of a 64-byte-aligned array and every chunk
// but the last starts on a full vector. Element-wise kernels therefore give the same bits for
// any thread count; reductions must define their own order (see SquaredNormF64).
//
// Threading contract: ParallelFor may be called from any thread but calls are serialized (a
// second caller waits); `fn` must not call ParallelFor on the same pool and must not throw.
#ifndef BRAID_OPTIM_PARALLEL_FOR_H_
#define BRAID_OPTIM_PARALLEL_FOR_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace braid::optim {

inline constexpr size_t kKernelAlign = 16;

class KernelPool {
 public:
  // `threads` >= 1 participants including the caller; 1 runs everything inline. When a worker
  // thread cannot be started, the ones started are joined and ResourceExhausted names it.
  static absl::StatusOr<std::unique_ptr<KernelPool>> Create(int threads);
  ~KernelPool();  // wakes and joins the workers

  KernelPool(const KernelPool&) = delete;
  KernelPool& operator=(const KernelPool&) = delete;

  int threads() const { return threads_; }

  // Calls fn(lo, hi) on disjoint chunks covering [0, n), each at least `grain` elements (except
  // when n itself is smaller), concurrently; returns when all chunks are done. The caller runs
  // chunk 0. n == 0 calls nothing.
  void ParallelFor(size_t n, size_t grain, const std::function<void(size_t lo, size_t hi)>& fn);

  // The chunk [lo, hi) that participant `part` gets for (n, grain); exposed for tests.
  struct Range {
    size_t lo, hi;
  };
  static Range Chunk(size_t n, size_t grain, int threads, int part);

 private:
  explicit KernelPool(int threads);
  void WorkerLoop(int part);
  void RunPart(int part);

  const int threads_;
  std::vector<std::thread> workers_;

  std::mutex call_mu_;  // serializes callers of ParallelFor

  // The current job: written by the caller before `generation_` advances, read by workers after
  // they observe it, and not rewritten until every worker has acknowledged it (`pending_`).
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 0;

  std::mutex mu_;
  std::condition_variable wake_cv_;  // workers sleep here for the next generation
  std::condition_variable done_cv_;  // the caller sleeps here for pending_ == 0
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};    // workers that have not finished the current job
  std::atomic<bool> stop_{false};  // set before the final generation bump
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_PARALLEL_FOR_H_
