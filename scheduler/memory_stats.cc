#include "scheduler/memory_stats.h"

#include <mutex>
#include <utility>

namespace braid::sched {
namespace {

struct AtomicCounter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};

  // Adds `delta`; a rise beyond the peak moves it.
  void Add(int64_t delta) {
    const int64_t now = current.fetch_add(delta, std::memory_order_relaxed) + delta;
    int64_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  MemoryCounter Read() const {
    return {current.load(std::memory_order_relaxed), peak.load(std::memory_order_relaxed)};
  }
  void ResetPeak() {
    peak.store(current.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
};

}  // namespace

const char* MemoryUseName(MemoryUse use) {
  switch (use) {
    case MemoryUse::kGradBuckets:
      return "grad_buckets";
    case MemoryUse::kGradShards:
      return "grad_shards";
    case MemoryUse::kParamGather:
      return "param_gather";
    case MemoryUse::kParamShards:
      return "param_shards";
    case MemoryUse::kOptimizerState:
      return "optimizer_state";
    case MemoryUse::kStaging:
      return "staging";
  }
  return "unknown";
}

struct MemoryStats::Counters {
  AtomicCounter host, device;
  AtomicCounter by_use[kMemoryUses];
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> pool_waits{0}, pool_wait_ns{0}, pool_over_limit{0};

  std::mutex tl_mu;  // the timeline and its row
  Timeline* timeline = nullptr;
  int tl_row = 0;

  void Add(bool device, MemoryUse use, int64_t delta) {
    AtomicCounter& side = device ? this->device : host;
    side.Add(delta);
    by_use[static_cast<int>(use)].Add(delta);
    std::lock_guard<std::mutex> lock(tl_mu);
    if (timeline != nullptr) {
      timeline->Counter(tl_row, device ? "device bytes" : "host bytes",
                        side.current.load(std::memory_order_relaxed));
    }
  }
};

MemoryStats::MemoryStats() : counters_(std::make_shared<Counters>()) {}
MemoryStats::~MemoryStats() = default;

OwnedBuffer MemoryStats::Adopt(OwnedBuffer buffer, bool device, MemoryUse use, size_t counted) {
  if (!buffer) return buffer;
  const size_t bytes = counted != 0 ? counted : buffer.bytes();
  counters_->allocations.fetch_add(1, std::memory_order_relaxed);
  counters_->Add(device, use, static_cast<int64_t>(bytes));
  // The new deleter frees through the old owner, then uncounts.
  auto inner = std::make_shared<OwnedBuffer>(std::move(buffer));
  void* ptr = inner->get();
  return OwnedBuffer(ptr, inner->bytes(), [inner, counters = counters_, device, use, bytes](void*) {
    inner->Reset();
    counters->Add(device, use, -static_cast<int64_t>(bytes));
  });
}

absl::StatusOr<OwnedBuffer> MemoryStats::Allocate(BufferOps& ops, size_t bytes, MemoryUse use,
                                                  absl::string_view what) {
  absl::StatusOr<OwnedBuffer> b = ops.Allocate(bytes, what);
  if (!b.ok()) return b.status();
  return Adopt(*std::move(b), !ops.synchronous(), use, bytes);
}

MemorySnapshot MemoryStats::Snapshot() const {
  MemorySnapshot s;
  s.host = counters_->host.Read();
  s.device = counters_->device.Read();
  for (int u = 0; u < kMemoryUses; ++u) s.by_use[u] = counters_->by_use[u].Read();
  s.allocations = counters_->allocations.load(std::memory_order_relaxed);
  s.pool_waits = counters_->pool_waits.load(std::memory_order_relaxed);
  s.pool_wait_ns = counters_->pool_wait_ns.load(std::memory_order_relaxed);
  s.pool_over_limit = counters_->pool_over_limit.load(std::memory_order_relaxed);
  return s;
}

void MemoryStats::NotePoolWait(int64_t ns) {
  counters_->pool_waits.fetch_add(1, std::memory_order_relaxed);
  counters_->pool_wait_ns.fetch_add(ns, std::memory_order_relaxed);
}

void MemoryStats::NotePoolOverLimit() {
  counters_->pool_over_limit.fetch_add(1, std::memory_order_relaxed);
}

void MemoryStats::ResetPeaks() {
  counters_->host.ResetPeak();
  counters_->device.ResetPeak();
  for (AtomicCounter& c : counters_->by_use) c.ResetPeak();
}

void MemoryStats::SetTimeline(Timeline* timeline) {
  std::lock_guard<std::mutex> lock(counters_->tl_mu);
  counters_->timeline = timeline != nullptr && timeline->enabled() ? timeline : nullptr;
  if (counters_->timeline != nullptr) counters_->tl_row = timeline->Track("memory");
}

absl::StatusOr<OwnedBuffer> CountedAllocate(MemoryStats* stats, BufferOps& ops, size_t bytes,
                                            MemoryUse use, absl::string_view what) {
  if (stats != nullptr) return stats->Allocate(ops, bytes, use, what);
  return ops.Allocate(bytes, what);
}

}  // namespace braid::sched
