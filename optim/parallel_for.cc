#include "optim/parallel_for.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "comm/check.h"
#include "comm/spin.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"

namespace braid::optim {
namespace {

// A worker polls this long for the next call before sleeping: long enough to catch the next
// bucket of the same optimizer step, short enough not to starve other threads on a small VM.
constexpr int64_t kWorkerSpinNs = 50'000;
// The caller polls this long for the workers' chunks (about as large as its own) to finish.
constexpr int64_t kCallerSpinNs = 200'000;

size_t RoundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace

KernelPool::Range KernelPool::Chunk(size_t n, size_t grain, int threads, int part) {
  const size_t g = std::max<size_t>(grain, 1);
  const size_t parts = std::clamp<size_t>(n / g, 1, static_cast<size_t>(threads));
  const size_t chunk = RoundUp((n + parts - 1) / parts, kKernelAlign);
  const size_t lo = std::min(n, static_cast<size_t>(part) * chunk);
  return Range{lo, std::min(n, lo + chunk)};
}

KernelPool::KernelPool(int threads) : threads_(threads) {}

absl::StatusOr<std::unique_ptr<KernelPool>> KernelPool::Create(int threads) {
  if (threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kernel threads must be >= 1, got ", threads));
  }
  std::unique_ptr<KernelPool> pool(new KernelPool(threads));
  pool->workers_.reserve(static_cast<size_t>(threads - 1));
  for (int part = 1; part < threads; ++part) {
    std::thread t;
    KernelPool* p = pool.get();
    // On failure the destructor joins the workers already started.
    RETURN_IF_ERROR(StartThread(&t, absl::StrCat("optimizer kernel worker ", part, " of ", threads),
                                [p, part] { p->WorkerLoop(part); }));
    pool->workers_.push_back(std::move(t));
  }
  return pool;
}

KernelPool::~KernelPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void KernelPool::RunPart(int part) {
  const Range r = Chunk(n_, grain_, threads_, part);
  if (r.lo < r.hi) (*fn_)(r.lo, r.hi);
}

void KernelPool::ParallelFor(size_t n, size_t grain,
                             const std::function<void(size_t lo, size_t hi)>& fn) {
  if (n == 0) return;
  // One chunk (small n or one thread): no hand-off at all.
  if (threads_ == 1 || Chunk(n, grain, threads_, 0).hi == n) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  pending_.store(threads_ - 1, std::memory_order_relaxed);
  {
    // Bumping under mu_ means a worker that checked the generation under mu_ and went to sleep
    // cannot miss this notification.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();
  RunPart(0);
  auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(done, kCallerSpinNs)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
  }
  fn_ = nullptr;
}

void KernelPool::WorkerLoop(int part) {
  uint64_t seen = 0;
  for (;;) {
    auto posted = [this, &seen] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!SpinUntil(posted, kWorkerSpinNs)) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_cv_.wait(lock, posted);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_relaxed)) return;
    RunPart(part);
    // Every worker acknowledges every job, even with an empty chunk, so the caller never
    // rewrites the job while a late worker still reads it.
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // pairs with the caller's predicate check
      done_cv_.notify_one();
    }
  }
}

}  // namespace braid::optim
