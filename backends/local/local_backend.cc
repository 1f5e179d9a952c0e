#include "backends/local/local_backend.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "backends/local/local_group.h"
#include "comm/status_macros.h"

namespace braid::local {

absl::StatusOr<std::unique_ptr<Backend>> LocalBackend::Create(const Options& options) {
  if (options.local_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("local backend: local_ranks must be >= 1, got ", options.local_ranks));
  }
  return std::unique_ptr<Backend>(new LocalBackend(options.local_ranks, options));
}

LocalBackend::LocalBackend(int world_size, const Options& options)
    : world_size_(world_size),
      faults_(std::make_shared<FaultInjector>()),
      domain_(AbortDomain::Create()),
      handed_out_(world_size, false) {
  std::vector<int> ranks(world_size);
  std::iota(ranks.begin(), ranks.end(), 0);
  world_ = MakeLocalComm("world", std::move(ranks), options.timeout, options.spin,
                         LocalWorld{faults_, domain_, options.abort_on_failure});
}

Capabilities LocalBackend::capabilities() const { return LocalGroup::LocalCapabilities(); }

std::vector<int> LocalBackend::local_ranks() const {
  std::vector<int> ranks(world_size_);
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

absl::StatusOr<std::unique_ptr<Group>> LocalBackend::CreateWorldGroup(int rank) {
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("local backend: rank ", rank, " is outside the world of size ", world_size_));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (handed_out_[rank]) {
    return absl::FailedPreconditionError(
        absl::StrCat("local backend: the world group of rank ", rank, " was already created"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Group> group, LocalGroup::Start(world_, rank));
  handed_out_[rank] = true;
  return group;
}

namespace {
const BackendRegistration kRegistration(
    "local", "ranks are threads of this process over shared memory (deterministic)",
    &LocalBackend::Create);
}  // namespace

}  // namespace braid::local
