#include "scheduler/buffer_pool.h"

#include <utility>

namespace braid::sched {

OwnedBuffer BufferPool::Take(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t k = 0; k < free_.size(); ++k) {
    if (free_[k].key != bytes) continue;
    OwnedBuffer out = std::move(free_[k].buffer);
    if (k + 1 != free_.size()) free_[k] = std::move(free_.back());
    free_.pop_back();
    free_bytes_ -= static_cast<int64_t>(out.bytes());
    return out;
  }
  return OwnedBuffer();
}

void BufferPool::Give(OwnedBuffer buffer, size_t bytes) {
  if (!buffer) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_bytes_ += static_cast<int64_t>(buffer.bytes());
  free_.push_back(Entry{bytes, std::move(buffer)});
}

int64_t BufferPool::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_bytes_;
}

void BufferPool::Reserve(size_t buffers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.capacity() < buffers) free_.reserve(2 * buffers);
}

void BufferPool::Trim() {
  std::vector<Entry> freed;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  freed.swap(free_);
  free_bytes_ = 0;
}

void BufferPool::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : free_) (void)e.buffer.release();
  free_.clear();
  free_bytes_ = 0;
}

}  // namespace braid::sched
