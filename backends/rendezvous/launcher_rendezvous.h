// LauncherRendezvous: every rank of a torchrun / srun world (or one the embedder describes:
// Options::rendezvous) meeting at rank 0's store before a backend builds its communicators on
// it (NCCL's unique id, Gloo's pair addresses).
//
//   ASSIGN_OR_RETURN(std::optional<LauncherEnv> env, LauncherEnvFor(options));
//   ASSIGN_OR_RETURN(std::unique_ptr<LauncherRendezvous> rv,
//                    LauncherRendezvous::Join(*env, "braid/gloo", absl::Seconds(300)));
//   rv->store().Set(...);   // all ranks checked in: the world is complete
//
// Join: rank 0 serves the store on MASTER_ADDR; every rank connects and checks in. The store's
// port is env.store_port when set, else one the OS picks, published through env.exchange (the
// embedder's channel) or handed out at MASTER_ADDR:MASTER_PORT by a bootstrap store that is
// closed again before Join returns on any rank, so MASTER_PORT is free afterwards.
// Everything happens before one deadline, `timeout` from the call.
//
// CheckIn: a rank that never arrives fails every rank that did at the deadline, with
// DeadlineExceeded naming the missing ranks; two processes claiming one rank fail the second
// with AlreadyExists. Lifetime: the server lives as long as rank 0's LauncherRendezvous, so
// the backend owning it must outlive the others' store operations (group creation is
// collective, so it does). One LauncherRendezvous per prefix and world.
// The port hand-off step by step: docs/design/backends.md, "Rendezvous".
#ifndef BRAID_BACKENDS_RENDEZVOUS_LAUNCHER_RENDEZVOUS_H_
#define BRAID_BACKENDS_RENDEZVOUS_LAUNCHER_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "backends/rendezvous/launcher_env.h"
#include "backends/rendezvous/store_client.h"
#include "backends/rendezvous/store_server.h"

namespace braid::rendezvous {

absl::Status CheckIn(TcpStore& store, absl::string_view prefix, int rank, int world_size,
                     absl::Duration timeout);

class LauncherRendezvous {
 public:
  static absl::StatusOr<std::unique_ptr<LauncherRendezvous>> Join(const LauncherEnv& env,
                                                                  absl::string_view prefix,
                                                                  absl::Duration timeout);
  // The store's address as the ranks reach it ("host:port").
  const std::string& store_address() const { return client_->address(); }
  // The client: its default timeout is Join's.
  TcpStore& store() { return *client_; }
  const LauncherEnv& env() const { return env_; }
  const std::string& prefix() const { return prefix_; }

 private:
  LauncherRendezvous(LauncherEnv env, std::string prefix)
      : env_(std::move(env)), prefix_(std::move(prefix)) {}
  // Rank 0: starts the server on a port the OS picks (or env_.store_port); its address.
  absl::StatusOr<std::string> Serve();
  // Case 3 of Join: the store's address through a bootstrap store at master_port, and the
  // check-in; rank 0 stops the bootstrap before any rank returns.
  absl::Status HandOff(absl::Time deadline, absl::Duration timeout);
  const LauncherEnv env_;
  const std::string prefix_;
  std::unique_ptr<StoreServer> server_;  // rank 0 only; destroyed after the client
  std::unique_ptr<TcpStore> client_;
};

}  // namespace braid::rendezvous

#endif  // BRAID_BACKENDS_RENDEZVOUS_LAUNCHER_RENDEZVOUS_H_
