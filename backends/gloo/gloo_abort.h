// GlooAbortLink: a gloo world's link to the job's abort domain (comm/abort_domain.h), carried
// by the rendezvous store the ranks already share (there is no MPI here).
//
//   - A local abort (a group's own failure, AbortJob) is written to the store under one key
//     ("braid/abort": "<rank>\n<code>\n<cause>"); the first writer's cause is the job's.
//   - A watcher thread per process checks that key every kPoll (20 ms) and hands a peer's
//     abort to the domain.
//   - When the domain aborts, every registered Gloo context with no call in flight on this
//     rank closes its connections (gloo::Context::closeConnections), and a context whose call
//     is in flight closes them as soon as that call returns. Closing wakes the *peers* blocked
//     on this rank (they read EOF), never this rank's own waiter (Gloo ignores errors on a pair
//     it closed itself), hence the rule: a rank blocked in Gloo waits for its peers' EOF, then
//     closes in turn, and the closes run around the ring. Queued calls fail with the cause.
//
//   - A process whose world shuts down while the job has not aborted (process exit, an exception,
//     braid_world_destroy) writes a leave notice there (code kLeftCode): peers hand it to the
//     domain kLeaveGrace after they saw it (what the leaver completed completes meanwhile), or
//     at once when a call of theirs fails on a connection the leaver closed (TakeLeaveNotice).
//     A world still alive when its process ends (a return from main) sends it at exit
//     (leave_at_exit.h, LeaveAtExit); there the store's host (rank 0) waits up to kExitWait
//     until every peer that has not left (kLeftKey) acknowledged it (kSeenKey), since the
//     store closes with the process.
//
//   ASSIGN_OR_RETURN(auto link, GlooAbortLink::Start(store, rank, size, /*report=*/true));
//   link->Register(context, busy);  // every group's Gloo context
//   link->Report(status);           // a group failed by itself
//
// Cost: one small store round trip per process every 20 ms (to rank 0's store), so a job of
// N ranks sends rank 0 N/0.02 requests a second: fine for tens of ranks; a push from the store
// would scale further. The store must outlive the link (the gloo world keeps it).
#ifndef BRAID_BACKENDS_GLOO_GLOO_ABORT_H_
#define BRAID_BACKENDS_GLOO_GLOO_ABORT_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "backends/rendezvous/store_client.h"
#include "comm/abort_domain.h"
#include "gloo/context.h"

namespace braid::gloo_backend {

class GlooAbortLink {
 public:
  static constexpr char kKey[] = "braid/abort";
  static constexpr absl::Duration kPoll = absl::Milliseconds(20);
  static constexpr int kLeftCode = -1;  // the code field of a leave notice
  static constexpr absl::Duration kLeaveGrace = absl::Milliseconds(500);
  static constexpr char kSeenKey[] = "braid/abort/seen";  // peers that saw a leave notice
  static constexpr char kLeftKey[] = "braid/abort/left";  // ranks that sent one
  static constexpr absl::Duration kExitWait = absl::Milliseconds(200);

  // `store` is not owned. `report`: a group's own failure aborts the job
  // (BRAID_ABORT_ON_FAILURE). Registered for the leave notice at exit (leave_at_exit.h).
  // ResourceExhausted when the watcher thread cannot be started.
  static absl::StatusOr<std::shared_ptr<GlooAbortLink>> Start(rendezvous::TcpStore* store,
                                                              int world_rank, int world_size,
                                                              bool report);
  ~GlooAbortLink();  // leaves the job (the notice, unless aborted); stops and joins the watcher
  GlooAbortLink(const GlooAbortLink&) = delete;
  GlooAbortLink& operator=(const GlooAbortLink&) = delete;

  // `busy`: true while this rank's call on `context` is inside Gloo.
  void Register(const std::shared_ptr<::gloo::Context>& context,
                std::shared_ptr<std::atomic<bool>> busy);
  // After a call on `context` returned: closes its connections if the job aborted.
  void CloseIfAborted(::gloo::Context& context);
  // A group failed by itself (not because the job aborted): abort the job (if `report`).
  void Report(const absl::Status& cause);
  // A call failed on a closed connection: a peer's leave notice seen (in its grace) is handed
  // to the domain now (true), naming the rank that left.
  bool TakeLeaveNotice();
  // The process ends with this world alive: the destructor's leave notice (once; not after an
  // abort), then, on rank 0 of a world of several, up to kExitWait for the peers to see it.
  void LeaveAtExit();

  const std::shared_ptr<AbortDomain>& domain() const { return domain_; }
  int world_rank() const { return world_rank_; }

 private:
  GlooAbortLink(rendezvous::TcpStore* store, int world_rank, int world_size, bool report);
  // The leave notice, `how` saying how this rank left: once, and only while the job runs.
  void SendLeave(absl::string_view how);
  void Watch();
  void CloseAll();

  rendezvous::TcpStore* const store_;
  const int world_rank_;
  const int world_size_;
  const bool report_;
  std::atomic<bool> left_{false};  // the leave notice was sent
  const std::shared_ptr<AbortDomain> domain_ = AbortDomain::Create();
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  struct Entry {
    std::weak_ptr<::gloo::Context> context;
    std::shared_ptr<std::atomic<bool>> busy;
  };
  std::vector<Entry> contexts_;  // guarded by mu_
  // A peer's leave notice, not yet handed to the domain (guarded by mu_).
  struct Leave {
    int rank = -1;
    std::string cause;
    absl::Time due;
  };
  std::optional<Leave> leave_;
  AbortDomain::Subscription sub_;
  std::thread watcher_;  // last: starts after everything it uses
};

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_GLOO_ABORT_H_
