#include "tests/gloo/gloo_gtest_main.h"

#include <cstdio>

#include "absl/time/time.h"
#include "comm/backend.h"
#include "comm/options.h"
#include "gtest/gtest.h"
#include "tests/mpi_gtest.h"

namespace braid::testing {

int RunGlooTests(int argc, char** argv, const std::function<void(Group* world)>& set_world) {
  auto options = Options::FromEnv();
  if (!options.ok()) {
    std::fprintf(stderr, "options: %s\n", options.status().ToString().c_str());
    return 1;
  }
  options->backend = "gloo";  // BRAID_TIMEOUT_MS from the launcher script (the BUILD's env)
  auto backend = CreateBackend(*options);
  if (!backend.ok()) {
    std::fprintf(stderr, "creating the gloo backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  const int rank = (*backend)->local_ranks().at(0);
  BeforeInitGoogleTest(rank);
  ::testing::InitGoogleTest(&argc, argv);
  auto world = (*backend)->WorldGroup(rank);
  if (!world.ok()) {
    std::fprintf(stderr, "creating the world group: %s\n", world.status().ToString().c_str());
    return 1;
  }
  set_world(world->get());
  AfterInitGoogleTest(rank);
  const int result = RUN_ALL_TESTS();
  // Everyone finishes before rank 0's store goes away with its backend.
  auto done = (*world)->Barrier();
  if (done.ok()) (void)(*done)->Wait(absl::Seconds(60));
  world->reset();
  backend->reset();
  return result;
}

}  // namespace braid::testing
