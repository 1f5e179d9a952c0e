// Multi-rank test harness: one thread per rank over the `local` backend (as Gloo's
// base_test.h does), so N-rank behaviour runs inside one gtest process.
//
//   RunRanks(4, [](Group& world) {
//     EXPECT_OK(RunAndCheck(world, c));
//   });
//
// Body failures are ordinary gtest failures (EXPECT_* is thread-safe); every rank thread is
// joined before RunRanks returns.
#ifndef BRAID_TESTS_MULTIRANK_H_
#define BRAID_TESTS_MULTIRANK_H_

#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>

#include "absl/status/status.h"
#include "comm/backend.h"
#include "gtest/gtest.h"

namespace braid::testing {

// Options for a local world of `n` ranks with a test-sized deadline.
Options LocalOptions(int n, absl::Duration timeout = absl::Seconds(60));

// Expects `s` to have `code` and to mention every one of `parts` (errors must name what is
// wrong: the parameter, bucket, group, rank...).
void ExpectError(const absl::Status& s, absl::StatusCode code,
                 std::initializer_list<absl::string_view> parts);

// Creates the backend and runs body(world group of rank r) on one thread per local rank.
void RunRanks(Backend& backend, const std::function<void(Group&)>& body);
void RunRanks(int n, const std::function<void(Group&)>& body);

}  // namespace braid::testing

namespace absl {
// Lets gtest print statuses in failure messages.
inline void PrintTo(const Status& s, std::ostream* os) { *os << s.ToString(); }
}  // namespace absl

#define EXPECT_OK(expr)                                \
  do {                                                 \
    const ::absl::Status braid_s_ = (expr);            \
    EXPECT_TRUE(braid_s_.ok()) << braid_s_.ToString(); \
  } while (0)
#define ASSERT_OK(expr)                                \
  do {                                                 \
    const ::absl::Status braid_s_ = (expr);            \
    ASSERT_TRUE(braid_s_.ok()) << braid_s_.ToString(); \
  } while (0)

#endif  // BRAID_TESTS_MULTIRANK_H_
