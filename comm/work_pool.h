// WorkPool: Works without heap allocation in steady state.
//
// A training step issues the same collectives every iteration; allocating a Work (and its
// shared_ptr control block) for each one puts the allocator on the hot path of every bucket.
// WorkPool hands out ordinary WorkPtrs whose single allocation (control block + Work, through
// std::allocate_shared) comes from a free list of fixed-size blocks: once the pool has warmed
// up to the number of Works alive at once, Create() allocates nothing (given info strings that
// fit the small-string buffer, <= 15 characters, as group names like "world/shard0" do).
//
// Lifetime: every WorkPtr keeps the pool's arena alive, so a Work may outlive the WorkPool
// object that created it, and be released on any thread. Thread-safe.
#ifndef BRAID_COMM_WORK_POOL_H_
#define BRAID_COMM_WORK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/time/time.h"
#include "comm/work.h"

namespace braid {

class WorkPool {
 public:
  // Keeps at most `max_free` released blocks for reuse (the rest go back to the heap).
  explicit WorkPool(size_t max_free = 4096);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  WorkPtr Create(WorkInfo info, absl::Duration spin = absl::Microseconds(20));

  // Blocks taken from the heap so far (for tests and benchmarks: flat once warmed up).
  uint64_t heap_blocks() const;

  struct Arena;  // shared with the allocator inside every control block

 private:
  std::shared_ptr<Arena> arena_;
};

}  // namespace braid

#endif  // BRAID_COMM_WORK_POOL_H_
