#include "backends/rendezvous/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace braid::rendezvous {
namespace {

std::string Errno(int err) { return std::strerror(err); }

// Milliseconds left until `deadline`, clamped to [0, 1 h] for poll(2).
int MillisLeft(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 3600 * 1000));
}

// poll(2) for `events` on `fd` until `deadline`: true when ready, false on timeout.
absl::StatusOr<bool> PollFor(int fd, short events, absl::Time deadline, const std::string& peer,
                             absl::string_view what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, MillisLeft(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (absl::Now() >= deadline) return false;
      continue;
    }
    if (errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("poll (", what, ") on ", peer, ": ", Errno(errno)));
  }
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

absl::StatusOr<AddrInfoPtr> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* out = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", HostPort(host, port), ": ", gai_strerror(rc)));
  }
  return AddrInfoPtr(out);
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

std::string HostPort(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

Socket::Socket(Socket&& other) noexcept : fd_(other.fd_), peer_(std::move(other.peer_)) {
  other.fd_ = -1;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.fd_;
    peer_ = std::move(other.peer_);
    other.fd_ = -1;
  }
  return *this;
}

Socket::~Socket() { Close(); }

void Socket::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::StatusOr<Socket> Socket::Listen(const std::string& host, int port) {
  const std::string where = HostPort(host, port);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", port, " is out of range (", where, ")"));
  }
  auto addrs = Resolve(host, port, /*passive=*/true);
  if (!addrs.ok()) return addrs.status();
  std::string last = "no address";
  for (addrinfo* a = addrs->get(); a != nullptr; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol), where);
    if (!s.valid()) {
      last = absl::StrCat("socket: ", Errno(errno));
      continue;
    }
    int one = 1;
    ::setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd_, a->ai_addr, a->ai_addrlen) != 0) {
      last = absl::StrCat("bind: ", Errno(errno));
      continue;
    }
    if (::listen(s.fd_, 1024) != 0) {
      last = absl::StrCat("listen: ", Errno(errno));
      continue;
    }
    return s;
  }
  return absl::UnavailableError(absl::StrCat("cannot listen on ", where, ": ", last));
}

absl::StatusOr<Socket> Socket::Connect(const std::string& host, int port, absl::Time deadline) {
  const std::string where = HostPort(host, port);
  auto addrs = Resolve(host, port, /*passive=*/false);
  if (!addrs.ok()) return addrs.status();
  absl::Duration pause = absl::Milliseconds(10);
  std::string last = "no attempt before the deadline";
  int attempts = 0;
  for (;;) {
    for (addrinfo* a = addrs->get(); a != nullptr; a = a->ai_next) {
      ++attempts;
      Socket s(
          ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol),
          where);
      if (!s.valid()) {
        last = absl::StrCat("socket: ", Errno(errno));
        continue;
      }
      int rc = ::connect(s.fd_, a->ai_addr, a->ai_addrlen);
      int err = rc == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        auto ready = PollFor(s.fd_, POLLOUT, deadline, where, "connect");
        if (!ready.ok()) return ready.status();
        if (!*ready) {
          last = "connect did not complete";
          break;
        }
        socklen_t len = sizeof(err);
        ::getsockopt(s.fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      if (err == 0) {
        // Back to blocking mode: every later call polls with its own deadline first.
        ::fcntl(s.fd_, F_SETFL, ::fcntl(s.fd_, F_GETFL) & ~O_NONBLOCK);
        SetNoDelay(s.fd_);
        return s;
      }
      last = absl::StrCat("connect: ", Errno(err));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat("could not connect to ", where, " before the ",
                                                  "deadline (", attempts, " attempts; last: ", last,
                                                  ")"));
}

absl::StatusOr<Socket> Socket::Accept(absl::Time deadline) {
  auto ready = PollFor(fd_, POLLIN, deadline, peer_, "accept");
  if (!ready.ok()) return ready.status();
  if (!*ready) return absl::DeadlineExceededError(absl::StrCat("no connection on ", peer_));
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("accept on ", peer_, ": ", Errno(errno)));
  }
  char host[NI_MAXHOST] = "?";
  char serv[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
              NI_NUMERICHOST | NI_NUMERICSERV);
  SetNoDelay(fd);
  return Socket(fd, absl::StrCat(host, ":", serv));
}

absl::Status Socket::SendAll(absl::string_view data, absl::Time deadline) {
  size_t done = 0;
  while (done < data.size()) {
    auto ready = PollFor(fd_, POLLOUT, deadline, peer_, "send");
    if (!ready.ok()) return ready.status();
    if (!*ready) {
      return absl::DeadlineExceededError(absl::StrCat("sending to ", peer_, ": ", done, " of ",
                                                      data.size(), " bytes sent by the deadline"));
    }
    const ssize_t n =
        ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(absl::StrCat("sending to ", peer_, ": ", Errno(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status Socket::RecvAll(char* out, size_t n, absl::Time deadline) {
  size_t done = 0;
  while (done < n) {
    auto ready = PollFor(fd_, POLLIN, deadline, peer_, "recv");
    if (!ready.ok()) return ready.status();
    if (!*ready) {
      return absl::DeadlineExceededError(
          absl::StrCat("receiving from ", peer_, ": ", done, " of ", n, " bytes by the deadline"));
    }
    const ssize_t got = ::recv(fd_, out + done, n - done, MSG_DONTWAIT);
    if (got == 0) {
      return absl::UnavailableError(absl::StrCat(peer_, " closed the connection"));
    }
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(absl::StrCat("receiving from ", peer_, ": ", Errno(errno)));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Socket::WaitReadable(absl::Time deadline) {
  return PollFor(fd_, POLLIN, deadline, peer_, "wait");
}

absl::StatusOr<int> Socket::LocalPort() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::UnavailableError(absl::StrCat("getsockname on ", peer_, ": ", Errno(errno)));
  }
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

absl::StatusOr<std::string> ListenAddressFor(const std::string& host) {
  auto addrs = Resolve(host, 0, /*passive=*/false);
  if (!addrs.ok()) return addrs.status();
  const addrinfo* a = addrs->get();
  if (a->ai_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) return host;
    return std::string("0.0.0.0");
  }
  if (a->ai_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return host;
    return std::string("::");
  }
  return host;
}

absl::StatusOr<std::string> LocalAddressToward(const std::string& host, int port) {
  const std::string where = HostPort(host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* out = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &out); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", where, ": ", gai_strerror(rc)));
  }
  AddrInfoPtr addrs(out);
  std::string last = "no address";
  for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
    Socket s(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), where);
    if (!s.valid() || ::connect(s.fd_, a->ai_addr, a->ai_addrlen) != 0) {
      last = Errno(errno);
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char name[NI_MAXHOST];
    if (::getsockname(s.fd_, reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
        getnameinfo(reinterpret_cast<sockaddr*>(&local), len, name, sizeof(name), nullptr, 0,
                    NI_NUMERICHOST) != 0) {
      last = Errno(errno);
      continue;
    }
    return std::string(name);
  }
  return absl::UnavailableError(absl::StrCat("no local interface routes to ", where, ": ", last));
}

}  // namespace braid::rendezvous
