#include "backends/nccl/completion_poller.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/nccl/errors.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"

namespace braid::nccl {
namespace {

// Passes without a completion before the thread sleeps between passes instead of yielding.
constexpr int kYieldPasses = 256;
constexpr auto kBackoffSleep = std::chrono::microseconds(50);
constexpr auto kRetiredSweep = std::chrono::milliseconds(10);

std::string AbortNote(const NcclComm& comm) {
  return absl::StrCat("; the NCCL communicator was aborted, so group '", comm.config().name,
                      "' is failed and every later call on it fails");
}

// The communicator's failure cause names the call that failed first.
absl::Status Named(const CompletionPoller::Tracked& e, const absl::Status& s) {
  return WithContext(s, e.works.front()->info().Describe());
}

}  // namespace

struct CompletionPoller::Core {
  struct Retired {
    absl::InlinedVector<std::weak_ptr<Work>, 1> users;
    CudaEvent event;
  };
  struct Finished {
    Tracked entry;
    absl::Status status;
  };
  using Aborts = std::vector<std::pair<std::shared_ptr<NcclComm>, absl::Status>>;

  Core(std::shared_ptr<CudaApi> c, int d) : cuda(std::move(c)), device(d) {}
  void ThreadMain();
  // One pass over the entries; moves finished ones to `out`. Returns communicators to abort.
  Aborts PollLocked(absl::Time now, std::vector<Finished>* out);
  void SweepRetiredLocked();
  void Finish(std::vector<Finished>& finished);

  const std::shared_ptr<CudaApi> cuda;
  const int device;  // the thread's current device: its queries, destroys and frees go there
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Tracked> entries;                          // guarded by mu, in issue order
  std::vector<Retired> retired;                         // guarded by mu
  bool stopping = false;                                // guarded by mu
  std::function<void(const absl::Status&)> on_failure;  // guarded by mu
};

absl::StatusOr<std::shared_ptr<CompletionPoller>> CompletionPoller::Create(
    std::shared_ptr<CudaApi> cuda, int device) {
  std::shared_ptr<CompletionPoller> p(new CompletionPoller());
  p->core_ = std::make_shared<Core>(std::move(cuda), device);
  RETURN_IF_ERROR(StartThread(&p->thread_,
                              absl::StrCat("the nccl completion poller of device ", device),
                              [core = p->core_] { core->ThreadMain(); }));
  return p;
}

CompletionPoller::~CompletionPoller() {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->stopping = true;
  }
  core_->cv.notify_all();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // released from a completion callback: the thread ends on its own
    return;
  }
  thread_.join();
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->retired.clear();
}

void CompletionPoller::SetFailureHandler(std::function<void(const absl::Status&)> handler) {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->on_failure = std::move(handler);
}

void CompletionPoller::Track(Tracked t) {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->entries.push_back(std::move(t));
  }
  core_->cv.notify_one();
}

size_t CompletionPoller::in_flight() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->entries.size();
}

size_t CompletionPoller::retired_events() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->retired.size();
}

CompletionPoller::Core::Aborts CompletionPoller::Core::PollLocked(absl::Time now,
                                                                  std::vector<Finished>* out) {
  Aborts aborts;
  // Per pass: each communicator's async state is read once.
  std::vector<std::pair<NcclComm*, absl::Status>> probed;
  auto probe = [&](NcclComm* c) -> absl::Status {
    for (auto& [p, s] : probed) {
      if (p == c) return s;
    }
    probed.emplace_back(c, c->ProbeAsyncError());
    return probed.back().second;
  };
  auto aborting = [&](NcclComm* c) -> const absl::Status* {
    for (auto& [p, s] : aborts) {
      if (p.get() == c) return &s;
    }
    return nullptr;
  };
  for (size_t i = 0; i < entries.size();) {
    Tracked& e = entries[i];
    NcclComm* comm = e.comm.get();
    absl::Status fail;
    bool done = false;
    if (const absl::Status* cause = aborting(comm)) {
      fail = absl::AbortedError(absl::StrCat("aborted with its communicator: ", cause->message()));
    } else if (absl::Status async = probe(comm); !async.ok()) {
      if (comm->failed()) {
        fail = absl::Status(async.code(), absl::StrCat("group failed earlier: ", async.message()));
      } else {
        fail = absl::Status(async.code(), absl::StrCat("NCCL reported an error: ", async.message(),
                                                       AbortNote(*comm)));
        aborts.emplace_back(e.comm, Named(e, fail));
      }
    } else {
      const cudaError_t q = cuda->EventQuery(e.event.get());
      if (q == cudaSuccess) {
        done = true;
      } else if (q != cudaErrorNotReady) {
        const absl::Status c = CudaStatus(*cuda, q, "cudaEventQuery on the completion event");
        fail = absl::Status(c.code(), absl::StrCat(c.message(), AbortNote(*comm)));
        aborts.emplace_back(e.comm, Named(e, fail));
      } else if (now >= e.deadline) {
        fail = absl::DeadlineExceededError(absl::StrCat(
            "not complete at its deadline (timeout ", absl::FormatDuration(e.timeout),
            "); a rank may have stopped or called a different collective", AbortNote(*comm)));
        aborts.emplace_back(e.comm, Named(e, fail));
      }
    }
    if (done || !fail.ok()) {
      out->push_back(Finished{std::move(e), std::move(fail)});
      entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (aborts.empty()) return aborts;
  // Entries issued earlier on a communicator that failed during this pass end with it too.
  for (size_t i = 0; i < entries.size();) {
    if (const absl::Status* cause = aborting(entries[i].comm.get())) {
      absl::Status fail =
          absl::AbortedError(absl::StrCat("aborted with its communicator: ", cause->message()));
      out->push_back(Finished{std::move(entries[i]), std::move(fail)});
      entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return aborts;
}

void CompletionPoller::Core::Finish(std::vector<Finished>& finished) {
  std::vector<Retired> done;
  for (Finished& f : finished) {
    Retired r;
    for (const WorkPtr& w : f.entry.works) {
      w->Complete(WithContext(f.status, w->info().Describe()));
      r.users.push_back(w);
    }
    r.event = std::move(f.entry.event);
    done.push_back(std::move(r));
  }
  finished.clear();  // releases communicators and buffers outside the lock
  std::lock_guard<std::mutex> lock(mu);
  for (Retired& r : done) retired.push_back(std::move(r));
}

void CompletionPoller::Core::SweepRetiredLocked() {
  retired.erase(std::remove_if(retired.begin(), retired.end(),
                               [](const Retired& r) {
                                 for (const auto& u : r.users) {
                                   if (!u.expired()) return false;
                                 }
                                 return true;
                               }),
                retired.end());
}

void CompletionPoller::Core::ThreadMain() {
  // A new thread's current device is 0: without this, every query, event destroy and free
  // here would run on (and make a CUDA context on) device 0, whatever the rank's device. A
  // failure shows up as errors of the first queries, which name the work.
  (void)cuda->SetDevice(device);
  std::unique_lock<std::mutex> lock(mu);
  int idle_passes = 0;
  auto last_sweep = std::chrono::steady_clock::now();
  while (true) {
    const auto steady_now = std::chrono::steady_clock::now();
    if (steady_now - last_sweep >= kRetiredSweep) {
      SweepRetiredLocked();
      last_sweep = steady_now;
    }
    if (entries.empty()) {
      if (stopping) break;
      idle_passes = 0;
      if (retired.empty()) {
        cv.wait(lock, [this] { return stopping || !entries.empty() || !retired.empty(); });
      } else {
        cv.wait_for(lock, kRetiredSweep, [this] { return stopping || !entries.empty(); });
      }
      continue;
    }
    std::vector<Finished> finished;
    auto aborts = PollLocked(absl::Now(), &finished);
    const bool progressed = !finished.empty();
    std::function<void(const absl::Status&)> handler;
    if (!aborts.empty()) handler = on_failure;
    lock.unlock();
    for (auto& [comm, cause] : aborts) comm->Abort(cause);
    if (handler) handler(aborts.front().second);  // the job aborts (abort_hub.h)
    aborts.clear();
    Finish(finished);
    idle_passes = progressed ? 0 : idle_passes + 1;
    if (idle_passes < kYieldPasses) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kBackoffSleep);
    }
    lock.lock();
  }
}

}  // namespace braid::nccl
