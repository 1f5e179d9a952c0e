// The main() of a gtest binary whose ranks form a `gloo` world, started as torchrun would
// (tests/gloo/run_ranks.sh): the backend from the environment, gtest set up per rank
// (tests/mpi_gtest.h), the world group handed to the tests, and a barrier at the end so every
// rank finishes before rank 0's store goes away with its backend.
//
//   int main(int argc, char** argv) {
//     return braid::testing::RunGlooTests(argc, argv, [](Group* world) { TheWorld() = world; });
//   }
//
// Returns RUN_ALL_TESTS()'s result, or 1 (with a message on stderr) when the backend or the
// world group cannot be created.
#ifndef BRAID_TESTS_GLOO_GLOO_GTEST_MAIN_H_
#define BRAID_TESTS_GLOO_GLOO_GTEST_MAIN_H_

#include <functional>

#include "comm/group.h"

namespace braid::testing {

int RunGlooTests(int argc, char** argv, const std::function<void(Group* world)>& set_world);

}  // namespace braid::testing

#endif  // BRAID_TESTS_GLOO_GLOO_GTEST_MAIN_H_
