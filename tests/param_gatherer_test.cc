// ParamGatherer on the local backend. Every rank writes distinct bit patterns into its shard of
// every bucket (f32, bf16 and f16 buckets; odd parameter sizes that straddle shards; 1 to 4
// ranks); after the gathers every rank's ParamView must equal, bit for bit, the serial
// reference: the concatenation of all ranks' shards, cut at the plan's slot offsets. Also:
// prefetch overlapping the use of the previous bucket, release and re-gather (ZeRO-3), an
// optimizer-style update of the shard, misuse errors, stalled and late peers, the issue-order
// check, and the timeline rows.
#include "scheduler/param_gatherer.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "gtest/gtest.h"
#include "scheduler/timeline.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::LocalOptions;
using braid::testing::RunRanks;

using braid::testing::ExpectError;
// Odd sizes, three dtypes interleaved, small caps: several buckets per dtype, parameters that
// straddle shard boundaries.
std::vector<ParamSpec> MixedParams() {
  const size_t sizes[] = {1, 37, 300, 1025, 64, 13, 4099, 7, 515, 3, 129};
  const DType pick[] = {DType::kF32, DType::kBF16, DType::kF16};
  std::vector<ParamSpec> ps;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    ps.push_back(ParamSpec{static_cast<ParamId>(100 + 3 * i), sizes[i], pick[i % 3], Device::Cpu(),
                           absl::StrCat("layer", i, ".weight")});
  }
  return ps;
}

BucketPlan MakePlan(std::vector<ParamSpec> params, int shards, size_t first_cap = 256,
                    size_t cap = 4096) {
  PlanOptions o;
  o.shards = shards;
  o.first_bucket_cap_bytes = first_cap;
  o.bucket_cap_bytes = cap;
  auto plan = BucketPlan::Build(std::move(params), o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// The byte pattern rank r writes at byte j of its shard of bucket b in round k (any bits: NaN
// payloads included, since a gather moves bits and must not touch them).
uint8_t ShardByte(int r, int b, size_t j, int k) {
  uint64_t z = (((static_cast<uint64_t>(r) * 977 + b) * 31 + k) << 32) + j + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint8_t>(z ^ (z >> 31));
}

void WriteShards(ParamGatherer& pg, int r, int k) {
  for (int b = 0; b < pg.num_buckets(); ++b) {
    auto sv = pg.ShardView(b);
    ASSERT_TRUE(sv.ok()) << sv.status();
    auto* p = static_cast<uint8_t*>(sv->data);
    for (size_t j = 0; j < sv->bytes(); ++j) p[j] = ShardByte(r, b, j, k);
  }
}

// Serial reference: bucket b as the concatenation of every rank's shard, in rank order.
std::vector<uint8_t> ReferenceBucket(const BucketPlan& plan, int b, int ranks, int k) {
  const Bucket& bk = plan.buckets()[b];
  const size_t shard_bytes = bk.shard_count * DTypeSize(bk.dtype);
  std::vector<uint8_t> all;
  for (int r = 0; r < ranks; ++r) {
    for (size_t j = 0; j < shard_bytes; ++j) all.push_back(ShardByte(r, b, j, k));
  }
  return all;
}

// Every parameter of bucket b, as this rank sees it, against the reference.
void ExpectBucketMatches(const ParamGatherer& pg, int b, int ranks, int k, int me) {
  const BucketPlan& plan = pg.plan();
  const std::vector<uint8_t> want = ReferenceBucket(plan, b, ranks, k);
  for (int p : plan.buckets()[b].params) {
    const ParamSpec& ps = plan.params()[p];
    auto v = pg.ParamView(ps.id);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_EQ(v->count, ps.count);
    ASSERT_EQ(v->dtype, ps.dtype);
    const size_t es = DTypeSize(ps.dtype);
    const uint8_t* got = static_cast<const uint8_t*>(v->data);
    const uint8_t* ref = want.data() + plan.slot(p).offset * es;
    for (size_t j = 0; j < v->bytes(); ++j) {
      ASSERT_EQ(got[j], ref[j]) << "rank " << me << " of " << ranks << ", round " << k
                                << ", bucket " << b << " (" << DTypeName(ps.dtype)
                                << "), parameter " << ps.Label() << ", element " << j / es;
    }
  }
}

GathererConfig Config(bool fully_sharded) {
  GathererConfig c;
  c.timeout = absl::Seconds(60);
  c.fully_sharded = fully_sharded;
  return c;
}

// ---- bit-exact against the serial reference --------------------------------------------

struct Scenario {
  int ranks;
  bool fully_sharded;
};
void PrintTo(const Scenario& s, std::ostream* os) {
  *os << s.ranks << " ranks" << (s.fully_sharded ? ", fully_sharded" : "");
}

class GatherVsReference : public ::testing::TestWithParam<Scenario> {};

TEST_P(GatherVsReference, BitExact) {
  const Scenario sc = GetParam();
  RunRanks(sc.ranks, [&](Group& g) {
    const int r = g.rank();
    auto made =
        ParamGatherer::Create(MakePlan(MixedParams(), sc.ranks), &g, Config(sc.fully_sharded));
    ASSERT_TRUE(made.ok()) << made.status();
    ParamGatherer& pg = **made;
    const BucketPlan& plan = pg.plan();
    const int nb = pg.num_buckets();
    ASSERT_GE(nb, 6);  // several buckets of each dtype
    bool straddles = false;
    for (int b = 0; b < nb; ++b) {
      const Bucket& bk = plan.buckets()[b];
      for (int p : bk.params) {
        const size_t lo = plan.slot(p).offset, hi = lo + plan.params()[p].count;
        straddles |= sc.ranks > 1 && lo / bk.shard_count != (hi - 1) / bk.shard_count;
      }
    }
    EXPECT_TRUE(straddles || sc.ranks == 1) << "no parameter straddles a shard boundary";

    // Layout: 64-byte aligned flat buffer, this rank's shard in place inside it (without
    // fully_sharded; with it, the shard has its own storage).
    WriteShards(pg, r, /*k=*/0);
    for (int b = 0; b < nb; ++b) ASSERT_OK(pg.WaitParams(b));
    for (int b = 0; b < nb; ++b) {
      const Bucket& bk = plan.buckets()[b];
      const int first = bk.params[0];
      const size_t es = DTypeSize(bk.dtype);
      auto v = pg.ParamView(plan.params()[first].id);
      ASSERT_TRUE(v.ok());
      const char* base = static_cast<const char*>(v->data) - plan.slot(first).offset * es;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % 64, 0u) << "bucket " << b;
      auto sv = pg.ShardView(b);
      ASSERT_TRUE(sv.ok());
      EXPECT_EQ(sv->count, bk.shard_count);
      if (!sc.fully_sharded) {
        EXPECT_EQ(sv->data, base + r * bk.shard_count * es) << "bucket " << b;
      }
      ExpectBucketMatches(pg, b, sc.ranks, 0, r);
    }

    // Forward-like walk (last bucket first): bucket b-1's gather overlaps the use of bucket b.
    for (int b = 0; b < nb; ++b) ASSERT_OK(pg.Release(b));
    for (int b = 0; b < nb; ++b) {
      EXPECT_EQ(pg.IsGathered(b), !sc.fully_sharded) << b;
      if (sc.fully_sharded) {
        EXPECT_EQ(pg.ParamView(plan.params()[plan.buckets()[b].params[0]].id).status().code(),
                  absl::StatusCode::kFailedPrecondition);
      }
    }
    ASSERT_OK(pg.Prefetch(nb - 1));
    for (int b = nb - 1; b >= 0; --b) {
      ASSERT_OK(pg.WaitParams(b));
      if (b > 0) ASSERT_OK(pg.Prefetch(b - 1));  // prefetch the next while this one is used
      ExpectBucketMatches(pg, b, sc.ranks, 0, r);
      ASSERT_OK(pg.Release(b));
    }
    // Backward-like walk (first bucket first), nobody prefetching: WaitParams starts the
    // gather (fully_sharded) or finds the bucket still gathered.
    for (int b = 0; b < nb; ++b) {
      ASSERT_OK(pg.WaitParams(b));
      ExpectBucketMatches(pg, b, sc.ranks, 0, r);
      ASSERT_OK(pg.Release(b));
    }

    // An optimizer step writes new shard values; prefetching everything publishes them.
    WriteShards(pg, r, /*k=*/1);
    for (int b = 0; b < nb; ++b) ASSERT_OK(pg.Prefetch(b));
    ASSERT_OK(pg.WaitAll());
    for (int b = 0; b < nb; ++b) {
      EXPECT_TRUE(pg.IsGathered(b));
      ExpectBucketMatches(pg, b, sc.ranks, 1, r);
    }
    EXPECT_OK(pg.CheckIssueOrder());
  });
}

INSTANTIATE_TEST_SUITE_P(RanksAndRelease, GatherVsReference,
                         ::testing::Values(Scenario{1, false}, Scenario{2, false},
                                           Scenario{3, false}, Scenario{4, false},
                                           Scenario{1, true}, Scenario{2, true}, Scenario{3, true},
                                           Scenario{4, true}),
                         [](const ::testing::TestParamInfo<Scenario>& i) {
                           return absl::StrCat(i.param.ranks, "ranks",
                                               i.param.fully_sharded ? "_fully_sharded" : "");
                         });

// ---- prefetch is asynchronous ------------------------------------------------------------

// Rank 1 stalls before joining bucket 1's gather: on every rank Prefetch(1) returns at once,
// bucket 0 stays usable meanwhile, and WaitParams(1) then completes with the right values.
TEST(ParamGatherer, PrefetchOverlapsUseOfPreviousBucket) {
  auto backend = CreateBackend(LocalOptions(2, absl::Seconds(30)));
  ASSERT_TRUE(backend.ok());
  // Without the plan check, the group's sequence numbers are the gathers: bucket 1's is #1.
  static_cast<local::LocalBackend*>(backend->get())
      ->faults()
      .StallRank(1, 1, absl::Milliseconds(400), "world");
  RunRanks(**backend, [](Group& g) {
    GathererConfig cfg = Config(/*fully_sharded=*/true);
    cfg.verify_plan = false;
    auto made = ParamGatherer::Create(MakePlan(MixedParams(), 2), &g, cfg);
    ASSERT_TRUE(made.ok()) << made.status();
    ParamGatherer& pg = **made;
    WriteShards(pg, g.rank(), 0);
    ASSERT_OK(pg.Prefetch(0));
    ASSERT_OK(pg.WaitParams(0));
    const absl::Time t0 = absl::Now();
    ASSERT_OK(pg.Prefetch(1));
    EXPECT_LT(absl::Now() - t0, absl::Milliseconds(200)) << "Prefetch blocked";
    ASSERT_NE(pg.GatherWork(1), nullptr);
    EXPECT_FALSE(pg.GatherWork(1)->Done()) << "the peer is stalled: the gather cannot be done yet";
    EXPECT_FALSE(pg.IsGathered(1));
    ExpectBucketMatches(pg, 0, 2, 0, g.rank());  // use bucket 0 while bucket 1 is in flight
    ASSERT_OK(pg.WaitParams(1));
    EXPECT_GE(absl::Now() - t0, absl::Milliseconds(300));
    ExpectBucketMatches(pg, 1, 2, 0, g.rank());
    EXPECT_EQ(pg.GatherWork(1)->info().label, "bucket 1");
  });
}

// ---- misuse ------------------------------------------------------------------------------

TEST(ParamGathererErrors, DoublePrefetchUnknownIdsAndBucketsReleaseInFlight) {
  RunRanks(2, [](Group& g) {
    auto made =
        ParamGatherer::Create(MakePlan(MixedParams(), 2), &g, Config(/*fully_sharded=*/true));
    ASSERT_TRUE(made.ok()) << made.status();
    ParamGatherer& pg = **made;
    WriteShards(pg, g.rank(), 0);
    ASSERT_OK(pg.Prefetch(2));
    ExpectError(pg.Prefetch(2), absl::StatusCode::kFailedPrecondition,
                {"prefetching bucket 2", "already in flight", "'world'"});
    ExpectError(pg.Release(2), absl::StatusCode::kFailedPrecondition,
                {"releasing bucket 2", "in flight", "wait for it"});
    ASSERT_OK(pg.WaitParams(2));
    ExpectBucketMatches(pg, 2, 2, 0, g.rank());  // the refused calls changed nothing

    ExpectError(pg.ParamView(999).status(), absl::StatusCode::kNotFound, {"parameter view", "999"});
    const ParamSpec& in0 = pg.plan().params()[pg.plan().buckets()[0].params[0]];
    ExpectError(pg.ParamView(in0.id).status(), absl::StatusCode::kFailedPrecondition,
                {in0.Label(), "bucket 0", "released", "braid_unit_enter"});
    const int nb = pg.num_buckets();
    ExpectError(pg.Prefetch(nb), absl::StatusCode::kOutOfRange,
                {absl::StrCat("prefetching bucket ", nb, ":"), "no such bucket"});
    ExpectError(pg.WaitParams(-1), absl::StatusCode::kOutOfRange,
                {"waiting for bucket -1:", "no such bucket"});
    ExpectError(pg.Release(nb + 5), absl::StatusCode::kOutOfRange,
                {"releasing bucket", "no such bucket"});
    ExpectError(pg.ShardView(nb).status(), absl::StatusCode::kOutOfRange,
                {"the shard of bucket", "no such bucket"});
    EXPECT_EQ(pg.GatherWork(nb), nullptr);
    EXPECT_FALSE(pg.IsGathered(-3));
    EXPECT_OK(pg.Release(0));  // never gathered: nothing to free
    EXPECT_OK(pg.CheckIssueOrder());
  });
}

TEST(ParamGathererErrors, PlanForOtherShardCountNullGroupAndPlanMismatch) {
  RunRanks(2, [](Group& g) {
    ExpectError(ParamGatherer::Create(MakePlan(MixedParams(), 4), &g, Config(false)).status(),
                absl::StatusCode::kInvalidArgument, {"4 shard(s)", "group 'world' has 2 rank(s)"});
    ExpectError(ParamGatherer::Create(MakePlan(MixedParams(), 2), nullptr, Config(false)).status(),
                absl::StatusCode::kInvalidArgument, {"no group"});
    std::vector<ParamSpec> params = MixedParams();
    if (g.rank() == 1) params[4].count += 1;  // this rank disagrees about layer4
    auto made = ParamGatherer::Create(MakePlan(params, 2), &g, Config(false));
    EXPECT_FALSE(made.ok());
    if (!made.ok()) {
      EXPECT_NE(made.status().message().find("id 112"), absl::string_view::npos) << made.status();
    }
  });
}

// ---- peers that stall or come late -------------------------------------------------------

// Rank 1 never gathers: the backend's deadline fails rank 0's gather, and WaitParams says which
// bucket, which group and who did not arrive.
TEST(ParamGathererErrors, StalledPeerIsADeadlineErrorNamingBucketAndGroup) {
  auto backend = CreateBackend(LocalOptions(2, absl::Milliseconds(300)));
  ASSERT_TRUE(backend.ok());
  RunRanks(**backend, [](Group& g) {
    GathererConfig cfg = Config(false);
    cfg.verify_plan = false;
    auto made = ParamGatherer::Create(MakePlan(MixedParams(), 2), &g, cfg);
    ASSERT_TRUE(made.ok()) << made.status();
    if (g.rank() != 0) return;
    ExpectError((*made)->WaitParams(1), absl::StatusCode::kDeadlineExceeded,
                {"waiting for parameters: gathering bucket 1 on group 'world'", "allgather #0",
                 "rank(s) 1 did not arrive"});
    EXPECT_FALSE((*made)->IsGathered(1));
  });
}

// The gatherer's own deadline is shorter than the peer's delay: WaitParams fails naming the
// bucket and group, the gather keeps running, and a later WaitParams succeeds.
TEST(ParamGathererErrors, LatePeerMissesTheWaitDeadlineThenArrives) {
  auto backend = CreateBackend(LocalOptions(2, absl::Seconds(30)));
  ASSERT_TRUE(backend.ok());
  RunRanks(**backend, [](Group& g) {
    GathererConfig cfg = Config(true);
    cfg.verify_plan = false;
    cfg.timeout = absl::Milliseconds(100);
    auto made = ParamGatherer::Create(MakePlan(MixedParams(), 2), &g, cfg);
    ASSERT_TRUE(made.ok()) << made.status();
    ParamGatherer& pg = **made;
    WriteShards(pg, g.rank(), 0);
    if (g.rank() == 1) {
      absl::SleepFor(absl::Milliseconds(500));
      ASSERT_OK(pg.Prefetch(0));
    } else {
      ExpectError(pg.WaitParams(0), absl::StatusCode::kDeadlineExceeded,
                  {"waiting for parameters: gathering bucket 0 on group 'world'", "(bucket 0)"});
      ExpectError(pg.Prefetch(0), absl::StatusCode::kFailedPrecondition, {"already in flight"});
    }
    absl::Status st;
    for (int i = 0; i < 200; ++i) {
      st = pg.WaitParams(0);
      if (st.ok()) break;
    }
    ASSERT_OK(st);
    ExpectBucketMatches(pg, 0, 2, 0, g.rank());
  });
}

// ---- the rank-order contract ---------------------------------------------------------------

// Two buckets of the same size and dtype gathered in opposite orders: the transport cannot tell
// them apart (the contents land swapped), and CheckIssueOrder reports it on every rank.
TEST(ParamGathererErrors, CheckIssueOrderCatchesSameSizeBucketsSwapped) {
  RunRanks(2, [](Group& g) {
    std::vector<ParamSpec> params = {{1, 1000, DType::kF32, Device::Cpu(), "a"},
                                     {2, 1000, DType::kF32, Device::Cpu(), "b"}};
    auto made = ParamGatherer::Create(MakePlan(params, 2, 4000, 4000), &g, Config(false));
    ASSERT_TRUE(made.ok()) << made.status();
    ParamGatherer& pg = **made;
    ASSERT_EQ(pg.num_buckets(), 2);
    ASSERT_EQ(pg.plan().buckets()[0].padded_count, pg.plan().buckets()[1].padded_count);
    for (int k : {0, 1}) ASSERT_OK(pg.WaitParams(g.rank() == 0 ? k : 1 - k));  // contract broken
    ExpectError(
        pg.CheckIssueOrder(), absl::StatusCode::kFailedPrecondition,
        {"group 'world'", "rank-order contract", "rank 0 issued 2 gather(s), latest buckets [0, 1]",
         "rank 1 issued 2 gather(s), latest buckets [1, 0]"});
  });
}

// ---- timeline ------------------------------------------------------------------------------

TEST(ParamGatherer, TimelineShowsEachGatherOnTheGroupRowAndTheWaits) {
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/gatherer_trace");
  RunRanks(2, [&](Group& g) {
    auto tl = Timeline::Create(prefix, g.rank());
    ASSERT_TRUE(tl.ok()) << tl.status();
    GathererConfig cfg = Config(true);
    cfg.timeline = tl->get();
    auto made = ParamGatherer::Create(MakePlan(MixedParams(), 2), &g, cfg);
    ASSERT_TRUE(made.ok()) << made.status();
    for (int b = 0; b < (*made)->num_buckets(); ++b) ASSERT_OK((*made)->Prefetch(b));
    ASSERT_OK((*made)->WaitAll());
    made->reset();
    ASSERT_OK((*tl)->Close());
    std::ifstream in((*tl)->path());
    const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const char* part : {"\"allgather\"", "\"wait params\"", "group world", "waits"}) {
      EXPECT_NE(json.find(part), std::string::npos) << part << " missing from " << (*tl)->path();
    }
  });
}

}  // namespace
}  // namespace braid::sched
