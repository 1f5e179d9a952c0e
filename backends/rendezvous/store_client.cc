#include "backends/rendezvous/store_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/status_macros.h"

namespace braid::rendezvous {
namespace {

std::string QuotedKeys(absl::Span<const std::string> keys) {
  return absl::StrCat("'", absl::StrJoin(keys, "', '"), "'");
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                            absl::Duration timeout) {
  const std::string address = HostPort(host, port);
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous store at ", address, ": the timeout must be positive"));
  }
  absl::StatusOr<Socket> s = Socket::Connect(host, port, absl::Now() + timeout);
  if (!s.ok()) {
    return absl::Status(s.status().code(),
                        absl::StrCat("rendezvous store: ", s.status().message()));
  }
  return std::unique_ptr<TcpStore>(new TcpStore(*std::move(s), address, timeout));
}

absl::StatusOr<Reply> TcpStore::RoundTrip(const Request& request, absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  absl::Status sent = socket_.SendAll(EncodeRequest(request), deadline);
  absl::StatusOr<std::string> payload =
      sent.ok() ? ReadFrame(socket_, deadline) : absl::StatusOr<std::string>(sent);
  absl::StatusOr<Reply> reply =
      payload.ok() ? DecodeReply(*payload) : absl::StatusOr<Reply>(payload.status());
  if (!reply.ok()) {
    broken_ = absl::UnavailableError(
        absl::StrCat("rendezvous store at ", address_, " is unusable: ", reply.status().message()));
    socket_.Close();
    return broken_;
  }
  if (reply->code == Reply::kError) {
    return absl::FailedPreconditionError(
        absl::StrCat("rendezvous store at ", address_, ": ", reply->value));
  }
  return reply;
}

absl::Status TcpStore::Set(absl::string_view key, absl::string_view value) {
  Request r{StoreOp::kSet, {std::string(key)}, std::string(value), 0};
  return RoundTrip(r, absl::Now() + timeout_).status();
}

absl::StatusOr<int64_t> TcpStore::Add(absl::string_view key, int64_t delta) {
  Request r{StoreOp::kAdd, {std::string(key)}, "", delta};
  ASSIGN_OR_RETURN(Reply reply, RoundTrip(r, absl::Now() + timeout_));
  return reply.number;
}

absl::StatusOr<std::vector<std::string>> TcpStore::Missing(absl::Span<const std::string> keys) {
  if (keys.empty()) return std::vector<std::string>{};
  Request r{StoreOp::kCheck, std::vector<std::string>(keys.begin(), keys.end()), "", 0};
  ASSIGN_OR_RETURN(Reply reply, RoundTrip(r, absl::Now() + timeout_));
  return std::move(reply.keys);
}

absl::Status TcpStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  const absl::Duration limit = Or(timeout);
  const absl::Time deadline = absl::Now() + limit;
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    ASSIGN_OR_RETURN(std::vector<std::string> missing, Missing(keys));
    if (missing.empty()) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous store at ", address_, ": key", missing.size() > 1 ? "s " : " ",
                       QuotedKeys(missing), " not set within ", absl::FormatDuration(limit)));
    }
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(50));
  }
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key, absl::Duration timeout) {
  const std::string k(key);
  RETURN_IF_ERROR(Wait(absl::MakeConstSpan(&k, 1), timeout));
  Request r{StoreOp::kGet, {k}, "", 0};
  ASSIGN_OR_RETURN(Reply reply, RoundTrip(r, absl::Now() + timeout_));
  if (reply.code == Reply::kMissing) {
    // Set, seen by Wait, cannot be unset: the table only grows.
    return absl::InternalError(absl::StrCat("rendezvous store at ", address_, ": key '", k,
                                            "' vanished after it was set"));
  }
  return std::move(reply.value);
}

}  // namespace braid::rendezvous
