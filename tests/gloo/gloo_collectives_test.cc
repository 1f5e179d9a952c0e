// The `gloo` backend as torchrun would start it: N plain processes on loopback with
// MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE (tests/gloo/run_ranks.sh), meeting at rank 0's
// TCP store. Every collective kind x reduce op x dtype x size {0, 1, 37, 65536+13} x
// in-place/out-of-place, bit for bit against the serial reference of tests/collective_check.h
// (exact data: Gloo's ring adds in its own order); Split (colors, keys, kNoColor, a bad color
// failing every rank); Launch not blocking on a late peer, completion without waiting; a missed
// deadline failing the op and then its group.
//
// Every process runs the same tests in the same order (the rank-order contract applies to the
// test itself). Every call has a deadline and the launcher script a wall-clock limit.
#include <atomic>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/collective_check.h"
#include "tests/gloo/gloo_gtest_main.h"
#include "tests/multirank.h"

namespace braid::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

Group*& TheWorld() {
  static Group* world = nullptr;
  return world;
}
Group& World() { return *TheWorld(); }

using Param = std::tuple<int /*kind index*/, DType, bool /*in_place*/>;

class GlooCollectives : public ::testing::TestWithParam<Param> {};

TEST_P(GlooCollectives, MatchesSerialReference) {
  const auto [ki, dtype, in_place] = GetParam();
  const CollectiveVariant k = kCollectiveVariants[ki];
  Group& g = World();
  if (const char* why = MatrixSkipReason(k, dtype, in_place)) GTEST_SKIP() << why;
  if (RefusedUpFront(k, dtype)) {
    const absl::Status s = LaunchStatus(g, k.kind, dtype, k.op);
    ExpectError(s, absl::StatusCode::kInvalidArgument, {DTypeName(dtype)});
    return;
  }
  uint64_t seed = 1;
  for (size_t count : kCheckSizes) {
    const int root = static_cast<int>(count % static_cast<size_t>(g.size()));
    CollectiveCase c{k.kind, k.op, dtype, count, in_place, /*exact_data=*/true, seed++, root};
    EXPECT_OK(RunAndCheck(g, c, kTimeout));
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [ki, dtype, in_place] = info.param;
  const CollectiveVariant k = kCollectiveVariants[ki];
  std::string s(CollectiveName(k.kind));
  if (Reduces(k.kind)) absl::StrAppend(&s, "_", ReduceKindName(k.op));
  absl::StrAppend(&s, "_", DTypeName(dtype), in_place ? "_inplace" : "");
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    All, GlooCollectives,
    ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCollectiveVariants))),
                       ::testing::ValuesIn(kAllDTypes), ::testing::Bool()),
    ParamName);

// Colors by parity, keys reversed: ranks ordered by key; each half reduces only its members;
// kNoColor gives a null group; the matrix's reference holds on a child too.
TEST(GlooSplit, ColorsKeysAndNoColor) {
  Group& w = World();
  const int n = w.size();
  const int r = w.rank();
  auto half = w.Split(r % 2, -r, "half");
  ASSERT_TRUE(half.ok()) << half.status();
  ASSERT_NE(*half, nullptr);
  int members = 0;
  int64_t expect = 0;
  for (int i = 0; i < n; ++i) {
    if (i % 2 == r % 2) {
      ++members;
      expect += i;
    }
  }
  EXPECT_EQ((*half)->size(), members);
  EXPECT_EQ((*half)->name(), "half");
  int higher = 0;  // same color, larger old rank: smaller key, so before us
  for (int i = r + 1; i < n; ++i) higher += (i % 2 == r % 2);
  EXPECT_EQ((*half)->rank(), higher);
  std::vector<int64_t> x(3, r);
  auto work = (*half)->AllReduce(x.data(), x.data(), 3, DType::kI64, ReduceOp::Sum());
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_OK((*work)->Wait(kTimeout));
  EXPECT_EQ(x, std::vector<int64_t>(3, expect));
  CollectiveCase c{
      CollectiveKind::kReduceScatter, ReduceKind::kAvg, DType::kBF16, 37, false, true, 7, 0};
  EXPECT_OK(RunAndCheck(**half, c, kTimeout));

  auto some = w.Split(r == 0 ? kNoColor : 5, r);
  ASSERT_TRUE(some.ok()) << some.status();
  if (r == 0) {
    EXPECT_EQ(*some, nullptr);
  } else {
    ASSERT_NE(*some, nullptr);
    EXPECT_EQ((*some)->size(), n - 1);
    EXPECT_EQ((*some)->rank(), r - 1);
    EXPECT_OK(RunAndCheck(**some,
                          CollectiveCase{CollectiveKind::kAllGather, ReduceKind::kSum, DType::kF16,
                                         37, true, true, 3, 0},
                          kTimeout));
  }
}

TEST(GlooSplit, ABadColorFailsEveryRankNamingIt) {
  Group& w = World();
  const int last = w.size() - 1;
  auto g = w.Split(w.rank() == last ? -5 : 0, 0);
  ExpectError(g.status(), absl::StatusCode::kInvalidArgument,
              {absl::StrCat("rank ", last, " passed color -5")});
  // The world is still usable.
  EXPECT_OK(RunAndCheck(w,
                        CollectiveCase{CollectiveKind::kAllReduce, ReduceKind::kSum, DType::kF32, 5,
                                       false, true, 9, 0},
                        kTimeout));
}

// Launch returns at once even when a peer is late; the callback fires without a Wait.
TEST(GlooAsync, LaunchDoesNotBlockOnALatePeer) {
  Group& w = World();
  if (w.rank() == 0) absl::SleepFor(absl::Milliseconds(500));
  std::vector<float> x(1000, 1.0f);
  std::atomic<bool> called{false};
  const absl::Time start = absl::Now();
  auto work = w.AllReduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::Sum());
  const absl::Duration launch = absl::Now() - start;
  ASSERT_TRUE(work.ok()) << work.status();
  (*work)->OnComplete([&](const absl::Status& s) { called = s.ok(); });
  if (w.rank() != 0) {
    EXPECT_LT(launch, absl::Milliseconds(200));
    EXPECT_FALSE((*work)->Done());  // rank 0 is still asleep
  }
  const absl::Time until = absl::Now() + kTimeout;
  while (!called && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(called);
  EXPECT_EQ(x[0], static_cast<float>(w.size()));
  EXPECT_EQ(x[999], static_cast<float>(w.size()));
}

// Several collectives in flight at once, completed in issue order.
TEST(GlooAsync, ManyInFlight) {
  Group& w = World();
  constexpr int kCalls = 16;
  std::vector<std::vector<int32_t>> bufs(kCalls, std::vector<int32_t>(100));
  std::vector<WorkPtr> works;
  for (int i = 0; i < kCalls; ++i) {
    for (auto& v : bufs[i]) v = i * (w.rank() + 1);
    auto work = w.AllReduce(bufs[i].data(), bufs[i].data(), 100, DType::kI32, ReduceOp::Sum());
    ASSERT_TRUE(work.ok());
    works.push_back(*work);
  }
  const int tri = w.size() * (w.size() + 1) / 2;
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_OK(works[i]->Wait(kTimeout));
    EXPECT_EQ(works[i]->info().seq + 1, works.back()->info().seq + 1 - (kCalls - 1 - i));
    EXPECT_EQ(bufs[i][0], i * tri);
    EXPECT_EQ(bufs[i][99], i * tri);
  }
}

// Only rank 0 calls: it misses its deadline with an error naming the op, and its group is then
// failed for good. Runs on a child group, last, so the world stays healthy.
TEST(GlooErrors, AMissedDeadlineFailsTheOpThenTheGroup) {
  Group& w = World();
  auto g = w.Split(0, w.rank(), "doomed");
  ASSERT_TRUE(g.ok()) << g.status();
  if (w.rank() == 0) {
    std::vector<float> x(8, 1.0f);
    CollectiveOptions o;
    o.timeout = absl::Milliseconds(500);
    o.label = "lonely bucket";
    auto work = (*g)->AllReduce(x.data(), x.data(), 8, DType::kF32, ReduceOp::Sum(), o);
    ASSERT_TRUE(work.ok());
    ExpectError((*work)->Wait(kTimeout), absl::StatusCode::kDeadlineExceeded,
                {"allreduce #0", "doomed", "lonely bucket"});
    auto again = (*g)->Barrier();
    ASSERT_TRUE(again.ok());
    ExpectError((*again)->Wait(kTimeout), absl::StatusCode::kDeadlineExceeded,
                {"barrier #1", "failed earlier", "allreduce #0"});
  }
  // Everyone meets again on the world before the group goes away.
  auto b = w.Barrier();
  ASSERT_TRUE(b.ok());
  ASSERT_OK((*b)->Wait(kTimeout));
}

}  // namespace
}  // namespace braid::testing

int main(int argc, char** argv) {
  return braid::testing::RunGlooTests(
      argc, argv, [](braid::Group* world) { braid::testing::TheWorld() = world; });
}
