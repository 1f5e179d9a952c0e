// ShardedOptimizer on the `local` backend against the serial, unsharded reference of
// tests/optim/optimizer_harness.h, bit for bit: world sizes 1, 2, 4, 8 and 2x2 / 2x4 meshes,
// AdamW and SGD, f32 / bf16 / f16 models, overlapped and explicit steps, accumulation
// schedules (no_sync, reduce_scatter_only), clipping, the tracked norm (track_grad_norm),
// skipped non-finite steps, two parameter groups and an lr change; resume from a checkpoint;
// and the errors.
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/optim/optimizer_harness.h"

namespace braid::optim::testing {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

using Case = NamedScenario;

OptScenario Base(int replicas, int shards) { return TwoGroupScenario(replicas, shards); }

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (int n : {1, 2, 4, 8}) cases.push_back({absl::StrCat("adamw_f32_world", n), Base(1, n)});
  {
    Case c{"adamw_f32_world2_explicit_step", Base(1, 2)};
    c.s.opt.overlap = false;
    cases.push_back(c);
  }
  {
    Case c{"adamw_bf16_world4_nosync", Base(1, 4)};
    c.s.dtype = DType::kBF16;
    c.s.schedule = {SyncMode::kNoSync, SyncMode::kSync};
    cases.push_back(c);
  }
  {
    Case c{"adamw_f16_world2_lr_change", Base(1, 2)};
    c.s.dtype = DType::kF16;
    c.s.lr_change_step = 2;
    cases.push_back(c);
  }
  {
    Case c{"adamw_f32_mesh2x2_rsonly", Base(2, 2)};
    c.s.schedule = {SyncMode::kReduceScatterOnly, SyncMode::kSync};
    cases.push_back(c);
  }
  {
    Case c{"adamw_bf16_mesh2x4", Base(2, 4)};
    c.s.dtype = DType::kBF16;
    c.s.steps = 3;
    cases.push_back(c);
  }
  {
    Case c{"adamw_f32_world4_clip", Base(1, 4)};
    c.s.opt.max_grad_norm = 0.5;  // the gradients' norm is ~5-10: clipping is active
    cases.push_back(c);
  }
  {
    Case c{"adamw_f32_mesh2x2_clip_skip_inf", Base(2, 2)};
    c.s.opt.max_grad_norm = 0.5;
    c.s.opt.skip_nonfinite = true;
    c.s.inf_step = 1;
    cases.push_back(c);
  }
  {
    Case c{"adamw_f16_world2_skip_inf_explicit", Base(1, 2)};
    c.s.dtype = DType::kF16;
    c.s.opt.skip_nonfinite = true;
    c.s.opt.overlap = false;
    c.s.inf_step = 2;
    cases.push_back(c);
  }
  {
    // The norm for logging (track_grad_norm): the clipped step's norm, bit for bit, while
    // the steps are unchanged.
    Case c{"adamw_f32_world4_track_norm", Base(1, 4)};
    c.s.opt.track_grad_norm = true;
    cases.push_back(c);
  }
  {
    Case c{"sgd_bf16_mesh2x2_track_norm_explicit", Base(2, 2)};
    c.s.opt.kind = OptimizerKind::kSgd;
    c.s.dtype = DType::kBF16;
    c.s.opt.track_grad_norm = true;
    c.s.opt.overlap = false;
    cases.push_back(c);
  }
  {
    Case c{"sgd_f32_world4", Base(1, 4)};
    c.s.opt.kind = OptimizerKind::kSgd;
    cases.push_back(c);
  }
  {
    Case c{"sgd_bf16_mesh2x2_clip", Base(2, 2)};
    c.s.opt.kind = OptimizerKind::kSgd;
    c.s.dtype = DType::kBF16;
    c.s.opt.max_grad_norm = 0.5;
    cases.push_back(c);
  }
  // Divergent control flow: ranks use different parameters; parameters no rank used in a step
  // are not stepped (their moments, step count and weight decay untouched), as torch skips a
  // None grad; the others are stepped with the average (zeros from the ranks that skipped).
  {
    Case c{"adamw_f32_world4_divergent_declared", Base(1, 4)};
    c.s.agree = sched::UnusedAgreement::kDeclared;
    cases.push_back(c);
  }
  {
    Case c{"adamw_bf16_world2_nosync_divergent_at_finish", Base(1, 2)};
    c.s.dtype = DType::kBF16;
    c.s.schedule = {SyncMode::kNoSync, SyncMode::kSync};
    c.s.agree = sched::UnusedAgreement::kAtFinish;
    cases.push_back(c);
  }
  {
    Case c{"adamw_f32_mesh2x2_rsonly_divergent_declared", Base(2, 2)};
    c.s.schedule = {SyncMode::kReduceScatterOnly, SyncMode::kSync};
    c.s.agree = sched::UnusedAgreement::kDeclared;
    cases.push_back(c);
  }
  {
    Case c{"sgd_f32_world4_clip_divergent_at_finish", Base(1, 4)};
    c.s.opt.kind = OptimizerKind::kSgd;
    c.s.opt.max_grad_norm = 0.5;
    c.s.agree = sched::UnusedAgreement::kAtFinish;
    cases.push_back(c);
  }
  {
    Case c{"adamw_f32_world2_divergent_explicit_step", Base(1, 2)};
    c.s.opt.overlap = false;
    c.s.agree = sched::UnusedAgreement::kDeclared;
    cases.push_back(c);
  }
  {
    Case c{"adamw_f32_world2_threads2", Base(1, 2)};
    c.s.opt.threads = 2;
    c.s.counts = {70000, 3, 131072 + 5};  // shards above the kernels' parallel grain
    c.s.opt.group_of = {{1, 1}};
    c.s.bucket_cap_bytes = size_t{1} << 20;
    c.s.steps = 2;
    cases.push_back(c);
  }
  return cases;
}

class OptimizerVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerVsReference, BitExact) {
  const OptScenario& s = GetParam().s;
  RunRanks(s.replicas * s.shards,
           [&](Group& world) { EXPECT_OK(CheckAgainstReference(world, s)); });
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerVsReference, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The reference itself: a sanity anchor, so a harness bug that made both sides no-ops fails.
// After skipped steps each parameter has its own step count (torch's state['step']): the whole
// state carries it; the per-rank file, which keeps one count per bucket, refuses to save.
TEST(DivergentSteps, PerParameterStepCountsInTheCheckpoint) {
  OptScenario s = Base(1, 2);
  s.agree = sched::UnusedAgreement::kDeclared;
  RunRanks(2, [&](Group& world) {
    auto st = BuildStack(world, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK(RunSteps(**st, s, 0, 4));
    absl::StatusOr<Checkpoint> c = (*st)->opt->GatherCheckpoint();
    ASSERT_TRUE(c.ok()) << c.status();
    for (int i = 0; i < static_cast<int>(s.counts.size()); ++i) {
      int64_t want = 0;
      for (int t = 0; t < 4; ++t) {
        bool used = false;
        for (int r = 0; r < 2; ++r) used |= UsedIn(r, t, 0, i, s);
        want += used ? 1 : 0;
      }
      const int pi = *c->plan.IndexOf(i);
      EXPECT_EQ(c->steps[pi], want) << "parameter " << i;
    }
    EXPECT_EQ(c->steps[*c->plan.IndexOf(3)], 2);  // unused by every rank in steps 1 and 3
    ExpectError((*st)->opt->Save(absl::StrCat(::testing::TempDir(), "/skips", world.rank())),
                absl::StatusCode::kFailedPrecondition, {"skipped", "braid_optimizer_get_state"});
  });
}

TEST(OptimizerReference, StepsChangeEveryParameter) {
  const OptScenario s = Base(1, 2);
  const auto before = ReferenceParams(s, 0), after = ReferenceParams(s, 2);
  for (size_t i = 0; i < s.counts.size(); ++i) EXPECT_NE(before[i], after[i]) << "parameter " << i;
}

// Overlap: bucket 0's step and all-gather start while the rest of the backward is unmarked.
TEST(ShardedOptimizer, StepsBucketZeroBeforeTheBackwardEnds) {
  OptScenario s = Base(1, 2);
  RunRanks(2, [&](Group& world) {
    auto st = BuildStack(world, s);
    ASSERT_TRUE(st.ok()) << st.status();
    RankStack& k = **st;
    const WorkPtr before = k.gatherer->GatherWork(0);
    ASSERT_OK(k.opt->BeginBackward(SyncMode::kSync));
    const auto& plan = k.reducer->plan();
    for (int pi : plan.buckets()[0].params) ASSERT_OK(k.reducer->MarkReady(plan.params()[pi].id));
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (k.gatherer->GatherWork(0) == before && absl::Now() < deadline)
      absl::SleepFor(absl::Microseconds(100));
    EXPECT_NE(k.gatherer->GatherWork(0), before)
        << "bucket 0 was not stepped and gathered during backward";
    for (size_t b = 1; b < plan.buckets().size(); ++b) {
      for (int pi : plan.buckets()[b].params) ASSERT_OK(k.reducer->MarkReady(plan.params()[pi].id));
    }
    ASSERT_OK(k.opt->FinishBackward());
    ASSERT_OK(k.opt->WaitAllParams());
  });
}

// A reduction that fails on one rank: bucket 0 was stepped everywhere, buckets 1.. are dropped on
// every rank (parameters unchanged, gathered again: WaitAllParams works), the error names the
// bucket, and nothing hangs.
TEST(ShardedOptimizer, FailedReductionDropsTheRestOfTheStepOnEveryRank) {
  OptScenario s = Base(1, 2);
  // Only the reducer's group fails here (what the optimizer keeps of a partly failed step);
  // by default the failure would abort the job and refuse bucket 0's gather as well.
  Options o = braid::testing::LocalOptions(2, absl::Seconds(20));
  o.abort_on_failure = false;
  auto backend = CreateBackend(o);
  ASSERT_TRUE(backend.ok());
  auto* local = static_cast<local::LocalBackend*>(backend->get());
  const auto after_one_step = ReferenceParams(s, 1), initial = ReferenceParams(s, 0);
  RunRanks(**backend, [&](Group& world) {
    auto red = world.Split(0, world.rank(), "red");  // the reducer's own group, to aim the fault
    ASSERT_TRUE(red.ok()) << red.status();
    auto st = BuildStack(**red, s);
    ASSERT_TRUE(st.ok()) << st.status();
    RankStack& k = **st;
    auto w = (*red)->Barrier();
    ASSERT_TRUE(w.ok());
    ASSERT_OK((*w)->Wait(absl::Seconds(20)));
    const uint64_t next = (*w)->info().seq + 1;  // bucket b's reduce-scatter is next + b
    if (world.rank() == 0) local->faults().FailRank(1, next + 1, "red", "simulated link loss");
    auto wb = world.Barrier();
    ASSERT_TRUE(wb.ok());
    ASSERT_OK((*wb)->Wait(absl::Seconds(20)));
    ASSERT_OK(k.opt->BeginBackward(SyncMode::kSync));
    for (int i = static_cast<int>(s.counts.size()) - 1; i >= 0; --i) {
      auto g = k.reducer->GradView(i);
      ASSERT_TRUE(g.ok());
      for (size_t j = 0; j < g->count; ++j)
        static_cast<float*>(g->data)[j] = Grad(world.rank(), 0, 0, i, j, s);
      ASSERT_OK(k.reducer->MarkReady(i));
    }
    EXPECT_FALSE(k.opt->FinishBackward().ok());
    ASSERT_OK(k.opt->WaitAllParams());
    ExpectError(k.opt->last_step().error, absl::StatusCode::kInternal,
                {"bucket 1", "simulated link loss", "dropped"});
    auto got = Params(k, s);
    ASSERT_TRUE(got.ok());
    const auto& plan = k.reducer->plan();
    for (size_t i = 0; i < s.counts.size(); ++i) {
      const bool stepped = plan.slot(static_cast<int>(i)).bucket == 0;
      EXPECT_EQ((*got)[i], stepped ? after_one_step[i] : initial[i]) << "parameter " << i;
    }
    EXPECT_EQ(k.opt->bucket_steps(0), 1);
    EXPECT_EQ(k.opt->bucket_steps(1), 0);
  });
}

// fully_sharded: steps write the shards and gather nothing; a gather
// after WaitShard gives the reference parameters; Load gathers nothing either.
TEST(ShardedOptimizer, NoGatherAfterStepLeavesGatheringToTheCaller) {
  for (int replicas : {1, 2}) {
    OptScenario s = Base(replicas, 2);
    s.opt.fully_sharded = true;
    s.schedule = {SyncMode::kNoSync, SyncMode::kSync};
    s.steps = 3;
    const std::string dir = ::testing::TempDir();
    RunRanks(replicas * 2, [&](Group& world) {
      auto st = BuildStack(world, s);
      ASSERT_TRUE(st.ok()) << st.status();
      sched::ParamGatherer& g = *(*st)->gatherer;
      auto gather_all = [&] {
        for (int b = 0; b < g.num_buckets(); ++b) {
          DeviceEvent ready;
          ASSERT_OK((*st)->opt->WaitShard(b, &ready));
          EXPECT_FALSE(ready);  // host: the step is done
          ASSERT_OK(g.Prefetch(b, ready));
          ASSERT_OK(g.WaitParams(b));
        }
      };
      for (int b = 0; b < g.num_buckets(); ++b)
        EXPECT_EQ(g.GatherWork(b), nullptr) << "bucket " << b;
      const std::string path = absl::StrCat(dir, "/nogather_rank", world.rank(), ".braid");
      for (int t = 0; t < s.steps; ++t) {
        std::vector<WorkPtr> before;
        for (int b = 0; b < g.num_buckets(); ++b) before.push_back(g.GatherWork(b));
        ASSERT_OK(RunSteps(**st, s, t, t + 1));
        for (int b = 0; b < g.num_buckets(); ++b) {
          EXPECT_EQ(g.GatherWork(b), before[b]) << "step " << t << " gathered bucket " << b;
        }
        gather_all();
        auto p = Params(**st, s);
        ASSERT_TRUE(p.ok()) << p.status();
        EXPECT_EQ(*p, ReferenceParams(s, t + 1)) << "rank " << world.rank() << " step " << t;
        if (t == 0) ASSERT_OK((*st)->opt->Save(path));
      }
      std::vector<WorkPtr> before;
      for (int b = 0; b < g.num_buckets(); ++b) before.push_back(g.GatherWork(b));
      ASSERT_OK((*st)->opt->Load(path));
      for (int b = 0; b < g.num_buckets(); ++b)
        EXPECT_EQ(g.GatherWork(b), before[b]) << "Load gathered " << b;
      gather_all();
      auto p = Params(**st, s);
      ASSERT_TRUE(p.ok());
      EXPECT_EQ(*p, ReferenceParams(s, 1));
    });
  }
}

TEST(ShardedOptimizer, ResumeFromCheckpointIsBitExact) {
  OptScenario s = Base(2, 2);
  s.dtype = DType::kBF16;
  s.steps = 4;
  const std::string dir = ::testing::TempDir();
  RunRanks(4, [&](Group& world) {
    const std::string path = absl::StrCat(dir, "/resume_rank", world.rank(), ".braid");
    std::vector<std::vector<uint8_t>> uninterrupted;
    {
      auto st = BuildStack(world, s);
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK(RunSteps(**st, s, 0, 2));
      ASSERT_OK((*st)->opt->Save(path));
      ASSERT_OK(RunSteps(**st, s, 2, 4));
      auto p = Params(**st, s);
      ASSERT_TRUE(p.ok());
      uninterrupted = *p;
    }
    auto st = BuildStack(world, s);  // fresh state: initial weights, zero moments
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK((*st)->opt->Load(path));
    ASSERT_OK((*st)->opt->WaitAllParams());
    ASSERT_OK(RunSteps(**st, s, 2, 4));
    auto resumed = Params(**st, s);
    ASSERT_TRUE(resumed.ok());
    EXPECT_EQ(*resumed, uninterrupted);
    EXPECT_EQ(*resumed, ReferenceParams(s, 4));
  });
}

TEST(ShardedOptimizerErrors, LoadRefusesOtherWorldsCorruptFilesAndKinds) {
  const std::string dir = ::testing::TempDir();
  const std::string path2 = absl::StrCat(dir, "/world2_rank0.braid");
  OptScenario s2 = Base(1, 2);
  s2.steps = 1;
  RunRanks(2, [&](Group& world) {
    auto st = BuildStack(world, s2);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK(RunSteps(**st, s2, 0, 1));
    ASSERT_OK((*st)->opt->Save(absl::StrCat(dir, "/world2_rank", world.rank(), ".braid")));
  });
  OptScenario s1 = Base(1, 1);
  RunRanks(1, [&](Group& world) {
    auto st = BuildStack(world, s1);
    ASSERT_TRUE(st.ok()) << st.status();
    const auto before = Params(**st, s1);
    ExpectError((*st)->opt->Load(path2), absl::StatusCode::kFailedPrecondition,
                {path2, "world size 2", "has 1"});
    ExpectError((*st)->opt->Load(dir + "/missing.braid"), absl::StatusCode::kNotFound,
                {"missing.braid"});
    // A file of the right world, then corrupted.
    const std::string good = dir + "/world1.braid";
    ASSERT_OK((*st)->opt->Save(good));
    {
      FILE* f = std::fopen(good.c_str(), "r+b");
      ASSERT_NE(f, nullptr);
      std::fseek(f, -40, SEEK_END);
      std::fputc(0x5a, f);
      std::fclose(f);
    }
    ExpectError((*st)->opt->Load(good), absl::StatusCode::kDataLoss, {good});
    EXPECT_EQ(Params(**st, s1).value(), before.value()) << "a failed Load changed parameters";
  });
  // An SGD optimizer refuses an AdamW file.
  OptScenario sgd = Base(1, 1);
  sgd.opt.kind = OptimizerKind::kSgd;
  RunRanks(1, [&](Group& world) {
    auto st = BuildStack(world, Base(1, 1));
    ASSERT_TRUE(st.ok());
    ASSERT_OK((*st)->opt->Save(dir + "/adamw1.braid"));
    auto sg = BuildStack(world, sgd);
    ASSERT_TRUE(sg.ok());
    ExpectError((*sg)->opt->Load(dir + "/adamw1.braid"), absl::StatusCode::kFailedPrecondition,
                {"adamw", "sgd"});
  });
}

TEST(ShardedOptimizerErrors, LoadRefusesFilesSavedAtDifferentStepsOnEveryRank) {
  const std::string dir = ::testing::TempDir();
  OptScenario s = Base(1, 2);
  RunRanks(2, [&](Group& world) {
    const std::string path = absl::StrCat(dir, "/mixed_rank", world.rank(), ".braid");
    auto st = BuildStack(world, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK(RunSteps(**st, s, 0, 1));
    if (world.rank() == 0) ASSERT_OK((*st)->opt->Save(path));
    ASSERT_OK(RunSteps(**st, s, 1, 2));
    if (world.rank() == 1) ASSERT_OK((*st)->opt->Save(path));
    const auto before = Params(**st, s).value();
    ExpectError((*st)->opt->Load(path), absl::StatusCode::kFailedPrecondition,
                {"different steps", "nothing was loaded"});
    EXPECT_EQ((*st)->opt->bucket_steps(0), 2);
    ASSERT_OK((*st)->opt->WaitAllParams());
    EXPECT_EQ(Params(**st, s).value(), before);
    // Inside a backward, state changes are refused at once.
    ASSERT_OK((*st)->opt->BeginBackward(SyncMode::kSync));
    ExpectError((*st)->opt->Save(path), absl::StatusCode::kFailedPrecondition, {"between steps"});
    ExpectError((*st)->opt->WaitParams(0), absl::StatusCode::kFailedPrecondition,
                {"during a synced backward"});
    for (int i = 0; i < static_cast<int>(s.counts.size()); ++i)
      ASSERT_OK((*st)->reducer->MarkReady(i));
    ASSERT_OK((*st)->opt->FinishBackward());
    ASSERT_OK((*st)->opt->WaitAllParams());
  });
}

TEST(ShardedOptimizerErrors, MisuseIsNamed) {
  RunRanks(2, [](Group& world) {
    OptScenario s = Base(1, 2);
    s.opt.overlap = false;
    auto st = BuildStack(world, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ShardedOptimizer& opt = *(*st)->opt;
    ExpectError(opt.Step(), absl::StatusCode::kFailedPrecondition, {"step()", "without gradients"});
    ExpectError(opt.FinishBackward(), absl::StatusCode::kFailedPrecondition,
                {"without begin_backward"});
    ExpectError(opt.WaitParams(99), absl::StatusCode::kOutOfRange, {"bucket 99"});
    ExpectError(opt.SetParam(1234, nullptr), absl::StatusCode::kNotFound, {"1234"});
    ExpectError(opt.SetParam(0, nullptr), absl::StatusCode::kInvalidArgument, {"'p0'", "null"});
    GroupHyper bad;
    bad.adamw.beta2 = 1.0;
    ExpectError(opt.SetHyper(1, bad), absl::StatusCode::kInvalidArgument, {"group 1", "beta2"});
    ExpectError(opt.SetHyper(7, GroupHyper{}), absl::StatusCode::kOutOfRange, {"group 7"});
    // A synced backward not stepped must not be mixed into the next one.
    ASSERT_OK(RunSteps(**st, s, 0, 1));
    ASSERT_OK(opt.BeginBackward(SyncMode::kSync));
    for (int i = 0; i < static_cast<int>(s.counts.size()); ++i)
      ASSERT_OK((*st)->reducer->MarkReady(i));
    ASSERT_OK(opt.FinishBackward());
    ExpectError(opt.BeginBackward(SyncMode::kSync), absl::StatusCode::kFailedPrecondition,
                {"not stepped"});
    ASSERT_OK(opt.Step());
    ExpectError(opt.Step(), absl::StatusCode::kFailedPrecondition, {"without gradients"});
    ASSERT_OK(opt.WaitAllParams());
  });
}

TEST(ShardedOptimizerErrors, CreateRejectsBadConfigurations) {
  RunRanks(2, [](Group& world) {
    sched::ReducerConfig rc;  // all-reduce mode
    std::vector<sched::ParamSpec> specs = {sched::ParamSpec{0, 10, DType::kF32, Device::Cpu(), "w"},
                                           sched::ParamSpec{1, 3, DType::kF32, Device::Cpu(), "b"}};
    auto ar = sched::GradientReducer::Create(specs, {&world, nullptr}, rc);
    ASSERT_TRUE(ar.ok());
    auto gg = world.Split(0, world.rank(), "gather");
    ASSERT_TRUE(gg.ok());
    rc.mode = sched::ReduceMode::kReduceScatter;
    auto rs = sched::GradientReducer::Create(specs, {&world, nullptr}, rc);
    ASSERT_TRUE(rs.ok());
    auto gatherer = sched::ParamGatherer::Create((*rs)->plan(), gg->get(), sched::GathererConfig{});
    ASSERT_TRUE(gatherer.ok()) << gatherer.status();
    ExpectError(ShardedOptimizer::Create(ar->get(), gatherer->get(), OptimizerConfig{}).status(),
                absl::StatusCode::kInvalidArgument, {"all-reduce mode"});
    ExpectError(ShardedOptimizer::Create(rs->get(), nullptr, OptimizerConfig{}).status(),
                absl::StatusCode::kInvalidArgument, {"gatherer"});
    OptimizerConfig unknown;
    unknown.group_of = {{42, 0}};
    ExpectError(ShardedOptimizer::Create(rs->get(), gatherer->get(), unknown).status(),
                absl::StatusCode::kNotFound, {"42"});
    OptimizerConfig bad_group;
    bad_group.group_of = {{1, 3}};
    ExpectError(ShardedOptimizer::Create(rs->get(), gatherer->get(), bad_group).status(),
                absl::StatusCode::kInvalidArgument, {"'b'", "group 3"});
    OptimizerConfig bad_lr;
    bad_lr.groups[0].adamw.lr = -1;
    ExpectError(ShardedOptimizer::Create(rs->get(), gatherer->get(), bad_lr).status(),
                absl::StatusCode::kInvalidArgument, {"group 0", "lr"});
  });
}

}  // namespace
}  // namespace braid::optim::testing
