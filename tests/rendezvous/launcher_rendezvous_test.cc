// Ranks as threads meeting at rank 0's store through LauncherRendezvous: complete worlds
// (rank 0 arriving last included) check in; a rank that never arrives fails every other rank
// at the deadline naming it; a rank claimed twice is refused. Ports: by default MASTER_PORT is
// free again (no TIME_WAIT: a listener without SO_REUSEADDR binds it) once Join returned on
// every rank; a fixed store port and an embedder's address exchange never touch MASTER_PORT.
#include "backends/rendezvous/launcher_rendezvous.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/rendezvous/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::rendezvous {
namespace {

using ::testing::HasSubstr;

int FreePort() {
  auto s = Socket::Listen("127.0.0.1", 0);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s->LocalPort();
}

LauncherEnv Env(int port, int rank, int world) {
  LauncherEnv e;
  e.launcher = "torchrun";
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  return e;
}

// Whether a listener that does not set SO_REUSEADDR (as torch's TCPStore) can bind
// 127.0.0.1:port now: false while something listens there or a connection closed from the
// listening side lingers in TIME_WAIT.
bool PlainListenerCanBind(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok =
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 1) == 0;
  ::close(fd);
  return ok;
}

// An embedder's channel (as torch.distributed's store): a table shared by the threads.
struct Table {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> values;
  AddressExchange Exchange() {
    AddressExchange x;
    x.publish = [this](const std::string& key, const std::string& value) {
      std::lock_guard<std::mutex> lock(mu);
      values[key] = value;
      cv.notify_all();
      return absl::OkStatus();
    };
    x.lookup = [this](const std::string& key,
                      absl::Duration timeout) -> absl::StatusOr<std::string> {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                       [&] { return values.count(key) > 0; })) {
        return absl::DeadlineExceededError(absl::StrCat("no key '", key, "'"));
      }
      return values[key];
    };
    return x;
  }
};

// Runs `ranks` of a world of `world` as threads (rank r starts after delay(r)); their statuses.
// `tweak` adjusts each rank's environment; `after` sees the rendezvous of the ranks that
// joined (null where one failed) before they are destroyed.
std::vector<absl::Status> RunRanks(
    int world, const std::vector<int>& ranks, absl::Duration timeout,
    std::function<absl::Duration(int)> delay, int port = 0,
    std::function<void(LauncherEnv&)> tweak = nullptr,
    std::function<void(std::vector<std::unique_ptr<LauncherRendezvous>>&)> after = nullptr) {
  if (port == 0) port = FreePort();
  std::vector<absl::Status> out(ranks.size());
  std::vector<std::unique_ptr<LauncherRendezvous>> keep(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      absl::SleepFor(delay(ranks[i]));
      LauncherEnv env = Env(port, ranks[i], world);
      if (tweak) tweak(env);
      auto rv = LauncherRendezvous::Join(env, "test", timeout);
      out[i] = rv.status();
      if (rv.ok()) keep[i] = *std::move(rv);
    });
  }
  for (auto& t : threads) t.join();
  if (after) after(keep);
  // Every rank that joined counted itself once in the store.
  int64_t joined = 0;
  for (const absl::Status& s : out) joined += s.ok() ? 1 : 0;
  for (auto& rv : keep) {
    if (rv == nullptr) continue;
    auto n = rv->store().Add("test/arrived", 0);
    EXPECT_TRUE(n.ok());
    if (n.ok()) {
      EXPECT_EQ(*n, joined);
    }
  }
  return out;
}

TEST(LauncherRendezvousTest, CompleteWorldsCheckIn) {
  for (int world : {1, 2, 4}) {
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(r);
    for (absl::Status s :
         RunRanks(world, ranks, absl::Seconds(20), [](int) { return absl::ZeroDuration(); })) {
      EXPECT_TRUE(s.ok()) << "world " << world << ": " << s;
    }
  }
}

TEST(LauncherRendezvousTest, RankZeroLastStillWorks) {
  for (absl::Status s : RunRanks(3, {0, 1, 2}, absl::Seconds(20), [](int r) {
         return r == 0 ? absl::Milliseconds(400) : absl::ZeroDuration();
       })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(LauncherRendezvousTest, AMissingRankFailsEveryoneNamingIt) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> statuses =
      RunRanks(4, {0, 1, 3}, absl::Milliseconds(800), [](int) { return absl::ZeroDuration(); });
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (size_t i = 0; i < statuses.size(); ++i) {
    const absl::Status& s = statuses[i];
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("rank 2 of a world of 4 did not arrive"));
    EXPECT_THAT(s.message(), HasSubstr("3 arrived"));
    EXPECT_THAT(s.message(), HasSubstr("127.0.0.1:"));
  }
  statuses = RunRanks(5, {0, 2}, absl::Milliseconds(500), [](int) { return absl::ZeroDuration(); });
  for (const absl::Status& s : statuses) {
    EXPECT_THAT(s.message(), HasSubstr("ranks 1, 3, 4 of a world of 5")) << s;
  }
}

TEST(LauncherRendezvousTest, MissingRankZeroFailsAtConnectNamingTheMaster) {
  std::vector<absl::Status> statuses =
      RunRanks(2, {1}, absl::Milliseconds(400), [](int) { return absl::ZeroDuration(); });
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(statuses[0].message(), HasSubstr("torchrun rank 1 of 2"));
  EXPECT_THAT(statuses[0].message(), HasSubstr("could not connect to 127.0.0.1:"));
}

TEST(LauncherRendezvousTest, ARankClaimedTwiceIsRefused) {
  // World 3 with rank 2 missing: the world cannot complete before both claimants of rank 1
  // checked in, so the second is always refused by name (the others then fail at the deadline,
  // naming rank 2).
  std::vector<absl::Status> statuses =
      RunRanks(3, {0, 1, 1}, absl::Milliseconds(800), [](int) { return absl::ZeroDuration(); });
  int refused = 0;
  for (const absl::Status& s : statuses) {
    if (s.code() == absl::StatusCode::kAlreadyExists) {
      ++refused;
      EXPECT_THAT(s.message(), HasSubstr("rank 1 checked in by 2 processes"));
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_THAT(s.message(), HasSubstr("rank 2 of a world of 3 did not arrive")) << s;
    }
  }
  EXPECT_EQ(refused, 1);
  // A complete world beside a second claimant: the world's ranks succeed, and the claimant
  // fails, refused by name, or, when it came after the world completed and the store closed
  // (a loaded machine), on the store's closed connection.
  statuses =
      RunRanks(2, {0, 1, 1}, absl::Milliseconds(800), [](int) { return absl::ZeroDuration(); });
  int ok = 0, failed = 0;
  for (const absl::Status& s : statuses) {
    if (s.ok()) {
      ++ok;
    } else {
      ++failed;
      EXPECT_TRUE(s.code() == absl::StatusCode::kAlreadyExists ||
                  s.code() == absl::StatusCode::kUnavailable)
          << s;
    }
  }
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(failed, 1);
}

absl::Duration NoDelay(int) { return absl::ZeroDuration(); }

TEST(LauncherRendezvousTest, MasterPortIsFreeAgainWhenJoinReturns) {
  for (int world : {2, 4}) {
    const int master_port = FreePort();
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(r);
    const std::vector<absl::Status> statuses =
        RunRanks(world, ranks, absl::Seconds(20), NoDelay, master_port, nullptr, [&](auto& joined) {
          EXPECT_TRUE(PlainListenerCanBind(master_port)) << "world " << world;
          for (auto& rv : joined) {
            ASSERT_NE(rv, nullptr);
            // The store itself listens elsewhere, on a port the OS picked.
            EXPECT_NE(rv->store_address(), absl::StrCat("127.0.0.1:", master_port));
            EXPECT_EQ(rv->store_address(), joined[0]->store_address());
          }
        });
    for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << "world " << world << ": " << s;
  }
}

TEST(LauncherRendezvousTest, MasterPortHeldByAnotherStoreIsNamed) {
  auto other = Socket::Listen("127.0.0.1", 0);  // e.g. torch.distributed's env:// store
  ASSERT_TRUE(other.ok());
  const int held = *other->LocalPort();
  std::vector<absl::Status> statuses = RunRanks(2, {0}, absl::Seconds(5), NoDelay, held);
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kUnavailable) << statuses[0];
  EXPECT_THAT(statuses[0].message(), HasSubstr("MASTER_ADDR:MASTER_PORT while the world is"));
  EXPECT_THAT(statuses[0].message(), HasSubstr("initialize torch.distributed first"));
}

TEST(LauncherRendezvousTest, AFixedStorePortNeverTouchesMasterPort) {
  auto other = Socket::Listen("127.0.0.1", 0);  // MASTER_PORT taken: no rank may need it
  ASSERT_TRUE(other.ok());
  const int store_port = FreePort();
  for (absl::Status s : RunRanks(
           3, {0, 1, 2}, absl::Seconds(20), NoDelay, *other->LocalPort(),
           [&](LauncherEnv& e) { e.store_port = store_port; },
           [&](auto& joined) {
             for (auto& rv : joined) {
               ASSERT_NE(rv, nullptr);
               EXPECT_EQ(rv->store_address(), absl::StrCat("127.0.0.1:", store_port));
             }
           })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(LauncherRendezvousTest, AnExchangeCarriesTheStoresAddressWithoutMasterPort) {
  auto other = Socket::Listen("127.0.0.1", 0);
  ASSERT_TRUE(other.ok());
  Table table;
  for (absl::Status s : RunRanks(
           3, {0, 1, 2}, absl::Seconds(20),
           [](int r) { return absl::Milliseconds(r == 0 ? 200 : 0); }, *other->LocalPort(),
           [&](LauncherEnv& e) { e.exchange = table.Exchange(); },
           [&](auto& joined) {
             ASSERT_NE(joined[0], nullptr);
             EXPECT_EQ(table.values.at("test/store"), joined[0]->store_address());
           })) {
    EXPECT_TRUE(s.ok()) << s;
  }
  // An exchange that never delivers fails the rank naming the key, within the deadline.
  Table empty;
  std::vector<absl::Status> statuses =
      RunRanks(2, {1}, absl::Milliseconds(300), NoDelay, 0,
               [&](LauncherEnv& e) { e.exchange = empty.Exchange(); });
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kDeadlineExceeded) << statuses[0];
  EXPECT_THAT(statuses[0].message(), HasSubstr("looking up rank 0's store address under "
                                               "'test/store'"));
}

}  // namespace
}  // namespace braid::rendezvous
