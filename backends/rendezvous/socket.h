// TCP sockets for the rendezvous store: one owning handle, and every blocking step bounded by a
// deadline (poll(2) before each read, write, accept; connect retried until the deadline).
//
//   ASSIGN_OR_RETURN(Socket listener, Socket::Listen("127.0.0.1", 0));      // 0: any free port
//   ASSIGN_OR_RETURN(int port, listener.LocalPort());
//   // elsewhere:
//   ASSIGN_OR_RETURN(Socket s, Socket::Connect("127.0.0.1", port, absl::Now() + absl::Seconds(5)));
//   RETURN_IF_ERROR(s.SendAll(bytes, deadline));
//
// Invariants: a Socket owns its descriptor and closes it exactly once (move-only, RAII); no
// call waits past the deadline it is given; every error names the peer ("host:port") and the
// system call that failed. SIGPIPE is never raised (MSG_NOSIGNAL): a closed peer is an error.
//
// Why Connect retries: under torchrun/srun every rank starts at once, and rank 0's server may
// bind after the others try to connect; a refused or unreachable peer is retried with a growing
// pause (10 ms up to 200 ms) until the deadline, and the error then carries the last cause.
#ifndef BRAID_BACKENDS_RENDEZVOUS_SOCKET_H_
#define BRAID_BACKENDS_RENDEZVOUS_SOCKET_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace braid::rendezvous {

class Socket {
 public:
  Socket() = default;
  // Takes ownership of `fd` (-1: empty); `peer` names the other end in errors.
  Socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();

  // A listening socket bound to host:port (port 0: the kernel picks one, see LocalPort).
  // SO_REUSEADDR is set so a restarted master can rebind while old connections linger.
  // Unavailable naming the address when it is taken or cannot be bound.
  static absl::StatusOr<Socket> Listen(const std::string& host, int port);
  // Connects to host:port, retrying refused / unreachable attempts until `deadline`.
  // DeadlineExceeded naming the address and the last error when no attempt succeeded;
  // InvalidArgument when the host does not resolve.
  static absl::StatusOr<Socket> Connect(const std::string& host, int port, absl::Time deadline);

  // Accepts one connection; DeadlineExceeded when none arrived before `deadline` (the caller
  // loops, checking its own stop flag between calls).
  absl::StatusOr<Socket> Accept(absl::Time deadline);
  // Writes every byte of `data`; Unavailable when the peer closed, DeadlineExceeded when the
  // peer did not drain the socket in time.
  absl::Status SendAll(absl::string_view data, absl::Time deadline);
  // Reads exactly `n` bytes into `out`; Unavailable when the peer closed first.
  absl::Status RecvAll(char* out, size_t n, absl::Time deadline);
  // Whether bytes (or an orderly close) can be read before `deadline` (false on timeout).
  absl::StatusOr<bool> WaitReadable(absl::Time deadline);

  // The port this socket is bound to (after Listen with port 0).
  absl::StatusOr<int> LocalPort() const;
  bool valid() const { return fd_ >= 0; }
  const std::string& peer() const { return peer_; }
  void Close();

 private:
  friend absl::StatusOr<std::string> LocalAddressToward(const std::string& host, int port);
  int fd_ = -1;
  std::string peer_;
};

// The numeric address of this host's interface that routes to host:port (a UDP socket
// "connected" there, nothing sent): what peers should use to reach this process when they can
// reach `host`. 127.0.0.1 toward a loopback master. Unavailable naming host:port on failure.
absl::StatusOr<std::string> LocalAddressToward(const std::string& host, int port);

// Where a server for clients that connect to `host` should listen: `host` itself when it is a
// loopback address (tests, single-host runs stay off the network), else every interface of
// its family ("0.0.0.0" or "::", as c10d's TCPStore), since a host name may resolve to a
// different local address on the master than on the clients (Debian's 127.0.1.1 entry).
// InvalidArgument naming `host` when it does not resolve.
absl::StatusOr<std::string> ListenAddressFor(const std::string& host);

// "host:port" as errors print it.
std::string HostPort(absl::string_view host, int port);

}  // namespace braid::rendezvous

#endif  // BRAID_BACKENDS_RENDEZVOUS_SOCKET_H_
