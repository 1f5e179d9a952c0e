// Ranks as threads meeting at rank 0's store through LauncherRendezvous: complete worlds
// (rank 0 arriving last included) check in; a rank that never arrives fails every other rank
// at the deadline naming it; a rank claimed twice is refused.
#include "backends/rendezvous/launcher_rendezvous.h"

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

// Runs `ranks` of a world of `world` as threads (rank r starts after delay(r)); their statuses.
std::vector<absl::Status> RunRanks(int world, const std::vector<int>& ranks,
                                   absl::Duration timeout,
                                   std::function<absl::Duration(int)> delay) {
  const int port = FreePort();
  std::vector<absl::Status> out(ranks.size());
  std::vector<std::unique_ptr<LauncherRendezvous>> keep(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      absl::SleepFor(delay(ranks[i]));
      auto rv = LauncherRendezvous::Join(Env(port, ranks[i], world), "test", timeout);
      out[i] = rv.status();
      if (rv.ok()) keep[i] = *std::move(rv);
    });
  }
  for (auto& t : threads) t.join();
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
    for (absl::Status s : RunRanks(world, ranks, absl::Seconds(20),
                                   [](int) { return absl::ZeroDuration(); })) {
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
  std::vector<absl::Status> statuses = RunRanks(4, {0, 1, 3}, absl::Milliseconds(800),
                                                [](int) { return absl::ZeroDuration(); });
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (size_t i = 0; i < statuses.size(); ++i) {
    const absl::Status& s = statuses[i];
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("rank 2 of a world of 4 did not arrive"));
    EXPECT_THAT(s.message(), HasSubstr("3 arrived"));
    EXPECT_THAT(s.message(), HasSubstr("127.0.0.1:"));
  }
  statuses = RunRanks(5, {0, 2}, absl::Milliseconds(500), [](int) {
    return absl::ZeroDuration();
  });
  for (const absl::Status& s : statuses) {
    EXPECT_THAT(s.message(), HasSubstr("ranks 1, 3, 4 of a world of 5")) << s;
  }
}

TEST(LauncherRendezvousTest, MissingRankZeroFailsAtConnectNamingTheMaster) {
  std::vector<absl::Status> statuses = RunRanks(2, {1}, absl::Milliseconds(400),
                                                [](int) { return absl::ZeroDuration(); });
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(statuses[0].message(), HasSubstr("torchrun rank 1 of 2"));
  EXPECT_THAT(statuses[0].message(), HasSubstr("could not connect to 127.0.0.1:"));
}

TEST(LauncherRendezvousTest, ARankClaimedTwiceIsRefused) {
  std::vector<absl::Status> statuses = RunRanks(2, {0, 1, 1}, absl::Milliseconds(800), [](int) {
    return absl::ZeroDuration();
  });
  int refused = 0;
  for (const absl::Status& s : statuses) {
    if (s.code() == absl::StatusCode::kAlreadyExists) {
      ++refused;
      EXPECT_THAT(s.message(), HasSubstr("rank 1 checked in by 2 processes"));
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
  EXPECT_EQ(refused, 1);
}

}  // namespace
}  // namespace braid::rendezvous
