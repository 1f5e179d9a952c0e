#include "backends/local/fault_injector.h"

#include <utility>

namespace braid::local {

void FaultInjector::FailRank(int world_rank, uint64_t seq, std::string group, std::string message) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(Fault{Fault::Kind::kFail, world_rank, seq, std::move(group),
                          absl::ZeroDuration(), std::move(message)});
}

void FaultInjector::StallRank(int world_rank, uint64_t seq, absl::Duration duration,
                              std::string group) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(
      Fault{Fault::Kind::kStall, world_rank, seq, std::move(group), duration, "injected stall"});
}

void FaultInjector::StallRankInCopy(int world_rank, uint64_t seq, absl::Duration duration,
                                    std::string group) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(Fault{Fault::Kind::kStallInCopy, world_rank, seq, std::move(group), duration,
                          "injected stall in the copy"});
}

std::optional<Fault> FaultInjector::Take(int world_rank, absl::string_view group, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (it->world_rank == world_rank && it->seq == seq &&
        (it->group.empty() || it->group == group)) {
      Fault f = std::move(*it);
      faults_.erase(it);
      return f;
    }
  }
  return std::nullopt;
}

void FaultInjector::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.clear();
}

}  // namespace braid::local
