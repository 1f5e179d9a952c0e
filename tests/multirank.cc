#include "tests/multirank.h"

#include <thread>
#include <vector>

namespace braid::testing {

Options LocalOptions(int n, absl::Duration timeout) {
  Options o;
  o.backend = "local";
  o.local_ranks = n;
  o.timeout = timeout;
  return o;
}

void ExpectError(const absl::Status& s, absl::StatusCode code,
                 std::initializer_list<absl::string_view> parts) {
  EXPECT_EQ(s.code(), code) << s;
  for (absl::string_view p : parts) {
    EXPECT_NE(s.message().find(p), absl::string_view::npos) << "'" << p << "' not in: " << s;
  }
}

void RunRanks(Backend& backend, const std::function<void(Group&)>& body) {
  std::vector<std::unique_ptr<Group>> groups;
  for (int r : backend.local_ranks()) {
    auto g = backend.WorldGroup(r);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    groups.push_back(std::move(*g));
  }
  std::vector<std::thread> threads;
  for (auto& g : groups) {
    threads.emplace_back([&body, group = g.get()] { body(*group); });
  }
  for (auto& t : threads) t.join();
}

void RunRanks(int n, const std::function<void(Group&)>& body) {
  auto backend = CreateBackend(LocalOptions(n));
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  RunRanks(**backend, body);
}

}  // namespace braid::testing
