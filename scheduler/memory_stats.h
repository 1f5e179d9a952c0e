// MemoryStats: every byte Braid allocates for one rank, counted from allocation to free: current
// and peak, host and device apart, and per use (gradient buckets, kept gradient shards, gathered
// parameters, parameter shards, optimizer state, staging). Memory is a measured figure, like time.
//
//   auto memory = std::make_shared<MemoryStats>();        // one per rank
//   ReducerConfig rc;  rc.memory = memory.get();          // the gatherer and optimizer too
//   ... train ...
//   MemorySnapshot m = memory->Snapshot();
//   printf("peak device bytes: %lld\n", (long long)m.device.peak);
//
// How it counts: allocations made through Allocate() (or handed to Adopt()) return an
// OwnedBuffer whose deleter subtracts the bytes again, so a buffer is counted exactly while it
// exists, whoever frees it and on whatever thread. Whether memory is the device's is decided by
// the BufferOps that made it: asynchronous ops (a device group's, comm/buffer_ops.h) allocate
// device memory, synchronous ones host memory. The counters are the bytes requested (what the
// caller can reason about), not the allocator's rounding.
//
// Lifetime: the counters are shared with the deleters, so a buffer may outlive this object
// (it then counts into counters nobody reads). With a timeline (SetTimeline), every change is
// also written as a counter sample on its "memory" row ("host bytes", "device bytes"); the
// timeline must outlive every counted buffer, or be detached first (SetTimeline(nullptr)).
//
// Thread safety: every method may be called from any thread (atomic counters; the peaks are
// exact maxima of the running totals as each allocation saw them).
#ifndef BRAID_SCHEDULER_MEMORY_STATS_H_
#define BRAID_SCHEDULER_MEMORY_STATS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/buffer_ops.h"
#include "scheduler/timeline.h"

namespace braid::sched {

// What a buffer is for. The values are the C API's braid_memory_use_t.
enum class MemoryUse : int {
  kGradBuckets = 0,     // full-size gradient buckets (and their pooled storage)
  kGradShards = 1,      // this rank's kept gradient shards and partial sums
  kParamGather = 2,     // gathered (full) parameter buffers
  kParamShards = 3,     // this rank's parameter shards
  kOptimizerState = 4,  // master weights and moments
  kStaging = 5,         // reduce-dtype staging, statistics, transfer buffers
};
inline constexpr int kMemoryUses = 6;
const char* MemoryUseName(MemoryUse use);  // "grad_buckets", ...

struct MemoryCounter {
  int64_t current = 0;  // bytes allocated now
  int64_t peak = 0;     // the most bytes allocated at once since creation / ResetPeaks()
};

struct MemorySnapshot {
  MemoryCounter host, device;
  MemoryCounter by_use[kMemoryUses];  // host and device together, per MemoryUse
  int64_t allocations = 0;            // buffers allocated so far (a churn measure)
  // A bounded BufferPool (scheduler/buffer_pool.h): takers that waited for a buffer to come
  // back from a reduction in flight, their total wait, and growths past the limit (nothing was
  // coming back).
  int64_t pool_waits = 0;
  int64_t pool_wait_ns = 0;
  int64_t pool_over_limit = 0;
};

class MemoryStats {
 public:
  MemoryStats();
  ~MemoryStats();
  MemoryStats(const MemoryStats&) = delete;
  MemoryStats& operator=(const MemoryStats&) = delete;

  // ops.Allocate(bytes, what), counted as `use` on the device when !ops.synchronous().
  absl::StatusOr<OwnedBuffer> Allocate(BufferOps& ops, size_t bytes, MemoryUse use,
                                       absl::string_view what);
  // Counts an existing allocation from now until it is freed, as `bytes` (0: buffer.bytes()).
  OwnedBuffer Adopt(OwnedBuffer buffer, bool device, MemoryUse use, size_t bytes = 0);

  // A bounded BufferPool's backpressure: one wait of `ns`; one growth past its limit.
  void NotePoolWait(int64_t ns);
  void NotePoolOverLimit();

  MemorySnapshot Snapshot() const;
  // Every peak becomes the current value (to measure one phase's peak).
  void ResetPeaks();
  // Counter samples on `timeline`'s "memory" row from now on (null: none). Not owned.
  void SetTimeline(Timeline* timeline);

 private:
  struct Counters;
  std::shared_ptr<Counters> counters_;
};

// stats->Allocate(...) when `stats` is set, else a plain ops.Allocate(bytes, what).
absl::StatusOr<OwnedBuffer> CountedAllocate(MemoryStats* stats, BufferOps& ops, size_t bytes,
                                            MemoryUse use, absl::string_view what);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_MEMORY_STATS_H_
