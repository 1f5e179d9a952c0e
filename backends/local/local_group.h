// The `local` backend's Group: ranks are threads of one process over shared memory.
//
// RANK-ORDER CONTRACT (see comm/group.h): every rank issues this group's collectives in the
// same order. Each rank's Group object owns a worker thread that runs its collectives in
// issue order; the workers of one group meet at a generation barrier (with a deadline) per
// phase, so a collective never depends on which thread comes first:
//   all-reduce:      A | rank r reduces chunk r of every input, in rank order 0..n-1, and
//                    writes it into every rank's output | B
//   reduce-scatter:  A | rank r reduces block r of every input, in rank order | B
//   all-gather:      A | rank r copies every rank's block | B
//   broadcast:       A | every non-root copies the root's buffer | B
// Results are therefore bit-identical run to run. At barrier A every rank checks that all
// ranks called the same collective with the same count/dtype/op/root and fails (on every rank,
// naming the ranks) if not. A failed or stalled rank fails the group for all: peers get an
// error naming it, never a hang, and every later call on the group fails fast. A Work that
// fails completes only once no peer can still touch its buffers.
#ifndef BRAID_BACKENDS_LOCAL_LOCAL_GROUP_H_
#define BRAID_BACKENDS_LOCAL_LOCAL_GROUP_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/local/fault_injector.h"
#include "backends/local/rank_barrier.h"
#include "backends/local/ring_queue.h"
#include "comm/group.h"
#include "comm/work_pool.h"

namespace braid::local {

// What one rank publishes for the collective in progress (read by peers after barrier A).
struct Posted {
  CollectiveArgs args;
  bool split = false;
  int color = 0;
  int key = 0;
  std::string split_name;
};

// State shared by the n ranks of one group.
class LocalComm;

class LocalGroup final : public Group {
 public:
  // A rank's group on `comm`, its worker thread started (ResourceExhausted when it cannot be:
  // the peers' calls on the group then fail at once, as when a rank destroys its handle).
  static absl::StatusOr<std::unique_ptr<Group>> Start(std::shared_ptr<LocalComm> comm, int rank);
  ~LocalGroup() override;

  int rank() const override { return rank_; }
  int size() const override;
  const std::string& name() const override;
  absl::string_view backend_name() const override { return "local"; }
  Capabilities capabilities() const override;

  // Capabilities of every local group.
  static Capabilities LocalCapabilities();

 protected:
  absl::StatusOr<WorkPtr> Launch(const CollectiveArgs& args) override;
  absl::StatusOr<std::unique_ptr<Group>> DoSplit(int color, int key, std::string name) override;
  int world_rank() const override;

 private:
  struct Op {
    Posted posted;
    WorkPtr work;
    // For splits: where the worker puts the child. Shared, so a caller that stopped waiting
    // never leaves the worker writing through a dangling pointer.
    std::shared_ptr<std::shared_ptr<LocalComm>> split_result;
  };

  WorkPtr Enqueue(Op op, std::string label);
  LocalGroup(std::shared_ptr<LocalComm> comm, int rank);
  void WorkerLoop();
  absl::Status Execute(Op& op);
  absl::Status RunPhases(const Op& op, const std::vector<Posted>& posted, absl::Time deadline,
                         const WorkInfo& info);
  absl::Status RunCollective(const CollectiveArgs& a, const std::vector<Posted>& posted,
                             absl::Time deadline, const WorkInfo& info);
  absl::Status RunSplit(const Op& op, const std::vector<Posted>& posted, absl::Time deadline,
                        const WorkInfo& info);
  absl::Status CheckSameCall(const std::vector<Posted>& posted, const WorkInfo& info) const;

  const std::shared_ptr<LocalComm> comm_;
  const int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  RingQueue<Op> queue_;      // guarded by mu_
  bool running_op_ = false;  // guarded by mu_
  bool stopping_ = false;    // guarded by mu_
  uint64_t next_seq_ = 0;    // guarded by mu_
  WorkPool works_;           // steady state: no allocation per collective
  // The worker's scratch for reductions (one entry per rank), sized once.
  std::vector<const void*> in_;
  std::vector<void*> out_;
  std::vector<double> scalars_;
  absl::Duration copy_stall_;  // worker only: an injected stall before this op's copy (tests)
  std::thread worker_;         // last: starts after everything it uses
};

// What every group of one local world shares: the fault injector (tests), the job's abort
// domain (one for all ranks: they are threads of this process), and whether a failed op
// aborts the job (BRAID_ABORT_ON_FAILURE) or only fails its group.
struct LocalWorld {
  std::shared_ptr<FaultInjector> faults;
  std::shared_ptr<AbortDomain> domain;
  bool abort_on_failure = true;
};

// Creates the shared state of a new group (the world, or a split child).
std::shared_ptr<LocalComm> MakeLocalComm(std::string name, std::vector<int> world_ranks,
                                         absl::Duration timeout, absl::Duration spin,
                                         const LocalWorld& world);

}  // namespace braid::local

#endif  // BRAID_BACKENDS_LOCAL_LOCAL_GROUP_H_
