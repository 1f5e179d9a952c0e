// RingQueue: a FIFO that reuses its storage. std::deque allocates and frees a block every few
// hundred bytes of traffic; a queue of collectives issued every iteration should allocate only
// while it grows to its high-water mark.
#ifndef BRAID_BACKENDS_LOCAL_RING_QUEUE_H_
#define BRAID_BACKENDS_LOCAL_RING_QUEUE_H_

#include <cstddef>
#include <utility>
#include <vector>

namespace braid::local {

template <typename T>
class RingQueue {
 public:
  explicit RingQueue(size_t capacity = 16) : slots_(capacity < 1 ? 1 : capacity) {}

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

  void push_back(T v) {
    if (size_ == slots_.size()) Grow();
    slots_[(head_ + size_) % slots_.size()] = std::move(v);
    ++size_;
  }
  // Moves the front element out and leaves a moved-from T in its slot.
  T pop_front() {
    T v = std::move(slots_[head_]);
    slots_[head_] = T();  // drop what the moved-from slot may still own
    head_ = (head_ + 1) % slots_.size();
    --size_;
    return v;
  }

 private:
  void Grow() {
    std::vector<T> bigger(slots_.size() * 2);
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move(slots_[(head_ + i) % slots_.size()]);
    slots_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace braid::local

#endif  // BRAID_BACKENDS_LOCAL_RING_QUEUE_H_
