#include "backends/gloo/gloo_group.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/gloo/gloo_collectives.h"
#include "backends/gloo/gloo_errors.h"
#include "backends/gloo/store_adapter.h"
#include "comm/status_macros.h"
#include "gloo/rendezvous/context.h"

namespace braid::gloo_backend {

absl::StatusOr<std::shared_ptr<::gloo::Context>> ConnectContext(GlooWorld& world,
                                                                const std::string& prefix, int rank,
                                                                int size) {
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(
      std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(world.timeout))));
  StoreAdapter store(*world.store, prefix);
  RETURN_IF_ERROR(
      GlooCall(absl::StrCat("gloo backend: connecting '", prefix, "' as rank ", rank, " of ", size,
                            " through the store at ", world.store->address()),
               [&] { ctx->connectFullMesh(store, world.device); }));
  return std::shared_ptr<::gloo::Context>(std::move(ctx));
}

Capabilities GlooGroup::GlooCapabilities() {
  Capabilities c;
  c.host_memory = true;
  c.async_progress = true;  // the worker thread completes Work without anyone waiting
  c.split = true;
  c.deterministic = false;  // Gloo's ring adds in its own order
  return c;
}

GlooGroup::GlooGroup(std::shared_ptr<GlooWorld> world, std::shared_ptr<::gloo::Context> context,
                     std::string name, std::string prefix, std::unique_ptr<SerialWorker> worker)
    : world_(std::move(world)),
      context_(std::move(context)),
      name_(std::move(name)),
      prefix_(std::move(prefix)),
      worker_(std::move(worker)) {
  if (world_->aborts != nullptr) {
    SetAbortDomain(world_->aborts->domain());
    world_->aborts->Register(context_, busy_);
  }
}

absl::StatusOr<std::unique_ptr<Group>> GlooGroup::Create(std::shared_ptr<GlooWorld> world,
                                                         std::shared_ptr<::gloo::Context> context,
                                                         std::string name, std::string prefix) {
  ASSIGN_OR_RETURN(std::unique_ptr<SerialWorker> worker,
                   SerialWorker::Start(absl::StrCat("group '", name, "'")));
  return std::unique_ptr<Group>(std::make_unique<GlooGroup>(
      std::move(world), std::move(context), std::move(name), std::move(prefix), std::move(worker)));
}

GlooGroup::~GlooGroup() = default;

namespace {

// Queues `args` (buffers kept alive by `keep`, if given) on `worker`; the Work completes on
// the worker thread with the collective's status.
// The job's abort, as `what`'s error (or OK while the job runs).
absl::Status Aborted(const std::shared_ptr<GlooAbortLink>& aborts, const std::string& what) {
  if (aborts == nullptr || !aborts->domain()->aborted()) return absl::OkStatus();
  const absl::Status cause = aborts->domain()->status();
  return absl::Status(cause.code(), absl::StrCat(what, ": ", cause.message()));
}

WorkPtr Enqueue(SerialWorker& worker, const std::shared_ptr<::gloo::Context>& ctx,
                const std::shared_ptr<GroupFailure>& failure, WorkInfo info, CollectiveArgs args,
                absl::Time deadline, absl::Duration spin, std::shared_ptr<void> keep,
                std::shared_ptr<GlooAbortLink> aborts, std::shared_ptr<std::atomic<bool>> busy) {
  WorkPtr work = Work::Create(std::move(info), spin);
  const bool half_wire = args.options.half_wire;
  args.options = CollectiveOptions{};  // holds views the caller does not keep alive
  args.options.half_wire = half_wire;
  worker.Post([work, args, ctx, failure, deadline, keep = std::move(keep),
               aborts = std::move(aborts), busy = std::move(busy)](bool run) {
    const std::string what = work->info().Describe();
    if (!run) {
      work->Complete(absl::CancelledError(absl::StrCat(what, ": the group was destroyed first")));
      return;
    }
    // Busy before the abort check, idle after the call, then close if aborted: either the
    // domain's listener saw this call idle and closed, or this task closes (gloo_abort.h).
    busy->store(true);
    if (absl::Status a = Aborted(aborts, what); !a.ok()) {
      busy->store(false);
      aborts->CloseIfAborted(*ctx);
      work->Complete(std::move(a));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(failure->mu);
      if (!failure->cause.ok()) {
        work->Complete(absl::Status(
            failure->cause.code(),
            absl::StrCat(what, ": the group failed earlier: ", failure->cause.message())));
        return;
      }
    }
    const absl::Duration left = deadline - absl::Now();
    absl::Status s =
        left <= absl::ZeroDuration()
            ? absl::DeadlineExceededError(absl::StrCat(what, ": deadline passed while queued"))
            : RunCollective(ctx, args, static_cast<uint32_t>(work->info().seq), left, what);
    busy->store(false);
    if (!s.ok()) {
      // A peer that aborted or left closed its connections, which can reach us before its
      // cause or leave notice does through the store: give the store a few polls before
      // blaming the connection (a leave notice is taken at once: the closed connection shows
      // the leaver is gone).
      if (aborts != nullptr && s.code() == absl::StatusCode::kUnavailable) {
        const absl::Time until = absl::Now() + 10 * GlooAbortLink::kPoll;
        while (!aborts->domain()->aborted() && !aborts->TakeLeaveNotice() && absl::Now() < until) {
          absl::SleepFor(absl::Milliseconds(2));
        }
      }
      // Closed by the job's abort: say why, not Gloo's "connection closed".
      if (absl::Status a = Aborted(aborts, what); !a.ok()) s = std::move(a);
      {
        std::lock_guard<std::mutex> lock(failure->mu);
        if (failure->cause.ok()) failure->cause = s;
      }
      if (aborts != nullptr) aborts->Report(s);  // a no-op once the job aborted
    }
    if (aborts != nullptr) aborts->CloseIfAborted(*ctx);
    work->Complete(std::move(s));
  });
  return work;
}

}  // namespace

absl::StatusOr<WorkPtr> GlooGroup::Launch(const CollectiveArgs& args) {
  if (args.kind != CollectiveKind::kBarrier) {
    // Refused before it takes a sequence number: the next call matches its peers as if this
    // one had not been made. (Error text only on the error path: this runs for every call.)
    const absl::Status s = CheckDType(args.dtype);
    if (!s.ok()) return WithContext(s, absl::StrCat(args.Describe(), " on group '", name_, "'"));
  }
  const absl::Duration timeout =
      args.options.timeout > absl::ZeroDuration() ? args.options.timeout : world_->timeout;
  WorkInfo info{name_, std::string(CollectiveName(args.kind)), next_seq_++,
                std::string(args.options.label)};
  return Enqueue(*worker_, context_, failure_, std::move(info), args, absl::Now() + timeout,
                 world_->spin, nullptr, world_->aborts, busy_);
}

absl::StatusOr<std::unique_ptr<Group>> GlooGroup::DoSplit(int color, int key, std::string name) {
  const uint64_t seq = next_seq_++;
  const std::string what =
      absl::StrCat("split #", seq, " of group '", name_, "' into '", name, "'");
  const absl::Time deadline = absl::Now() + world_->timeout;
  // Step 1: every rank's (color, key), on the worker behind queued collectives.
  auto table = std::make_shared<std::vector<int64_t>>(2 * static_cast<size_t>(size()) + 2);
  int64_t* mine = table->data() + 2 * size();
  mine[0] = color;
  mine[1] = key;
  CollectiveArgs a;
  a.kind = CollectiveKind::kAllGather;
  a.send = mine;
  a.recv = table->data();
  a.count = 2;
  a.dtype = DType::kI64;
  WorkPtr w = Enqueue(*worker_, context_, failure_, WorkInfo{name_, "split", seq, name}, a,
                      deadline, world_->spin, table, world_->aborts, busy_);
  // The task is bounded by `deadline` inside Gloo; a little slack for it to report.
  RETURN_IF_ERROR(w->WaitUntil(deadline + absl::Seconds(5)));
  // Step 2: the same table on every rank, so the same verdict everywhere.
  for (int r = 0; r < size(); ++r) {
    const int64_t c = (*table)[2 * r];
    if (c < 0 && c != kNoColor) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": rank ", r, " passed color ", c, " (colors are >= 0, or kNoColor)"));
    }
  }
  if (color == kNoColor) return std::unique_ptr<Group>();
  std::vector<std::pair<int64_t, int>> members;  // (key, old rank)
  for (int r = 0; r < size(); ++r) {
    if ((*table)[2 * r] == color) members.emplace_back((*table)[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank()) new_rank = static_cast<int>(i);
  }
  const std::string prefix = absl::StrCat(prefix_, "/split", seq, "/", color);
  absl::StatusOr<std::shared_ptr<::gloo::Context>> ctx =
      ConnectContext(*world_, prefix, new_rank, static_cast<int>(members.size()));
  if (!ctx.ok()) return WithContext(ctx.status(), what);
  return GlooGroup::Create(world_, *std::move(ctx), std::move(name), prefix);
}

}  // namespace braid::gloo_backend
