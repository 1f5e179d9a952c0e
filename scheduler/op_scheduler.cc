#include "scheduler/op_scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/host_values.h"
#include "comm/logging.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"

namespace braid::sched {
namespace {

// Set while a thread is inside SubmitReduction / TrackUrgent / a WaitScope's end: its caller may
// hold a lock that a completion callback would take again (the reducer's launch mutex, the
// gatherer's, a unit scheduler's), so a callback that would run inline on such a thread, and a
// reduction it would complete, are handed to the scheduler's thread instead.
thread_local int tls_in_call = 0;

struct InCall {
  InCall() { ++tls_in_call; }
  ~InCall() { --tls_in_call; }
};

const char* PartName(CollectiveKind k) {
  return k == CollectiveKind::kReduceScatter ? "reduce_scatter partition [prio 1]"
                                             : "allreduce partition [prio 1]";
}

}  // namespace

struct OpScheduler::Pending {
  ReductionRequest req;
  std::string label;
  std::vector<PartRange> parts;
  int ranks = 1;        // group size for reduce-scatter, else 1
  size_t next = 0;      // next partition to issue (parts.size(): none left)
  int outstanding = 0;  // issued, not completed
  absl::Status error;
  WorkPtr done;
  // Device groups (buffer_ops() not synchronous): the readiness events, waited on by the comm
  // stream before partition 0 (the request's span may not outlive SubmitReduction), and
  // whether `done` is armed to complete after the last partition on the stream (CompleteAfter:
  // it then carries that point's device event for consumer streams).
  bool device = false;
  std::vector<DeviceEvent> ready;
  bool armed = false;
  size_t PartBytes(size_t k) const { return parts[k].count() * DTypeSize(req.dtype) * ranks; }
  bool Staged() const { return req.kind == CollectiveKind::kReduceScatter && parts.size() > 1; }
};

struct OpScheduler::Lane {
  Group* group = nullptr;
  std::deque<std::shared_ptr<Pending>> queue;
  size_t in_flight_bytes = 0;
  int in_flight = 0;
  OwnedBuffer staging[2];
  bool staging_busy[2] = {false, false};
  int track = 0;
};

// What a pump decided, acted on after mu_ is released.
struct OpScheduler::Outbox {
  std::vector<Issued> issued;
  std::vector<std::pair<WorkPtr, absl::Status>> complete;
};

absl::StatusOr<std::unique_ptr<OpScheduler>> OpScheduler::Create(const OpSchedulerConfig& config,
                                                                 Group* verify) {
  if (config.max_hold <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("op scheduler: max_hold must be positive");
  }
  if (verify != nullptr && verify->size() > 1) {
    std::vector<int64_t> mine = {static_cast<int64_t>(config.credit_bytes),
                                 config.priorities ? 1 : 0};
    std::vector<int64_t> all(mine.size() * verify->size());
    // Host values on any group (device groups stage them through their own memory).
    RETURN_IF_ERROR(AllGatherHostValues(*verify, mine.data(), all.data(), mine.size(), DType::kI64,
                                        "scheduler config check", absl::Now() + config.timeout));
    for (int r = 1; r < verify->size(); ++r) {
      if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
        std::vector<std::string> each;
        for (int k = 0; k < verify->size(); ++k) {
          each.push_back(absl::StrCat("rank ", k, ": credit_bytes=", all[2 * k],
                                      " priorities=", all[2 * k + 1]));
        }
        return absl::FailedPreconditionError(
            absl::StrCat("the op scheduler on group '", verify->name(),
                         "': ranks were configured differently (partitions would not match): ",
                         absl::StrJoin(each, "; ")));
      }
    }
  }
  std::unique_ptr<OpScheduler> s(new OpScheduler(config));
  OpScheduler* p = s.get();
  RETURN_IF_ERROR(
      StartThread(&p->timer_, "the launch scheduler's timer", [p] { p->HelperLoop(); }));
  return s;
}

OpScheduler::OpScheduler(const OpSchedulerConfig& config) : config_(config) {
  if (config_.timeline != nullptr && config_.timeline->enabled()) {
    tl_ = config_.timeline;
    tl_urgent_ = tl_->Track("sched urgent");
  }
}

OpScheduler::~OpScheduler() {
  std::vector<std::pair<WorkPtr, absl::Status>> cancelled;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& lane : lanes_) {
      for (auto& p : lane->queue) {
        if (p->next >= p->parts.size()) continue;
        p->next = p->parts.size();
        if (p->error.ok())
          p->error = absl::CancelledError(
              absl::StrCat(p->label, ": scheduler destroyed before it was issued"));
        if (p->outstanding == 0) cancelled.emplace_back(p->done, p->error);
      }
      lane->queue.clear();
    }
    const absl::Time deadline = absl::Now() + config_.timeout;
    auto drained = [this] {
      if (urgent_in_flight_ > 0 || !deferred_.empty() || !deferred_complete_.empty()) return false;
      for (auto& lane : lanes_) {
        if (lane->in_flight > 0) return false;
      }
      return true;
    };
    while (!drained() && absl::Now() < deadline) {
      cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
    if (!drained()) Log().error("op scheduler destroyed with operations still in flight");
    stopping_ = true;
  }
  cv_.notify_all();
  if (timer_.joinable()) timer_.join();  // not when Create could not start it
  for (auto& [w, s] : cancelled) w->Complete(s);
}

OpScheduler::Lane& OpScheduler::LaneLocked(Group* g) {
  for (auto& lane : lanes_) {
    if (lane->group == g) return *lane;
  }
  auto lane = std::make_unique<Lane>();
  lane->group = g;
  if (tl_ != nullptr) lane->track = tl_->Track(absl::StrCat("sched ", g->name()));
  lanes_.push_back(std::move(lane));
  return *lanes_.back();
}

absl::StatusOr<WorkPtr> OpScheduler::SubmitReduction(const ReductionRequest& r) {
  if (r.group == nullptr) return absl::InvalidArgumentError("submitting a reduction: no group");
  if (r.kind != CollectiveKind::kAllReduce && r.kind != CollectiveKind::kReduceScatter) {
    return absl::InvalidArgumentError(
        absl::StrCat("submitting a reduction: ", CollectiveName(r.kind), " is not a reduction"));
  }
  InCall in_call;
  auto p = std::make_shared<Pending>();
  p->req = r;
  p->label = std::string(r.options.label);
  p->req.options.label = {};
  p->device = !r.group->buffer_ops().synchronous();
  if (p->device) p->ready.assign(r.options.ready_events.begin(), r.options.ready_events.end());
  p->req.options.ready_events = {};  // the span would dangle (device: kept in p->ready)
  p->ranks = r.kind == CollectiveKind::kReduceScatter ? r.group->size() : 1;
  p->parts = SplitReduction(r.count, DTypeSize(r.dtype), p->ranks, config_.credit_bytes);
  p->done = works_.Create(WorkInfo{r.group->name(), std::string(CollectiveName(r.kind)),
                                   static_cast<uint64_t>(r.bucket), p->label});
  WorkPtr done = p->done;
  Outbox out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_)
      return absl::FailedPreconditionError(
          "submitting a reduction: the scheduler is being destroyed");
    ++submitted_;
    LaneLocked(r.group).queue.push_back(std::move(p));
    PumpLocked(&out);
  }
  Deliver(&out);
  return done;
}

void OpScheduler::TrackUrgent(const WorkPtr& w, int64_t arg) {
  if (w == nullptr) return;
  InCall in_call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++urgent_in_flight_;
  }
  const int64_t start = tl_ != nullptr ? Timeline::NowNs() : 0;
  w->OnComplete([this, start, arg](const absl::Status&) {
    if (tl_ != nullptr) tl_->Complete(tl_urgent_, "gather [prio 0]", start, Timeline::NowNs(), arg);
    if (tls_in_call > 0) {  // inline on a caller that may hold its own lock: hand it over
      std::lock_guard<std::mutex> lock(mu_);
      deferred_.push_back(Issued{});
      cv_.notify_all();
      return;
    }
    OnUrgentDone();
  });
}

bool OpScheduler::UrgentActiveLocked() const {
  if (!config_.priorities || urgent_in_flight_ == 0) return false;
  return config_.hold == OpSchedulerConfig::Hold::kInFlight || waiting_ > 0;
}

void OpScheduler::OnUrgentDone() {
  Outbox out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --urgent_in_flight_;
    if (!UrgentActiveLocked()) holding_ = hold_expired_ = false;
    PumpLocked(&out);
  }
  cv_.notify_all();
  Deliver(&out);
}

OpScheduler::WaitScope::WaitScope(OpScheduler* s) : s_(s) {
  if (s_ == nullptr) return;
  std::lock_guard<std::mutex> lock(s_->mu_);
  ++s_->waiting_;
}

OpScheduler::WaitScope::~WaitScope() {
  if (s_ == nullptr) return;
  InCall in_call;  // the waiter may hold locks of its own (e.g. a unit scheduler's)
  s_->EndWait();
}

void OpScheduler::EndWait() {
  Outbox out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --waiting_;
    if (!UrgentActiveLocked()) holding_ = hold_expired_ = false;
    PumpLocked(&out);
  }
  cv_.notify_all();
  Deliver(&out);
}

void OpScheduler::PumpLocked(Outbox* out) {
  for (auto& lane : lanes_) PumpLaneLocked(*lane, out);
}

void OpScheduler::PumpLaneLocked(Lane& lane, Outbox* out) {
  while (!lane.queue.empty()) {
    std::shared_ptr<Pending> p = lane.queue.front();
    if (p->next >= p->parts.size()) {
      lane.queue.pop_front();
      continue;
    }
    const size_t part = p->next;
    const size_t bytes = p->PartBytes(part);
    if (config_.credit_bytes > 0 && lane.in_flight > 0 &&
        lane.in_flight_bytes + bytes > config_.credit_bytes) {
      return;  // credit: wait for what is in flight
    }
    if (UrgentActiveLocked() && !hold_expired_) {
      if (!holding_) {
        holding_ = true;
        hold_since_ = absl::Now();
        ++holds_;
        if (tl_ != nullptr)
          tl_->Instant(lane.track, "held [prio 1 behind prio 0]", p->req.bucket * 1000 + part);
        cv_.notify_all();  // the helper watches max_hold
      }
      return;
    }
    int slot = -1;
    if (p->Staged()) {
      slot = !lane.staging_busy[0] ? 0 : !lane.staging_busy[1] ? 1 : -1;
      if (slot < 0) return;  // both staging blocks in flight
    }
    absl::StatusOr<Issued> is = LaunchPartLocked(lane, p, static_cast<int>(part), slot);
    ++p->next;
    if (!is.ok()) {
      if (p->error.ok()) p->error = is.status();
      p->next = p->parts.size();  // the rest is skipped
      if (p->outstanding == 0) out->complete.emplace_back(p->done, p->error);
      lane.queue.pop_front();
      continue;
    }
    ++p->outstanding;
    ++lane.in_flight;
    lane.in_flight_bytes += bytes;
    if (slot >= 0) lane.staging_busy[slot] = true;
    ++partitions_issued_;
    out->issued.push_back(*std::move(is));
    if (p->next >= p->parts.size()) {
      if (p->device) ArmDeviceCompletionLocked(*p);
      lane.queue.pop_front();
    }
  }
}

void OpScheduler::ArmDeviceCompletionLocked(Pending& p) {
  // Every partition is on the group's comm stream: `done` completes (with that point's event
  // as its device_event) once the stream has run past the last one. A partition that fails
  // completes it first with its error (OnPartDone): the first completion wins.
  const absl::Status st =
      p.req.group->buffer_ops().CompleteAfter(p.done, absl::Now() + config_.timeout);
  if (st.ok()) {
    p.armed = true;
  } else if (p.error.ok()) {
    p.error = WithContext(st, absl::StrCat(p.label, ": completion after the last partition"));
  }
}

absl::StatusOr<OpScheduler::Issued> OpScheduler::LaunchPartLocked(Lane& lane,
                                                                  const std::shared_ptr<Pending>& p,
                                                                  int part, int slot) {
  const ReductionRequest& r = p->req;
  const PartRange pr = p->parts[part];
  const size_t es = DTypeSize(r.dtype);
  CollectiveOptions opts = r.options;
  opts.label = p->label;
  Group& g = *r.group;
  if (part == 0) {
    // Device: the comm stream waits for the producers before the first partition (its packing
    // copies included); later partitions follow it on the same stream.
    for (const DeviceEvent& e : p->ready) {
      const absl::Status st = g.buffer_ops().WaitFor(e);
      if (!st.ok())
        return WithContext(st, absl::StrCat(p->label, ": waiting for the readiness events"));
    }
  }
  absl::StatusOr<WorkPtr> w;
  if (r.kind == CollectiveKind::kAllReduce) {
    w = g.AllReduce(static_cast<const char*>(r.send) + pr.lo * es,
                    static_cast<char*>(r.recv) + pr.lo * es, pr.count(), r.dtype, r.op, opts);
  } else if (slot < 0) {
    w = g.ReduceScatter(r.send, r.recv, r.count, r.dtype, r.op, opts);
  } else {
    // Pack slice [lo, hi) of every rank's region into a contiguous block (exact copies).
    BufferOps& ops = g.buffer_ops();
    const size_t block = pr.count() * es;
    const size_t need = block * static_cast<size_t>(p->ranks);
    OwnedBuffer& st = lane.staging[slot];
    if (!st || st.bytes() < need) {
      st.Reset();
      ASSIGN_OR_RETURN(st,
                       CountedAllocate(config_.memory, ops, std::max(need, config_.credit_bytes),
                                       MemoryUse::kStaging, "scheduler partition staging"));
    }
    for (int k = 0; k < p->ranks; ++k) {
      RETURN_IF_ERROR(ops.Copy(
          st.get() + k * block,
          static_cast<const char*>(r.send) + (static_cast<size_t>(k) * r.count + pr.lo) * es,
          block));
    }
    w = g.ReduceScatter(st.get(), static_cast<char*>(r.recv) + pr.lo * es, pr.count(), r.dtype,
                        r.op, opts);
  }
  if (!w.ok()) {
    return absl::Status(w.status().code(),
                        absl::StrCat(p->label, " partition ", part, "/", p->parts.size(), ": ",
                                     w.status().message()));
  }
  return Issued{*std::move(w),
                p,
                &lane,
                part,
                slot,
                p->PartBytes(part),
                tl_ != nullptr ? Timeline::NowNs() : 0};
}

void OpScheduler::Deliver(Outbox* out) {
  for (Issued& is : out->issued) {
    WorkPtr w = is.work;
    w->OnComplete([this, is](const absl::Status& st) {
      if (tls_in_call > 0) {  // see tls_in_call
        std::lock_guard<std::mutex> lock(mu_);
        Issued d = is;
        d.status = st;
        deferred_.push_back(std::move(d));
        cv_.notify_all();
        return;
      }
      OnPartDone(is, st);
    });
  }
  if (out->complete.empty()) return;
  if (tls_in_call > 0) {  // the caller may hold a lock its completion callbacks take
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : out->complete) deferred_complete_.push_back(std::move(c));
    cv_.notify_all();
    return;
  }
  for (auto& [w, s] : out->complete) w->Complete(s);
}

void OpScheduler::OnPartDone(const Issued& is, const absl::Status& st) {
  if (tl_ != nullptr) {
    tl_->Complete(is.lane->track, PartName(is.pending->req.kind), is.start_ns, Timeline::NowNs(),
                  is.pending->req.bucket * 1000 + is.part);
  }
  Outbox out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Lane& lane = *is.lane;
    Pending& p = *is.pending;
    --lane.in_flight;
    lane.in_flight_bytes -= is.bytes;
    if (is.staging >= 0) lane.staging_busy[is.staging] = false;
    --p.outstanding;
    if (!st.ok() && p.error.ok()) p.error = st;
    // An armed device reduction completes through its stream event (success); errors now.
    if (p.outstanding == 0 && p.next >= p.parts.size() && (!p.armed || !p.error.ok())) {
      out.complete.emplace_back(p.done, p.error);
    }
    PumpLocked(&out);
  }
  cv_.notify_all();
  Deliver(&out);
}

void OpScheduler::HelperLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!deferred_complete_.empty()) {
      std::vector<std::pair<WorkPtr, absl::Status>> done;
      done.swap(deferred_complete_);
      lock.unlock();
      for (auto& [w, st] : done) w->Complete(st);
      lock.lock();
      continue;
    }
    if (!deferred_.empty()) {
      Issued d = std::move(deferred_.front());
      deferred_.pop_front();
      lock.unlock();
      if (d.work == nullptr) {
        OnUrgentDone();
      } else {
        OnPartDone(d, d.status);
      }
      lock.lock();
      continue;
    }
    if (stopping_) return;
    if (holding_ && UrgentActiveLocked() && !hold_expired_) {
      const absl::Time until = hold_since_ + config_.max_hold;
      if (absl::Now() >= until) {
        hold_expired_ = true;
        ++hold_expiries_;
        Outbox out;
        PumpLocked(&out);
        lock.unlock();
        Deliver(&out);
        lock.lock();
        continue;
      }
      cv_.wait_for(lock, absl::ToChronoNanoseconds(until - absl::Now()));
      continue;
    }
    cv_.wait(lock);
  }
}

int64_t OpScheduler::partitions_issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return partitions_issued_;
}
int64_t OpScheduler::reductions_submitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return submitted_;
}
int64_t OpScheduler::holds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return holds_;
}
int64_t OpScheduler::hold_expiries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hold_expiries_;
}

}  // namespace braid::sched
