#include "comm/work_pool.h"

#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace braid {

// Fixed-size blocks; big enough for std::allocate_shared's control block holding a Work (the
// allocator checks, and falls back to the heap for anything larger).
struct WorkPool::Arena {
  static constexpr size_t kBlockBytes = 512;

  explicit Arena(size_t max_free) : max_free(max_free) { free.reserve(max_free); }
  ~Arena() {
    for (void* p : free) ::operator delete(p);
  }

  void* Get() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!free.empty()) {
        void* p = free.back();
        free.pop_back();
        return p;
      }
      ++heap_blocks;
    }
    return ::operator new(kBlockBytes);
  }

  void Put(void* p) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (free.size() < max_free) {  // capacity reserved up front: never reallocates
        free.push_back(p);
        return;
      }
    }
    ::operator delete(p);
  }

  const size_t max_free;
  std::mutex mu;
  std::vector<void*> free;   // guarded by mu
  uint64_t heap_blocks = 0;  // guarded by mu
};

namespace {

template <typename T>
struct PoolAllocator {
  using value_type = T;

  explicit PoolAllocator(std::shared_ptr<WorkPool::Arena> a) : arena(std::move(a)) {}
  template <typename U>
  PoolAllocator(const PoolAllocator<U>& o) : arena(o.arena) {}

  static constexpr bool kFits =
      sizeof(T) <= WorkPool::Arena::kBlockBytes && alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__;

  T* allocate(size_t n) {
    if (kFits && n == 1) return static_cast<T*>(arena->Get());
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) {
    if (kFits && n == 1) {
      arena->Put(p);
    } else {
      ::operator delete(p);
    }
  }

  template <typename U>
  bool operator==(const PoolAllocator<U>& o) const {
    return arena == o.arena;
  }
  template <typename U>
  bool operator!=(const PoolAllocator<U>& o) const {
    return arena != o.arena;
  }

  std::shared_ptr<WorkPool::Arena> arena;
};

}  // namespace

WorkPool::WorkPool(size_t max_free) : arena_(std::make_shared<Arena>(max_free)) {}
WorkPool::~WorkPool() = default;

WorkPtr WorkPool::Create(WorkInfo info, absl::Duration spin) {
  return std::allocate_shared<Work>(PoolAllocator<Work>(arena_), Work::PoolKey(), std::move(info),
                                    spin);
}

uint64_t WorkPool::heap_blocks() const {
  std::lock_guard<std::mutex> lock(arena_->mu);
  return arena_->heap_blocks;
}

}  // namespace braid
