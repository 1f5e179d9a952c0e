// gtest under mpirun: one console transcript and one XML report (rank 0's); every other rank
// prints only its failures, tagged with its rank.
//
//   int main(int argc, char** argv) {
//     ... create the mpi backend, learn `rank` ...
//     braid::testing::BeforeInitGoogleTest(rank);
//     ::testing::InitGoogleTest(&argc, argv);
//     braid::testing::AfterInitGoogleTest(rank);
//     return RUN_ALL_TESTS();
//   }
#ifndef BRAID_TESTS_MPI_GTEST_H_
#define BRAID_TESTS_MPI_GTEST_H_

namespace braid::testing {

// Bazel's premature-exit marker belongs to rank 0 alone: gtest creates it when the tests start
// and removes it when they end, and every rank would race on the one file.
void BeforeInitGoogleTest(int rank);
// Ranks other than 0: no XML output, and failures only (as "[rank N] FAILED ...").
void AfterInitGoogleTest(int rank);

}  // namespace braid::testing

#endif  // BRAID_TESTS_MPI_GTEST_H_
