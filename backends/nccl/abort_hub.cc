#include "backends/nccl/abort_hub.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace braid::nccl {

std::shared_ptr<CommAbortHub> CommAbortHub::Create(std::shared_ptr<AbortDomain> domain,
                                                   int world_rank, bool report) {
  if (domain == nullptr) domain = AbortDomain::Create();
  std::shared_ptr<CommAbortHub> hub(new CommAbortHub(std::move(domain), world_rank, report));
  std::weak_ptr<CommAbortHub> weak = hub;
  hub->sub_ = hub->domain_->Subscribe([weak](const absl::Status& cause) {
    if (std::shared_ptr<CommAbortHub> h = weak.lock()) h->AbortAll(cause);
  });
  return hub;
}

void CommAbortHub::Register(const std::shared_ptr<NcclComm>& comm) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.erase(std::remove_if(comms_.begin(), comms_.end(),
                                [](const std::weak_ptr<NcclComm>& c) { return c.expired(); }),
                 comms_.end());
    comms_.push_back(comm);
  }
  // Outside mu_: the domain's listener holds the domain's lock while it takes mu_.
  if (domain_->aborted() && !comm->failed()) comm->Abort(domain_->status());
}

void CommAbortHub::ReportFailure(const absl::Status& cause) {
  if (report_ && !cause.ok()) domain_->Abort(world_rank_, cause);
}

void CommAbortHub::AbortAll(const absl::Status& cause) {
  std::vector<std::shared_ptr<NcclComm>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& w : comms_) {
      if (std::shared_ptr<NcclComm> c = w.lock()) live.push_back(std::move(c));
    }
  }
  for (const auto& c : live) {
    if (!c->failed()) c->Abort(cause);
  }
}

}  // namespace braid::nccl
