// BucketTuner (scheduler/bucket_tuner.h): the autotuner's successive-halving policy, driven by
// simulated step times: it finds the fastest cap, keeps the default when nothing beats it by
// min_gain, goes back to the default when the confirmation trial is slower, discards the step
// that pays for each re-plan, and decides the same from the same times.
#include "scheduler/bucket_tuner.h"

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace braid::sched {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

struct TunerRun {
  std::vector<int> running;        // candidate index of every step
  std::vector<int> switches;       // steps after which a switch was decided
  int steps = 0;
};

// Drives `t` until done (at most 500 steps): each step runs on t.current() and takes
// time(candidate, step); the step right after a switch also pays `replan_s`.
TunerRun Drive(BucketTuner& t, const std::function<double(const TunerCandidate&, int)>& time,
          double replan_s = 0.5) {
  TunerRun r;
  bool switched = false;
  while (!t.done() && r.steps < 500) {
    r.running.push_back(t.current_index());
    const double s = time(t.current(), r.steps) + (switched ? replan_s : 0.0);
    TunerDecision d = t.Observe(s);
    switched = d.switch_to.has_value();
    if (switched) {
      EXPECT_EQ(*d.switch_to, t.current()) << "the decision names the candidate now current";
      r.switches.push_back(r.steps);
    }
    ++r.steps;
  }
  return r;
}

// Step time with a minimum at `best` bytes: 10 ms + 1 ms per factor of 2 away from it.
std::function<double(const TunerCandidate&, int)> Valley(size_t best) {
  return [best](const TunerCandidate& c, int) {
    return 0.010 + 0.001 * std::fabs(std::log2(static_cast<double>(c.bucket_cap) / best));
  };
}

TEST(BucketTuner, CandidatesAreTheDefaultThenScaledCaps) {
  BucketTuner t(TunerConfig{}, 16 * kMiB, kMiB);
  const auto& c = t.candidates();
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0], (TunerCandidate{16 * kMiB, kMiB}));
  EXPECT_EQ(c[1], (TunerCandidate{2 * kMiB, kMiB}));
  EXPECT_EQ(c[2], (TunerCandidate{4 * kMiB, kMiB}));
  EXPECT_EQ(c[3], (TunerCandidate{8 * kMiB, kMiB}));
  EXPECT_EQ(c[4], (TunerCandidate{32 * kMiB, kMiB}));
  // A tiny default: the first cap never exceeds the bucket cap; duplicates are dropped.
  BucketTuner tiny(TunerConfig{}, 2, 1);
  for (const TunerCandidate& x : tiny.candidates()) EXPECT_LE(x.first_cap, x.bucket_cap);
  EXPECT_EQ(tiny.candidates().size(), 3u);  // 2, 1 (0.125 .. 0.5 -> 1, once), 4
}

TEST(BucketTuner, FindsTheFastestCapAndConfirmsIt) {
  BucketTuner t(TunerConfig{}, 16 * kMiB, kMiB);
  TunerRun r = Drive(t, Valley(4 * kMiB));
  ASSERT_TRUE(t.done());
  EXPECT_EQ(t.current(), (TunerCandidate{4 * kMiB, kMiB}));
  // Round 0 tries every candidate once, in order; the table ends with the confirmation.
  ASSERT_GE(t.table().size(), 6u);
  for (int c = 0; c < 5; ++c) {
    EXPECT_EQ(t.table()[c].candidate, c);
    EXPECT_EQ(t.table()[c].round, 0);
    EXPECT_EQ(t.table()[c].samples, 3);
  }
  EXPECT_EQ(t.table().back().round, -1);
  EXPECT_EQ(t.table().back().candidate, 2);
  // The re-plan step is discarded: every recorded median is a clean 10-13 ms, not 0.5 s.
  for (const TunerTrial& tr : t.table()) EXPECT_LT(tr.median_s, 0.0135) << tr.candidate;
  EXPECT_LT(r.steps, 60);  // 2 warmup + 5 trials + 3 + 2 survivors' trials + confirmation
  EXPECT_NE(t.TableText().find("adopted: cap 4.00 MiB"), std::string::npos) << t.TableText();
  // Settled: no more switches.
  EXPECT_FALSE(t.Observe(1.0).switch_to.has_value());
  EXPECT_EQ(t.current(), (TunerCandidate{4 * kMiB, kMiB}));
}

TEST(BucketTuner, KeepsTheDefaultWhenNothingIsFasterByMinGain) {
  BucketTuner t(TunerConfig{}, 16 * kMiB, kMiB);
  // Candidate 4 (32 MiB) is 1% faster than the default: below min_gain (3%).
  Drive(t, [](const TunerCandidate& c, int) { return c.bucket_cap == 32 * kMiB ? 0.0099 : 0.010; });
  ASSERT_TRUE(t.done());
  EXPECT_EQ(t.current_index(), 0);
  EXPECT_NE(t.TableText().find("(the default)"), std::string::npos);
}

TEST(BucketTuner, GoesBackToTheDefaultWhenTheConfirmationIsSlower) {
  BucketTuner t(TunerConfig{}, 16 * kMiB, kMiB);
  // 2 MiB is fastest during the search; from step 40 on it is slower than the default.
  TunerRun r = Drive(t, [](const TunerCandidate& c, int step) {
    if (c.bucket_cap == 2 * kMiB) return step < 40 ? 0.008 : 0.012;
    return 0.010;
  });
  ASSERT_TRUE(t.done());
  EXPECT_EQ(t.current_index(), 0);
  EXPECT_EQ(t.table().back().round, -1);
  EXPECT_EQ(t.table().back().candidate, 1);
  EXPECT_GE(r.steps, 40);
}

TEST(BucketTuner, AFailedOrNonFiniteStepLosesItsTrial) {
  BucketTuner t(TunerConfig{}, 16 * kMiB, kMiB);
  Drive(t, [](const TunerCandidate& c, int) {
    if (c.bucket_cap == 2 * kMiB) return std::numeric_limits<double>::quiet_NaN();
    return c.bucket_cap == 8 * kMiB ? 0.005 : 0.010;
  });
  EXPECT_EQ(t.current(), (TunerCandidate{8 * kMiB, kMiB}));
}

TEST(BucketTuner, TheSameTimesGiveTheSameDecisions) {
  // Every rank feeds the agreed (max) times, so every rank's tuner switches at the same steps.
  BucketTuner a(TunerConfig{}, 16 * kMiB, kMiB), b(TunerConfig{}, 16 * kMiB, kMiB);
  TunerRun ra = Drive(a, Valley(32 * kMiB)), rb = Drive(b, Valley(32 * kMiB));
  EXPECT_EQ(ra.running, rb.running);
  EXPECT_EQ(ra.switches, rb.switches);
  EXPECT_EQ(a.current(), (TunerCandidate{32 * kMiB, kMiB}));
}

TEST(BucketTuner, WarmupAndTrialLengthsAreHonoured) {
  TunerConfig cfg;
  cfg.warmup_steps = 4;
  cfg.steps_per_trial = 2;
  cfg.cap_factors = {0.5};
  BucketTuner t(cfg, 16 * kMiB, kMiB);
  TunerRun r = Drive(t, Valley(8 * kMiB));
  // 4 warmup, default trial 2, switch: 1 discarded + 2, then confirmation on the winner
  // (already running: no switch, nothing discarded) 2.
  EXPECT_EQ(r.steps, 4 + 2 + 3 + 2);
  EXPECT_EQ(r.switches, std::vector<int>({5}));
  EXPECT_EQ(t.current(), (TunerCandidate{8 * kMiB, kMiB}));
}

}  // namespace
}  // namespace braid::sched
