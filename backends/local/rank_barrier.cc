#include "backends/local/rank_barrier.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/spin.h"

namespace braid::local {

RankBarrier::RankBarrier(int n, absl::Duration spin)
    : n_(n), spin_ns_(absl::ToInt64Nanoseconds(spin)), arrived_(n, 0) {}

absl::Status RankBarrier::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void RankBarrier::Fail(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load(std::memory_order_relaxed)) return;
    failure_ = std::move(status);
    failed_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

absl::Status RankBarrier::Arrive(int rank, absl::Time deadline, const WorkInfo& info,
                                 const std::vector<int>& rank_names) {
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load(std::memory_order_relaxed)) return failure_;
    gen = generation_.load(std::memory_order_relaxed);
    arrived_[rank] = 1;
    if (++count_ == n_) {
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), 0);
      generation_.store(gen + 1, std::memory_order_release);
      cv_.notify_all();
      return absl::OkStatus();
    }
  }
  auto released = [&] {
    return generation_.load(std::memory_order_acquire) != gen ||
           failed_.load(std::memory_order_acquire);
  };
  SpinUntil(released, spin_ns_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, absl::ToChronoTime(deadline), released);
  if (generation_.load(std::memory_order_relaxed) != gen) return absl::OkStatus();
  if (failed_.load(std::memory_order_relaxed)) return failure_;
  // Deadline: fail the barrier for everyone, naming who is missing.
  std::vector<int> missing;
  for (int r = 0; r < n_; ++r) {
    if (!arrived_[r]) missing.push_back(rank_names[r]);
  }
  failure_ = absl::DeadlineExceededError(absl::StrCat(info.Describe(), ": rank(s) ",
                                                      absl::StrJoin(missing, ", "),
                                                      " did not arrive before the deadline"));
  failed_.store(true, std::memory_order_release);
  cv_.notify_all();
  return failure_;
}

}  // namespace braid::local
