#include "backends/mpi/comm_thread.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/mpi/mpi_comm.h"
#include "comm/dtype.h"
#include "comm/logging.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"

namespace braid::mpi {
namespace {

// How long the comm thread keeps looking for the next call (yielding between looks) before it
// sleeps on its condition variable: a launch/wait loop never waits for a futex wake-up, and an
// idle group stops costing CPU within this time.
constexpr int64_t kLingerNs = 200'000;

// How long a destroyed group waits for a call that failed inside MPI to return after all
// (peers that arrive late complete it) before leaking the thread.
constexpr auto kStuckGrace = std::chrono::seconds(1);

}  // namespace

absl::StatusOr<MpiEngine> ParseMpiEngine(absl::string_view name) {
  if (name == "auto") return MpiEngine::kAuto;
  if (name == "sized") return MpiEngine::kSized;
  if (name == "blocking") return MpiEngine::kBlocking;
  if (name == "nonblocking") return MpiEngine::kNonblocking;
  return absl::InvalidArgumentError(
      absl::StrCat("BRAID_MPI_ENGINE='", name, "': expected auto, sized, blocking or nonblocking"));
}

MpiEngine ResolveAuto(MpiEngine engine, int local_ranks, int cores) {
  if (engine != MpiEngine::kAuto) return engine;
  return local_ranks * 2 <= cores ? MpiEngine::kSized : MpiEngine::kNonblocking;
}

bool UsesCommThread(MpiEngine engine, bool thread_multiple, const CollectiveArgs& args) {
  if (!thread_multiple || engine == MpiEngine::kNonblocking) return false;
  if (engine == MpiEngine::kBlocking) return true;  // kSized (or an unresolved kAuto): by size
  if (args.kind == CollectiveKind::kBarrier) return false;
  return args.count * DTypeSize(args.dtype) >= kBlockingMinBytes;
}

struct CommThread::Shared {
  explicit Shared(Config c) : config(std::move(c)) {}

  const Config config;  // config.comm: the thread's communicator, freed by ~CommThread

  std::mutex mu;
  std::condition_variable work_cv;   // the comm thread sleeps here when idle
  std::condition_variable watch_cv;  // the watchdog sleeps here until the next deadline
  std::condition_variable idle_cv;   // the destructor waits here for the queue to drain
  // Guarded by mu.
  std::deque<std::unique_ptr<CollectiveOp>> queue;
  CollectiveOp* running = nullptr;  // owned by the comm thread while inside MPI
  bool running_abandoned = false;   // its Work was failed by the watchdog
  bool sleeping = false;
  bool stopping = false;
  bool watch_stop = false;
  absl::Time watch_until = absl::InfiniteFuture();  // when the watchdog wakes next
  absl::Status abort_cause;                         // the job aborted
  bool abort_pending = false;                       // abort_cause not yet applied
  std::atomic<uint64_t> submitted{0};               // read by the lingering thread

  AbortDomain::Subscription abort_sub;
  std::thread worker;
  std::thread watchdog;
};

namespace {

using Shared = CommThread::Shared;

// Marks the group failed (under the MPI lock) and returns whether it was still OK before.
bool FailGroup(Shared& s, const absl::Status& cause) {
  std::lock_guard<std::mutex> lock(s.config.engine->mu());
  const bool first = s.config.state->failure.ok();
  s.config.state->MarkFailedLocked(cause);
  return first;
}

absl::Status GroupUsable(Shared& s) {
  std::lock_guard<std::mutex> lock(s.config.engine->mu());
  return s.config.state->CheckUsableLocked();
}

// Under s.mu: every queued call leaves the queue (the caller fails them outside the lock).
std::vector<std::unique_ptr<CollectiveOp>> TakeQueueLocked(Shared& s) {
  std::vector<std::unique_ptr<CollectiveOp>> out;
  for (auto& op : s.queue) out.push_back(std::move(op));
  s.queue.clear();
  return out;
}

void WorkerMain(const std::shared_ptr<Shared>& sp) {
  Shared& s = *sp;
  uint64_t taken = 0;
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    if (s.queue.empty()) {
      if (s.stopping) break;
      lock.unlock();
      const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kLingerNs);
      while (s.submitted.load(std::memory_order_acquire) == taken &&
             std::chrono::steady_clock::now() < end) {
        std::this_thread::yield();
      }
      lock.lock();
      if (s.queue.empty() && !s.stopping) {
        s.sleeping = true;
        s.work_cv.wait(lock, [&] { return !s.queue.empty() || s.stopping; });
        s.sleeping = false;
      }
      continue;
    }
    std::unique_ptr<CollectiveOp> op = std::move(s.queue.front());
    s.queue.pop_front();
    ++taken;
    s.running = op.get();
    s.running_abandoned = false;
    const absl::Status aborted = s.abort_cause;
    lock.unlock();

    absl::Status status = aborted.ok() ? GroupUsable(s) : aborted;
    bool fails_group = false;
    bool ran = false;
    if (status.ok()) {
      ran = true;
      status = op->RunBlocking(s.config.comm, &fails_group);
    } else {
      status = absl::Status(status.code(),
                            absl::StrCat(op->work()->info().Describe(), ": ", status.message()));
    }

    lock.lock();
    const bool abandoned = s.running_abandoned;
    s.running = nullptr;
    lock.unlock();
    if (!abandoned) {
      if (status.ok()) {
        op->Finish();
        op->work()->Complete(absl::OkStatus());
      } else {
        if (ran && fails_group && FailGroup(s, status)) {
          s.config.engine->ReportGroupFailure(status);
        }
        op->work()->Complete(status);
      }
    }
    op.reset();  // staging freed: MPI is done with it
    lock.lock();
    if (s.stopping) s.idle_cv.notify_all();
  }
  s.idle_cv.notify_all();
}

void WatchdogMain(const std::shared_ptr<Shared>& sp) {
  Shared& s = *sp;
  std::unique_lock<std::mutex> lock(s.mu);
  while (!s.watch_stop) {
    if (s.abort_pending) {
      // The job aborted: every call fails with its cause; a running one is abandoned in MPI.
      s.abort_pending = false;
      const absl::Status cause = s.abort_cause;
      std::vector<WorkPtr> works;
      if (s.running != nullptr && !s.running_abandoned) {
        s.running_abandoned = true;
        works.push_back(s.running->work());
      }
      std::vector<std::unique_ptr<CollectiveOp>> queued = TakeQueueLocked(s);
      for (const auto& op : queued) works.push_back(op->work());
      s.idle_cv.notify_all();
      lock.unlock();
      FailGroup(s, cause);
      for (const WorkPtr& w : works) {
        w->Complete(
            absl::Status(cause.code(), absl::StrCat(w->info().Describe(), ": ", cause.message())));
      }
      queued.clear();
      lock.lock();
      continue;
    }
    // The earliest deadline among the running call and the queued ones.
    const Operation* due = nullptr;
    if (s.running != nullptr && !s.running_abandoned) due = s.running;
    for (const auto& op : s.queue) {
      if (due == nullptr || op->deadline() < due->deadline()) due = op.get();
    }
    const absl::Time now = absl::Now();
    if (due != nullptr && due->deadline() <= now) {
      const absl::Status cause = DeadlineStatus(*due);
      const WorkPtr work = due->work();
      std::unique_ptr<CollectiveOp> expired;  // a queued call: never reached MPI
      if (due == s.running) {
        s.running_abandoned = true;
      } else {
        auto it = std::find_if(s.queue.begin(), s.queue.end(),
                               [&](const auto& op) { return op.get() == due; });
        expired = std::move(*it);
        s.queue.erase(it);
      }
      std::vector<std::unique_ptr<CollectiveOp>> rest = TakeQueueLocked(s);
      s.idle_cv.notify_all();
      lock.unlock();
      if (FailGroup(s, cause)) s.config.engine->ReportGroupFailure(cause);
      work->Complete(cause);
      for (auto& op : rest) op->work()->Complete(AbortedByGroup(*op, cause));
      rest.clear();
      expired.reset();
      lock.lock();
      continue;
    }
    s.watch_until = due != nullptr ? due->deadline() : absl::InfiniteFuture();
    if (due == nullptr) {
      s.watch_cv.wait(lock);
    } else {
      s.watch_cv.wait_until(lock, absl::ToChronoTime(s.watch_until));
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CommThread>> CommThread::Create(Config config) {
  auto shared = std::make_shared<Shared>(std::move(config));
  std::unique_ptr<CommThread> t(new CommThread(shared));
  Shared* s = shared.get();
  if (s->config.domain != nullptr) {
    // Runs under the domain's lock: only record the cause; the watchdog fails the calls.
    s->abort_sub = s->config.domain->Subscribe([s](const absl::Status& cause) {
      {
        std::lock_guard<std::mutex> lock(s->mu);
        if (!s->abort_cause.ok()) return;
        s->abort_cause = cause;
        s->abort_pending = true;
      }
      s->watch_cv.notify_all();
    });
  }
  // On failure ~CommThread stops what was started (and frees the communicator).
  const std::string& name = s->config.state->name;
  RETURN_IF_ERROR(StartThread(&s->worker, absl::StrCat("group '", name, "' (mpi comm thread)"),
                              [shared] { WorkerMain(shared); }));
  RETURN_IF_ERROR(StartThread(&s->watchdog, absl::StrCat("group '", name, "' (mpi watchdog)"),
                              [shared] { WatchdogMain(shared); }));
  return t;
}

CommThread::CommThread(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

absl::Status CommThread::Submit(std::unique_ptr<CollectiveOp> op) {
  Shared& s = *shared_;
  RETURN_IF_ERROR(GroupUsable(s));
  bool wake_worker = false;
  bool wake_watchdog = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.abort_cause.ok()) {
      return absl::Status(s.abort_cause.code(), absl::StrCat(op->work()->info().Describe(), ": ",
                                                             s.abort_cause.message()));
    }
    wake_watchdog = op->deadline() < s.watch_until;
    if (wake_watchdog) s.watch_until = op->deadline();
    s.queue.push_back(std::move(op));
    s.submitted.fetch_add(1, std::memory_order_release);
    wake_worker = s.sleeping;
  }
  if (wake_worker) s.work_cv.notify_one();
  if (wake_watchdog) s.watch_cv.notify_one();
  return absl::OkStatus();
}

CommThread::~CommThread() {
  Shared& s = *shared_;
  const bool on_worker = std::this_thread::get_id() == s.worker.get_id();
  bool stuck = false;
  std::vector<std::unique_ptr<CollectiveOp>> queued;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.stopping = true;
    s.work_cv.notify_all();
    if (!on_worker) {
      // Calls already issued on this rank go to MPI (the peers issue them too); a failed group
      // fails them at once. A running call that was abandoned in MPI may never return.
      s.idle_cv.wait(
          lock, [&] { return s.queue.empty() && (s.running == nullptr || s.running_abandoned); });
      s.idle_cv.wait_for(lock, kStuckGrace, [&] { return s.running == nullptr; });
      stuck = s.running != nullptr;
    } else {
      // Inside a Work callback on the comm thread: it cannot join itself. Queued calls fail
      // (the group is going away) and the thread exits after the callback returns.
      queued = TakeQueueLocked(s);
      stuck = true;
    }
    s.watch_stop = true;
  }
  s.watch_cv.notify_all();
  for (auto& op : queued) {
    op->work()->Complete(absl::CancelledError(absl::StrCat(
        op->work()->info().Describe(), ": group '", s.config.state->name, "' was destroyed")));
  }
  queued.clear();
  s.abort_sub.Reset();
  if (s.watchdog.joinable()) s.watchdog.join();  // not when Create could not start it
  if (!stuck) {
    if (s.worker.joinable()) s.worker.join();
    MPI_Comm comm = s.config.comm;
    if (comm != MPI_COMM_NULL) {
      std::lock_guard<std::mutex> lock(s.config.engine->mu());
      MPI_Comm_free(&comm);
    }
    return;
  }
  s.worker.detach();  // holds `shared_`: the state lives until the call returns, if ever
  if (!on_worker) {
    s.config.engine->NoteStuckThread();
    Log().error(
        "mpi backend: group '{}' destroyed while its communication thread is inside a "
        "blocking MPI call that failed; the thread and its communicator are leaked",
        s.config.state->name);
  }
}

}  // namespace braid::mpi
