// The half-wire checks (tests/half_wire_cases.cc) as a gtest suite linked into a backend's test
// binary, whose main() sets the world before RUN_ALL_TESTS:
//
//   braid::testing::HalfWireWorld() = world.get();   // mpi or gloo, 2..4 ranks
//   return RUN_ALL_TESTS();
#ifndef BRAID_TESTS_HALF_WIRE_CASES_H_
#define BRAID_TESTS_HALF_WIRE_CASES_H_

#include "comm/group.h"

namespace braid::testing {

Group*& HalfWireWorld();

}  // namespace braid::testing

#endif  // BRAID_TESTS_HALF_WIRE_CASES_H_
