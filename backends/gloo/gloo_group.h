// The `gloo` backend's Group: a Gloo context (full mesh of TCP pairs) and a SerialWorker that
// runs its collectives in issue order.
//
// RANK-ORDER CONTRACT (see comm/group.h): every rank issues this group's collectives and
// Splits in the same order, with matching arguments. Each call takes the next sequence number,
// which is also its Gloo tag; the worker hands calls to Gloo in that order. Gloo cannot see a
// mismatch: it shows as a deadline error (or Gloo's size check).
//
//   ASSIGN_OR_RETURN(WorkPtr w, world->AllReduce(buf, buf, n, DType::kF32, ReduceOp::Sum()));
//   w->OnComplete([](const absl::Status& s) { ... });  // on the group's worker thread
//   ASSIGN_OR_RETURN(std::unique_ptr<Group> half, world->Split(rank % 2, rank));
//
// Launch never blocks on peers: it queues the call on the worker and returns its Work. Every
// call has a deadline (CollectiveOptions::timeout, else the backend's BRAID_TIMEOUT_MS),
// counted from Launch; Gloo gets what is left as its own timeout. A call that fails (deadline,
// a peer gone) fails the group: Gloo's pairs are unusable after an error, so every later call
// returns that cause at once (naming the failed op), never a hang.
//
// SPLIT is collective and blocks its caller: (color, key) of every rank are all-gathered on
// this group (queued behind its collectives, under the deadline), every rank checks the same
// table (a negative color other than kNoColor fails every rank, naming the rank), and the
// ranks of each color connect a new Gloo context through the rendezvous store under the key
// prefix "<this group's prefix>/split<seq>/<color>": Gloo's pairs are per context. Split
// waits for the group's worker, so it must not be called from a completion callback of the
// same group (that runs on the worker): it would fail at the deadline, not hang.
#ifndef BRAID_BACKENDS_GLOO_GLOO_GROUP_H_
#define BRAID_BACKENDS_GLOO_GLOO_GROUP_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/gloo/gloo_abort.h"
#include "backends/gloo/serial_worker.h"
#include "backends/rendezvous/store_client.h"
#include "comm/group.h"
#include "gloo/context.h"
#include "gloo/transport/device.h"

namespace braid::gloo_backend {

// What every group of one backend shares: the store (Split's rendezvous), the TCP device (one
// event loop thread for all pairs) and the settings. Owns whatever keeps the store up (on rank
// 0 the server): groups keep it alive, so they may outlive the backend object.
struct GlooWorld {
  std::shared_ptr<void> store_owner;  // LauncherRendezvous, or a world of one's own server
  rendezvous::TcpStore* store = nullptr;
  std::shared_ptr<::gloo::transport::Device> device;
  absl::Duration timeout = absl::Seconds(300);
  absl::Duration spin = absl::Microseconds(20);
  // The job's abort domain through the store (gloo_abort.h). Declared after store_owner: it
  // is destroyed first, while the store it polls still exists.
  std::shared_ptr<GlooAbortLink> aborts;
};

// A Gloo context of `size` ranks as `rank`, its peers found through the store under `prefix`.
// Collective over those ranks; bounded by world.timeout. Errors name the prefix.
absl::StatusOr<std::shared_ptr<::gloo::Context>> ConnectContext(GlooWorld& world,
                                                                const std::string& prefix, int rank,
                                                                int size);

// A group's first failure; later calls fail with it. Shared with its queued tasks.
struct GroupFailure {
  std::mutex mu;
  absl::Status cause;  // guarded by mu
};

class GlooGroup final : public Group {
 public:
  // ResourceExhausted when the group's worker thread cannot be started.
  static absl::StatusOr<std::unique_ptr<Group>> Create(std::shared_ptr<GlooWorld> world,
                                                       std::shared_ptr<::gloo::Context> context,
                                                       std::string name, std::string prefix);
  GlooGroup(std::shared_ptr<GlooWorld> world, std::shared_ptr<::gloo::Context> context,
            std::string name, std::string prefix, std::unique_ptr<SerialWorker> worker);
  ~GlooGroup() override;

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  const std::string& name() const override { return name_; }
  absl::string_view backend_name() const override { return "gloo"; }
  Capabilities capabilities() const override { return GlooCapabilities(); }
  static Capabilities GlooCapabilities();

 protected:
  absl::StatusOr<WorkPtr> Launch(const CollectiveArgs& args) override;
  absl::StatusOr<std::unique_ptr<Group>> DoSplit(int color, int key, std::string name) override;
  int world_rank() const override {
    return world_->aborts != nullptr ? world_->aborts->world_rank() : rank();
  }

 private:
  const std::shared_ptr<GlooWorld> world_;
  const std::shared_ptr<::gloo::Context> context_;
  const std::string name_;
  const std::string prefix_;
  const std::shared_ptr<GroupFailure> failure_ = std::make_shared<GroupFailure>();
  // True while this rank's call is inside Gloo (gloo_abort.h's closing rule).
  const std::shared_ptr<std::atomic<bool>> busy_ = std::make_shared<std::atomic<bool>>(false);
  uint64_t next_seq_ = 0;  // collectives and splits, identical on every rank
  // Last: destroyed first, so no task runs once the members above are gone.
  std::unique_ptr<SerialWorker> worker_;
};

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_GLOO_GROUP_H_
