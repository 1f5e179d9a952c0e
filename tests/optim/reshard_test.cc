// Re-sharding optimizer checkpoints (optim/reshard.h): state saved by a 2-rank run (local
// backend threads) is converted for 4 ranks, 1 rank and a 2x2 mesh, loaded there, saved again
// and read back: master weights, moments and step counts bit for bit those of the source, and
// the gathered parameters those of the serial reference. Files of other parameters, of mixed
// runs and without a recorded layout are refused, naming the parameter or the file.
#include "optim/reshard.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optim/checkpoint_layout.h"
#include "optim/state_file.h"
#include "tests/multirank.h"
#include "tests/optim/optimizer_harness.h"

namespace braid::optim::testing {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

std::vector<std::string> RankFiles(const std::string& prefix, int n) {
  std::vector<std::string> v;
  for (int r = 0; r < n; ++r) v.push_back(absl::StrCat(prefix, r, ".braid"));
  return v;
}

// Saves the state of `s` after `steps` steps as "<prefix><rank>.braid".
void SaveRun(const OptScenario& s, int steps, const std::string& prefix) {
  RunRanks(s.replicas * s.shards, [&](Group& world) {
    auto st = BuildStack(world, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK(RunSteps(**st, s, 0, steps));
    ASSERT_OK((*st)->opt->Save(absl::StrCat(prefix, world.rank(), ".braid")));
  });
}

void ExpectSameState(const Checkpoint& a, const Checkpoint& b) {
  ASSERT_EQ(a.state_names, b.state_names);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.header.step, b.header.step);
  ASSERT_EQ(a.header.scalars.size(), b.header.scalars.size());
  for (size_t i = 0; i < a.header.scalars.size(); ++i) {
    EXPECT_EQ(a.header.scalars[i].first, b.header.scalars[i].first);
    EXPECT_EQ(std::memcmp(&a.header.scalars[i].second, &b.header.scalars[i].second, sizeof(double)),
              0);
  }
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t k = 0; k < a.values.size(); ++k) {
    ASSERT_EQ(a.values[k].size(), b.values[k].size());
    for (size_t i = 0; i < a.values[k].size(); ++i) {
      ASSERT_EQ(a.values[k][i].size(), b.values[k][i].size());
      EXPECT_EQ(std::memcmp(a.values[k][i].data(), b.values[k][i].data(),
                            a.values[k][i].size() * sizeof(float)),
                0)
          << a.state_names[k] << " of parameter #" << i << " differs";
    }
  }
}

struct Target {
  int replicas, shards;
};

class ReshardTest : public ::testing::TestWithParam<DType> {};

TEST_P(ReshardTest, TwoRanksToFourOneAndAMeshBitExact) {
  const std::string dir = ::testing::TempDir();
  OptScenario src = TwoGroupScenario(1, 2);
  src.dtype = GetParam();
  src.steps = 2;
  const std::string tag = std::string(DTypeName(src.dtype));
  SaveRun(src, 2, absl::StrCat(dir, "/src_", tag, "_rank"));
  absl::StatusOr<Checkpoint> c =
      ReadCheckpoint(RankFiles(absl::StrCat(dir, "/src_", tag, "_rank"), 2));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->header.step, 2);
  const auto expected_params = ReferenceParams(src, 2);
  for (Target t : {Target{1, 4}, Target{1, 1}, Target{2, 2}}) {
    SCOPED_TRACE(absl::StrCat(t.replicas, "x", t.shards));
    const int m = t.replicas * t.shards;
    const std::string to = absl::StrCat(dir, "/to", t.replicas, "x", t.shards, "_", tag, "_rank");
    const std::string back =
        absl::StrCat(dir, "/back", t.replicas, "x", t.shards, "_", tag, "_rank");
    absl::StatusOr<std::vector<std::string>> files = WriteCheckpoint(*c, m, t.shards, to);
    ASSERT_TRUE(files.ok()) << files.status();
    ASSERT_EQ(*files, RankFiles(to, m));
    OptScenario dst = src;
    dst.replicas = t.replicas;
    dst.shards = t.shards;
    RunRanks(m, [&](Group& world) {
      auto st = BuildStack(world, dst);
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK((*st)->opt->Load((*files)[world.rank()]));
      ASSERT_OK((*st)->opt->WaitAllParams());
      auto p = Params(**st, dst);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(*p, expected_params) << "gathered parameters after the move";
      ASSERT_OK((*st)->opt->Save(absl::StrCat(back, world.rank(), ".braid")));
    });
    absl::StatusOr<Checkpoint> again = ReadCheckpoint(RankFiles(back, m));
    ASSERT_TRUE(again.ok()) << again.status();
    ExpectSameState(*c, *again);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReshardTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(DTypeName(i.param));
                         });

TEST(ReshardErrors, OtherParametersAreRefusedNamingTheParameter) {
  const std::string dir = ::testing::TempDir();
  OptScenario src = TwoGroupScenario(1, 2);
  SaveRun(src, 1, dir + "/a_rank");
  OptScenario other = src;
  other.counts[3] = 301;
  SaveRun(other, 1, dir + "/b_rank");
  // Mixed runs: the first parameter that differs is named.
  ExpectError(ReadCheckpoint({dir + "/a_rank0.braid", dir + "/b_rank1.braid"}).status(),
              absl::StatusCode::kFailedPrecondition,
              {"b_rank1.braid", "parameter #3", "'p3'", "300", "301"});
  // A converted checkpoint loaded where a parameter has another size.
  absl::StatusOr<Checkpoint> c = ReadCheckpoint(RankFiles(dir + "/a_rank", 2));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(WriteCheckpoint(*c, 1, 1, dir + "/a1_rank").ok());
  OptScenario one = other;
  one.shards = 1;
  RunRanks(1, [&](Group& world) {
    auto st = BuildStack(world, one);
    ASSERT_TRUE(st.ok()) << st.status();
    ExpectError((*st)->opt->Load(dir + "/a1_rank0.braid"), absl::StatusCode::kFailedPrecondition,
                {"a1_rank0.braid", "'p3'", "301"});
  });
  // Not every rank, or a rank twice.
  ExpectError(ReadCheckpoint({dir + "/a_rank0.braid"}).status(),
              absl::StatusCode::kFailedPrecondition, {"a_rank0.braid", "world of 2 ranks"});
  ExpectError(ReadCheckpoint({dir + "/a_rank0.braid", dir + "/a_rank0.braid"}).status(),
              absl::StatusCode::kFailedPrecondition, {"rank 1 is missing"});
  ExpectError(WriteCheckpoint(*c, 6, 4, dir + "/x").status(), absl::StatusCode::kInvalidArgument,
              {"6", "4"});
}

// A file written before layouts were recorded (no layout/ sections) still loads on its own
// world, but cannot be re-sharded.
TEST(ReshardErrors, FilesWithoutLayoutLoadButAreNotConverted) {
  const std::string dir = ::testing::TempDir();
  OptScenario src = TwoGroupScenario(1, 2);
  SaveRun(src, 1, dir + "/new_rank");
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<LoadedState> f = ReadStateFile(absl::StrCat(dir, "/new_rank", r, ".braid"));
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE(HasLayout(*f));
    std::vector<StateSection> kept;
    for (const LoadedSection& s : f->sections()) {
      if (s.name.rfind("layout/", 0) == 0) continue;
      kept.push_back(StateSection{s.name, s.dtype, s.count, s.data(), s.bytes});
    }
    ASSERT_OK(WriteStateFile(absl::StrCat(dir, "/old_rank", r, ".braid"), f->header(), kept));
  }
  ExpectError(ReadCheckpoint(RankFiles(dir + "/old_rank", 2)).status(), absl::StatusCode::kNotFound,
              {"old_rank0.braid", "no bucket layout"});
  RunRanks(2, [&](Group& world) {
    auto st = BuildStack(world, src);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_OK((*st)->opt->Load(absl::StrCat(dir, "/old_rank", world.rank(), ".braid")));
  });
}

}  // namespace
}  // namespace braid::optim::testing
