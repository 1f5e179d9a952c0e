#include "backends/rendezvous/launcher_rendezvous.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backends/rendezvous/socket.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::rendezvous {
namespace {

std::string RankKey(absl::string_view prefix, int rank) {
  return absl::StrCat(prefix, "/rank/", rank);
}

// "2, 5, 7" (at most 32 listed, then "... (N in all)").
std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < 32; ++i) {
    absl::StrAppend(&out, i ? ", " : "", ranks[i]);
  }
  if (ranks.size() > 32) absl::StrAppend(&out, ", ... (", ranks.size(), " in all)");
  return out;
}

}  // namespace

absl::Status CheckIn(TcpStore& store, absl::string_view prefix, int rank, int world_size,
                     absl::Duration timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous '", prefix, "': rank ", rank,
                                                   " is outside the world of size ", world_size));
  }
  const absl::Time deadline = absl::Now() + timeout;
  ASSIGN_OR_RETURN(const int64_t claims, store.Add(RankKey(prefix, rank), 1));
  if (claims > 1) {
    return absl::AlreadyExistsError(absl::StrCat("rendezvous '", prefix, "' at ", store.address(),
                                                 ": rank ", rank, " checked in by ", claims,
                                                 " processes (two were given the same rank)"));
  }
  RETURN_IF_ERROR(store.Add(absl::StrCat(prefix, "/arrived"), 1).status());
  std::vector<std::string> keys;
  keys.reserve(world_size);
  for (int r = 0; r < world_size; ++r) keys.push_back(RankKey(prefix, r));
  // Polls the rank keys itself (rather than TcpStore::Wait) to remember who was missing last:
  // rank 0 usually reaches its deadline first and takes its server down, and the others must
  // still say which ranks never came.
  const auto missing_ranks = [&](const std::vector<std::string>& missing) {
    std::vector<int> ranks;
    for (int r = 0; r < world_size; ++r) {
      if (std::find(missing.begin(), missing.end(), keys[r]) != missing.end()) ranks.push_back(r);
    }
    return ranks;
  };
  const auto failure = [&](const std::vector<int>& ranks, absl::string_view why) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rendezvous '", prefix, "' at ", store.address(), ": rank", ranks.size() > 1 ? "s " : " ",
        RankList(ranks), " of a world of ", world_size, " did not arrive within ",
        absl::FormatDuration(absl::Ceil(timeout, absl::Milliseconds(100))), " (",
        world_size - static_cast<int>(ranks.size()), " arrived, this is rank ", rank, why, ")"));
  };
  std::vector<int> last_missing;
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    absl::StatusOr<std::vector<std::string>> missing = store.Missing(keys);
    if (!missing.ok()) {
      if (rank != 0 && absl::IsUnavailable(missing.status()) && !last_missing.empty()) {
        return failure(last_missing,
                       "; rank 0 closed its store first: it gave up at its deadline, or exited");
      }
      return missing.status();
    }
    if (missing->empty()) return absl::OkStatus();
    last_missing = missing_ranks(*missing);
    const absl::Time now = absl::Now();
    if (now >= deadline) return failure(last_missing, "");
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(50));
  }
}

namespace {

absl::Duration Left(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::Nanoseconds(1));
}

// "host:port" (the host possibly "[v6]") -> host, port. InvalidArgument naming `what`.
absl::Status SplitHostPort(absl::string_view address, absl::string_view what, std::string* host,
                           int* port) {
  const size_t colon = address.rfind(':');
  int p = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 1 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", address, "' is not a store address (host:port)"));
  }
  absl::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = std::string(h);
  *port = p;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> LauncherRendezvous::Serve() {
  absl::StatusOr<std::string> listen = ListenAddressFor(env_.master_addr);
  absl::StatusOr<std::unique_ptr<StoreServer>> server =
      listen.ok() ? StoreServer::Start(*listen, env_.store_port)
                  : absl::StatusOr<std::unique_ptr<StoreServer>>(listen.status());
  if (!server.ok()) {
    return WithContext(
        server.status(),
        absl::StrCat(env_.Describe(), ": rank 0 serves the rendezvous store",
                     env_.store_port > 0 ? " at MASTER_ADDR:BRAID_STORE_PORT" : " on MASTER_ADDR"));
  }
  server_ = *std::move(server);
  return HostPort(env_.master_addr, server_->port());
}

absl::Status LauncherRendezvous::HandOff(absl::Time deadline, absl::Duration timeout) {
  const std::string key = absl::StrCat(prefix_, "/store");
  const std::string closed_key = absl::StrCat(prefix_, "/bootstrap_closed");
  const std::string where = absl::StrCat(
      env_.Describe(), ": the store's address is handed out at MASTER_ADDR:",
      env_.agent_store ? "MASTER_PORT + 1" : "MASTER_PORT", " while the world is created");
  std::unique_ptr<StoreServer> bootstrap;
  std::string address;
  if (env_.rank == 0) {
    absl::StatusOr<std::string> listen = ListenAddressFor(env_.master_addr);
    absl::StatusOr<std::unique_ptr<StoreServer>> started =
        listen.ok() ? StoreServer::Start(*listen, env_.master_port)
                    : absl::StatusOr<std::unique_ptr<StoreServer>>(listen.status());
    if (!started.ok()) {
      return WithContext(started.status(),
                         absl::StrCat(where,
                                      " (is torch.distributed's or another job's store "
                                      "there? initialize torch.distributed first, or set "
                                      "BRAID_STORE_PORT)"));
    }
    bootstrap = *std::move(started);
    ASSIGN_OR_RETURN(address, Serve());
  }
  {
    // Every rank's bootstrap connection is closed (by this side) before it checks in.
    absl::StatusOr<std::unique_ptr<TcpStore>> boot =
        TcpStore::Connect(env_.master_addr, env_.master_port, Left(deadline));
    if (!boot.ok()) return WithContext(boot.status(), where);
    if (env_.rank == 0) {
      RETURN_IF_ERROR(WithContext((*boot)->Set(key, address), where));
    } else {
      absl::StatusOr<std::string> got = (*boot)->Get(key, Left(deadline));
      if (!got.ok()) return WithContext(got.status(), where);
      address = *std::move(got);
    }
  }
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(SplitHostPort(address, where, &host, &port));
  // `timeout` also becomes the client's default for every later call (Join's contract).
  absl::StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::Connect(host, port, timeout);
  if (!client.ok()) return WithContext(client.status(), env_.Describe());
  client_ = *std::move(client);
  RETURN_IF_ERROR(CheckIn(*client_, prefix_, env_.rank, env_.world_size, Left(deadline)));
  if (env_.rank != 0) {
    return WithContext(client_->Get(closed_key, Left(deadline)).status(),
                       absl::StrCat(where, ": waiting for rank 0 to release that port"));
  }
  // Every rank checked in, so every rank has read the address and closed its bootstrap
  // connection; wait until the server saw each close (their FINs may still be in flight).
  absl::Duration pause = absl::Milliseconds(1);
  while (bootstrap->open_connections() > 0 && absl::Now() < deadline) {
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
  if (bootstrap->open_connections() > 0) {
    Log().warn(
        "{}: {} bootstrap connection(s) still open at the deadline; closing them from "
        "this side may hold the port in TIME_WAIT",
        where, bootstrap->open_connections());
  }
  bootstrap.reset();
  return WithContext(client_->Set(closed_key, "1"), where);
}

absl::StatusOr<std::unique_ptr<LauncherRendezvous>> LauncherRendezvous::Join(
    const LauncherEnv& env, absl::string_view prefix, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous '", prefix, "': the timeout must be positive"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_ptr<LauncherRendezvous> rv(new LauncherRendezvous(env, std::string(prefix)));
  if (env.store_port == 0 && env.exchange.empty()) {
    if (env.master_port < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          env.Describe(), ": no MASTER_PORT, store port or address exchange to meet at"));
    }
    RETURN_IF_ERROR(rv->HandOff(deadline, timeout));
    return rv;
  }
  std::string address;
  if (env.rank == 0) {
    ASSIGN_OR_RETURN(address, rv->Serve());
  }
  if (env.store_port > 0) {
    address = HostPort(env.master_addr, env.store_port);
  } else {
    const std::string key = absl::StrCat(prefix, "/store");
    if (env.rank == 0) {
      RETURN_IF_ERROR(WithContext(env.exchange.publish(key, address),
                                  absl::StrCat(env.Describe(),
                                               ": publishing the store's address "
                                               "under '",
                                               key, "'")));
    } else {
      absl::StatusOr<std::string> got = env.exchange.lookup(key, Left(deadline));
      if (!got.ok()) {
        return WithContext(got.status(), absl::StrCat(env.Describe(),
                                                      ": looking up rank 0's "
                                                      "store address under '",
                                                      key, "'"));
      }
      address = *std::move(got);
    }
  }
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(SplitHostPort(address, env.Describe(), &host, &port));
  absl::StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::Connect(host, port, timeout);
  if (!client.ok()) return WithContext(client.status(), env.Describe());
  rv->client_ = *std::move(client);
  RETURN_IF_ERROR(CheckIn(*rv->client_, rv->prefix_, env.rank, env.world_size, Left(deadline)));
  return rv;
}

}  // namespace braid::rendezvous
