// Work (the collective future), the status macros, and the backend registry.
#include "comm/work.h"

#include <atomic>
#include <thread>
#include <vector>

#include "comm/backend.h"
#include "comm/status_macros.h"
#include "comm/work_pool.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

WorkInfo Info() { return WorkInfo{"world", "allreduce", 7, "bucket 3"}; }

TEST(Work, CompletesOnceAndReportsStatus) {
  WorkPtr w = Work::Create(Info());
  EXPECT_FALSE(w->Done());
  EXPECT_EQ(w->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(w->Complete(absl::OkStatus()));
  EXPECT_FALSE(w->Complete(absl::InternalError("late")));  // first completion wins
  EXPECT_TRUE(w->Done());
  EXPECT_TRUE(w->Wait(absl::ZeroDuration()).ok());
}

TEST(Work, WaitTimesOutNamingGroupOpSeqAndLabel) {
  WorkPtr w = Work::Create(Info());
  absl::Status s = w->Wait(absl::Milliseconds(20));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  for (const char* part : {"allreduce", "#7", "'world'", "bucket 3"}) {
    EXPECT_NE(s.message().find(part), absl::string_view::npos) << s;
  }
  // Still completable afterwards: the op keeps running past a caller's deadline.
  w->Complete(absl::UnavailableError("rank 2 failed"));
  EXPECT_EQ(w->Wait(absl::Seconds(1)).code(), absl::StatusCode::kUnavailable);
}

TEST(Work, CallbackRunsOnceBeforeOrAfterCompletion) {
  WorkPtr w = Work::Create(Info());
  int before = 0, after = 0;
  absl::Status seen;
  w->OnComplete([&](const absl::Status& s) {
    ++before;
    seen = s;
  });
  EXPECT_EQ(before, 0);
  w->Complete(absl::AbortedError("x"));
  EXPECT_EQ(before, 1);
  EXPECT_EQ(seen.code(), absl::StatusCode::kAborted);
  w->OnComplete([&](const absl::Status&) { ++after; });  // already done: runs inline
  EXPECT_EQ(after, 1);
  EXPECT_EQ(before, 1);
}

TEST(Work, CrossThreadCompletionWakesWaiter) {
  for (absl::Duration spin : {absl::ZeroDuration(), absl::Microseconds(50)}) {
    WorkPtr w = Work::Create(Info(), spin);
    std::thread t([w] {
      absl::SleepFor(absl::Milliseconds(5));
      w->Complete(absl::OkStatus());
    });
    EXPECT_TRUE(w->Wait(absl::Seconds(10)).ok());
    t.join();
  }
}

TEST(Work, PollerDrivesCompletion) {
  WorkPtr w = Work::Create(Info());
  std::atomic<int> polls{0};
  Work* raw = w.get();
  w->set_poller([raw, &polls] {
    if (++polls == 100) raw->Complete(absl::OkStatus());
  });
  EXPECT_TRUE(w->Wait(absl::Seconds(10)).ok());
  EXPECT_GE(polls.load(), 100);
}

TEST(Work, PollerWaitHonoursDeadline) {
  WorkPtr w = Work::Create(Info());
  w->set_poller([] {});
  EXPECT_EQ(w->Wait(absl::Milliseconds(10)).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(Work, DeviceEventSlot) {
  WorkPtr w = Work::Create(Info());
  EXPECT_FALSE(w->device_event());
  int token;
  w->set_device_event(DeviceEvent{&token});
  EXPECT_EQ(w->device_event().handle, &token);
}

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}
absl::Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  RETURN_IF_ERROR(*out > 100 ? absl::OutOfRangeError("big") : absl::OkStatus());
  return absl::OkStatus();
}

TEST(WorkPool, ReusesBlocksOnceWarm) {
  WorkPool pool;
  for (int round = 0; round < 50; ++round) {
    std::vector<WorkPtr> live;
    for (int i = 0; i < 4; ++i) live.push_back(pool.Create(Info()));
    int calls = 0;
    live[0]->OnComplete([&calls](const absl::Status&) { ++calls; });
    for (WorkPtr& w : live) EXPECT_TRUE(w->Complete(absl::OkStatus()));
    EXPECT_EQ(calls, 1);
  }
  EXPECT_EQ(pool.heap_blocks(), 4u);  // the high-water mark, not one per Create
}

TEST(WorkPool, WorksOutliveThePoolAndAreReleasedOnOtherThreads) {
  std::vector<WorkPtr> kept;
  {
    WorkPool pool;
    for (int i = 0; i < 8; ++i) kept.push_back(pool.Create(Info()));
  }
  std::thread t([&kept] {
    for (WorkPtr& w : kept) w->Complete(absl::InternalError("late"));
    kept.clear();  // the last references: blocks go back to the (orphaned) arena
  });
  t.join();
  EXPECT_TRUE(kept.empty());
}

TEST(WorkPool, ConcurrentCreateAndRelease) {
  WorkPool pool;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool] {
      for (int i = 0; i < 2000; ++i) {
        WorkPtr w = pool.Create(Info());
        w->Complete(absl::OkStatus());
        EXPECT_TRUE(w->Wait(absl::Seconds(1)).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(pool.heap_blocks(), 4u);
}

TEST(StatusMacros, PropagateAndAssign) {
  int q = 0;
  EXPECT_TRUE(Quarter(8, &q).ok());
  EXPECT_EQ(q, 2);
  EXPECT_EQ(Quarter(6, &q).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(1000, &q).code(), absl::StatusCode::kOutOfRange);
}

TEST(Registry, UnknownBackendListsRegisteredOnes) {
  BackendRegistry reg;
  ASSERT_TRUE(reg.Register("alpha", "test",
                           [](const Options&) -> absl::StatusOr<std::unique_ptr<Backend>> {
                             return absl::UnimplementedError("no");
                           })
                  .ok());
  EXPECT_EQ(reg.Register("alpha", "dup", nullptr).code(), absl::StatusCode::kAlreadyExists);
  auto b = reg.Create("beta", Options());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(b.status().message().find("'beta'"), absl::string_view::npos);
  EXPECT_NE(b.status().message().find("alpha"), absl::string_view::npos);
}

// A backend linked into the binary wins over a module of the same name (backends/module), in
// either registration order; two modules or two linked-in backends of one name conflict.
TEST(Registry, LinkedInBackendTakesPrecedenceOverModule) {
  auto failing = [](const char* who) -> BackendFactory {
    return [who](const Options&) -> absl::StatusOr<std::unique_ptr<Backend>> {
      return absl::UnimplementedError(who);
    };
  };
  for (bool module_first : {true, false}) {
    BackendRegistry reg;
    if (module_first) {
      ASSERT_TRUE(reg.RegisterModule("mpi", "module", failing("module")).ok());
      ASSERT_TRUE(reg.Register("mpi", "linked", failing("linked")).ok());
    } else {
      ASSERT_TRUE(reg.Register("mpi", "linked", failing("linked")).ok());
      ASSERT_TRUE(reg.RegisterModule("mpi", "module", failing("module")).ok());
    }
    EXPECT_EQ(reg.Create("mpi", Options()).status().message(), "linked") << module_first;
    EXPECT_EQ(reg.Register("mpi", "again", failing("again")).code(),
              absl::StatusCode::kAlreadyExists);
  }
  BackendRegistry reg;
  ASSERT_TRUE(reg.RegisterModule("gloo", "module", failing("module")).ok());
  EXPECT_EQ(reg.RegisterModule("gloo", "other", failing("other")).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Create("gloo", Options()).status().message(), "module");
}

}  // namespace
}  // namespace braid
