// TimelineQueue: the bounded, lock-free, many-producer / one-consumer ring between the threads
// that record timeline events and the Timeline's writer thread.
//
//   TimelineQueue<Event> q(1024);          // capacity rounds up to a power of two (>= 2)
//   if (!q.TryPush(e)) ++dropped;          // any thread: never blocks, never allocates
//   Event out;
//   while (q.TryPop(&out)) Write(out);     // the one consumer thread
//
// Why this shape: a recording thread must never wait for the writer (that is the point of the
// timeline being off the hot path), so a full queue is reported to the caller, who drops and
// counts. The algorithm is D. Vyukov's bounded MPMC queue: each cell carries a sequence number
// that says whose turn it is (a producer for lap n, or the consumer for lap n), so a push is one
// CAS on the enqueue cursor plus one release store; there is no lock a descheduled thread could
// hold. Pop is single-consumer here, which makes the dequeue cursor a plain field.
//
// A producer that has claimed a cell but not yet published it holds the consumer at that cell
// until it does (TryPop returns false meanwhile); the writer simply retries on its next round.
#ifndef BRAID_SCHEDULER_TIMELINE_QUEUE_H_
#define BRAID_SCHEDULER_TIMELINE_QUEUE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace braid::sched {

template <typename T>
class TimelineQueue {
  static_assert(std::is_trivially_copyable_v<T>, "cells are overwritten in place");

 public:
  explicit TimelineQueue(size_t min_capacity)
      : capacity_(RoundUp(min_capacity)), mask_(capacity_ - 1), cells_(new Cell[capacity_]) {
    for (size_t i = 0; i < capacity_; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  TimelineQueue(const TimelineQueue&) = delete;
  TimelineQueue& operator=(const TimelineQueue&) = delete;

  size_t capacity() const { return capacity_; }

  // Any thread. False when the queue is full (the value is not stored).
  bool TryPush(const T& value) {
    uint64_t pos = enqueue_pos_.load(std::memory_order_relaxed);
    Cell* cell;
    for (;;) {
      cell = &cells_[pos & mask_];
      const uint64_t seq = cell->seq.load(std::memory_order_acquire);
      const int64_t diff = static_cast<int64_t>(seq) - static_cast<int64_t>(pos);
      if (diff == 0) {
        if (enqueue_pos_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;  // the consumer has not freed this cell from the previous lap: full
      } else {
        pos = enqueue_pos_.load(std::memory_order_relaxed);  // another producer took it
      }
    }
    cell->value = value;
    cell->seq.store(pos + 1, std::memory_order_release);
    return true;
  }

  // The single consumer thread only. False when empty (or the next cell is not yet published).
  bool TryPop(T* out) {
    Cell& cell = cells_[dequeue_pos_ & mask_];
    if (cell.seq.load(std::memory_order_acquire) != dequeue_pos_ + 1) return false;
    *out = cell.value;
    cell.seq.store(dequeue_pos_ + capacity_, std::memory_order_release);
    ++dequeue_pos_;
    consumed_.store(dequeue_pos_, std::memory_order_release);
    return true;
  }

  // Any thread: how many pushes have been accepted / popped so far (monotone counters).
  uint64_t pushed() const { return enqueue_pos_.load(std::memory_order_acquire); }
  uint64_t popped() const { return consumed_.load(std::memory_order_acquire); }

 private:
  struct Cell {
    std::atomic<uint64_t> seq;
    T value;
  };

  static size_t RoundUp(size_t n) {
    size_t c = 2;
    while (c < n) c <<= 1;
    return c;
  }

  const size_t capacity_;
  const size_t mask_;
  const std::unique_ptr<Cell[]> cells_;
  alignas(64) std::atomic<uint64_t> enqueue_pos_{0};  // producers' cursor, own cache line
  alignas(64) uint64_t dequeue_pos_ = 0;              // consumer's private cursor
  std::atomic<uint64_t> consumed_{0};                 // dequeue_pos_ published for readers
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_TIMELINE_QUEUE_H_
