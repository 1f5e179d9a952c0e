#include "tests/mpi_world.h"

#include <cstdio>

#include "comm/backend.h"
#include "gtest/gtest.h"
#include "tests/mpi_gtest.h"

namespace braid::testing {

int RunTestsOnMpiWorld(int argc, char** argv, absl::Duration timeout, Group** world_out) {
  Options options;
  options.backend = "mpi";
  options.timeout = timeout;
  auto backend = CreateBackend(options);
  if (!backend.ok()) {
    std::fprintf(stderr, "creating the mpi backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  const int rank = (*backend)->local_ranks().at(0);
  BeforeInitGoogleTest(rank);
  auto world = (*backend)->WorldGroup(rank);
  if (!world.ok()) {
    std::fprintf(stderr, "creating the world group: %s\n", world.status().ToString().c_str());
    return 1;
  }
  *world_out = world->get();
  ::testing::InitGoogleTest(&argc, argv);
  AfterInitGoogleTest(rank);
  const int result = RUN_ALL_TESTS();
  *world_out = nullptr;
  backend->reset();
  world->reset();
  return result;
}

}  // namespace braid::testing
