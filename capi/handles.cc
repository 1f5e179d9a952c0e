#include "capi/handles.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::capi {
namespace {

// Tokens look like nothing a caller allocates: a high base, 16-aligned serials, tag in the low
// bits. They are compared, never dereferenced.
constexpr uintptr_t kBase = sizeof(uintptr_t) >= 8 ? static_cast<uintptr_t>(0xB4A1D0000000ull)
                                                   : static_cast<uintptr_t>(0x40000000u);

bool ValidTag(unsigned t) { return t >= 1 && t < static_cast<unsigned>(kNumTags); }

}  // namespace

const char* TagName(Tag tag) {
  switch (tag) {
    case Tag::kWorld:
      return "braid_world_t";
    case Tag::kGroup:
      return "braid_group_t";
    case Tag::kWork:
      return "braid_work_t";
    case Tag::kReducer:
      return "braid_reducer_t";
    case Tag::kOptimizer:
      return "braid_optimizer_t";
  }
  return "unknown handle type";
}

HandleRegistry& HandleRegistry::Get() {
  static HandleRegistry* const registry = new HandleRegistry();  // never destroyed
  return *registry;
}

absl::StatusOr<void*> HandleRegistry::Add(Tag tag, std::shared_ptr<void> object,
                                          std::initializer_list<const void*> parents) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uintptr_t> ps;
  for (const void* p : parents) {
    if (p == nullptr) continue;
    const auto token = reinterpret_cast<uintptr_t>(p);
    if (!entries_.contains(token)) {
      return absl::FailedPreconditionError(
          "a handle this one depends on was destroyed while it was being created");
    }
    ps.push_back(token);
  }
  const uintptr_t token =
      kBase + (static_cast<uintptr_t>(next_serial_++) << 4) + static_cast<uintptr_t>(tag);
  for (uintptr_t p : ps) ++entries_[p].children[static_cast<int>(tag)];
  entries_.emplace(token, Entry{tag, std::move(object), std::move(ps), {}});
  return reinterpret_cast<void*>(token);
}

absl::Status HandleRegistry::Explain(uintptr_t token, Tag tag, const char* arg) const {
  const std::string want = TagName(tag);
  if (token == 0) return absl::InvalidArgumentError(absl::StrCat("argument '", arg, "' is NULL"));
  auto it = entries_.find(token);
  if (it != entries_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "argument '", arg, "' is a ", TagName(it->second.tag), " handle, not a ", want));
  }
  const unsigned t = static_cast<unsigned>(token & 15);
  if (token > kBase && ValidTag(t) && ((token - kBase) >> 4) < next_serial_) {
    const Tag was = static_cast<Tag>(t);
    return absl::InvalidArgumentError(absl::StrCat(
        "argument '", arg, "' is a destroyed ", TagName(was), " handle (used after its destroy)",
        was == tag ? "" : absl::StrCat("; a ", want, " is expected here")));
  }
  return absl::InvalidArgumentError(absl::StrCat("argument '", arg, "' (0x", absl::Hex(token),
                                                 ") is not a Braid handle (garbage, or a "
                                                 "pointer from elsewhere); expected a ",
                                                 want));
}

absl::StatusOr<std::shared_ptr<void>> HandleRegistry::Find(const void* handle, Tag tag,
                                                           const char* arg) const {
  const auto token = reinterpret_cast<uintptr_t>(handle);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(token);
  if (it == entries_.end() || it->second.tag != tag) return Explain(token, tag, arg);
  return it->second.object;
}

absl::StatusOr<std::shared_ptr<void>> HandleRegistry::Remove(const void* handle, Tag tag,
                                                             const char* arg) {
  const auto token = reinterpret_cast<uintptr_t>(handle);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(token);
  if (it == entries_.end() || it->second.tag != tag) return Explain(token, tag, arg);
  std::vector<std::string> alive;
  for (int t = 1; t < kNumTags; ++t) {
    if (it->second.children[t] > 0) {
      alive.push_back(absl::StrCat(it->second.children[t], " ", TagName(static_cast<Tag>(t))));
    }
  }
  if (!alive.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", arg, "' still has live handles created from it: ", absl::StrJoin(alive, ", "),
        "; destroy them first (nothing was destroyed)"));
  }
  std::shared_ptr<void> object = std::move(it->second.object);
  for (uintptr_t p : it->second.parents) {
    auto parent = entries_.find(p);
    if (parent != entries_.end()) --parent->second.children[static_cast<int>(tag)];
  }
  entries_.erase(it);
  return object;
}

int HandleRegistry::Children(const void* handle, Tag child) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(reinterpret_cast<uintptr_t>(handle));
  return it == entries_.end() ? 0 : it->second.children[static_cast<int>(child)];
}

absl::Status Destroy(const void* handle, Tag tag, const char* arg) {
  if (handle == nullptr) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<void>> object = HandleRegistry::Get().Remove(handle, tag, arg);
  if (!object.ok()) return object.status();
  object->reset();  // outside the registry lock: destructors may wait
  return absl::OkStatus();
}

}  // namespace braid::capi
