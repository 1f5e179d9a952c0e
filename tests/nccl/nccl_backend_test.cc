// The nccl backend as a Backend: registration, options, worlds from unique-id bytes and from a
// CPU bootstrap group (the mpirun path, with the `local` backend standing in for MPI), and bad
// input at creation (each error naming the offending item).
#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/unique_id.h"
#include "backends/rendezvous/launcher_env.h"
#include "backends/rendezvous/socket.h"
#include "backends/rendezvous/store_client.h"
#include "backends/rendezvous/store_server.h"
#include "comm/backend.h"
#include "comm/options.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl::testing {
namespace {

using braid::testing::ExpectError;

TEST(NcclBackend, RegisteredAsNccl) {
  const std::vector<std::string> names = BackendRegistry::Global().Names();
  EXPECT_NE(std::find(names.begin(), names.end(), "nccl"), names.end())
      << absl::StrJoin(names, ", ");
}

TEST(NcclBackend, OptionsSelectModeAndDevice) {
  auto o = Options::FromMap(
      {{"BRAID_BACKEND", "nccl"}, {"BRAID_NCCL_BLOCKING", "0"}, {"BRAID_CUDA_DEVICE", "3"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->backend, "nccl");
  EXPECT_FALSE(o->nccl_blocking);
  EXPECT_EQ(o->cuda_device, 3);
  EXPECT_TRUE(o->unknown.empty());
  auto d = Options::FromMap({});
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->nccl_blocking);
  EXPECT_EQ(d->cuda_device, -1);
  ExpectError(Options::FromMap({{"BRAID_NCCL_BLOCKING", "yes"}}).status(),
              absl::StatusCode::kInvalidArgument, {"BRAID_NCCL_BLOCKING", "yes"});
  ExpectError(Options::FromMap({{"BRAID_CUDA_DEVICE", "-2"}}).status(),
              absl::StatusCode::kInvalidArgument, {"BRAID_CUDA_DEVICE", "-2"});
}

// On a machine without a GPU, CreateBackend("nccl") fails before touching MPI, naming CUDA's
// error. (With a GPU this would initialize MPI; that path runs under mpirun only.)
TEST(NcclBackend, CreateWithoutGpuFailsNamingCudaError) {
  int n = 0;
  const cudaError_t rc = RealCudaApi()->GetDeviceCount(&n);
  if (rc == cudaSuccess && n > 0) GTEST_SKIP() << "a GPU is present: the no-GPU path is moot";
  Options o;
  o.backend = "nccl";
  ExpectError(CreateBackend(o).status(), absl::StatusCode::kFailedPrecondition,
              {"nccl backend", "no usable CUDA device", "cudaGetDeviceCount"});
}

TEST(NcclBackend, BadInputAtCreationNamesTheItem) {
  FakeGpu gpu;
  auto id = NewUniqueIdBytes(*gpu.nccl);
  ASSERT_TRUE(id.ok());
  ExpectError(NcclBackend::CreateFromUniqueId(gpu.apis(), "abc", 2, 0, FakeConfig()).status(),
              absl::StatusCode::kInvalidArgument, {"unique id", "128", "got 3"});
  ExpectError(NcclBackend::CreateFromUniqueId(gpu.apis(), *id, 2, 2, FakeConfig()).status(),
              absl::StatusCode::kInvalidArgument, {"rank 2", "size 2"});
  NcclBackendConfig bad_device = FakeConfig();
  bad_device.device = 3;
  ExpectError(NcclBackend::CreateFromUniqueId(gpu.apis(), *id, 2, 0, bad_device).status(),
              absl::StatusCode::kInvalidArgument, {"CUDA device 3", "1 visible"});
  NcclBackendConfig no_timeout = FakeConfig();
  no_timeout.timeout = absl::ZeroDuration();
  ExpectError(NcclBackend::CreateFromUniqueId(gpu.apis(), *id, 2, 0, no_timeout).status(),
              absl::StatusCode::kInvalidArgument, {"timeout"});
  gpu.cuda->SetDeviceCountResult(cudaErrorInsufficientDriver, 0);
  ExpectError(NcclBackend::CreateFromUniqueId(gpu.apis(), *id, 2, 0, FakeConfig()).status(),
              absl::StatusCode::kFailedPrecondition, {"no usable CUDA device", "CUDA error 35"});
  gpu.cuda->SetDeviceCountResult(cudaSuccess, 1);
  auto b = NcclBackend::CreateFromUniqueId(gpu.apis(), *id, 1, 0, FakeConfig());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "nccl");
  EXPECT_EQ((*b)->local_ranks(), std::vector<int>{0});
  ExpectError((*b)->WorldGroup(1).status(), absl::StatusCode::kInvalidArgument,
              {"world rank 0", "rank 1"});
  auto world = (*b)->WorldGroup(0);
  ASSERT_TRUE(world.ok()) << world.status();
  ExpectError((*b)->WorldGroup(0).status(), absl::StatusCode::kFailedPrecondition,
              {"already created"});
  b->reset();  // the group outlives its backend
  std::vector<float> x(3, 2.0f);
  auto w = (*world)->AllReduce(x.data(), x.data(), 3, DType::kF32, ReduceOp::Sum());
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_OK((*w)->Wait(absl::Seconds(30)));
  EXPECT_EQ(x[0], 2.0f);
  world->reset();
  ExpectClean(gpu);
}

// Outside a launcher: a world of one rank on the configured device (0 by default), from an id
// the backend made itself, in the options' mode; the device option is checked against the
// visible devices.
TEST(NcclBackend, SingleRankWithoutLauncher) {
  FakeGpu gpu;
  gpu.cuda->SetDeviceCountResult(cudaSuccess, 2);
  Options o;
  o.cuda_device = 1;
  o.nccl_blocking = false;
  auto b = NcclBackend::CreateSingleRank(gpu.apis(), o);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->world_size(), 1);
  EXPECT_EQ((*b)->local_ranks(), std::vector<int>{0});
  auto world = (*b)->WorldGroup(0);
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ((*world)->size(), 1);
  std::vector<float> x = {1.5f, -2.0f};
  auto w = (*world)->AllReduce(x.data(), x.data(), 2, DType::kF32, ReduceOp::Sum());
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_OK((*w)->Wait(absl::Seconds(30)));
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f}));
  world->reset();
  b->reset();
  o.cuda_device = 2;  // only devices 0 and 1 exist
  ExpectError(NcclBackend::CreateSingleRank(gpu.apis(), o).status(),
              absl::StatusCode::kInvalidArgument, {"CUDA device 2", "2 visible"});
  ExpectClean(gpu);
}

// The mpirun path's logic with the `local` backend as the CPU bootstrap: rank 0 of the CPU
// group makes the id, broadcasts it, and every rank builds its NCCL world from it.
TEST(NcclBackend, BootstrapOverACpuGroup) {
  FakeGpu gpu;
  braid::testing::RunRanks(4, [&](Group& cpu) {
    auto b = NcclBackend::CreateWithBootstrap(gpu.apis(), cpu, FakeConfig());
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->world_size(), 4);
    auto world = (*b)->WorldGroup(cpu.rank());
    ASSERT_TRUE(world.ok()) << world.status();
    std::vector<int64_t> x(5, cpu.rank());
    auto w = (*world)->AllReduce(x.data(), x.data(), 5, DType::kI64, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(absl::Seconds(30)));
    EXPECT_EQ(x, std::vector<int64_t>(5, 6));
  });
  ExpectClean(gpu);
}

// Rank 0 cannot make an id: every rank fails instead of waiting for it.
TEST(NcclBackend, BootstrapFailureReachesEveryRank) {
  FakeGpu gpu;
  gpu.nccl->FailNextCall("GetUniqueId", ncclSystemError);
  braid::testing::RunRanks(3, [&](Group& cpu) {
    auto b = NcclBackend::CreateWithBootstrap(gpu.apis(), cpu, FakeConfig());
    if (cpu.rank() == 0) {
      ExpectError(b.status(), absl::StatusCode::kInternal, {"ncclGetUniqueId"});
    } else {
      ExpectError(b.status(), absl::StatusCode::kUnavailable,
                  {"rank 0", "could not create the NCCL unique id"});
    }
  });
  ExpectClean(gpu);
}

// A free loopback port for a launcher world's MASTER_PORT.
int FreePort() {
  auto s = rendezvous::Socket::Listen("127.0.0.1", 0);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s->LocalPort();
}

rendezvous::LauncherEnv TorchrunEnv(int port, int rank, int world) {
  rendezvous::LauncherEnv e;
  e.launcher = "torchrun";
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  return e;
}

// Runs `ranks` (of a torchrun world of `world`) as threads through CreateFromLauncher on the
// shared fake device; body(rank, backend or error) on each.
void RunLauncherRanks(
    FakeGpu& gpu, int world, const std::vector<int>& ranks, const NcclBackendConfig& config,
    const std::function<void(int, absl::StatusOr<std::unique_ptr<NcclBackend>>)>& body) {
  const int port = FreePort();
  std::vector<std::thread> threads;
  for (int r : ranks) {
    threads.emplace_back([&, r] {
      body(r, NcclBackend::CreateFromLauncher(gpu.apis(), TorchrunEnv(port, r, world), config));
    });
  }
  for (auto& t : threads) t.join();
}

// The id itself, through the store: every rank gets rank 0's bytes.
TEST(NcclLauncher, ExchangeUniqueIdGivesEveryRankRankZerosId) {
  FakeGpu gpu;
  auto server = rendezvous::StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kRanks = 4;
  std::vector<std::string> ids(kRanks);
  std::vector<std::thread> threads;
  for (int r = kRanks - 1; r >= 0; --r) {  // rank 0 starts last: the others wait for it
    threads.emplace_back([&, r] {
      if (r == 0) absl::SleepFor(absl::Milliseconds(200));
      auto store = rendezvous::TcpStore::Connect("127.0.0.1", (*server)->port(), absl::Seconds(30));
      ASSERT_TRUE(store.ok()) << store.status();
      auto id = ExchangeUniqueId(**store, "t", r, kRanks, *gpu.nccl);
      ASSERT_TRUE(id.ok()) << id.status();
      ids[r] = std::string(id->internal, kUniqueIdBytes);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(ids[r], ids[0]) << "rank " << r;
  EXPECT_EQ(ids[0].size(), kUniqueIdBytes);
  // A second exchange under another prefix makes a different id (the fake's ids are distinct).
  auto store = rendezvous::TcpStore::Connect("127.0.0.1", (*server)->port(), absl::Seconds(30));
  auto other = ExchangeUniqueId(**store, "u", 0, 1, *gpu.nccl);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(std::string(other->internal, kUniqueIdBytes), ids[0]);
  // A rank other than 0 with nobody publishing: the deadline names the key.
  auto short_store =
      rendezvous::TcpStore::Connect("127.0.0.1", (*server)->port(), absl::Milliseconds(200));
  ExpectError(ExchangeUniqueId(**short_store, "nobody", 1, 2, *gpu.nccl).status(),
              absl::StatusCode::kDeadlineExceeded, {"'nobody/unique_id'"});
  // Rank 0 whose peer never reads the id: the deadline names the peer's key.
  ExpectError(ExchangeUniqueId(**short_store, "unread", 0, 2, *gpu.nccl).status(),
              absl::StatusCode::kDeadlineExceeded, {"'unread/unique_id_read/1'"});
}

// torchrun without MPI: a world of 4 from the launcher's environment, rank 0's store carrying
// the id; collectives then run on it (the fake executes them only when every rank's
// communicator shares the one id).
TEST(NcclLauncher, TorchrunWorldWithoutMpi) {
  FakeGpu gpu;
  gpu.cuda->SetDeviceCountResult(cudaSuccess, 2);  // LOCAL_RANK 0..3 -> devices 0,1,0,1
  NcclBackendConfig config = FakeConfig();
  config.device = -1;
  std::vector<int64_t> results(4, -1);
  RunLauncherRanks(gpu, 4, {0, 1, 2, 3}, config, [&](int r, auto b) {
    ASSERT_TRUE(b.ok()) << "rank " << r << ": " << b.status();
    EXPECT_EQ((*b)->world_size(), 4);
    EXPECT_EQ((*b)->local_ranks(), std::vector<int>{r});
    auto world = (*b)->WorldGroup(r);
    ASSERT_TRUE(world.ok()) << world.status();
    std::vector<int64_t> x(5, r + 1);
    auto w = (*world)->AllReduce(x.data(), x.data(), 5, DType::kI64, ReduceOp::Sum());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(absl::Seconds(30)));
    EXPECT_EQ(x, std::vector<int64_t>(5, 10));
    results[r] = x[0];
  });
  EXPECT_EQ(results, std::vector<int64_t>(4, 10));
  ExpectClean(gpu);
}

// Rank 0 cannot make an id: it publishes the failure, the others fail with it at once.
TEST(NcclLauncher, IdFailureOnRankZeroReachesEveryRankBeforeTheDeadline) {
  FakeGpu gpu;
  gpu.nccl->FailNextCall("GetUniqueId", ncclSystemError);
  const absl::Time start = absl::Now();
  RunLauncherRanks(gpu, 3, {0, 1, 2}, FakeConfig(), [&](int r, auto b) {
    if (r == 0) {
      ExpectError(b.status(), absl::StatusCode::kInternal, {"ncclGetUniqueId", "torchrun rank 0"});
    } else {
      ExpectError(b.status(), absl::StatusCode::kUnavailable,
                  {"rank 0 could not create the NCCL unique id", "ncclGetUniqueId",
                   "braid/nccl/unique_id"});
    }
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // not the 60 s deadline
  ExpectClean(gpu);
}

// A rank that never starts: the others fail at the deadline, naming it.
TEST(NcclLauncher, AMissingRankFailsEveryoneNamingIt) {
  FakeGpu gpu;
  RunLauncherRanks(gpu, 4, {0, 1, 3}, FakeConfig(true, absl::Milliseconds(600)), [&](int, auto b) {
    ExpectError(b.status(), absl::StatusCode::kDeadlineExceeded,
                {"rank 2 of a world of 4 did not arrive", "braid/nccl"});
  });
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
