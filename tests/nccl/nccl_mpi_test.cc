// The nccl backend as a real multi-process job on CPU: one rank per process under mpirun (and
// across the hosts of the multi-host test bed, tests/hosts:nccl_2x2), each process with its
// own fake device (fake_cuda_api.h) and an NCCL whose data moves through MPI
// (mpi_fake_nccl_api.h). The world is bootstrapped as a framework would: rank 0's unique id
// broadcast over the `mpi` backend's world (NcclBackend::CreateWithBootstrap). Checked against
// the serial references, bit for bit (the fake computes NCCL's arithmetic in rank order):
//  - the bootstrap: one nccl world with the mpi world's ranks;
//  - the collective matrix (every op x f32/bf16/f16/i32 x in-place, sizes 0 .. 65549);
//  - the gradient reducer on device buffers (all-reduce, reduce-scatter, hybrid on the
//    replicas x shards mesh — shards inside a host, replicas across hosts on the 2x2 bed),
//    marks with readiness events from a compute stream (device_reducer_driver.h).
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/nccl/nccl_backend.h"
#include "comm/backend.h"
#include "gtest/gtest.h"
#include "tests/collective_check.h"
#include "tests/mpi_gtest.h"
#include "tests/nccl/device_reducer_driver.h"
#include "tests/nccl/fake_cuda_api.h"
#include "tests/nccl/fake_kernel_api.h"
#include "tests/nccl/mpi_fake_nccl_api.h"
#include "tests/reducer_reference.h"

namespace braid::nccl::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

struct Job {
  Group* mpi_world = nullptr;
  Group* world = nullptr;  // the nccl world
  std::shared_ptr<FakeCudaApi> cuda;
  std::shared_ptr<MpiFakeNcclApi> nccl;
};
Job* job = nullptr;  // set by main for the tests' duration

TEST(NcclAcrossProcesses, TheBootstrapMakesOneWorld) {
  EXPECT_EQ(job->world->size(), job->mpi_world->size());
  EXPECT_EQ(job->world->rank(), job->mpi_world->rank());
  EXPECT_EQ(job->world->backend_name(), "nccl");
  // Each rank's id, summed over the nccl world on the device: every process took part.
  braid::testing::CollectiveCase c;
  c.dtype = DType::kI32;
  c.count = 5;
  c.exact_data = true;
  EXPECT_TRUE(braid::testing::RunAndCheck(*job->world, c, kTimeout).ok());
}

TEST(NcclAcrossProcesses, CollectiveMatrixMatchesSerialReference) {
  Group& g = *job->world;
  const int before = job->nccl->executed_collectives();
  for (const auto& k : braid::testing::kCollectiveVariants) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
      for (bool in_place : {false, true}) {
        if (braid::testing::MatrixSkipReason(k, dtype, in_place) != nullptr) continue;
        const std::string name = braid::testing::MatrixCaseName(k, dtype, g.size(), in_place);
        if (braid::testing::RefusedUpFront(k, dtype)) {
          const absl::Status s = braid::testing::LaunchStatus(g, k.kind, dtype, k.op);
          EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name << ": " << s;
          continue;
        }
        uint64_t seed = 1;
        for (size_t count : braid::testing::kCheckSizes) {
          braid::testing::CollectiveCase c{k.kind,   k.op,  dtype,  count,
                                           in_place, false, seed++, g.size() - 1};
          c.nccl_arithmetic = true;
          const absl::Status s = braid::testing::RunAndCheck(g, c, kTimeout);
          EXPECT_TRUE(s.ok()) << braid::testing::CaseName(c) << ": " << s;
        }
      }
    }
  }
  // The data crossed processes through the MPI-backed NCCL (not a local shortcut).
  EXPECT_GT(job->nccl->executed_collectives(), before + 100);
}

std::vector<sched::reference::Scenario> Scenarios(int n) {
  using sched::ReduceMode;
  std::vector<sched::reference::Scenario> out = {
      {ReduceMode::kAllReduce, 1, n, 3, "NS"},
      {ReduceMode::kReduceScatter, 1, n, 1, "NS"},
  };
  if (n % 2 == 0 && n >= 4) {
    out.push_back({ReduceMode::kHybrid, 2, n / 2, 3, "NRS"});
    sched::reference::Scenario kept{ReduceMode::kHybrid, 2, n / 2, 0, "NS"};
    kept.values = kept.shard_gradients = true;
    out.push_back(kept);
  }
  return out;
}

TEST(NcclAcrossProcesses, DeviceReducerMatchesSerialReference) {
  for (const sched::reference::Scenario& sc : Scenarios(job->world->size())) {
    const absl::Status s = RunDeviceScenario(*job->world, job->cuda, sc, ExactGrad, kTimeout);
    EXPECT_TRUE(s.ok()) << sched::reference::ScenarioName(sc) << " on rank " << job->world->rank()
                        << ": " << s;
  }
}

int Main(int argc, char** argv) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "nccl_mpi_test: needs MPI_THREAD_MULTIPLE (got %d)\n", provided);
    MPI_Finalize();
    return 1;
  }
  int result = 1;
  {
    Options options;
    options.backend = "mpi";
    options.timeout = kTimeout;
    auto mpi = CreateBackend(options);
    if (!mpi.ok()) {
      std::fprintf(stderr, "mpi backend: %s\n", mpi.status().ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const int rank = (*mpi)->local_ranks().at(0);
    braid::testing::BeforeInitGoogleTest(rank);
    auto mpi_world = (*mpi)->WorldGroup(rank);
    Job j;
    j.cuda = std::make_shared<FakeCudaApi>();
    j.nccl = std::make_shared<MpiFakeNcclApi>(j.cuda);
    NcclApis apis{j.cuda, j.nccl, std::make_shared<FakeKernelApi>(j.cuda)};
    NcclBackendConfig config;
    config.timeout = kTimeout;
    config.device = 0;
    absl::StatusOr<std::unique_ptr<NcclBackend>> backend =
        mpi_world.ok() ? NcclBackend::CreateWithBootstrap(apis, **mpi_world, config)
                       : absl::StatusOr<std::unique_ptr<NcclBackend>>(mpi_world.status());
    absl::StatusOr<std::unique_ptr<Group>> world =
        backend.ok() ? (*backend)->WorldGroup(rank) : backend.status();
    if (!world.ok()) {
      std::fprintf(stderr, "rank %d: nccl world over the mpi bootstrap: %s\n", rank,
                   world.status().ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    j.mpi_world = mpi_world->get();
    j.world = world->get();
    job = &j;
    ::testing::InitGoogleTest(&argc, argv);
    braid::testing::AfterInitGoogleTest(rank);
    result = RUN_ALL_TESTS();
    job = nullptr;
    world->reset();
    backend->reset();
    mpi->reset();
    mpi_world->reset();
  }
  MPI_Finalize();
  return result;
}

}  // namespace
}  // namespace braid::nccl::testing

int main(int argc, char** argv) { return braid::nccl::testing::Main(argc, argv); }
