// The half-wire checks (tests/half_wire_cases.cc) on the `mpi` backend under mpirun.
#include "absl/time/time.h"
#include "tests/half_wire_cases.h"
#include "tests/mpi_world.h"

int main(int argc, char** argv) {
  return braid::testing::RunTestsOnMpiWorld(argc, argv, absl::Seconds(60),
                                            &braid::testing::HalfWireWorld());
}
