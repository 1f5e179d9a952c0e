#include "backends/gloo/store_adapter.h"

#include "absl/time/time.h"
#include "gloo/common/error.h"

namespace braid::gloo_backend {
namespace {

[[noreturn]] void Throw(const absl::Status& s) {
  throw ::gloo::IoException(std::string(s.ToString()));
}

}  // namespace

void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  const absl::Status s = store_.Set(Key(key), absl::string_view(data.data(), data.size()));
  if (!s.ok()) Throw(s);
}

std::vector<char> StoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> v = store_.Get(Key(key));
  if (!v.ok()) Throw(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void StoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(store_.timeout())));
}

void StoreAdapter::wait(const std::vector<std::string>& keys,
                        const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(Key(k));
  // Gloo's kNoTimeout (0) means "no limit" there; here it means the store's own deadline.
  const absl::Duration limit =
      timeout.count() > 0 ? absl::Milliseconds(timeout.count()) : store_.timeout();
  const absl::Status s = store_.Wait(full, limit);
  if (!s.ok()) Throw(s);
}

}  // namespace braid::gloo_backend
