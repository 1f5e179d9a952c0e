// Destroying a ShardedOptimizer while its stepper waits for a reduction that will never come
// (a synced backward was begun, nothing was marked): the destructor cancels the step and
// returns. Before the fix the stepper called Cancel() with mu_ still held and deadlocked on
// it, so the destructor's join never returned (found by tests/fuzz/capi under libFuzzer).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/optim/optimizer_harness.h"

namespace braid::optim::testing {
namespace {

using braid::testing::RunRanks;

TEST(ShardedOptimizerLifetime, DestroyWhileAStepWaitsForItsReductionReturns) {
  OptScenario s = TwoGroupScenario(1, 1);
  RunRanks(1, [&](Group& world) {
    auto st = BuildStack(world, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK((*st)->opt->BeginBackward(SyncMode::kSync));
    // Let the stepper reach its wait for bucket 0's reduction.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::unique_ptr<ShardedOptimizer> opt = std::move((*st)->opt);
    std::promise<void> done;
    std::thread destroyer([&] {
      opt.reset();
      done.set_value();
    });
    if (done.get_future().wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      std::fprintf(stderr, "~ShardedOptimizer did not return within 20 s (deadlock)\n");
      std::_Exit(1);
    }
    destroyer.join();
  });
}

}  // namespace
}  // namespace braid::optim::testing
