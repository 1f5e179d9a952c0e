#include "comm/abort_domain.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace braid {

std::shared_ptr<AbortDomain> AbortDomain::Create() {
  return std::shared_ptr<AbortDomain>(new AbortDomain());
}

AbortDomain::Subscription::Subscription(Subscription&& other) noexcept
    : domain_(std::move(other.domain_)), id_(other.id_) {
  other.id_ = 0;
}

AbortDomain::Subscription& AbortDomain::Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    Reset();
    domain_ = std::move(other.domain_);
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

AbortDomain::Subscription::~Subscription() { Reset(); }

void AbortDomain::Subscription::Reset() {
  if (id_ == 0) return;
  if (std::shared_ptr<AbortDomain> d = domain_.lock()) d->Unsubscribe(id_);
  domain_.reset();
  id_ = 0;
}

AbortDomain::Subscription AbortDomain::Subscribe(Listener listener) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (aborted()) {
    listener(cause_);
    return Subscription();
  }
  const uint64_t id = next_id_++;
  listeners_.emplace(id, std::move(listener));
  return Subscription(weak_from_this(), id);
}

void AbortDomain::Unsubscribe(uint64_t id) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  listeners_.erase(id);
}

void AbortDomain::SetNotifier(Notifier notifier) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  notifier_ = std::move(notifier);
}

bool AbortDomain::Abort(int rank, const absl::Status& cause) {
  if (cause.ok() || aborted()) return false;
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return AbortLocked(rank, cause, /*notify=*/true);
}

bool AbortDomain::AbortFromPeer(int rank, absl::string_view cause_message, absl::StatusCode code) {
  if (aborted()) return false;
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kAborted;
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return AbortLocked(rank, absl::Status(code, cause_message), /*notify=*/false);
}

bool AbortDomain::AbortLocked(int rank, absl::Status cause, bool notify) {
  if (aborted()) return false;
  const absl::Status original = cause;
  // kAborted ("a remote rank failed": BRAID_PEER_ERROR in the C API) for everything the abort
  // fails; the reported code stays in the text.
  cause_ = absl::AbortedError(absl::StrCat("job aborted: rank ", rank, " reported ",
                                           absl::StatusCodeToString(cause.code()), ": ",
                                           cause.message()));
  rank_ = rank;
  at_ = absl::Now();
  aborted_.store(true, std::memory_order_release);
  if (notify && notifier_) notifier_(rank, original);
  // A listener may unsubscribe others (or itself): walk by id, not by iterator.
  uint64_t next = 0;
  for (;;) {
    auto it = listeners_.lower_bound(next);
    if (it == listeners_.end()) break;
    next = it->first + 1;
    Listener l = it->second;  // a copy: the entry may be erased while it runs
    l(cause_);
  }
  return true;
}

absl::Status AbortDomain::status() const {
  if (!aborted()) return absl::OkStatus();
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return cause_;
}

int AbortDomain::aborting_rank() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return rank_;
}

absl::Time AbortDomain::aborted_at() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return at_;
}

absl::Status AbortDomain::RefusalFor(absl::string_view group) const {
  const absl::Status s = status();
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat("group '", group, "' refuses new calls: ", s.message()));
}

}  // namespace braid
