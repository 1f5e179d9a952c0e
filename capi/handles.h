// The handle registry: the one process-wide table the C boundary needs, so that every handle a
// caller passes is checked before use (NULL, destroyed, a handle of another type, or a pointer
// that is no handle at all) instead of being dereferenced.
//
//   ASSIGN_OR_RETURN(braid_group_t* h, Register<GroupImpl>(std::move(impl), {world}));
//   ASSIGN_OR_RETURN(std::shared_ptr<GroupImpl> g, Find<GroupImpl>(h, "group"));
//   ASSIGN_OR_RETURN(std::shared_ptr<void> gone, HandleRegistry::Get().Remove(h, kGroup, "group"));
//
// Handles are tokens, not addresses: base + (serial << 4) + type tag, with a serial that only
// grows, so a destroyed handle is never reissued and is always recognized (with its type, from
// the tag bits). Lookups hand out shared_ptr copies: a handle destroyed on one thread while
// another thread is inside a call on it stays alive until that call returns.
// Ownership edges: each handle may name parent handles (a group's world, a work's group, a
// reducer's groups, an optimizer's reducer). A parent counts its live children and cannot be
// removed while it has any (FailedPrecondition naming the counts).
// The table is a function-local static behind one mutex; it is never destroyed (handles may
// be released from atexit handlers or other libraries' destructors).
#ifndef BRAID_CAPI_HANDLES_H_
#define BRAID_CAPI_HANDLES_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace braid::capi {

enum class Tag : uint8_t { kWorld = 1, kGroup = 2, kWork = 3, kReducer = 4, kOptimizer = 5 };
inline constexpr int kNumTags = 6;  // tag values 1..5

// "braid_world_t", ...
const char* TagName(Tag tag);

class HandleRegistry {
 public:
  static HandleRegistry& Get();

  // Registers `object` as a new handle of type `tag`; each parent (a live handle) counts it
  // as a child until Remove. FailedPrecondition if a parent is no longer alive.
  absl::StatusOr<void*> Add(Tag tag, std::shared_ptr<void> object,
                            std::initializer_list<const void*> parents);
  // The object behind a live handle of type `tag`. InvalidArgument naming `arg` otherwise.
  absl::StatusOr<std::shared_ptr<void>> Find(const void* handle, Tag tag, const char* arg) const;
  // Unregisters a live handle without live children and returns its object (the caller drops
  // it outside the lock). InvalidArgument for a bad handle, FailedPrecondition with children.
  absl::StatusOr<std::shared_ptr<void>> Remove(const void* handle, Tag tag, const char* arg);
  // Live children of type `child` of a live handle (0 for anything else).
  int Children(const void* handle, Tag child) const;

 private:
  struct Entry {
    Tag tag;
    std::shared_ptr<void> object;
    std::vector<uintptr_t> parents;
    std::array<int, kNumTags> children{};
  };
  HandleRegistry() = default;
  // With mu_ held: the error for a handle that is not a live one of type `tag`.
  absl::Status Explain(uintptr_t token, Tag tag, const char* arg) const;

  mutable std::mutex mu_;
  uint64_t next_serial_ = 1;                       // guarded by mu_
  absl::flat_hash_map<uintptr_t, Entry> entries_;  // guarded by mu_
};

// Typed helpers: each Impl type declares `static constexpr Tag kTag` and the C handle type
// `Handle`.
template <typename Impl>
absl::StatusOr<typename Impl::Handle*> Register(std::shared_ptr<Impl> impl,
                                                std::initializer_list<const void*> parents) {
  absl::StatusOr<void*> h = HandleRegistry::Get().Add(Impl::kTag, std::move(impl), parents);
  if (!h.ok()) return h.status();
  return static_cast<typename Impl::Handle*>(*h);
}

template <typename Impl>
absl::StatusOr<std::shared_ptr<Impl>> Find(const void* handle, const char* arg) {
  absl::StatusOr<std::shared_ptr<void>> p = HandleRegistry::Get().Find(handle, Impl::kTag, arg);
  if (!p.ok()) return p.status();
  return std::static_pointer_cast<Impl>(*std::move(p));
}

// Destroy: NULL is a no-op; the object is released after the registry lock (its destructor
// may wait for peers or threads).
absl::Status Destroy(const void* handle, Tag tag, const char* arg);

}  // namespace braid::capi

#endif  // BRAID_CAPI_HANDLES_H_
