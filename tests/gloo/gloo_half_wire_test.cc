// The half-wire checks (tests/half_wire_cases.cc) on the `gloo` backend, ranks started as
// torchrun would (tests/gloo/run_ranks.sh).

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/gloo/gloo_gtest_main.h"
#include "tests/half_wire_cases.h"

int main(int argc, char** argv) {
  return braid::testing::RunGlooTests(
      argc, argv, [](braid::Group* world) { braid::testing::HalfWireWorld() = world; });
}
