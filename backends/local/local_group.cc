#include "backends/local/local_group.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/logging.h"
#include "comm/reduce_kernels.h"
#include "comm/spin.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"

namespace braid::local {

class LocalComm {
 public:
  LocalComm(std::string name, std::vector<int> world_ranks, absl::Duration timeout,
            absl::Duration spin, const LocalWorld& world)
      : name_(std::move(name)),
        world_ranks_(std::move(world_ranks)),
        timeout_(timeout),
        spin_(spin),
        faults_(world.faults),
        world_(world),
        barrier_(static_cast<int>(world_ranks_.size()), spin),
        posted_{std::vector<Posted>(world_ranks_.size()), std::vector<Posted>(world_ranks_.size())},
        split_children_(world_ranks_.size()),
        busy_(new std::atomic<bool>[world_ranks_.size()]) {
    for (size_t r = 0; r < world_ranks_.size(); ++r) busy_[r].store(false);
    if (world_.domain != nullptr) {
      // The job aborted: waiters at this group's barrier stop, later ops fail at once.
      abort_sub_ = world_.domain->Subscribe([this](const absl::Status& cause) {
        barrier_.Fail(
            absl::Status(cause.code(), absl::StrCat("group '", name_, "': ", cause.message())));
      });
    }
  }

  // A failed op of rank `world_rank` aborts the job (if so configured).
  void ReportFailure(int world_rank, const absl::Status& s) const {
    if (!s.ok() && world_.abort_on_failure && world_.domain != nullptr) {
      world_.domain->Abort(world_rank, s);
    }
  }

  int size() const { return static_cast<int>(world_ranks_.size()); }

  const std::string name_;
  const std::vector<int> world_ranks_;  // group rank -> world rank
  const absl::Duration timeout_;
  const absl::Duration spin_;
  const std::shared_ptr<FaultInjector> faults_;
  const LocalWorld world_;
  RankBarrier barrier_;
  // posted_[seq % 2][r] is written only by rank r, before barrier A of op `seq`, and read by
  // all ranks after it. Two generations: a rank that finished op s may post op s+1 while a
  // peer still reads op s (a barrier has no phase after A), but it cannot post op s+2 before
  // every rank has arrived at op s+1, i.e. finished reading op s.
  std::vector<Posted> posted_[2];

  std::vector<Posted>& slots(uint64_t seq) { return posted_[seq & 1]; }
  // Written by the leader of each split color between A and B, read by members after B.
  std::vector<std::shared_ptr<LocalComm>> split_children_;
  // busy_[r]: rank r has posted an op and may be reading or writing peers' buffers. When an
  // op fails, a rank waits for every peer's flag to clear before completing its Work: the
  // caller may free its buffers as soon as Wait() returns, error or not.
  std::unique_ptr<std::atomic<bool>[]> busy_;

  // After the barrier failed: returns once no peer is inside an op, however long that takes.
  // A peer past the rendezvous may still read or write this rank's buffers, which the caller
  // may free as soon as the Work completes, so giving up would be a use after free (fuzz
  // finding 9, docs/hardening.md). It ends: a peer blocked in the failed barrier returns at
  // once, and a data phase is finite memory work (a peer descheduled mid-copy resumes).
  // `warn_after`: when to log that a peer is still inside.
  void WaitForPeersToLeave(int rank, absl::Duration warn_after) const {
    const absl::Time warn_at = absl::Now() + warn_after;
    bool warned = false;
    for (int k = 0; k < size(); ++k) {
      while (k != rank && busy_[k].load(std::memory_order_acquire)) {
        if (!warned && absl::Now() > warn_at) {
          Log().warn(
              "group '{}': rank {} still inside an op {} after the group failed; rank {} waits "
              "for it to leave before its Work completes (the op may use its buffers)",
              name_, world_ranks_[k], absl::FormatDuration(warn_after), world_ranks_[rank]);
          warned = true;
        }
        absl::SleepFor(absl::Microseconds(50));
      }
    }
  }

  // Last: unsubscribed first, so the listener never sees a half-destroyed comm.
  AbortDomain::Subscription abort_sub_;
};

std::shared_ptr<LocalComm> MakeLocalComm(std::string name, std::vector<int> world_ranks,
                                         absl::Duration timeout, absl::Duration spin,
                                         const LocalWorld& world) {
  return std::make_shared<LocalComm>(std::move(name), std::move(world_ranks), timeout, spin, world);
}

namespace {

constexpr size_t kChunkAlignBytes = 64;

// Chunk of an all-reduce owned by rank r: [lo, hi), cache-line aligned.
void ChunkRange(size_t count, size_t esize, int n, int r, size_t* lo, size_t* hi) {
  const size_t align = std::max<size_t>(1, kChunkAlignBytes / esize);
  size_t per = (count + n - 1) / n;
  per = (per + align - 1) / align * align;
  *lo = std::min(count, per * static_cast<size_t>(r));
  *hi = std::min(count, *lo + per);
}

bool SameCall(const Posted& a, const Posted& b) {
  if (a.split != b.split) return false;
  if (a.split) return true;
  const CollectiveArgs& x = a.args;
  const CollectiveArgs& y = b.args;
  if (x.kind != y.kind) return false;
  if (x.kind == CollectiveKind::kBarrier) return true;
  if (x.count != y.count || x.dtype != y.dtype) return false;
  if ((x.kind == CollectiveKind::kAllReduce || x.kind == CollectiveKind::kReduceScatter) &&
      x.op.kind != y.op.kind) {
    return false;
  }
  return x.kind != CollectiveKind::kBroadcast || x.root == y.root;
}

std::string DescribePosted(const Posted& p) {
  return p.split ? std::string("split") : p.args.Describe();
}

}  // namespace

LocalGroup::LocalGroup(std::shared_ptr<LocalComm> comm, int rank)
    : comm_(std::move(comm)),
      rank_(rank),
      in_(comm_->size()),
      out_(comm_->size()),
      scalars_(comm_->size()) {
  SetAbortDomain(comm_->world_.domain);
}

absl::StatusOr<std::unique_ptr<Group>> LocalGroup::Start(std::shared_ptr<LocalComm> comm,
                                                         int rank) {
  std::unique_ptr<LocalGroup> g(new LocalGroup(std::move(comm), rank));
  LocalGroup* p = g.get();
  RETURN_IF_ERROR(StartThread(&p->worker_,
                              absl::StrCat("rank ", p->world_rank(), " of group '", p->name(), "'"),
                              [p] { p->WorkerLoop(); }));
  return std::unique_ptr<Group>(std::move(g));
}

LocalGroup::~LocalGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    // Whatever happens next, peers must not wait for this rank: with work in flight they
    // fail now; otherwise any later collective of theirs fails fast instead of timing out.
    const bool busy = running_op_ || !queue_.empty();
    const absl::Status cause = absl::CancelledError(
        absl::StrCat("rank ", comm_->world_ranks_[rank_], " destroyed its handle of group '",
                     comm_->name_, "'", busy ? " with work in flight" : ""));
    comm_->barrier_.Fail(cause);
    // Peers waiting on other groups for this rank would wait out their deadlines.
    if (busy) comm_->ReportFailure(comm_->world_ranks_[rank_], cause);
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();  // not when Start could not start it
}

int LocalGroup::size() const { return comm_->size(); }
int LocalGroup::world_rank() const { return comm_->world_ranks_[rank_]; }
const std::string& LocalGroup::name() const { return comm_->name_; }

Capabilities LocalGroup::LocalCapabilities() {
  Capabilities c;
  c.native_avg = true;
  c.native_premul_sum = true;
  c.native_half = true;
  c.deterministic = true;
  return c;
}
Capabilities LocalGroup::capabilities() const { return LocalCapabilities(); }

WorkPtr LocalGroup::Enqueue(Op op, std::string label) {
  WorkPtr work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = next_seq_++;
    std::string op_name =
        op.posted.split ? std::string("split") : std::string(CollectiveName(op.posted.args.kind));
    work = works_.Create(WorkInfo{comm_->name_, std::move(op_name), seq, std::move(label)},
                         comm_->spin_);
    op.work = work;
    queue_.push_back(std::move(op));
  }
  cv_.notify_one();
  return work;
}

absl::StatusOr<WorkPtr> LocalGroup::Launch(const CollectiveArgs& args) {
  Op op;
  op.posted.args = args;
  op.posted.args.options.label = {};  // the label lives in the Work; don't keep the view
  WorkPtr w = Enqueue(std::move(op), std::string(args.options.label));
  return w;
}

absl::StatusOr<std::unique_ptr<Group>> LocalGroup::DoSplit(int color, int key, std::string name) {
  auto result = std::make_shared<std::shared_ptr<LocalComm>>();
  Op op;
  op.posted.split = true;
  op.posted.color = color;
  op.posted.key = key;
  op.posted.split_name = std::move(name);
  op.split_result = result;
  WorkPtr w = Enqueue(std::move(op), "");
  // The worker's barriers carry the deadline; this wait only adds a margin.
  RETURN_IF_ERROR(w->Wait(comm_->timeout_ + absl::Seconds(5)));
  std::shared_ptr<LocalComm> child = std::move(*result);
  if (child == nullptr) return std::unique_ptr<Group>();
  const auto& members = child->world_ranks_;
  const int my_world = comm_->world_ranks_[rank_];
  const int child_rank =
      static_cast<int>(std::find(members.begin(), members.end(), my_world) - members.begin());
  return Start(std::move(child), child_rank);
}

void LocalGroup::WorkerLoop() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queue_.empty() && !stopping_) {
        lock.unlock();
        SpinUntil(
            [this] {
              std::lock_guard<std::mutex> l(mu_);
              return !queue_.empty() || stopping_;
            },
            absl::ToInt64Nanoseconds(comm_->spin_));
        lock.lock();
        cv_.wait(lock, [this] { return !queue_.empty() || stopping_; });
      }
      if (queue_.empty()) return;  // stopping and drained
      op = queue_.pop_front();
      running_op_ = true;
    }
    absl::Status s = Execute(op);
    comm_->ReportFailure(comm_->world_ranks_[rank_], s);
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_op_ = false;
    }
    op.work->Complete(std::move(s));
    op = Op();  // release the Work now, not when the next op arrives
  }
}

absl::Status LocalGroup::Execute(Op& op) {
  const WorkInfo& info = op.work->info();
  const int world_rank = comm_->world_ranks_[rank_];
  const absl::Duration timeout = op.posted.args.options.timeout > absl::ZeroDuration()
                                     ? op.posted.args.options.timeout
                                     : comm_->timeout_;
  copy_stall_ = absl::ZeroDuration();
  if (comm_->faults_ != nullptr) {
    if (auto fault = comm_->faults_->Take(world_rank, comm_->name_, info.seq)) {
      if (fault->kind == Fault::Kind::kFail) {
        absl::Status s = absl::InternalError(
            absl::StrCat(info.Describe(), ": rank ", world_rank, " failed: ", fault->message));
        comm_->barrier_.Fail(s);
        return s;
      }
      if (fault->kind == Fault::Kind::kStallInCopy) {
        copy_stall_ = fault->stall;  // RunCollective sleeps it after the rendezvous
      } else {
        const absl::Time until = absl::Now() + fault->stall;
        while (absl::Now() < until && !comm_->barrier_.failed())
          absl::SleepFor(absl::Milliseconds(1));
      }
    }
  }
  // A failed group takes no more calls: nothing is posted into slots peers may still read.
  if (comm_->barrier_.failed()) return comm_->barrier_.failure();
  const absl::Time deadline = absl::Now() + timeout;
  op.work->MarkStarted();  // this rank joins the collective (the flight recorder's "started")
  std::vector<Posted>& posted = comm_->slots(info.seq);
  posted[rank_] = op.posted;
  comm_->busy_[rank_].store(true, std::memory_order_release);
  absl::Status s = RunPhases(op, posted, deadline, info);
  comm_->busy_[rank_].store(false, std::memory_order_release);
  if (!s.ok() && comm_->barrier_.failed()) {
    comm_->WaitForPeersToLeave(rank_, std::max(timeout, comm_->timeout_));
  }
  return s;
}

absl::Status LocalGroup::RunPhases(const Op& op, const std::vector<Posted>& posted,
                                   absl::Time deadline, const WorkInfo& info) {
  RETURN_IF_ERROR(comm_->barrier_.Arrive(rank_, deadline, info, comm_->world_ranks_));
  // Every rank sees the same slots, so every rank reaches the same verdict.
  RETURN_IF_ERROR(CheckSameCall(posted, info));
  if (op.posted.split) return RunSplit(op, posted, deadline, info);
  return RunCollective(op.posted.args, posted, deadline, info);
}

absl::Status LocalGroup::CheckSameCall(const std::vector<Posted>& posted,
                                       const WorkInfo& info) const {
  for (int r = 1; r < comm_->size(); ++r) {
    if (!SameCall(posted[0], posted[r])) {
      std::vector<std::string> calls;
      for (int k = 0; k < comm_->size(); ++k) {
        calls.push_back(
            absl::StrCat("rank ", comm_->world_ranks_[k], ": ", DescribePosted(posted[k])));
      }
      return absl::InvalidArgumentError(
          absl::StrCat(info.Describe(),
                       ": ranks called different collectives (the rank-order contract "
                       "was broken or arguments differ): ",
                       absl::StrJoin(calls, "; ")));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalGroup::RunCollective(const CollectiveArgs& a, const std::vector<Posted>& posted,
                                       absl::Time deadline, const WorkInfo& info) {
  const int n = comm_->size();
  auto& barrier = comm_->barrier_;
  const size_t es = DTypeSize(a.dtype);
  char* recv = static_cast<char*>(a.recv);
  if (copy_stall_ > absl::ZeroDuration()) absl::SleepFor(copy_stall_);  // injected (tests)
  switch (a.kind) {
    case CollectiveKind::kBarrier:
      return absl::OkStatus();
    case CollectiveKind::kAllReduce: {
      // Rank r alone reads chunk r of every input and writes it, reduced, into every rank's
      // output: no other rank touches chunk r, so this is safe in place too, and one barrier
      // ends the op.
      std::vector<const void*>& in = in_;
      std::vector<void*>& out = out_;
      std::vector<double>& scalars = scalars_;
      size_t lo, hi;
      ChunkRange(a.count, es, n, rank_, &lo, &hi);
      for (int k = 0; k < n; ++k) {
        in[k] = static_cast<const char*>(posted[k].args.send) + lo * es;
        out[k] = static_cast<char*>(posted[k].args.recv) + lo * es;
        scalars[k] = posted[k].args.op.scalar;
      }
      if (hi > lo) {
        ReduceIntoMany(in.data(), n, out.data(), n, hi - lo, a.dtype, a.op, n, scalars.data());
      }
      break;
    }
    case CollectiveKind::kReduceScatter: {
      std::vector<const void*>& in = in_;
      std::vector<double>& scalars = scalars_;
      for (int k = 0; k < n; ++k) {
        in[k] = static_cast<const char*>(posted[k].args.send) +
                static_cast<size_t>(rank_) * a.count * es;
        scalars[k] = posted[k].args.op.scalar;
      }
      if (a.count > 0) ReduceInto(in.data(), n, recv, a.count, a.dtype, a.op, n, scalars.data());
      break;
    }
    case CollectiveKind::kAllGather: {
      const size_t block = a.count * es;
      for (int k = 0; k < n; ++k) {
        if (k == rank_ && a.in_place) continue;
        if (block > 0) std::memcpy(recv + k * block, posted[k].args.send, block);
      }
      break;
    }
    case CollectiveKind::kBroadcast: {
      if (rank_ != a.root && a.count > 0) {
        std::memcpy(recv, posted[a.root].args.send, a.count * es);
      }
      break;
    }
  }
  if (n == 1) return absl::OkStatus();
  return barrier.Arrive(rank_, deadline, info, comm_->world_ranks_);
}

absl::Status LocalGroup::RunSplit(const Op& op, const std::vector<Posted>& posted,
                                  absl::Time deadline, const WorkInfo& info) {
  const int n = comm_->size();
  for (int r = 0; r < n; ++r) {
    if (posted[r].color < kNoColor) {
      return absl::InvalidArgumentError(absl::StrCat(
          "split of group '", comm_->name_, "': rank ", comm_->world_ranks_[r], " passed color ",
          posted[r].color, "; a color must be >= 0, or kNoColor (-1) to join no group"));
    }
  }
  const int color = op.posted.color;
  if (color != kNoColor) {
    // Members of my color, ordered by (key, rank): identical on every member.
    std::vector<int> members;
    for (int r = 0; r < n; ++r) {
      if (posted[r].color == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(),
                     [&](int x, int y) { return posted[x].key < posted[y].key; });
    if (members.front() == rank_) {
      std::vector<int> world;
      for (int r : members) world.push_back(comm_->world_ranks_[r]);
      comm_->split_children_[rank_] = MakeLocalComm(posted[rank_].split_name, std::move(world),
                                                    comm_->timeout_, comm_->spin_, comm_->world_);
    }
    RETURN_IF_ERROR(comm_->barrier_.Arrive(rank_, deadline, info, comm_->world_ranks_));
    *op.split_result = comm_->split_children_[members.front()];
    RETURN_IF_ERROR(comm_->barrier_.Arrive(rank_, deadline, info, comm_->world_ranks_));
    if (members.front() == rank_) comm_->split_children_[rank_].reset();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(comm_->barrier_.Arrive(rank_, deadline, info, comm_->world_ranks_));
  return comm_->barrier_.Arrive(rank_, deadline, info, comm_->world_ranks_);
}

}  // namespace braid::local
