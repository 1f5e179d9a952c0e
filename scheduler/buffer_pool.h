// BufferPool: free full-size host buffers shared by a ParamGatherer (gathered parameters) and a
// GradientReducer (shard_gradients gradient storage), so that the buffer a unit's parameters
// are released from becomes the next bucket's gradient storage, and back. This is what makes
// fully sharded training's transient memory about two units rather than three: PyTorch's FSDP
// gets the same from its caching allocator (the freed parameter block serves the reduce-scatter
// input).
//
//   auto pool = std::make_shared<BufferPool>();
//   gc.shared_pool = pool;   rc.shared_pool = pool;   // same host memory (synchronous BufferOps)
//
// Buffers are keyed by the (aligned) size they were allocated for and handed out only for
// exactly that size, so the pool never holds more buffers of a size than were in use at once.
// Host memory only: device groups queue their operations on different streams (a gather
// group's and a shard group's), and a buffer moving between them would need an event
// hand-over; the gatherer and reducer refuse a shared pool on device groups.
// Accounting: a buffer stays counted (MemoryStats) under the use it was first allocated for,
// whoever holds it now; totals are exact, the split between kParamGather and kGradBuckets is
// then approximate.
// Thread safety: every method may be called from any thread.
#ifndef BRAID_SCHEDULER_BUFFER_POOL_H_
#define BRAID_SCHEDULER_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "comm/buffer_ops.h"

namespace braid::sched {

class BufferPool {
 public:
  // A free buffer allocated for exactly `bytes`, or an empty one.
  OwnedBuffer Take(size_t bytes);
  // Gives back a buffer allocated for `bytes` (its user is done with it, on the host).
  void Give(OwnedBuffer buffer, size_t bytes);
  int64_t free_bytes() const;
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
  mutable std::mutex mu_;
  std::vector<Entry> free_;
  int64_t free_bytes_ = 0;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_BUFFER_POOL_H_
