#include "tests/mpi_gtest.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace braid::testing {
namespace {

// It must not ask gtest for the current test inside OnTestPartResult: gtest holds its lock
// there, so the test's name is remembered at OnTestStart.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestStart(const ::testing::TestInfo& t) override {
    test_ = absl::StrCat(t.test_suite_name(), ".", t.name());
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  const int rank_;
  std::string test_;
};

}  // namespace

void BeforeInitGoogleTest(int rank) {
  if (rank != 0) unsetenv("TEST_PREMATURE_EXIT_FILE");
}

void AfterInitGoogleTest(int rank) {
  if (rank == 0) return;
  GTEST_FLAG_SET(output, "");
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace braid::testing
