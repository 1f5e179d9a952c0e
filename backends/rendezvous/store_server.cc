#include "backends/rendezvous/store_server.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/logging.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"

namespace braid::rendezvous {

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host, int port) {
  absl::StatusOr<Socket> listener = Socket::Listen(host, port);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("rendezvous store server: ", listener.status().message()));
  }
  absl::StatusOr<int> bound = listener->LocalPort();
  if (!bound.ok()) return bound.status();
  std::unique_ptr<StoreServer> server(
      new StoreServer(*std::move(listener), *bound, HostPort(host, *bound)));
  StoreServer* s = server.get();
  RETURN_IF_ERROR(StartThread(&s->acceptor_, absl::StrCat("the rendezvous store at ", s->address_),
                              [s] { s->AcceptLoop(); }));
  return server;
}

StoreServer::~StoreServer() {
  stop_.store(true);
  if (acceptor_.joinable()) acceptor_.join();
  // The acceptor is gone: nobody adds to connections_ any more.
  for (std::thread& t : connections_) t.join();
}

void StoreServer::AcceptLoop() {
  while (!stop_.load()) {
    absl::StatusOr<Socket> c = listener_.Accept(absl::Now() + kStopPoll);
    if (absl::IsDeadlineExceeded(c.status())) continue;
    if (!c.ok()) {
      Log().warn("rendezvous store {}: {}", address_, c.status().ToString());
      absl::SleepFor(absl::Milliseconds(10));  // e.g. EMFILE: do not spin
      continue;
    }
    std::lock_guard<std::mutex> lock(threads_mu_);
    const std::string peer = c->peer();
    std::thread t;
    open_connections_.fetch_add(1);
    const absl::Status started =
        StartThread(&t, absl::StrCat("store connection from ", peer),
                    [this, s = std::make_shared<Socket>(*std::move(c))]() mutable {
                      Serve(std::move(*s));  // closes the connection when it returns
                      open_connections_.fetch_sub(1);
                    });
    if (!started.ok()) {
      // The socket went with the lambda, so the client sees its connection closed and fails
      // with UNAVAILABLE rather than waiting; the store keeps serving the others.
      open_connections_.fetch_sub(1);
      Log().warn("rendezvous store {}: {}", address_, started.ToString());
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    connections_.push_back(std::move(t));
  }
}

void StoreServer::Serve(Socket connection) {
  while (!stop_.load()) {
    absl::StatusOr<bool> readable = connection.WaitReadable(absl::Now() + kStopPoll);
    if (!readable.ok()) break;
    if (!*readable) continue;
    absl::StatusOr<std::string> payload = ReadFrame(connection, absl::Now() + kFrameTimeout);
    if (!payload.ok()) {
      // A client that exits closes its connection: that is the normal end, not worth a warning.
      if (!absl::IsUnavailable(payload.status())) {
        Log().warn("rendezvous store {}: dropping {}: {}", address_, connection.peer(),
                   payload.status().ToString());
      }
      break;
    }
    absl::StatusOr<Request> request = DecodeRequest(*payload);
    Reply reply;
    if (!request.ok()) {
      reply.code = Reply::kError;
      reply.value = std::string(request.status().message());
    } else {
      reply = Apply(*request);
    }
    if (!connection.SendAll(EncodeReply(reply), absl::Now() + kFrameTimeout).ok()) break;
    if (!request.ok()) break;
  }
}

Reply StoreServer::Apply(const Request& r) {
  Reply reply;
  if (r.keys.empty() || (r.op != StoreOp::kCheck && r.keys.size() != 1)) {
    reply.code = Reply::kError;
    reply.value =
        absl::StrCat("store operation ", static_cast<int>(r.op), " with ", r.keys.size(), " keys");
    return reply;
  }
  const std::string& key = r.keys.front();
  std::lock_guard<std::mutex> lock(table_mu_);
  switch (r.op) {
    case StoreOp::kSet:
      table_[key] = r.value;
      break;
    case StoreOp::kGet: {
      auto it = table_.find(key);
      if (it == table_.end()) {
        reply.code = Reply::kMissing;
      } else {
        reply.value = it->second;
      }
      break;
    }
    case StoreOp::kAdd: {
      int64_t current = 0;
      auto it = table_.find(key);
      if (it != table_.end() && !absl::SimpleAtoi(it->second, &current)) {
        reply.code = Reply::kError;
        reply.value = absl::StrCat("add on key '", key, "' whose value is not an integer");
        break;
      }
      current += r.delta;
      table_[key] = absl::StrCat(current);
      reply.number = current;
      break;
    }
    case StoreOp::kCheck:
      for (const std::string& k : r.keys) {
        if (table_.find(k) == table_.end()) reply.keys.push_back(k);
      }
      if (!reply.keys.empty()) reply.code = Reply::kMissing;
      break;
  }
  return reply;
}

}  // namespace braid::rendezvous
