// The `local` backend: a world of N ranks that are threads of this process (the embedded
// default; deterministic; fault injection for tests).
//
//   Options o;
//   o.backend = "local";
//   o.local_ranks = 4;
//   ASSIGN_OR_RETURN(auto backend, CreateBackend(o));
//   // give backend->WorldGroup(r) to thread r, for r in 0..3
#ifndef BRAID_BACKENDS_LOCAL_LOCAL_BACKEND_H_
#define BRAID_BACKENDS_LOCAL_LOCAL_BACKEND_H_

#include <memory>
#include <mutex>
#include <vector>

#include "backends/local/fault_injector.h"
#include "comm/backend.h"

namespace braid::local {

class LocalComm;

class LocalBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const Options& options);

  absl::string_view name() const override { return "local"; }
  Capabilities capabilities() const override;
  int world_size() const override { return world_size_; }
  std::vector<int> local_ranks() const override;
  absl::StatusOr<std::unique_ptr<Group>> CreateWorldGroup(int rank) override;

  FaultInjector& faults() { return *faults_; }
  // The job's abort domain, shared by every group of every rank (comm/abort_domain.h).
  AbortDomain& abort_domain() { return *domain_; }

 private:
  LocalBackend(int world_size, const Options& options);

  const int world_size_;
  std::shared_ptr<FaultInjector> faults_;
  std::shared_ptr<AbortDomain> domain_;
  std::shared_ptr<LocalComm> world_;
  std::mutex mu_;
  std::vector<bool> handed_out_;  // guarded by mu_
};

}  // namespace braid::local

#endif  // BRAID_BACKENDS_LOCAL_LOCAL_BACKEND_H_
