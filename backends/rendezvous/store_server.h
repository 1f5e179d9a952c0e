// The rendezvous store's server: a key-value table in the master's process (rank 0 under
// torchrun / srun), served over TCP to every rank's TcpStore client. Like the server half of
// PyTorch c10d's TCPStore.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<StoreServer> server, StoreServer::Start("0.0.0.0", 29500));
//   // ... clients (including this process's own) connect to MASTER_ADDR:server->port() ...
//   server.reset();   // stops accepting, closes every connection, joins every thread
//
// Contract: operations are applied atomically in arrival order (one lock over the table);
// the server never waits for a key itself (kGet/kCheck answer at once; clients poll with their
// own deadlines), so a slow or vanished client cannot stall others. One thread accepts and one
// thread serves each connection; all of them stop within ~100 ms of destruction (they poll a
// stop flag between bounded waits) and are joined by the destructor (RAII, nothing detached).
// A connection that sends a malformed frame, or stalls mid-frame for longer than
// kFrameTimeout, is dropped (logged with its peer), never the server.
// Scale: one thread per connection (each rank holds one), and clients poll for keys; fine for
// worlds of a few thousand ranks. c10d's TCPStore uses an event loop and server-side waits,
// which a larger world would want here too.
#ifndef BRAID_BACKENDS_RENDEZVOUS_STORE_SERVER_H_
#define BRAID_BACKENDS_RENDEZVOUS_STORE_SERVER_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/rendezvous/socket.h"
#include "backends/rendezvous/wire.h"

namespace braid::rendezvous {

class StoreServer {
 public:
  static constexpr absl::Duration kFrameTimeout = absl::Seconds(30);
  static constexpr absl::Duration kStopPoll = absl::Milliseconds(100);

  // Binds host:port (port 0: a free one) and starts serving. Unavailable naming the address
  // when it cannot bind (e.g. another job's master already holds MASTER_PORT).
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& host, int port);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  const std::string& address() const { return address_; }  // "host:port"
  // Connections accepted and not yet closed. A server that stops after its clients closed
  // their connections (this count reached 0) leaves no TIME_WAIT on its port, so another
  // listener can bind it at once: the side closing first keeps TIME_WAIT, and not every
  // listener sets SO_REUSEADDR (torch's TCPStore does not).
  int open_connections() const { return open_connections_.load(); }

 private:
  StoreServer(Socket listener, int port, std::string address)
      : listener_(std::move(listener)), port_(port), address_(std::move(address)) {}
  void AcceptLoop();
  void Serve(Socket connection);
  Reply Apply(const Request& request);

  Socket listener_;
  const int port_;
  const std::string address_;
  std::atomic<bool> stop_{false};
  std::atomic<int> open_connections_{0};
  std::thread acceptor_;

  std::mutex threads_mu_;
  std::vector<std::thread> connections_;  // guarded by threads_mu_; joined by the destructor

  std::mutex table_mu_;
  std::map<std::string, std::string> table_;  // guarded by table_mu_
};

}  // namespace braid::rendezvous

#endif  // BRAID_BACKENDS_RENDEZVOUS_STORE_SERVER_H_
