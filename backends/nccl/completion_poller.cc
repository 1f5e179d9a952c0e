#include "backends/nccl/completion_poller.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/nccl/errors.h"

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
  return absl::Status(s.code(), absl::StrCat(e.works.front()->info().Describe(), ": ", s.message()));
}

}  // namespace

std::shared_ptr<CompletionPoller> CompletionPoller::Create(std::shared_ptr<CudaApi> cuda) {
  std::shared_ptr<CompletionPoller> p(new CompletionPoller(std::move(cuda)));
  p->thread_ = std::thread([raw = p.get()] { raw->ThreadMain(); });
  return p;
}

CompletionPoller::~CompletionPoller() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // released from a completion callback: the thread ends on its own
    } else {
      thread_.join();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  retired_.clear();
}

void CompletionPoller::Track(Tracked t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.push_back(std::move(t));
  }
  cv_.notify_one();
}

size_t CompletionPoller::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t CompletionPoller::retired_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retired_.size();
}

std::vector<std::pair<std::shared_ptr<NcclComm>, absl::Status>> CompletionPoller::PollLocked(
    absl::Time now, std::vector<Finished>* out) {
  std::vector<std::pair<std::shared_ptr<NcclComm>, absl::Status>> aborts;
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
  for (size_t i = 0; i < entries_.size();) {
    Tracked& e = entries_[i];
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
      const cudaError_t q = cuda_->EventQuery(e.event.get());
      if (q == cudaSuccess) {
        done = true;
      } else if (q != cudaErrorNotReady) {
        const absl::Status c = CudaStatus(*cuda_, q, "cudaEventQuery on the completion event");
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
      entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (aborts.empty()) return aborts;
  // Entries issued earlier on a communicator that failed during this pass end with it too.
  for (size_t i = 0; i < entries_.size();) {
    if (const absl::Status* cause = aborting(entries_[i].comm.get())) {
      absl::Status fail = absl::AbortedError(
          absl::StrCat("aborted with its communicator: ", cause->message()));
      out->push_back(Finished{std::move(entries_[i]), std::move(fail)});
      entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return aborts;
}

void CompletionPoller::Finish(std::vector<Finished>& finished) {
  std::vector<Retired> retired;
  for (Finished& f : finished) {
    Retired r;
    for (const WorkPtr& w : f.entry.works) {
      if (f.status.ok()) {
        w->Complete(absl::OkStatus());
      } else {
        w->Complete(absl::Status(f.status.code(),
                                 absl::StrCat(w->info().Describe(), ": ", f.status.message())));
      }
      r.users.push_back(w);
    }
    r.event = std::move(f.entry.event);
    retired.push_back(std::move(r));
  }
  finished.clear();  // releases communicators and buffers outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (Retired& r : retired) retired_.push_back(std::move(r));
}

void CompletionPoller::SweepRetiredLocked() {
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                [](const Retired& r) {
                                  for (const auto& u : r.users) {
                                    if (!u.expired()) return false;
                                  }
                                  return true;
                                }),
                 retired_.end());
}

void CompletionPoller::ThreadMain() {
  std::unique_lock<std::mutex> lock(mu_);
  int idle_passes = 0;
  auto last_sweep = std::chrono::steady_clock::now();
  while (true) {
    const auto steady_now = std::chrono::steady_clock::now();
    if (steady_now - last_sweep >= kRetiredSweep) {
      SweepRetiredLocked();
      last_sweep = steady_now;
    }
    if (entries_.empty()) {
      if (stopping_) break;
      idle_passes = 0;
      if (retired_.empty()) {
        cv_.wait(lock, [this] { return stopping_ || !entries_.empty() || !retired_.empty(); });
      } else {
        cv_.wait_for(lock, kRetiredSweep, [this] { return stopping_ || !entries_.empty(); });
      }
      continue;
    }
    std::vector<Finished> finished;
    auto aborts = PollLocked(absl::Now(), &finished);
    const bool progressed = !finished.empty();
    lock.unlock();
    for (auto& [comm, cause] : aborts) comm->Abort(cause);
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
