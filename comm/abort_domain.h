// AbortDomain: the ranks of one job fail together. When anything fails on one rank (a
// collective's deadline or transport error on any group, a step, an explicit abort), every
// group of every rank stops waiting for it: pending Works fail and new calls are refused with
// the first cause, naming the rank that reported it, instead of each rank waiting out its own
// deadline (torch's NCCL watchdog and Horovod's coordinator do the same).
//
// One domain per process and job, shared by the world group and every group split from it
// (Group::abort_domain()). Where ranks are threads of one process (`local`), the one domain is
// shared by all of them, so an abort reaches every rank at once. Where ranks are processes,
// the backend installs a Notifier that tells the other processes (the `mpi` backend: a
// message on a communicator of its own) and delivers theirs here with AbortFromPeer.
//
//   std::shared_ptr<AbortDomain> domain = AbortDomain::Create();
//   AbortDomain::Subscription sub = domain->Subscribe([&](const absl::Status& cause) {
//     barrier.Fail(cause);                    // fail what is pending (must not block long)
//   });
//   domain->Abort(/*rank=*/2, absl::InternalError("allreduce #5 on group 'world': ..."));
//   domain->status();   // Aborted: "job aborted: rank 2 reported INTERNAL: allreduce #5 on ..."
//
// Invariants: the first cause wins (later Abort and AbortFromPeer calls are ignored and return
// false); every listener subscribed before the abort is called exactly once with it, and one
// subscribed after is called at once on Subscribe; the notifier is called only for an abort
// that started on this process (Abort), never for one a peer reported, so nothing echoes.
// Listeners and the notifier run on the aborting thread, under the domain's lock: they must
// not call back into the domain (Subscribe, Abort) and must not wait for other ranks.
// Destroying a Subscription waits for a running listener call to end, so a listener never
// runs after its Subscription is gone.
#ifndef BRAID_COMM_ABORT_DOMAIN_H_
#define BRAID_COMM_ABORT_DOMAIN_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace braid {

class AbortDomain : public std::enable_shared_from_this<AbortDomain> {
 public:
  using Listener = std::function<void(const absl::Status& cause)>;
  // Tells the other processes of the job: (this process's reporting rank, the cause).
  using Notifier = std::function<void(int rank, const absl::Status& cause)>;

  static std::shared_ptr<AbortDomain> Create();
  AbortDomain(const AbortDomain&) = delete;
  AbortDomain& operator=(const AbortDomain&) = delete;

  // Unsubscribes on destruction (waiting for a running call of its listener). Movable.
  class Subscription {
   public:
    Subscription() = default;
    Subscription(Subscription&& other) noexcept;
    Subscription& operator=(Subscription&& other) noexcept;
    ~Subscription();
    void Reset();

   private:
    friend class AbortDomain;
    Subscription(std::weak_ptr<AbortDomain> domain, uint64_t id)
        : domain_(std::move(domain)), id_(id) {}
    std::weak_ptr<AbortDomain> domain_;
    uint64_t id_ = 0;
  };

  // Calls `listener` when the domain aborts (at once if it already has).
  Subscription Subscribe(Listener listener);
  // Set once by a multi-process backend; replaced by a later call.
  void SetNotifier(Notifier notifier);

  // Rank `rank` (a world rank) of this process reports `cause` (not OK): the job aborts,
  // listeners run, the notifier tells the other processes. False if the domain had aborted.
  bool Abort(int rank, const absl::Status& cause);
  // Another process's abort, as its notifier sent it: listeners run, nobody is told.
  bool AbortFromPeer(int rank, absl::string_view cause_message,
                     absl::StatusCode code = absl::StatusCode::kAborted);

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // OK until aborted; then kAborted (whatever the reported code: everything the abort fails
  // failed because of another group or rank) with "job aborted: rank R reported CODE: <cause>".
  absl::Status status() const;
  int aborting_rank() const;      // -1 until aborted
  absl::Time aborted_at() const;  // InfinitePast until aborted
  // The cause as refused by a new call on group `group`: "group 'g' refuses new calls: ...".
  absl::Status RefusalFor(absl::string_view group) const;

 private:
  AbortDomain() = default;
  bool AbortLocked(int rank, absl::Status cause, bool notify);
  void Unsubscribe(uint64_t id);

  mutable std::recursive_mutex mu_;         // recursive: Unsubscribe from within a listener is safe
  std::map<uint64_t, Listener> listeners_;  // guarded by mu_
  uint64_t next_id_ = 1;                    // guarded by mu_
  Notifier notifier_;                       // guarded by mu_
  absl::Status cause_;                      // guarded by mu_
  int rank_ = -1;                           // guarded by mu_
  absl::Time at_ = absl::InfinitePast();    // guarded by mu_
  std::atomic<bool> aborted_{false};
};

}  // namespace braid

#endif  // BRAID_COMM_ABORT_DOMAIN_H_
