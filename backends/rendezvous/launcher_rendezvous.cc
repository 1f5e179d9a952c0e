#include "backends/rendezvous/launcher_rendezvous.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
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
    return absl::AlreadyExistsError(absl::StrCat(
        "rendezvous '", prefix, "' at ", store.address(), ": rank ", rank,
        " checked in by ", claims, " processes (two were given the same rank)"));
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

absl::StatusOr<std::unique_ptr<LauncherRendezvous>> LauncherRendezvous::Join(
    const LauncherEnv& env, absl::string_view prefix, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous '", prefix, "': the timeout must be positive"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_ptr<LauncherRendezvous> rv(new LauncherRendezvous(env, std::string(prefix)));
  if (env.rank == 0) {
    absl::StatusOr<std::string> listen = ListenAddressFor(env.master_addr);
    absl::StatusOr<std::unique_ptr<StoreServer>> server =
        listen.ok() ? StoreServer::Start(*listen, env.master_port)
                    : absl::StatusOr<std::unique_ptr<StoreServer>>(listen.status());
    if (!server.ok()) {
      return WithContext(server.status(),
                         absl::StrCat(env.Describe(), ": rank 0 serves the rendezvous store at "
                                                      "MASTER_ADDR:MASTER_PORT"));
    }
    rv->server_ = *std::move(server);
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> client =
      TcpStore::Connect(env.master_addr, env.master_port, timeout);
  if (!client.ok()) return WithContext(client.status(), env.Describe());
  rv->client_ = *std::move(client);
  RETURN_IF_ERROR(CheckIn(*rv->client_, rv->prefix_, env.rank, env.world_size,
                          std::max(deadline - absl::Now(), absl::Nanoseconds(1))));
  return rv;
}

}  // namespace braid::rendezvous
