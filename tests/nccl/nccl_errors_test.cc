// Failure paths of the nccl backend on fakes: deadlines (a peer that never calls, a kernel that
// never finishes), NCCL asynchronous errors, CUDA errors from the completion event, NCCL calls
// that fail at launch, failed finalize, init that never leaves ncclInProgress. Every error must
// name group, op, sequence number (and label), abort the communicator, fail later calls fast,
// and leave nothing leaked and no NCCL rule broken.
#include <atomic>
#include <string>
#include <vector>

#include "backends/nccl/unique_id.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl::testing {
namespace {

using braid::testing::ExpectError;

constexpr absl::Duration kWait = absl::Seconds(30);

void WaitFor(const std::atomic<bool>& flag) {
  const absl::Time deadline = absl::Now() + kWait;
  while (!flag.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
}

// Rank 1 never issues the all-reduce: rank 0's Work fails at its deadline, the communicator
// is aborted, and the group refuses later calls at once.
TEST(NcclErrors, MissingPeerHitsDeadlineAndAborts) {
  FakeGpu gpu;
  std::atomic<bool> rank0_done{false};
  RunFakeRanks(gpu, 2, FakeConfig(true, absl::Milliseconds(300)), [&](NcclGroup& g) {
    if (g.rank() == 1) {
      WaitFor(rank0_done);
      return;
    }
    std::vector<float> x(8, 1.0f);
    CollectiveOptions o;
    o.label = "bucket 7";
    auto w = g.AllReduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::Sum(), o);
    ASSERT_TRUE(w.ok()) << w.status();
    const absl::Time start = absl::Now();
    const absl::Status s = (*w)->Wait(kWait);
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    ExpectError(
        s, absl::StatusCode::kDeadlineExceeded,
        {"allreduce #0 on group 'world' (bucket 7)", "deadline", "timeout 300ms", "aborted"});
    EXPECT_TRUE(g.comm().failed());
    // The failure aborted this rank's job (its own abort domain here: the ranks' worlds were
    // made from a unique id, with no shared domain): later calls are refused with the cause.
    ExpectError(g.AllReduce(x.data(), x.data(), 1, DType::kF32, ReduceOp::Sum()).status(),
                absl::StatusCode::kAborted,
                {"group 'world' refuses new calls", "job aborted: rank 0", "bucket 7"});
    ExpectError(g.Split(0, 0).status(), absl::StatusCode::kAborted, {"world", "refuses new calls"});
    rank0_done = true;
  });
  EXPECT_EQ(gpu.nccl->comms_aborted(), 1);
  EXPECT_EQ(gpu.nccl->comms_finalized(), 1);
  ExpectClean(gpu);
}

// A kernel that never finishes (the event never completes): the per-call timeout applies.
TEST(NcclErrors, StalledEventHitsPerCallDeadline) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 1, FakeConfig(), [&](NcclGroup& g) {
    gpu.cuda->StallEvents(true);
    std::vector<float> x(8, 1.0f);
    CollectiveOptions o;
    o.timeout = absl::Milliseconds(100);
    auto w = g.ReduceScatter(x.data(), x.data(), 8, DType::kF32, ReduceOp::Avg(), o);
    ASSERT_TRUE(w.ok()) << w.status();
    ExpectError((*w)->Wait(kWait), absl::StatusCode::kDeadlineExceeded,
                {"reduce_scatter #0 on group 'world'", "timeout 100ms", "aborted"});
    gpu.cuda->StallEvents(false);
  });
  EXPECT_EQ(gpu.nccl->comms_aborted(), 1);
  ExpectClean(gpu);
}

// NCCL reports an asynchronous error while a collective is in flight: the Work fails with
// NCCL's text and the communicator's last error, naming the call.
TEST(NcclErrors, AsyncErrorFailsWorkAndGroup) {
  FakeGpu gpu;
  std::atomic<bool> rank0_done{false};
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& g) {
    if (g.rank() == 1) {
      WaitFor(rank0_done);
      return;
    }
    std::vector<int32_t> x(4, 1);
    CollectiveOptions o;
    o.label = "bucket 1";
    auto w = g.AllGather(x.data(), x.data(), 2, DType::kI32, o);
    ASSERT_TRUE(w.ok()) << w.status();
    gpu.nccl->InjectAsyncError(g.comm().handle(), ncclRemoteError, "peer 3 went away");
    ExpectError((*w)->Wait(kWait), absl::StatusCode::kUnavailable,
                {"allgather #0 on group 'world' (bucket 1)", "remote process exited",
                 "peer 3 went away", "aborted"});
    rank0_done = true;
  });
  EXPECT_EQ(gpu.nccl->comms_aborted(), 1);
  ExpectClean(gpu);
}

TEST(NcclErrors, EventQueryErrorFailsWork) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 1, FakeConfig(), [&](NcclGroup& g) {
    gpu.cuda->FailEventQueries(cudaErrorLaunchFailure);
    std::vector<float> x(2, 1.0f);
    auto w = g.Broadcast(x.data(), 2, DType::kF32, 0);
    ASSERT_TRUE(w.ok()) << w.status();
    ExpectError((*w)->Wait(kWait), absl::StatusCode::kInternal,
                {"broadcast #0 on group 'world'", "cudaEventQuery", "unspecified launch failure"});
    gpu.cuda->FailEventQueries(cudaSuccess);
  });
  EXPECT_EQ(gpu.nccl->comms_aborted(), 1);
  ExpectClean(gpu);
}

// An NCCL call that fails inside the group bracket: the bracket is still closed (the fake
// flags an unbalanced one), the error names the NCCL call and the Braid call, and the group
// fails.
TEST(NcclErrors, LaunchFailureClosesBracketAndAborts) {
  for (const char* call : {"AllReduce", "GroupEnd", "RedOpCreatePreMulSum"}) {
    SCOPED_TRACE(call);
    FakeGpu gpu;
    RunFakeRanks(gpu, 1, FakeConfig(), [&](NcclGroup& g) {
      std::vector<float> x(2, 1.0f);
      gpu.nccl->FailNextCall(
          call, std::string(call) == "GroupEnd" ? ncclInternalError : ncclInvalidArgument);
      auto w = g.AllReduce(x.data(), x.data(), 2, DType::kF32, ReduceOp::PreMulSum(0.5));
      ExpectError(w.status(),
                  std::string(call) == "GroupEnd" ? absl::StatusCode::kInternal
                                                  : absl::StatusCode::kInvalidArgument,
                  {"allreduce #0 on group 'world'", std::string("nccl") + call, "injected failure",
                   "aborted"});
      ExpectError(g.Barrier().status(), absl::StatusCode::kFailedPrecondition,
                  {"barrier", "world", "failed earlier"});
    });
    EXPECT_EQ(gpu.nccl->comms_aborted(), 1);
    ExpectClean(gpu);
  }
}

// A coalesced bucket whose launch fails fails every member Work too, each naming itself.
TEST(NcclErrors, FailedBucketFailsItsMembers) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 1, FakeConfig(), [&](NcclGroup& g) {
    std::vector<float> a(2), b(2);
    ASSERT_OK(g.StartCoalescing());
    auto wa = g.AllReduce(a.data(), a.data(), 2, DType::kF32, ReduceOp::Sum());
    auto wb = g.AllReduce(b.data(), b.data(), 2, DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(wa.ok() && wb.ok());
    gpu.nccl->FailNextCall("ReduceScatter", ncclInvalidArgument);  // not used: no effect
    gpu.nccl->FailNextCall("AllReduce", ncclInvalidUsage);
    auto bucket = g.EndCoalescing("bucket 4");
    ExpectError(bucket.status(), absl::StatusCode::kInvalidArgument,
                {"coalesced(2 calls) #0 on group 'world' (bucket 4)", "ncclAllReduce"});
    ExpectError((*wa)->Wait(kWait), absl::StatusCode::kInvalidArgument,
                {"allreduce #0 on group 'world'", "ncclAllReduce"});
    ExpectError((*wb)->Wait(kWait), absl::StatusCode::kInvalidArgument,
                {"allreduce #1 on group 'world'"});
  });
  ExpectClean(gpu);
}

// Finalize that fails falls back to abort; nothing leaks.
TEST(NcclErrors, FailedFinalizeFallsBackToAbort) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 1, FakeConfig(/*blocking=*/false),
               [&](NcclGroup& g) { gpu.nccl->FailNextCall("CommFinalize", ncclInternalError); });
  EXPECT_EQ(gpu.nccl->comms_finalized(), 0);
  EXPECT_EQ(gpu.nccl->comms_aborted(), 1);
  ExpectClean(gpu);
}

// A nonblocking world whose peer never joins: init stays ncclInProgress until the deadline,
// then fails naming the group and is aborted, without ever calling while in progress.
TEST(NcclErrors, NonblockingInitTimesOut) {
  FakeGpu gpu;
  auto id = NewUniqueIdBytes(*gpu.nccl);
  ASSERT_TRUE(id.ok());
  auto backend = NcclBackend::CreateFromUniqueId(gpu.apis(), *id, 2, 0,
                                                 FakeConfig(false, absl::Milliseconds(200)));
  ASSERT_TRUE(backend.ok()) << backend.status();
  ExpectError((*backend)->WorldGroup(0).status(), absl::StatusCode::kDeadlineExceeded,
              {"group 'world'", "rank 0 of 2", "ncclInProgress"});
  ExpectError((*backend)->WorldGroup(0).status(), absl::StatusCode::kFailedPrecondition,
              {"already created"});
  backend->reset();
  EXPECT_EQ(gpu.nccl->comms_aborted(), 1);
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
