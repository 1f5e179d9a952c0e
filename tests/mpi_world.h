// main() of a gtest binary run under mpirun on the `mpi` backend's world group.
//
//   Group* the_world = nullptr;  // what the tests use
//   int main(int argc, char** argv) {
//     return braid::testing::RunTestsOnMpiWorld(argc, argv, absl::Seconds(60), &the_world);
//   }
//
// Creates the backend and the world group, sets *world before InitGoogleTest (so
// parameterized suites may depend on the world size), runs every test with rank 0 alone
// reporting (tests/mpi_gtest.h), and destroys the backend before the group (the last group
// finalizes MPI).
#ifndef BRAID_TESTS_MPI_WORLD_H_
#define BRAID_TESTS_MPI_WORLD_H_

#include "absl/time/time.h"
#include "comm/group.h"

namespace braid::testing {

int RunTestsOnMpiWorld(int argc, char** argv, absl::Duration timeout, Group** world);

}  // namespace braid::testing

#endif  // BRAID_TESTS_MPI_WORLD_H_
