#include "scheduler/buffer_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace braid::sched {

OwnedBuffer BufferPool::TakeLocked(size_t bytes) {
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

bool BufferPool::OverLimitLocked(size_t bytes) const {
  return options_.limit_bytes > 0 && held_ + static_cast<int64_t>(bytes) > options_.limit_bytes;
}

OwnedBuffer BufferPool::EvictLocked(size_t bytes) {
  // The smallest free buffer whose size covers what is missing, else the largest: few bytes
  // and few buffers freed.
  const int64_t short_by = held_ + static_cast<int64_t>(bytes) - options_.limit_bytes;
  size_t pick = free_.size();
  for (size_t k = 0; k < free_.size(); ++k) {
    const int64_t key = static_cast<int64_t>(free_[k].key);
    if (pick == free_.size()) {
      pick = k;
      continue;
    }
    const int64_t best = static_cast<int64_t>(free_[pick].key);
    const bool covers = key >= short_by, best_covers = best >= short_by;
    if (covers != best_covers ? covers : (covers ? key < best : key > best)) pick = k;
  }
  if (pick == free_.size()) return OwnedBuffer();
  OwnedBuffer out = std::move(free_[pick].buffer);
  held_ -= static_cast<int64_t>(free_[pick].key);
  free_bytes_ -= static_cast<int64_t>(out.bytes());
  if (pick + 1 != free_.size()) free_[pick] = std::move(free_.back());
  free_.pop_back();
  return out;
}

absl::StatusOr<OwnedBuffer> BufferPool::Acquire(size_t bytes, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  absl::Time wait_start = absl::InfinitePast();
  const auto note_wait = [&] {
    if (wait_start != absl::InfinitePast() && options_.memory != nullptr) {
      options_.memory->NotePoolWait(absl::ToInt64Nanoseconds(absl::Now() - wait_start));
    }
  };
  for (;;) {
    if (OwnedBuffer out = TakeLocked(bytes)) {
      note_wait();
      return out;
    }
    const bool over = OverLimitLocked(bytes);
    // A buffer of this size on its way back is reused (below: the wait) rather than freeing
    // others to allocate one more.
    if (over && !ReturningLocked(bytes) && !free_.empty()) {
      // None of `bytes` is free: free buffers of other sizes make room before the pool grows
      // past its limit or waits. Freed outside the lock (MemoryStats counts them freed), then
      // everything is looked at again.
      OwnedBuffer evicted = EvictLocked(bytes);
      lock.unlock();
      evicted.Reset();
      lock.lock();
      continue;
    }
    if (!over || returning_ == 0) {
      // Grow: within the limit, or past it when nothing in use comes back on its own.
      if (over && options_.memory != nullptr) options_.memory->NotePoolOverLimit();
      held_ += static_cast<int64_t>(bytes);
      if (held_ > peak_held_) peak_held_ = held_;
      note_wait();
      return OwnedBuffer();
    }
    if (wait_start == absl::InfinitePast()) {
      wait_start = absl::Now();
    } else if (absl::Now() - wait_start >= timeout) {
      note_wait();
      return absl::DeadlineExceededError(absl::StrCat(
          "the buffer pool holds ", held_, " of its limit of ", options_.limit_bytes,
          " bytes and none of the ", returning_, " buffer(s) of reductions in flight came back ",
          "within ", absl::FormatDuration(timeout), " (", bytes, " bytes wanted)"));
    }
    ++waiters_;
    cv_.wait_until(lock, absl::ToChronoTime(wait_start + timeout));
    --waiters_;
  }
}

void BufferPool::Unhold(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  held_ -= static_cast<int64_t>(bytes);
  if (held_ < 0) held_ = 0;  // buffers given in that Acquire never counted (tests)
  if (waiters_ > 0) cv_.notify_all();
}

bool BufferPool::Fits(size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!OverLimitLocked(bytes)) return true;
  int64_t evictable = 0;  // free buffers of other sizes, which Acquire frees to make room
  for (const Entry& e : free_) {
    if (e.key == bytes) return true;
    evictable += static_cast<int64_t>(e.key);
  }
  if (ReturningLocked(bytes)) return false;  // Acquire waits for it
  return held_ - evictable + static_cast<int64_t>(bytes) <= options_.limit_bytes;
}

OwnedBuffer BufferPool::Take(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return TakeLocked(bytes);
}

void BufferPool::Give(OwnedBuffer buffer, size_t bytes, bool returning) {
  std::lock_guard<std::mutex> lock(mu_);
  if (returning) StopReturningLocked(bytes);
  if (buffer) {
    free_bytes_ += static_cast<int64_t>(buffer.bytes());
    free_.push_back(Entry{bytes, std::move(buffer)});
  }
  if (waiters_ > 0) cv_.notify_all();
}

void BufferPool::StartReturning(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++returning_;
  for (auto& [key, n] : returning_by_size_) {
    if (key == bytes) {
      ++n;
      return;
    }
  }
  // A few sizes (one per bucket size): after the first steps this never allocates.
  returning_by_size_.emplace_back(bytes, 1);
}

void BufferPool::EndReturning(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  StopReturningLocked(bytes);
  if (waiters_ > 0) cv_.notify_all();
}

void BufferPool::StopReturningLocked(size_t bytes) {
  for (auto& [key, n] : returning_by_size_) {
    if (key == bytes && n > 0) {
      --n;
      --returning_;
      return;
    }
  }
}

bool BufferPool::ReturningLocked(size_t bytes) const {
  for (const auto& [key, n] : returning_by_size_) {
    if (key == bytes) return n > 0;
  }
  return false;
}

int64_t BufferPool::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_bytes_;
}

int64_t BufferPool::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

int64_t BufferPool::peak_held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_held_;
}

void BufferPool::Reserve(size_t buffers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.capacity() < buffers) free_.reserve(2 * buffers);
}

void BufferPool::Trim() {
  std::vector<Entry> freed;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : free_) held_ -= static_cast<int64_t>(e.key);
  if (held_ < 0) held_ = 0;  // buffers given in that Acquire never counted (tests)
  freed.swap(free_);
  free_bytes_ = 0;
}

void BufferPool::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : free_) {
    held_ -= static_cast<int64_t>(e.key);
    (void)e.buffer.release();
  }
  if (held_ < 0) held_ = 0;
  free_.clear();
  free_bytes_ = 0;
}

}  // namespace braid::sched
