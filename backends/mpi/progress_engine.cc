#include "backends/mpi/progress_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/mpi/mpi_errors.h"
#include "comm/logging.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"

namespace braid::mpi {
namespace {

// The thread's pacing. It lingers a few milliseconds after the last operation (waking every
// tick) before sleeping until notified, so a tight launch/wait loop never pays a wake-up.
constexpr auto kTick = std::chrono::microseconds(100);
constexpr int kLingerTicks = 50;
constexpr auto kZombieInterval = std::chrono::milliseconds(10);
// A waiter polled this recently: it drives progress (all operations, not only its own), so
// the thread stays off the CPU until the waiter has been gone this long.
constexpr int64_t kWaiterGraceNs = 1'000'000;
// Polls without a completion before the thread sleeps between polls instead of yielding.
constexpr int kYieldPolls = 256;
constexpr auto kBackoffSleep = std::chrono::microseconds(20);
// How often an idle engine with an abort channel looks for a peer's abort.
constexpr auto kAbortPoll = std::chrono::milliseconds(5);
// A peer's leave notice fails this process's work only this long after it arrived: an operation
// the peer completed before it left (its data on the way, maybe behind the notice, which
// travels on another communicator) completes meanwhile; one that needs the peer fails after.
constexpr absl::Duration kLeaveGrace = absl::Milliseconds(500);

}  // namespace

absl::Status DeadlineStatus(const Operation& op) {
  const std::string group = op.group() != nullptr ? op.group()->name : op.work()->info().group;
  return absl::DeadlineExceededError(absl::StrCat(
      op.work()->info().Describe(), ": not complete at its deadline (timeout ",
      absl::FormatDuration(op.timeout()),
      "); a rank may have stopped or called a different collective. MPI cannot cancel it, so "
      "group '",
      group, "' is now failed and every later call on it fails"));
}

absl::Status AbortedByGroup(const Operation& op, const absl::Status& cause) {
  return absl::Status(cause.code(), absl::StrCat(op.work()->info().Describe(), ": aborted, group '",
                                                 op.group()->name, "' failed: ", cause.message()));
}

absl::StatusOr<std::shared_ptr<ProgressEngine>> ProgressEngine::Create() {
  std::shared_ptr<ProgressEngine> engine(new ProgressEngine());
  RETURN_IF_ERROR(StartThread(&engine->thread_, "the mpi progress engine",
                              [e = engine.get()] { e->ThreadMain(); }));
  return engine;
}

ProgressEngine::~ProgressEngine() {
  Shutdown();
  // MPI may still write into (or read from) these buffers: never free them under it.
  for (auto& z : zombies_) z.release();  // NOLINT: deliberate leak, see the header
}

WorkPtr ProgressEngine::NewWork(WorkInfo info, absl::Duration spin) {
  WorkPtr work = Work::Create(std::move(info), spin);
  work->set_poller([engine = shared_from_this()] { engine->Poll(); });
  return work;
}

absl::Status ProgressEngine::Submit(std::unique_ptr<Operation> op) {
  std::unique_lock<std::mutex> lock(mu_);
  if (shut_down_ || stopping_) {
    return absl::FailedPreconditionError(
        absl::StrCat(op->work()->info().Describe(), ": the MPI runtime is shutting down"));
  }
  if (!abort_cause_.ok()) {
    return absl::Status(abort_cause_.code(),
                        absl::StrCat(op->work()->info().Describe(), ": ", abort_cause_.message()));
  }
  if (op->group() != nullptr) RETURN_IF_ERROR(op->group()->CheckUsableLocked());
  absl::Status started = op->Start();
  if (!started.ok()) {
    // Peers may have issued this call: the group's call order can no longer be trusted.
    if (op->group() != nullptr) {
      op->group()->MarkFailedLocked(started);
      NoteGroupFailureLocked(started);
    }
    lock.unlock();
    DeliverAborts();
    return started;
  }
  ops_.push_back(std::move(op));
  if (asleep_) cv_.notify_one();
  return absl::OkStatus();
}

void ProgressEngine::Poll() {
  const int64_t now_ns = absl::GetCurrentTimeNanos();
  last_waiter_poll_ns_.store(now_ns, std::memory_order_relaxed);
  FinishedList finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_ || ops_.empty()) return;
    PollLocked(absl::FromUnixNanos(now_ns), &finished);
  }
  RunFinished(finished);
  DeliverAborts();
}

void ProgressEngine::AttachAbortDomain(std::shared_ptr<AbortDomain> domain,
                                       std::unique_ptr<AbortChannel> channel, int world_rank,
                                       bool report) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (domain_ != nullptr || shut_down_) {
      if (channel != nullptr) channel->Close();
      return;
    }
    domain_ = domain;
    channel_ = std::move(channel);
    world_rank_ = world_rank;
    report_failures_ = report;
  }
  // Lock order: the domain's, then mu_ (the domain calls these under its own lock).
  domain->SetNotifier([this](int, const absl::Status& cause) {
    std::lock_guard<std::mutex> lock(mu_);
    if (channel_ != nullptr) channel_->Send(cause);
  });
  abort_sub_ = domain->Subscribe([this](const absl::Status& cause) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (abort_cause_.ok()) abort_cause_ = cause;
    }
    abort_pending_.store(true, std::memory_order_release);
    cv_.notify_all();  // the thread fails what is in flight (a waiter's poll may do it first)
  });
}

void ProgressEngine::SendLeaveLocked(absl::string_view how) {
  if (channel_ == nullptr || !abort_cause_.ok()) return;
  channel_->SendLeft(absl::StrCat("rank ", world_rank_, " left the job: ", how,
                                  " while this rank still needed it"));
}

void ProgressEngine::LeaveAtExit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  int finalized = 0;  // a host that owns MPI may have finalized it with our world alive
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  SendLeaveLocked("its process ended with its mpi world alive (a return from main or exit())");
  if (channel_ != nullptr) channel_->FlushSends(absl::Now() + absl::Milliseconds(200));
}

bool ProgressEngine::PeerAbortDueLocked() const {
  return peer_abort_.has_value() && absl::Now() >= peer_abort_due_;
}

bool ProgressEngine::has_abort_channel() {
  std::lock_guard<std::mutex> lock(mu_);
  return channel_ != nullptr;
}

void ProgressEngine::ReportGroupFailure(const absl::Status& cause) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    NoteGroupFailureLocked(cause);
  }
  DeliverAborts();
}

void ProgressEngine::NoteStuckThread() { stuck_threads_.fetch_add(1, std::memory_order_relaxed); }

void ProgressEngine::NoteGroupFailureLocked(const absl::Status& cause) {
  if (report_failures_ && to_report_.ok() && abort_cause_.ok()) to_report_ = cause;
}

void ProgressEngine::PollAbortsLocked(FinishedList* out) {
  if (channel_ != nullptr && !peer_abort_.has_value() && abort_cause_.ok()) {
    peer_abort_ = channel_->Poll();
    if (peer_abort_.has_value()) {
      peer_abort_due_ = peer_abort_->left ? absl::Now() + kLeaveGrace : absl::InfinitePast();
    }
  }
  if (!abort_pending_.load(std::memory_order_acquire)) return;
  abort_pending_.store(false, std::memory_order_relaxed);
  for (auto& op : ops_) {
    if (op->group() != nullptr) op->group()->MarkFailedLocked(abort_cause_);
  }
  while (!ops_.empty()) {
    absl::Status fail(abort_cause_.code(), absl::StrCat(ops_.front()->work()->info().Describe(),
                                                        ": ", abort_cause_.message()));
    RemoveLocked(0, std::move(fail), out);
  }
}

void ProgressEngine::DeliverAborts() {
  absl::Status report;
  std::optional<PeerAbort> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (domain_ == nullptr) return;
    report = std::exchange(to_report_, absl::OkStatus());
    if (PeerAbortDueLocked()) peer = std::exchange(peer_abort_, std::nullopt);
  }
  if (peer.has_value()) domain_->AbortFromPeer(peer->rank, peer->cause, peer->code);
  if (!report.ok()) domain_->Abort(world_rank_, report);
  if (abort_pending_.load(std::memory_order_acquire)) {
    FinishedList finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      PollAbortsLocked(&finished);
    }
    RunFinished(finished);
  }
}

void ProgressEngine::TestRequestsLocked() {
  const size_t n = ops_.size();
  errors_.assign(n, absl::OkStatus());
  requests_.resize(n);
  bool any_active = false;
  for (size_t i = 0; i < n; ++i) {
    requests_[i] = ops_[i]->request();
    any_active |= requests_[i] != MPI_REQUEST_NULL;
  }
  if (!any_active) return;
  indices_.resize(n);
  statuses_.resize(n);
  int completed = 0;
  const int rc = MPI_Testsome(static_cast<int>(n), requests_.data(), &completed, indices_.data(),
                              statuses_.data());
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    const absl::Status s = MpiStatus(rc, "MPI_Testsome");
    for (size_t i = 0; i < n; ++i) {
      if (ops_[i]->request() != MPI_REQUEST_NULL) errors_[i] = s;
    }
    return;
  }
  if (completed == MPI_UNDEFINED) return;
  for (int k = 0; k < completed; ++k) {
    const size_t i = static_cast<size_t>(indices_[k]);
    ops_[i]->request() = MPI_REQUEST_NULL;
    if (rc == MPI_ERR_IN_STATUS && statuses_[k].MPI_ERROR != MPI_SUCCESS) {
      errors_[i] = MpiStatus(statuses_[k].MPI_ERROR,
                             absl::StrCat(ops_[i]->work()->info().Describe(), ": MPI request"));
    }
  }
}

void ProgressEngine::PollLocked(absl::Time now, FinishedList* out) {
  PollAbortsLocked(out);
  TestRequestsLocked();
  // errors_ is indexed like ops_ before any removal: walk both with separate cursors.
  std::vector<absl::Status> errors;
  errors.swap(errors_);
  bool newly_failed = false;
  size_t i = 0;
  for (size_t k = 0; k < errors.size(); ++k) {
    Operation& op = *ops_[i];
    GroupState* group = op.group();
    absl::Status fail;
    bool done = false;
    if (!errors[k].ok()) {
      fail = errors[k];
      if (group != nullptr && group->failure.ok()) {
        newly_failed = true;
        NoteGroupFailureLocked(fail);
      }
      if (group != nullptr) group->MarkFailedLocked(fail);
    } else if (group != nullptr && !group->failure.ok()) {
      fail = AbortedByGroup(op, op.group()->failure);
    } else if (op.request() == MPI_REQUEST_NULL) {
      const bool was_ok = group != nullptr && group->failure.ok();
      absl::StatusOr<Operation::Progress> p = op.Advance();
      if (!p.ok()) {
        fail = p.status();
        if (group != nullptr && !group->failure.ok()) newly_failed = true;
        if (was_ok && !group->failure.ok()) NoteGroupFailureLocked(fail);
      } else {
        done = *p == Operation::Progress::kDone;
      }
    }
    if (!done && fail.ok() && now >= op.deadline()) {
      fail = DeadlineStatus(op);
      if (group != nullptr && group->failure.ok()) {
        newly_failed = true;
        NoteGroupFailureLocked(fail);
      }
      if (group != nullptr) group->MarkFailedLocked(fail);
    }
    if (done || !fail.ok()) {
      RemoveLocked(i, std::move(fail), out);
    } else {
      ++i;
    }
  }
  errors_.swap(errors);
  if (!newly_failed) return;
  // A group that failed during this pass also ends its operations that came earlier in it.
  for (size_t j = 0; j < ops_.size();) {
    const GroupState* group = ops_[j]->group();
    if (group != nullptr && !group->failure.ok()) {
      RemoveLocked(j, AbortedByGroup(*ops_[j], ops_[j]->group()->failure), out);
    } else {
      ++j;
    }
  }
}

void ProgressEngine::RemoveLocked(size_t i, absl::Status status, FinishedList* out) {
  std::unique_ptr<Operation> op = std::move(ops_[i]);
  ops_.erase(ops_.begin() + static_cast<std::ptrdiff_t>(i));
  WorkPtr work = op->work();
  if (op->request() != MPI_REQUEST_NULL) {
    zombies_.push_back(std::move(op));
    out->push_back(Finished{nullptr, std::move(work), std::move(status)});
  } else {
    out->push_back(Finished{std::move(op), std::move(work), std::move(status)});
  }
}

void ProgressEngine::PollZombiesLocked() {
  for (size_t i = 0; i < zombies_.size();) {
    int flag = 0;
    const int rc = MPI_Test(&zombies_[i]->request(), &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || flag) {
      zombies_.erase(zombies_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

void ProgressEngine::RunFinished(FinishedList& finished) {
  for (Finished& f : finished) {
    if (f.status.ok() && f.op != nullptr) f.op->Finish();
    f.work->Complete(std::move(f.status));
  }
  finished.clear();  // destroys the operations (and their staging) outside the lock
}

void ProgressEngine::ThreadMain() {
  std::unique_lock<std::mutex> lock(mu_);
  int idle_ticks = 0;
  int empty_polls = 0;
  auto last_zombie_poll = std::chrono::steady_clock::now();
  while (!stopping_) {
    if (!zombies_.empty() &&
        std::chrono::steady_clock::now() - last_zombie_poll >= kZombieInterval) {
      PollZombiesLocked();
      last_zombie_poll = std::chrono::steady_clock::now();
    }
    if (ops_.empty()) {
      empty_polls = 0;
      if (channel_ != nullptr || abort_pending_.load(std::memory_order_acquire)) {
        FinishedList none;
        PollAbortsLocked(&none);  // nothing in flight: finishes nothing
        if (PeerAbortDueLocked() || !to_report_.ok()) {
          lock.unlock();
          DeliverAborts();
          lock.lock();
          continue;
        }
      }
      if (!zombies_.empty()) {
        cv_.wait_for(lock, kZombieInterval);
      } else if (idle_ticks < kLingerTicks) {
        ++idle_ticks;
        cv_.wait_for(lock, kTick);
      } else if (channel_ != nullptr) {
        asleep_ = true;
        cv_.wait_for(lock, kAbortPoll, [this] { return stopping_ || !ops_.empty(); });
        asleep_ = false;
      } else {
        asleep_ = true;
        cv_.wait(lock, [this] { return stopping_ || !ops_.empty(); });
        asleep_ = false;
      }
      continue;
    }
    idle_ticks = 0;
    const int64_t now_ns = absl::GetCurrentTimeNanos();
    const int64_t since_waiter = now_ns - last_waiter_poll_ns_.load(std::memory_order_relaxed);
    if (since_waiter < kWaiterGraceNs) {
      // A waiter drives progress: keep out of its lock and off its CPU.
      cv_.wait_for(lock, std::chrono::nanoseconds(kWaiterGraceNs - since_waiter));
      continue;
    }
    FinishedList finished;
    PollLocked(absl::FromUnixNanos(now_ns), &finished);
    const bool progressed = !finished.empty();
    lock.unlock();
    RunFinished(finished);
    DeliverAborts();
    empty_polls = progressed ? 0 : empty_polls + 1;
    if (empty_polls < kYieldPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kBackoffSleep);
    }
    lock.lock();
  }
}

size_t ProgressEngine::DrainGroup(const GroupState* group) {
  const auto of_group = [group](const std::unique_ptr<Operation>& op) {
    return op->group() == group;
  };
  for (;;) {
    FinishedList finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (std::none_of(ops_.begin(), ops_.end(), of_group)) {
        if (!shut_down_) PollZombiesLocked();  // one last chance for the failed ones
        return static_cast<size_t>(std::count_if(zombies_.begin(), zombies_.end(), of_group));
      }
      // Drives progress like a waiter (Poll): the progress thread keeps out of the way.
      const int64_t now_ns = absl::GetCurrentTimeNanos();
      last_waiter_poll_ns_.store(now_ns, std::memory_order_relaxed);
      PollLocked(absl::FromUnixNanos(now_ns), &finished);
    }
    RunFinished(finished);
    DeliverAborts();
    std::this_thread::yield();
  }
}

bool ProgressEngine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return zombies_.empty() && stuck_threads_.load() == 0;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Drain what is still in flight: someone may still wait on it. Bounded by its deadlines.
  for (;;) {
    FinishedList finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ops_.empty()) break;
      PollLocked(absl::Now(), &finished);
    }
    RunFinished(finished);
    std::this_thread::yield();
  }
  abort_sub_.Reset();
  if (domain_ != nullptr) domain_->SetNotifier(nullptr);  // the channel closes below
  std::lock_guard<std::mutex> lock(mu_);
  PollZombiesLocked();
  // Leaving while the job runs on: peers waiting for this process, or calling it later, fail
  // (after kLeaveGrace) instead of waiting out their deadlines. Under a collective shutdown
  // the peers are leaving too and have nothing left that needs this process.
  SendLeaveLocked(
      "its mpi world was shut down (at process exit, after an exception or sys.exit, "
      "or by braid_world_destroy)");
  if (channel_ != nullptr) channel_->Close();
  shut_down_ = true;
  if (!zombies_.empty()) {
    Log().error(
        "mpi backend: {} operation(s) never completed after failing their deadline; "
        "their buffers are leaked and MPI will not be finalized",
        zombies_.size());
  }
  const int stuck = stuck_threads_.load();
  if (stuck > 0) {
    Log().error(
        "mpi backend: {} communication thread(s) are still inside a blocking MPI call "
        "that failed its deadline; MPI will not be finalized",
        stuck);
  }
  return zombies_.empty() && stuck == 0;
}

}  // namespace braid::mpi
