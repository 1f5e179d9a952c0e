// LauncherRendezvous: every rank of a torchrun / srun world (or one the embedder describes:
// Options::rendezvous) meeting at rank 0's store before a backend builds its communicators on
// it (NCCL's unique id, Gloo's pair addresses).
//
//   ASSIGN_OR_RETURN(std::optional<LauncherEnv> env, LauncherEnvFor(options));
//   ASSIGN_OR_RETURN(std::unique_ptr<LauncherRendezvous> rv,
//                    LauncherRendezvous::Join(*env, "braid/gloo", absl::Seconds(300)));
//   rv->store().Set(...);   // all ranks checked in: the world is complete
//
// Join: rank 0 starts the store server on MASTER_ADDR (listening on MASTER_ADDR itself when it
// is a loopback address, so MASTER_ADDR=127.0.0.1 serves loopback only, else on every
// interface: see ListenAddressFor); every rank, rank 0 included, connects a client (retrying
// until the deadline: the server may come up after the others) and checks in (CheckIn below).
// Which port, and how the others learn it (the first that applies):
//   1. env.store_port > 0 (BRAID_STORE_PORT): the store listens there; everyone connects there.
//   2. env.exchange (the embedder's channel, e.g. torch.distributed's store): the store listens
//      on a port the OS picks; rank 0 publishes "host:port" under "<prefix>/store", the others
//      look it up. MASTER_PORT is never touched.
//   3. otherwise (hand-off): the store listens on a port the OS picks, and rank 0 serves a
//      bootstrap store at MASTER_ADDR:master_port holding only that address, for as long as the
//      world is being created: the others read the address there and close their bootstrap
//      connection before checking in; once all checked in and every bootstrap connection is
//      closed (by its client: so MASTER_PORT is left without TIME_WAIT and any listener can bind
//      it), rank 0 stops the bootstrap and says so at the store ("<prefix>/bootstrap_closed"),
//      which every rank waits for. So when Join returns, on any rank, MASTER_PORT is free again
//      (for torch.distributed's env:// store, or the next Braid world).
// Everything happens before one deadline, `timeout` from the call.
//
// CheckIn(store, prefix, rank, world_size, timeout): rank r adds 1 to "<prefix>/rank/<r>" and
// to "<prefix>/arrived", then waits for every "<prefix>/rank/<i>". A rank that never arrives
// fails every rank that did at the deadline, with DeadlineExceeded naming the missing ranks,
// the count that arrived and the store's address (a rank whose connection to rank 0's store
// drops, because rank 0 reached its own deadline first and exited, reports the ranks it last
// saw missing); two processes claiming one rank fail the second with AlreadyExists naming the
// rank.
//
// Lifetime: the server lives as long as rank 0's LauncherRendezvous, so the backend that owns
// it must outlive every store operation of the other ranks (they use the store only while
// creating groups, which are collective: rank 0 is still there). One LauncherRendezvous per
// prefix and world.
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
