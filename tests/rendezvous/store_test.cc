// The rendezvous store on loopback: values round-trip byte for byte, add is atomic across
// clients, every wait ends at its deadline with an error naming the keys and the address, a
// client may start before its server, and a vanished server breaks clients with a clear error.
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/rendezvous/socket.h"
#include "backends/rendezvous/store_client.h"
#include "backends/rendezvous/store_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::rendezvous {
namespace {

using ::testing::HasSubstr;

constexpr char kHost[] = "127.0.0.1";

std::unique_ptr<StoreServer> StartServer() {
  auto server = StoreServer::Start(kHost, 0);
  EXPECT_TRUE(server.ok()) << server.status();
  return *std::move(server);
}

std::unique_ptr<TcpStore> Client(int port, absl::Duration timeout = absl::Seconds(10)) {
  auto c = TcpStore::Connect(kHost, port, timeout);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

TEST(StoreTest, SetGetRoundTripsBinaryValues) {
  auto server = StartServer();
  auto a = Client(server->port());
  auto b = Client(server->port());
  std::string value("\0id\xff\x01", 5);
  value += std::string(100000, 'x');
  ASSERT_TRUE(a->Set("nccl/id", value).ok());
  auto got = b->Get("nccl/id");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
  ASSERT_TRUE(b->Set("nccl/id", "second").ok());  // overwrite
  EXPECT_EQ(*a->Get("nccl/id"), "second");
  ASSERT_TRUE(a->Set("empty", "").ok());
  EXPECT_EQ(*b->Get("empty"), "");
}

TEST(StoreTest, GetWaitsForALaterSet) {
  auto server = StartServer();
  auto reader = Client(server->port());
  std::thread writer([port = server->port()] {
    absl::SleepFor(absl::Milliseconds(200));
    auto w = Client(port);
    EXPECT_TRUE(w->Set("late", "v").ok());
  });
  const absl::Time start = absl::Now();
  auto got = reader->Get("late", absl::Seconds(10));
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
}

TEST(StoreTest, AddIsAtomicAcrossClients) {
  auto server = StartServer();
  constexpr int kClients = 8;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::set<int64_t> seen;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto store = Client(server->port());
      for (int i = 0; i < kAdds; ++i) {
        auto v = store->Add("counter", 1);
        ASSERT_TRUE(v.ok()) << v.status();
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(seen.insert(*v).second)
            << "value " << *v << " returned twice (client " << c << ")";
      }
    });
  }
  for (auto& t : threads) t.join();
  auto check = Client(server->port());
  EXPECT_EQ(*check->Add("counter", 0), kClients * kAdds);
  EXPECT_EQ(*check->Get("counter"), absl::StrCat(kClients * kAdds));
  EXPECT_EQ(*seen.begin(), 1);
  EXPECT_EQ(*seen.rbegin(), kClients * kAdds);
  EXPECT_EQ(*check->Add("counter", -kClients * kAdds - 5), -5);  // negative deltas
}

TEST(StoreTest, AddOnANonIntegerNamesTheKey) {
  auto server = StartServer();
  auto c = Client(server->port());
  ASSERT_TRUE(c->Set("text", "abc").ok());
  auto v = c->Add("text", 1);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(v.status().message(), HasSubstr("'text'"));
  EXPECT_TRUE(c->Set("still", "usable").ok());  // an application error does not break it
}

TEST(StoreTest, WaitTimesOutNamingTheMissingKeysAndTheAddress) {
  auto server = StartServer();
  auto c = Client(server->port());
  ASSERT_TRUE(c->Set("rank/0", "here").ok());
  const std::vector<std::string> keys = {"rank/0", "rank/1", "rank/2"};
  const absl::Time start = absl::Now();
  absl::Status s = c->Wait(keys, absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("'rank/1', 'rank/2'"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("rank/0")));
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("127.0.0.1:", server->port())));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(3));
  auto missing = c->Missing(keys);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(*missing, (std::vector<std::string>{"rank/1", "rank/2"}));

  auto g = c->Get("never", absl::Milliseconds(100));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(g.status().message(), HasSubstr("'never'"));
}

// A free loopback port: bound by the kernel, then released for the caller to bind again.
int FreePort() {
  auto s = Socket::Listen(kHost, 0);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s->LocalPort();
}

TEST(StoreTest, ClientStartedBeforeItsServerConnectsOnceItIsUp) {
  const int port = FreePort();
  std::unique_ptr<StoreServer> server;
  std::thread master([&] {
    absl::SleepFor(absl::Milliseconds(300));
    auto s = StoreServer::Start(kHost, port);
    ASSERT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
  });
  auto c = TcpStore::Connect(kHost, port, absl::Seconds(10));
  master.join();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Set("k", "v").ok());
  EXPECT_EQ(*(*c)->Get("k"), "v");
}

TEST(StoreTest, ConnectToNobodyFailsAtTheDeadlineNamingTheAddress) {
  const int port = FreePort();
  const absl::Time start = absl::Now();
  auto c = TcpStore::Connect(kHost, port, absl::Milliseconds(300));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(c.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", port)));
  EXPECT_THAT(c.status().message(), HasSubstr("refused"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(TcpStore::Connect(kHost, port, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StoreTest, ListenOnATakenPortNamesTheAddress) {
  auto server = StartServer();
  // SO_REUSEADDR does not let a second listener take a port someone listens on.
  auto second = StoreServer::Start(kHost, server->port());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", server->port())));
}

TEST(StoreTest, AVanishedServerBreaksTheClientWithAClearError) {
  auto server = StartServer();
  const int port = server->port();
  auto c = Client(port, absl::Seconds(2));
  ASSERT_TRUE(c->Set("k", "v").ok());
  server.reset();  // joins its threads: the connection is closed
  absl::Status s = c->Set("k", "w");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("127.0.0.1:", port)));
  absl::Status again = c->Wait({"k"});
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(again.message(), s.message());  // the first cause, kept
}

TEST(StoreTest, AMalformedFrameDropsOnlyItsConnection) {
  auto server = StartServer();
  auto good = Client(server->port());
  auto raw = Socket::Connect(kHost, server->port(), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(raw.ok());
  // A frame of 5 bytes holding an unknown operation.
  std::string junk("\x05\x00\x00\x00\x63\x00\x00\x00\x00", 9);
  ASSERT_TRUE(raw->SendAll(junk, absl::Now() + absl::Seconds(5)).ok());
  auto reply = ReadFrame(*raw, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status();
  auto decoded = DecodeReply(*reply);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->code, Reply::kError);
  EXPECT_THAT(decoded->value, HasSubstr("unknown operation"));
  // An oversized length: the server drops the connection without reading 4 GiB.
  auto raw2 = Socket::Connect(kHost, server->port(), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(
      raw2->SendAll(std::string("\xff\xff\xff\xff", 4), absl::Now() + absl::Seconds(5)).ok());
  char byte;
  EXPECT_EQ(raw2->RecvAll(&byte, 1, absl::Now() + absl::Seconds(5)).code(),
            absl::StatusCode::kUnavailable);
  ASSERT_TRUE(good->Set("k", "v").ok());
  EXPECT_EQ(*good->Get("k"), "v");
}

TEST(SocketTest, ListenAddressStaysOnLoopbackForLoopbackMasters) {
  EXPECT_EQ(*ListenAddressFor("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(*ListenAddressFor("127.0.0.5"), "127.0.0.5");
  EXPECT_EQ(*ListenAddressFor("::1"), "::1");
  EXPECT_EQ(*ListenAddressFor("10.1.2.3"), "0.0.0.0");
  EXPECT_EQ(*ListenAddressFor("fd00::1"), "::");
  EXPECT_EQ(ListenAddressFor("no-such-host.invalid").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto local = LocalAddressToward("127.0.0.1", 1234);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
}

TEST(WireTest, RoundTripsAndRejectsTruncation) {
  Request r{StoreOp::kCheck, {"a", std::string("b\0c", 3)}, "val", -7};
  std::string frame = EncodeRequest(r);
  auto back = DecodeRequest(absl::string_view(frame).substr(4));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->op, StoreOp::kCheck);
  EXPECT_EQ(back->keys, r.keys);
  EXPECT_EQ(back->value, "val");
  EXPECT_EQ(back->delta, -7);
  for (size_t cut = 4; cut < frame.size(); ++cut) {
    EXPECT_FALSE(DecodeRequest(absl::string_view(frame).substr(4, cut - 4)).ok()) << cut;
  }
  EXPECT_FALSE(DecodeRequest(frame.substr(4) + "x").ok());  // trailing bytes
}

}  // namespace
}  // namespace braid::rendezvous
