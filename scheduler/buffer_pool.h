// BufferPool: free full-size host buffers shared by a ParamGatherer (gathered parameters) and a
// GradientReducer (shard_gradients gradient storage), so that the buffer a unit's parameters
// are released from becomes the next bucket's gradient storage, and back. This is what makes
// fully sharded training's transient memory about two units rather than three: PyTorch's FSDP
// gets the same from its caching allocator (the freed parameter block serves the reduce-scatter
// input).
//
//   auto pool = std::make_shared<BufferPool>(BufferPool::Options{limit_bytes, &memory});
//   gc.shared_pool = pool;   rc.shared_pool = pool;   // same host memory (synchronous BufferOps)
//
// Buffers are keyed by the (aligned) size they were allocated for and handed out only for
// exactly that size, so the pool never holds more buffers of a size than were in use at once.
// Host memory only: device groups queue their operations on different streams (a gather
// group's and a shard group's), and a buffer moving between them would need an event
// hand-over; the gatherer and reducer refuse a shared pool on device groups.
// Limit (backpressure): held_bytes() counts every buffer allocated through Acquire, in use or
// free. Where a new one would take it past Options::limit_bytes, Acquire waits for a buffer of
// the same size that is *returning* (storage of a reduction already launched, StartReturning,
// which comes back without any waiting thread's help): reusing it costs no allocation. With none
// of that size returning, it frees free buffers of other sizes (to their allocator; MemoryStats
// counts them freed), the smallest that makes room else the largest, one at a time, until the
// new one fits or none is left (two users of sizes that do not fit together then reallocate in
// turn: the limit holds). Still over, it waits while any buffer is returning.
// Reductions launch in bucket order on every rank, so the earliest one in flight anywhere was
// launched everywhere and completes: no wait can close a cycle. With nothing returning the pool
// grows past the limit (counted in MemoryStats, pool_over_limit) rather than wait for what may
// never come. Accounting: a buffer stays counted (MemoryStats) under the use it was first allocated
// for, whoever holds it now; totals are exact, the split between kParamGather and kGradBuckets is
// then approximate.
// Thread safety: every method may be called from any thread; nothing here allocates on the
// heap once Reserve'd (a wait is a condition variable).
#ifndef BRAID_SCHEDULER_BUFFER_POOL_H_
#define BRAID_SCHEDULER_BUFFER_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/buffer_ops.h"
#include "scheduler/memory_stats.h"

namespace braid::sched {

class BufferPool {
 public:
  struct Options {
    int64_t limit_bytes = 0;        // most bytes held at once (see above); 0: no limit
    MemoryStats* memory = nullptr;  // optional: waits and growth past the limit counted here
  };
  BufferPool() : BufferPool(Options{}) {}
  explicit BufferPool(Options options) : options_(options) {}

  // A free buffer allocated for exactly `bytes`, or, when none is free, an empty one: the caller
  // allocates it (already counted in held_bytes(); Unhold(bytes) when that allocation fails)
  // and gives it back later. At the limit, frees free buffers of other sizes first, then waits
  // (up to `timeout`) while a buffer is returning; DeadlineExceeded says by how much the limit
  // was short (the caller names what it takes).
  absl::StatusOr<OwnedBuffer> Acquire(size_t bytes, absl::Duration timeout);
  void Unhold(size_t bytes);
  // Whether Acquire(bytes) would return at once without passing the limit, freeing free
  // buffers of other sizes if need be; false while it would wait for a returning buffer of that
  // size (a prefetch asks before it commits; the answer may be stale by the time it acquires).
  bool Fits(size_t bytes) const;
  // A free buffer allocated for exactly `bytes`, or an empty one (never waits, never counts).
  OwnedBuffer Take(size_t bytes);
  // Gives back a buffer allocated for `bytes` (its user is done with it, on the host);
  // `returning`: it was one of the buffers counted by StartReturning.
  void Give(OwnedBuffer buffer, size_t bytes, bool returning = false);
  // A buffer in use, allocated for `bytes`, will come back without a waiting thread's help (a
  // launched reduction's storage); it ends with Give(..., bytes, true) or, when it will not come
  // back (its reduction failed and keeps it), EndReturning(bytes).
  void StartReturning(size_t bytes);
  void EndReturning(size_t bytes);

  int64_t free_bytes() const;
  int64_t held_bytes() const;       // every buffer Acquire let a caller allocate, in use or free
  int64_t peak_held_bytes() const;  // the most held at once
  int64_t limit_bytes() const { return options_.limit_bytes; }
  // Room for `buffers` free buffers, so that Give never allocates while no more buffers than
  // that exist (a user that allocates its buffers calls it with their count: zero heap
  // allocations per step in steady state).
  void Reserve(size_t buffers);
  // Frees every free buffer.
  void Trim();
  // Leaks every free buffer (a collective may still write into one: destruction in flight).
  void Abandon();

 private:
  struct Entry {
    size_t key;  // the size the buffer was allocated for
    OwnedBuffer buffer;
  };
  OwnedBuffer TakeLocked(size_t bytes);
  bool OverLimitLocked(size_t bytes) const;
  // Removes one free buffer (of another size than `bytes`, none of which is free) from the pool
  // and its held bytes; the caller frees it. Empty when nothing is free.
  OwnedBuffer EvictLocked(size_t bytes);
  void StopReturningLocked(size_t bytes);
  bool ReturningLocked(size_t bytes) const;  // a buffer of exactly `bytes` is returning

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a buffer came back, or one stopped returning
  std::vector<Entry> free_;
  int64_t free_bytes_ = 0;
  int64_t held_ = 0, peak_held_ = 0;
  int returning_ = 0;  // buffers in use that come back on their own
  std::vector<std::pair<size_t, int>> returning_by_size_;  // of those: count per size
  int waiters_ = 0;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_BUFFER_POOL_H_
