// A failure reaches every rank promptly on the nccl backend (fake device): the ranks are threads
// whose nccl worlds are bootstrapped over a `local` world (CreateWithBootstrap), so they share
// its abort domain, as processes under mpirun share the mpi backend's. With the default 60 s
// deadline, ranks waiting in an nccl all-reduce stop within 2 s of a failure on another rank,
// naming it, and every rank's communicators are aborted (ncclCommAbort: no kernel left waiting).
#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "backends/local/local_backend.h"
#include "backends/nccl/nccl_backend.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl::testing {
namespace {

using braid::testing::ExpectError;
using braid::testing::LocalOptions;

constexpr absl::Duration kPrompt = absl::Seconds(2);

// Runs body(local world, nccl world) on n threads; the nccl worlds share the local world's
// abort domain.
void RunBootstrapped(FakeGpu& gpu, int n,
                     const std::function<void(Group& cpu, NcclGroup& gpu_world)>& body) {
  auto cpu = CreateBackend(LocalOptions(n));  // 60 s deadline
  ASSERT_TRUE(cpu.ok());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto world = (*cpu)->WorldGroup(r);
      ASSERT_TRUE(world.ok()) << world.status();
      auto backend = NcclBackend::CreateWithBootstrap(gpu.apis(), **world,
                                                      FakeConfig(true, absl::Seconds(60)));
      ASSERT_TRUE(backend.ok()) << backend.status();
      auto g = (*backend)->WorldGroup(r);
      ASSERT_TRUE(g.ok()) << g.status();
      body(**world, static_cast<NcclGroup&>(**g));
    });
  }
  for (auto& t : threads) t.join();
}

// The job's abort reaches this rank's communicator (the domain's listeners may still be running
// on another thread when this rank's wait returns): true once it is aborted, within 2 s.
bool CommAborted(NcclGroup& g) {
  const absl::Time end = absl::Now() + kPrompt;
  while (!g.comm().failed() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(1));
  return g.comm().failed();
}

absl::Status Outcome(absl::StatusOr<WorkPtr> w) {
  return w.ok() ? (*w)->Wait(absl::Seconds(90)) : w.status();
}

// Rank 2's framework step fails: ranks 0 and 1, inside an nccl all-reduce rank 2 never joins,
// stop within 2 s (not at 60 s) naming rank 2 and the cause.
TEST(NcclAbort, AbortJobReleasesRanksInsideAnNcclCollective) {
  FakeGpu gpu;
  RunBootstrapped(gpu, 3, [&](Group& cpu, NcclGroup& g) {
    std::vector<float> x(16, 1.0f);
    if (g.rank() == 2) {
      absl::SleepFor(absl::Milliseconds(100));
      ASSERT_TRUE(g.AbortJob(absl::InternalError("step 4: CUDA out of memory")).ok());
      ExpectError(cpu.Barrier().status(), absl::StatusCode::kAborted,
                  {"refuses new calls", "rank 2 reported"});
      return;
    }
    const absl::Time start = absl::Now();
    const absl::Status s =
        Outcome(g.AllReduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::Sum()));
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(100) + kPrompt);
    ExpectError(s, absl::StatusCode::kAborted,
                {"allreduce #0 on group 'world'", "job aborted: rank 2 reported",
                 "step 4: CUDA out of memory"});
    EXPECT_TRUE(g.comm().failed());
  });
  EXPECT_EQ(gpu.nccl->comms_aborted(), 3);  // every rank's world communicator
  ExpectClean(gpu);
}

// An nccl deadline on rank 0 (its peers never call) aborts the job: ranks 1 and 2, waiting in a
// CPU barrier with the 60 s default, stop right after it, naming rank 0 and the nccl op.
TEST(NcclAbort, AnNcclDeadlineStopsRanksWaitingOnTheCpuGroup) {
  FakeGpu gpu;
  RunBootstrapped(gpu, 3, [&](Group& cpu, NcclGroup& g) {
    std::vector<float> x(16, 1.0f);
    const absl::Time start = absl::Now();
    if (g.rank() == 0) {
      CollectiveOptions o;
      o.timeout = absl::Milliseconds(300);
      o.label = "bucket 3";
      const absl::Status s =
          Outcome(g.AllReduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::Sum(), o));
      ExpectError(s, absl::StatusCode::kDeadlineExceeded, {"bucket 3", "deadline"});
      EXPECT_TRUE(g.comm().failed());
      return;
    }
    const absl::Status s = Outcome(cpu.Barrier());
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(300) + kPrompt);
    ExpectError(s, absl::StatusCode::kAborted,
                {"job aborted: rank 0 reported", "allreduce #0 on group 'world' (bucket 3)"});
    EXPECT_TRUE(CommAborted(g)) << "rank " << g.rank();
  });
  EXPECT_EQ(gpu.nccl->comms_aborted(), 3);
  ExpectClean(gpu);
}

// A failed CPU collective (rank 1 stalls past rank 0's 300 ms barrier deadline) aborts the job:
// rank 2, inside an nccl all-reduce, stops at once and its communicator is aborted.
TEST(NcclAbort, ACpuGroupFailureAbortsTheNcclCommunicators) {
  FakeGpu gpu;
  std::atomic<bool> done{false};
  RunBootstrapped(gpu, 3, [&](Group& cpu, NcclGroup& g) {
    std::vector<float> x(16, 1.0f);
    const absl::Time start = absl::Now();
    if (g.rank() == 0) {
      CollectiveOptions o;
      o.timeout = absl::Milliseconds(300);
      ExpectError(Outcome(cpu.Barrier(o)), absl::StatusCode::kDeadlineExceeded, {"barrier"});
    } else if (g.rank() == 1) {
      while (!cpu.abort_domain()->aborted() && absl::Now() - start < absl::Seconds(30)) {
        absl::SleepFor(absl::Milliseconds(1));
      }
    } else {
      const absl::Status s =
          Outcome(g.AllReduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::Sum()));
      EXPECT_LT(absl::Now() - start, absl::Milliseconds(300) + kPrompt);
      // Barrier #0 of the CPU world carried the NCCL unique id.
      ExpectError(
          s, absl::StatusCode::kAborted,
          {"job aborted: rank 0 reported", "barrier #1 on group 'world'", "did not arrive"});
    }
    EXPECT_TRUE(CommAborted(g)) << "rank " << g.rank();
  });
  EXPECT_EQ(gpu.nccl->comms_aborted(), 3);
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
