#include "comm/work.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/spin.h"

namespace braid {

std::string WorkInfo::Describe() const {
  std::string s = absl::StrCat(op, " #", seq, " on group '", group, "'");
  if (!label.empty()) absl::StrAppend(&s, " (", label, ")");
  return s;
}

Work::Work(WorkInfo info, absl::Duration spin)
    : info_(std::move(info)), spin_ns_(absl::ToInt64Nanoseconds(spin)) {}

WorkPtr Work::Create(WorkInfo info, absl::Duration spin) {
  return WorkPtr(new Work(std::move(info), spin));
}

WorkPtr Work::Completed(WorkInfo info, absl::Status status) {
  WorkPtr w = Create(std::move(info));
  w->Complete(std::move(status));
  return w;
}

bool Work::Complete(absl::Status status) {
  absl::InlinedVector<Callback, 2> callbacks;
  std::shared_ptr<WorkObserver> observer;  // released after the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return false;
    status_ = std::move(status);
    callbacks.swap(callbacks_);
    observer.swap(observer_);
    // Before done_: whoever sees the work done also sees its record finished.
    if (observer != nullptr) observer->WorkFinished(observer_token_, status_, started_ns());
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& cb : callbacks) cb(status_);
  return true;
}

void Work::OnComplete(Callback cb) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_.load(std::memory_order_relaxed)) {
      callbacks_.push_back(std::move(cb));
      return;
    }
  }
  cb(status_);
}

void Work::Observe(std::shared_ptr<WorkObserver> observer, uint64_t token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_.load(std::memory_order_relaxed)) {
      observer_ = std::move(observer);
      observer_token_ = token;
      const int64_t started = started_ns();
      if (started != 0 && observer_ != nullptr) observer_->WorkStarted(token, started);
      return;
    }
  }
  if (observer != nullptr) observer->WorkFinished(token, status_, started_ns());
}

void Work::MarkStarted() {
  int64_t expected = 0;
  const int64_t now = absl::GetCurrentTimeNanos();
  if (!started_ns_.compare_exchange_strong(expected, now, std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (observer_ != nullptr) observer_->WorkStarted(observer_token_, now);
}

absl::Status Work::status() const {
  if (!Done()) {
    return absl::FailedPreconditionError(absl::StrCat(info_.Describe(), " is still in flight"));
  }
  return status_;
}

absl::Status Work::Wait(absl::Duration timeout) {
  if (Done()) return status_;  // no clock read on the common already-done path
  return WaitUntil(absl::Now() + timeout);
}

absl::Status Work::WaitUntil(absl::Time deadline) {
  if (Done()) return status_;
  if (poller_) {
    // Polling-driven backend: drive progress ourselves, as MPI_Wait does. After 20 ms of
    // continuous polling, sleep between polls for 1/20 of the time waited so far (at most
    // 1 ms): a long or stuck collective then costs little CPU, and adds at most ~5 % latency.
    const absl::Time start = absl::Now();
    for (uint32_t i = 0; !Done(); ++i) {
      poller_();
      if ((i & 63) != 63) continue;
      const absl::Time now = absl::Now();
      if (now >= deadline) break;
      const absl::Duration waited = now - start;
      if (waited < absl::Milliseconds(20)) {
        std::this_thread::yield();  // an oversubscribed box must still run the peer ranks
      } else {
        absl::SleepFor(std::min(absl::Milliseconds(1), waited / 20));
      }
    }
  } else {
    SpinUntil([this] { return Done(); }, spin_ns_);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, absl::ToChronoTime(deadline),
                   [this] { return done_.load(std::memory_order_relaxed); });
  }
  if (Done()) return status_;
  return absl::DeadlineExceededError(
      absl::StrCat("timed out waiting for ", info_.Describe(), ": not complete at the deadline"));
}

}  // namespace braid
