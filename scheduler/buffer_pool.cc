#include "scheduler/buffer_pool.h"

#include <utility>

namespace braid::sched {

OwnedBuffer BufferPool::Take(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.find(bytes);
  if (it == free_.end()) return OwnedBuffer();
  OwnedBuffer out = std::move(it->second);
  free_.erase(it);
  free_bytes_ -= static_cast<int64_t>(out.bytes());
  return out;
}

void BufferPool::Give(OwnedBuffer buffer, size_t bytes) {
  if (!buffer) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_bytes_ += static_cast<int64_t>(buffer.bytes());
  free_.emplace(bytes, std::move(buffer));
}

int64_t BufferPool::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_bytes_;
}

void BufferPool::Trim() {
  std::multimap<size_t, OwnedBuffer> freed;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  freed.swap(free_);
  free_bytes_ = 0;
}

}  // namespace braid::sched
