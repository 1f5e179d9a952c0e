#include "tests/nccl/fake_gpu.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "backends/nccl/unique_id.h"
#include "gtest/gtest.h"

namespace braid::nccl::testing {

NcclBackendConfig FakeConfig(bool blocking, absl::Duration timeout) {
  NcclBackendConfig c;
  c.blocking = blocking;
  c.timeout = timeout;
  c.device = 0;
  return c;
}

void RunFakeRanks(FakeGpu& gpu, int n, const NcclBackendConfig& config,
                  const std::function<void(NcclGroup&)>& body) {
  absl::StatusOr<std::string> id = NewUniqueIdBytes(*gpu.nccl);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto backend = NcclBackend::CreateFromUniqueId(gpu.apis(), *id, n, r, config);
      ASSERT_TRUE(backend.ok()) << backend.status();
      auto world = (*backend)->WorldGroup(r);
      ASSERT_TRUE(world.ok()) << world.status();
      body(static_cast<NcclGroup&>(**world));
    });
  }
  for (auto& t : threads) t.join();
}

void ExpectClean(const FakeGpu& gpu) {
  EXPECT_EQ(gpu.cuda->live_streams(), 0);
  EXPECT_EQ(gpu.cuda->live_events(), 0);
  EXPECT_EQ(gpu.cuda->live_buffers(), 0);
  EXPECT_EQ(gpu.nccl->live_comms(), 0);
  EXPECT_EQ(gpu.nccl->live_premul_ops(), 0);
  EXPECT_TRUE(gpu.nccl->violations().empty()) << absl::StrJoin(gpu.nccl->violations(), "\n");
  EXPECT_TRUE(gpu.cuda->errors().empty()) << absl::StrJoin(gpu.cuda->errors(), "\n");
}

}  // namespace braid::nccl::testing
