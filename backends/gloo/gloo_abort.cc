#include "backends/gloo/gloo_abort.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backends/gloo/leave_at_exit.h"
#include "comm/logging.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"

namespace braid::gloo_backend {

absl::StatusOr<std::shared_ptr<GlooAbortLink>> GlooAbortLink::Start(rendezvous::TcpStore* store,
                                                                    int world_rank, int world_size,
                                                                    bool report) {
  std::shared_ptr<GlooAbortLink> link(new GlooAbortLink(store, world_rank, world_size, report));
  GlooAbortLink* raw = link.get();
  // The notifier and listener run under the domain's lock; the link outlives neither (they
  // are removed in the destructor before anything they touch goes).
  link->domain_->SetNotifier([raw](int rank, const absl::Status& cause) {
    const std::string value =
        absl::StrCat(rank, "\n", static_cast<int>(cause.code()), "\n", cause.message());
    const absl::Status s = raw->store_->Set(kKey, value);
    if (!s.ok()) Log().warn("gloo backend: could not publish the job abort: {}", s.ToString());
  });
  link->sub_ = link->domain_->Subscribe([raw](const absl::Status&) { raw->CloseAll(); });
  // On failure the destructor unsubscribes and clears the notifier.
  RETURN_IF_ERROR(StartThread(&link->watcher_, "the gloo abort watcher", [raw] { raw->Watch(); }));
  NoticeLeaveAtExit(link);
  return link;
}

GlooAbortLink::GlooAbortLink(rendezvous::TcpStore* store, int world_rank, int world_size,
                             bool report)
    : store_(store), world_rank_(world_rank), world_size_(world_size), report_(report) {}

void GlooAbortLink::SendLeave(absl::string_view how) {
  // Peers still waiting for this process, or calling it later, fail instead of waiting out
  // their deadlines. Under a collective shutdown they leave too (and the store may be gone).
  if (domain_->aborted() || left_.exchange(true)) return;
  (void)store_->Add(kLeftKey, 1);  // a rank 0 leaving at exit waits for no ack of this one
  const absl::Status s =
      store_->Set(kKey, absl::StrCat(world_rank_, "\n", kLeftCode, "\n", "rank ", world_rank_,
                                     " left the job: ", how, " while this rank still needed it"));
  if (!s.ok()) Log().debug("gloo backend: leave notice not published: {}", s.ToString());
}

void GlooAbortLink::LeaveAtExit() {
  if (world_size_ < 2 || domain_->aborted() || left_.load()) return;  // no peer to tell
  // Acknowledgements counted before this notice (of an earlier one) do not count for it.
  const bool host = world_rank_ == 0;
  const absl::StatusOr<int64_t> before =
      host ? store_->Add(kSeenKey, 0) : absl::StatusOr<int64_t>(0);
  SendLeave(
      "its process ended with its gloo world alive (a return from main or exit(), without "
      "braid_world_destroy)");
  if (!host || !before.ok()) return;
  // Rank 0 serves the store, which closes with this process: wait (bounded) until every peer's
  // watcher has read the notice, so a peer whose call then fails on the closed connection, or
  // calls later, names this rank instead of the connection.
  // Peers that left themselves (a normal end without braid_world_destroy) are not waited for.
  const absl::Time until = absl::Now() + kExitWait;
  while (absl::Now() < until) {
    absl::StatusOr<int64_t> seen = store_->Add(kSeenKey, 0);
    absl::StatusOr<int64_t> left = store_->Add(kLeftKey, 0);  // this rank included
    if (!seen.ok() || !left.ok() || *seen - *before >= world_size_ - *left) return;
    absl::SleepFor(absl::Milliseconds(2));
  }
}

GlooAbortLink::~GlooAbortLink() {
  SendLeave(
      "its gloo world was shut down (at process exit, after an exception or sys.exit, or by "
      "braid_world_destroy)");
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  sub_.Reset();
  domain_->SetNotifier(nullptr);
}

void GlooAbortLink::Register(const std::shared_ptr<::gloo::Context>& context,
                             std::shared_ptr<std::atomic<bool>> busy) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    contexts_.erase(std::remove_if(contexts_.begin(), contexts_.end(),
                                   [](const Entry& e) { return e.context.expired(); }),
                    contexts_.end());
    contexts_.push_back(Entry{context, std::move(busy)});
  }
  CloseIfAborted(*context);
}

void GlooAbortLink::CloseIfAborted(::gloo::Context& context) {
  if (!domain_->aborted()) return;
  try {
    context.closeConnections();
  } catch (const std::exception& e) {
    Log().warn("gloo backend: closing a context's connections after the abort: {}", e.what());
  }
}

void GlooAbortLink::Report(const absl::Status& cause) {
  if (report_ && !cause.ok()) domain_->Abort(world_rank_, cause);
}

bool GlooAbortLink::TakeLeaveNotice() {
  std::optional<Leave> leave;
  {
    std::lock_guard<std::mutex> lock(mu_);
    leave = std::exchange(leave_, std::nullopt);
  }
  if (!leave.has_value()) return false;
  domain_->AbortFromPeer(leave->rank, leave->cause, absl::StatusCode::kUnavailable);
  return true;
}

void GlooAbortLink::CloseAll() {
  std::vector<std::shared_ptr<::gloo::Context>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : contexts_) {
      // In flight: its task closes it when the call returns (see the header).
      if (e.busy->load()) continue;
      if (auto c = e.context.lock()) idle.push_back(std::move(c));
    }
  }
  for (const auto& c : idle) CloseIfAborted(*c);
}

void GlooAbortLink::Watch() {
  const std::string key(kKey);
  std::unique_lock<std::mutex> lock(mu_);
  bool store_gone = false;
  int acked = -1;  // the rank whose leave notice this watcher acknowledged last (kSeenKey)
  while (!stopping_ && !domain_->aborted() && !(store_gone && !leave_.has_value())) {
    cv_.wait_for(lock, std::chrono::milliseconds(absl::ToInt64Milliseconds(kPoll)));
    if (stopping_) break;
    if (leave_.has_value() && absl::Now() >= leave_->due) {
      lock.unlock();
      TakeLeaveNotice();
      lock.lock();
      continue;
    }
    if (store_gone) continue;  // only a leave notice seen earlier is still to be handed over
    lock.unlock();
    absl::StatusOr<std::vector<std::string>> missing = store_->Missing({key});
    if (!missing.ok()) {
      // The store is gone (rank 0 left) or broken: nothing more can arrive through it.
      lock.lock();
      store_gone = true;
      continue;
    }
    if (missing->empty()) {
      absl::StatusOr<std::string> v = store_->Get(key, absl::Seconds(5));
      if (v.ok()) {
        std::vector<std::string> parts = absl::StrSplit(*v, absl::MaxSplits('\n', 2));
        int rank = -1;
        int code = static_cast<int>(absl::StatusCode::kAborted);
        if (parts.size() == 3 && absl::SimpleAtoi(parts[0], &rank) &&
            absl::SimpleAtoi(parts[1], &code) && code == kLeftCode) {
          lock.lock();
          if (rank == world_rank_) continue;  // its own notice, sent at exit: no peer left
          if (!leave_.has_value()) leave_ = Leave{rank, parts[2], absl::Now() + kLeaveGrace};
          if (acked != rank) {  // held, then acknowledged: the leaver may wait (LeaveAtExit)
            acked = rank;
            lock.unlock();
            (void)store_->Add(kSeenKey, 1);
            lock.lock();
          }
          continue;
        }
        if (parts.size() == 3 && absl::SimpleAtoi(parts[0], &rank) &&
            absl::SimpleAtoi(parts[1], &code)) {
          const auto c = code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                             ? static_cast<absl::StatusCode>(code)
                             : absl::StatusCode::kAborted;
          domain_->AbortFromPeer(rank, parts[2], c);
        } else {
          domain_->AbortFromPeer(-1, *v);
        }
      }
    }
    lock.lock();
  }
}

}  // namespace braid::gloo_backend
