#include "tests/nccl/fake_nccl_api.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/nccl/nccl_types.h"
#include "comm/reduce_kernels.h"
#include "tests/nccl/fake_nccl_reduce.h"

namespace braid::nccl::testing {

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

struct FakeNcclApi::Op {
  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;  // builtin, or ncclNumOps for a pre-mul-sum
  double scalar = 1.0;       // pre-mul-sum scalar as NCCL decoded it
  int root = 0;
  Comm* comm = nullptr;
  cudaStream_t stream = nullptr;
};

struct FakeNcclApi::SplitSlot {
  explicit SplitSlot(int n)
      : color(n), key(n), out(n, nullptr), posted(n, false), child_blocking(n) {}
  std::vector<int> color, key;
  std::vector<ncclComm_t*> out;
  std::vector<bool> posted;
  std::vector<bool> child_blocking;
  std::vector<std::string> child_name{std::vector<std::string>(posted.size())};
  bool resolved = false;
};

struct FakeNcclApi::Clique {
  std::string key;
  int n = 0;
  std::vector<Comm*> members;
  struct Slot {
    std::vector<Op> posted;
    std::vector<bool> has;
    bool executed = false;
  };
  std::map<uint64_t, Slot> ops;
  std::map<uint64_t, std::unique_ptr<SplitSlot>> splits;
  int joined() const {
    return static_cast<int>(
        std::count_if(members.begin(), members.end(), [](Comm* c) { return c != nullptr; }));
  }
};

struct FakeNcclApi::Comm {
  enum class State { kLive, kFinalizing, kFinalized, kDestroyed, kAborted };
  int id = 0;
  Clique* clique = nullptr;
  int rank = 0;
  bool blocking = true;
  std::string name;
  State state = State::kLive;
  int polls_left = 0;
  bool waiting_init = false;
  SplitSlot* waiting_split = nullptr;
  std::vector<Op> deferred;  // nonblocking: reach the stream when the state leaves InProgress
  ncclResult_t async = ncclSuccess;
  std::string last_error;
  uint64_t next_op = 0;
  uint64_t next_split = 0;
  int next_premul = 0;
  std::map<int, std::pair<double, ncclDataType_t>> premul;
  bool freed() const { return state == State::kDestroyed || state == State::kAborted; }
};

namespace {

DType FromNccl(ncclDataType_t t) {
  switch (t) {
    case ncclFloat64:
      return DType::kF64;
    case ncclBfloat16:
      return DType::kBF16;
    case ncclFloat16:
      return DType::kF16;
    case ncclInt32:
      return DType::kI32;
    case ncclInt64:
      return DType::kI64;
    case ncclUint8:
      return DType::kU8;
    default:
      return DType::kF32;
  }
}

bool KnownType(ncclDataType_t t) {
  return t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 || t == ncclFloat16 ||
         t == ncclInt32 || t == ncclInt64 || t == ncclUint8;
}

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "AllReduce";
    case Kind::kReduceScatter:
      return "ReduceScatter";
    case Kind::kAllGather:
      return "AllGather";
    case Kind::kBroadcast:
      return "Broadcast";
  }
  return "?";
}

constexpr auto kBlockingWait = std::chrono::seconds(60);

}  // namespace

FakeNcclApi::FakeNcclApi(std::shared_ptr<FakeCudaApi> cuda) : cuda_(std::move(cuda)) {}
FakeNcclApi::~FakeNcclApi() = default;

void FakeNcclApi::ViolationLocked(std::string what) { violations_.push_back(std::move(what)); }

FakeNcclApi::Comm* FakeNcclApi::FindLocked(ncclComm_t c) const {
  auto it = comms_.find(reinterpret_cast<Comm*>(c));
  return it == comms_.end() ? nullptr : it->second.get();
}

bool FakeNcclApi::BusyLocked(const Comm& c) const {
  if (c.polls_left > 0) return true;
  if (c.waiting_init && c.clique->joined() < c.clique->n) return true;
  if (c.waiting_split != nullptr && !c.waiting_split->resolved) return true;
  return false;
}

ncclResult_t FakeNcclApi::FailInjectedLocked(const char* name) {
  auto it = fail_next_.find(name);
  if (it == fail_next_.end()) return ncclSuccess;
  const ncclResult_t rc = it->second;
  fail_next_.erase(it);
  return rc;
}

ncclResult_t FakeNcclApi::CheckCallLocked(ncclComm_t c, const char* name, Comm** out) {
  Comm* comm = FindLocked(c);
  if (comm == nullptr) {
    ViolationLocked(absl::StrCat(name, " on an unknown communicator"));
    return ncclInvalidArgument;
  }
  if (comm->freed()) {
    ViolationLocked(absl::StrCat(name, " on communicator c", comm->id, " after it was freed"));
    return ncclInvalidUsage;
  }
  if (comm->state == Comm::State::kFinalized || comm->state == Comm::State::kFinalizing) {
    ViolationLocked(absl::StrCat(name, " on communicator c", comm->id, " after finalize"));
    return ncclInvalidUsage;
  }
  if (!comm->blocking && BusyLocked(*comm)) {
    ViolationLocked(absl::StrCat(name, " on communicator c", comm->id, " while ncclInProgress"));
    return ncclInvalidUsage;
  }
  *out = comm;
  const ncclResult_t injected = FailInjectedLocked(name);
  if (injected != ncclSuccess) {
    comm->last_error = absl::StrCat("injected failure of ", name);
    return injected;
  }
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::GetUniqueId(ncclUniqueId* id) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  const ncclResult_t injected = FailInjectedLocked("GetUniqueId");
  if (injected != ncclSuccess) return injected;
  std::memset(id->internal, 0, sizeof id->internal);
  const std::string s = absl::StrCat("fake-nccl-id-", next_id_++);
  std::memcpy(id->internal, s.data(), s.size());
  return ncclSuccess;
}

FakeNcclApi::Comm* FakeNcclApi::NewCommLocked(Clique* clique, int rank, bool blocking,
                                              std::string name) {
  auto c = std::make_unique<Comm>();
  c->id = ++comms_created_;
  c->clique = clique;
  c->rank = rank;
  c->blocking = blocking;
  c->name = std::move(name);
  Comm* raw = c.get();
  comms_.emplace(raw, std::move(c));
  clique->members[rank] = raw;
  return raw;
}

ncclResult_t FakeNcclApi::CommInitRankConfig(ncclComm_t* comm, int nranks, const ncclUniqueId& id,
                                             int rank, ncclConfig_t* config) {
  std::unique_lock<std::mutex> lock(cuda_->mu());
  *comm = nullptr;
  if (config == nullptr || config->magic != 0xcafebeef) {
    ViolationLocked("CommInitRankConfig with a config not from NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  const ncclResult_t injected = FailInjectedLocked("CommInitRankConfig");
  if (injected != ncclSuccess) return injected;
  const std::string key(id.internal, NCCL_UNIQUE_ID_BYTES);
  auto& slot = cliques_[key];
  if (slot == nullptr) {
    slot = std::make_unique<Clique>();
    slot->key = key;
    slot->n = nranks;
    slot->members.assign(nranks, nullptr);
  }
  Clique* clique = slot.get();
  if (clique->n != nranks || rank < 0 || rank >= nranks || clique->members[rank] != nullptr) {
    return ncclInvalidArgument;
  }
  const bool blocking = config->blocking != 0;  // NCCL_CONFIG_UNDEF_INT counts as blocking
  Comm* c =
      NewCommLocked(clique, rank, blocking, config->commName != nullptr ? config->commName : "");
  *comm = reinterpret_cast<ncclComm_t>(c);
  cv_.notify_all();
  if (!blocking) {
    c->waiting_init = true;
    c->polls_left = in_progress_polls_;
    return ncclInProgress;
  }
  // Blocking: NCCL returns once every rank has joined.
  if (!cv_.wait_for(lock, kBlockingWait, [&] { return clique->joined() == clique->n; })) {
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  if (c == nullptr || c->freed()) {
    ViolationLocked("CommGetAsyncError on a freed or unknown communicator");
    return ncclInvalidArgument;
  }
  if (c->async != ncclSuccess) {
    *async_error = c->async;
    return ncclSuccess;
  }
  if (BusyLocked(*c)) {
    if (c->polls_left > 0) --c->polls_left;
    *async_error = ncclInProgress;
    return ncclSuccess;
  }
  c->waiting_init = false;
  c->waiting_split = nullptr;
  if (c->state == Comm::State::kFinalizing) c->state = Comm::State::kFinalized;
  std::vector<Op> deferred;
  deferred.swap(c->deferred);
  for (Op& op : deferred) SubmitLocked(c, std::move(op));
  *async_error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* child,
                                    ncclConfig_t* config) {
  std::unique_lock<std::mutex> lock(cuda_->mu());
  Comm* c = nullptr;
  if (const ncclResult_t rc = CheckCallLocked(comm, "CommSplit", &c); rc != ncclSuccess) {
    return rc;
  }
  if (config == nullptr || config->magic != 0xcafebeef) {
    ViolationLocked("CommSplit with a config not from NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return ncclInvalidArgument;
  *child = nullptr;
  Clique* clique = c->clique;
  const uint64_t index = c->next_split++;
  auto& slot = clique->splits[index];
  if (slot == nullptr) slot = std::make_unique<SplitSlot>(clique->n);
  SplitSlot* s = slot.get();
  s->color[c->rank] = color;
  s->key[c->rank] = key;
  s->out[c->rank] = child;
  s->posted[c->rank] = true;
  s->child_blocking[c->rank] = config->blocking != 0;
  s->child_name[c->rank] = config->commName != nullptr ? config->commName : "";
  if (std::all_of(s->posted.begin(), s->posted.end(), [](bool b) { return b; })) {
    ResolveSplitLocked(clique, index);
  }
  if (!c->blocking) {
    c->waiting_split = s;
    c->polls_left = in_progress_polls_;
    return ncclInProgress;
  }
  if (!cv_.wait_for(lock, kBlockingWait, [&] { return s->resolved; })) return ncclSystemError;
  return ncclSuccess;
}

void FakeNcclApi::ResolveSplitLocked(Clique* parent, uint64_t index) {
  SplitSlot* s = parent->splits[index].get();
  std::map<int, std::vector<int>> by_color;  // color -> old ranks
  for (int r = 0; r < parent->n; ++r) {
    if (s->color[r] >= 0) by_color[s->color[r]].push_back(r);
  }
  for (auto& [color, ranks] : by_color) {
    std::stable_sort(ranks.begin(), ranks.end(),
                     [&](int a, int b) { return s->key[a] < s->key[b]; });
    auto clique = std::make_unique<Clique>();
    clique->key = absl::StrCat(parent->key.c_str(), "/split", index, "/", color);
    clique->n = static_cast<int>(ranks.size());
    clique->members.assign(ranks.size(), nullptr);
    Clique* raw = clique.get();
    cliques_[clique->key] = std::move(clique);
    for (size_t new_rank = 0; new_rank < ranks.size(); ++new_rank) {
      const int old = ranks[new_rank];
      Comm* child = NewCommLocked(raw, static_cast<int>(new_rank), s->child_blocking[old],
                                  s->child_name[old]);
      if (!child->blocking) child->polls_left = in_progress_polls_;
      *s->out[old] = reinterpret_cast<ncclComm_t>(child);
    }
  }
  s->resolved = true;
  cv_.notify_all();
}

ncclResult_t FakeNcclApi::CommFinalize(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = nullptr;
  if (const ncclResult_t rc = CheckCallLocked(comm, "CommFinalize", &c); rc != ncclSuccess) {
    return rc;
  }
  if (!c->blocking) {
    c->state = Comm::State::kFinalizing;
    c->polls_left = in_progress_polls_;
    return ncclInProgress;
  }
  c->state = Comm::State::kFinalized;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommDestroy(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  if (c == nullptr || c->freed()) {
    ViolationLocked("CommDestroy of a freed or unknown communicator");
    return ncclInvalidArgument;
  }
  if (!c->blocking && BusyLocked(*c)) {
    ViolationLocked(absl::StrCat("CommDestroy on communicator c", c->id, " while ncclInProgress"));
  }
  if (c->state == Comm::State::kFinalized) ++comms_finalized_;
  c->state = Comm::State::kDestroyed;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommAbort(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  if (c == nullptr || c->freed()) {
    ViolationLocked("CommAbort of a freed or unknown communicator");
    return ncclInvalidArgument;
  }
  c->state = Comm::State::kAborted;
  ++comms_aborted_;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommCount(ncclComm_t comm, int* count) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = nullptr;
  if (const ncclResult_t rc = CheckCallLocked(comm, "CommCount", &c); rc != ncclSuccess) return rc;
  *count = c->clique->n;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommUserRank(ncclComm_t comm, int* rank) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = nullptr;
  if (const ncclResult_t rc = CheckCallLocked(comm, "CommUserRank", &c); rc != ncclSuccess) {
    return rc;
  }
  *rank = c->rank;
  return ncclSuccess;
}

const char* FakeNcclApi::GetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (fake)";
    case ncclSystemError:
      return "unhandled system error (fake)";
    case ncclInternalError:
      return "internal error (fake)";
    case ncclInvalidArgument:
      return "invalid argument (fake)";
    case ncclInvalidUsage:
      return "invalid usage (fake)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (fake)";
    case ncclInProgress:
      return "NCCL operation in progress (fake)";
    default:
      return "unknown result code (fake)";
  }
}

const char* FakeNcclApi::GetLastError(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  return c == nullptr ? "" : c->last_error.c_str();
}

ncclResult_t FakeNcclApi::GroupStart() {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  ++groups_[std::this_thread::get_id()].depth;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::GroupEnd() {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  ThreadGroup& g = groups_[std::this_thread::get_id()];
  if (g.depth == 0) {
    ViolationLocked("GroupEnd without GroupStart");
    return ncclInvalidUsage;
  }
  if (--g.depth > 0) return ncclSuccess;
  std::vector<Op> ops;
  ops.swap(g.ops);
  ++group_ends_;
  ops_per_group_.push_back(static_cast<int>(ops.size()));
  cuda_->LogLocked(absl::StrCat("GroupEnd(", ops.size(), " ops)"));
  const ncclResult_t injected = FailInjectedLocked("GroupEnd");
  if (injected != ncclSuccess) {
    for (Op& op : ops) op.comm->last_error = "injected failure of GroupEnd";
    return injected;
  }
  bool in_progress = false;
  for (Op& op : ops) {
    Comm* c = op.comm;
    if (c->freed()) {
      ViolationLocked("GroupEnd with a call on a freed communicator");
      continue;
    }
    if (!c->blocking) {
      c->deferred.push_back(std::move(op));
      c->polls_left = in_progress_polls_;
      in_progress = true;
      if (in_progress_polls_ == 0) {
        std::vector<Op> d;
        d.swap(c->deferred);
        for (Op& o : d) SubmitLocked(c, std::move(o));
      }
    } else {
      SubmitLocked(c, std::move(op));
    }
  }
  return in_progress ? ncclInProgress : ncclSuccess;
}

ncclResult_t FakeNcclApi::CollectiveLocked(Op op, const char* name) {
  Comm* c = nullptr;
  if (const ncclResult_t rc = CheckCallLocked(reinterpret_cast<ncclComm_t>(op.comm), name, &c);
      rc != ncclSuccess) {
    return rc;
  }
  if (!KnownType(op.type)) return ncclInvalidArgument;
  if (op.op >= ncclNumOps) {
    auto it = c->premul.find(static_cast<int>(op.op));
    if (it == c->premul.end()) {
      ViolationLocked(absl::StrCat(name, " with unknown reduction op ", static_cast<int>(op.op)));
      return ncclInvalidArgument;
    }
    if (it->second.second != op.type) return ncclInvalidArgument;
    op.scalar = it->second.first;
  }
  if (op.root < 0 || op.root >= c->clique->n) return ncclInvalidArgument;
  cuda_->LogLocked(absl::StrCat(name, "(c", c->id, ",", cuda_->Name(op.stream), ")"));
  ThreadGroup& g = groups_[std::this_thread::get_id()];
  if (g.depth > 0) {
    g.ops.push_back(std::move(op));
    return ncclSuccess;
  }
  ops_per_group_.push_back(1);
  if (!c->blocking) {
    c->deferred.push_back(std::move(op));
    c->polls_left = in_progress_polls_;
    return ncclInProgress;
  }
  SubmitLocked(c, std::move(op));
  return ncclSuccess;
}

void FakeNcclApi::SubmitLocked(Comm* c, Op op) {
  const uint64_t index = c->next_op++;
  Clique* clique = c->clique;
  const int rank = c->rank;
  const cudaStream_t stream = op.stream;
  cuda_->EnqueueLocked(stream, [this, clique, index, rank, op = std::move(op)] {
    return PostLocked(clique, index, rank, op);
  });
}

bool FakeNcclApi::PostLocked(Clique* clique, uint64_t index, int rank, const Op& op) {
  if (op.comm->freed()) return true;  // aborted: its device work is gone
  Clique::Slot& slot = clique->ops[index];
  if (slot.posted.empty()) {
    slot.posted.resize(clique->n);
    slot.has.assign(clique->n, false);
  }
  if (!slot.has[rank]) {
    slot.posted[rank] = op;
    slot.has[rank] = true;
  }
  if (slot.executed) return true;
  if (!std::all_of(slot.has.begin(), slot.has.end(), [](bool b) { return b; })) return false;
  ExecuteLocked(clique, index);
  return true;
}

void FakeNcclApi::ExecuteLocked(Clique* clique, uint64_t index) {
  Clique::Slot& slot = clique->ops[index];
  slot.executed = true;
  const int n = clique->n;
  const Op& first = slot.posted[0];
  for (int r = 1; r < n; ++r) {
    const Op& o = slot.posted[r];
    if (o.kind != first.kind || o.count != first.count || o.type != first.type ||
        (o.op >= ncclNumOps) != (first.op >= ncclNumOps) ||
        (first.op < ncclNumOps && o.op != first.op) || o.root != first.root) {
      const std::string text = absl::StrCat("mismatched collective #", index, ": rank 0 called ",
                                            KindName(first.kind), " count ", first.count, ", rank ",
                                            r, " called ", KindName(o.kind), " count ", o.count);
      for (const Op& p : slot.posted) {
        p.comm->async = ncclInvalidUsage;
        p.comm->last_error = text;
      }
      return;
    }
  }
  ++executed_;
  if (first.count == 0) return;
  const DType dtype = FromNccl(first.type);
  const size_t es = DTypeSize(dtype);
  const size_t block = first.count * es;
  std::vector<const void*> in(n);
  std::vector<void*> out(n);
  std::vector<double> scalars(n);
  // NCCL's arithmetic, ncclAvg's premultiplied 1/n included (fake_nccl_reduce.h).
  FakeRedOp rop = FakeRedOp::kSum;
  if (first.op >= ncclNumOps) {
    rop = FakeRedOp::kPreMulSum;
    for (int r = 0; r < n; ++r) scalars[r] = slot.posted[r].scalar;
  } else if (first.op == ncclAvg) {
    rop = FakeRedOp::kAvg;
  } else if (first.op == ncclMax) {
    rop = FakeRedOp::kMax;
  } else if (first.op == ncclMin) {
    rop = FakeRedOp::kMin;
  }
  switch (first.kind) {
    case Kind::kAllReduce:
      for (int r = 0; r < n; ++r) {
        in[r] = slot.posted[r].send;
        out[r] = slot.posted[r].recv;
      }
      FakeNcclReduce(in.data(), n, out.data(), n, first.count, dtype, rop, scalars.data());
      break;
    case Kind::kReduceScatter:
      for (int dst = 0; dst < n; ++dst) {
        for (int r = 0; r < n; ++r) {
          in[r] = static_cast<const char*>(slot.posted[r].send) + static_cast<size_t>(dst) * block;
        }
        void* recv = slot.posted[dst].recv;
        FakeNcclReduce(in.data(), n, &recv, 1, first.count, dtype, rop, scalars.data());
      }
      break;
    case Kind::kAllGather:
      for (int src = 0; src < n; ++src) {
        for (int dst = 0; dst < n; ++dst) {
          std::memmove(static_cast<char*>(slot.posted[dst].recv) + static_cast<size_t>(src) * block,
                       slot.posted[src].send, block);
        }
      }
      break;
    case Kind::kBroadcast: {
      const Op& root = slot.posted[first.root];
      for (int dst = 0; dst < n; ++dst) {
        if (dst != first.root) std::memmove(slot.posted[dst].recv, root.send, block);
      }
      if (root.recv != root.send) std::memmove(root.recv, root.send, block);
      break;
    }
  }
}

ncclResult_t FakeNcclApi::AllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return CollectiveLocked(Op{Kind::kAllReduce, send, recv, count, type, op, 1.0, 0,
                             reinterpret_cast<Comm*>(comm), stream},
                          "AllReduce");
}

ncclResult_t FakeNcclApi::ReduceScatter(const void* send, void* recv, size_t recvcount,
                                        ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return CollectiveLocked(Op{Kind::kReduceScatter, send, recv, recvcount, type, op, 1.0, 0,
                             reinterpret_cast<Comm*>(comm), stream},
                          "ReduceScatter");
}

ncclResult_t FakeNcclApi::AllGather(const void* send, void* recv, size_t sendcount,
                                    ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return CollectiveLocked(Op{Kind::kAllGather, send, recv, sendcount, type, ncclSum, 1.0, 0,
                             reinterpret_cast<Comm*>(comm), stream},
                          "AllGather");
}

ncclResult_t FakeNcclApi::Broadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                                    int root, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return CollectiveLocked(Op{Kind::kBroadcast, send, recv, count, type, ncclSum, 1.0, root,
                             reinterpret_cast<Comm*>(comm), stream},
                          "Broadcast");
}

ncclResult_t FakeNcclApi::RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                               ncclScalarResidence_t residence, ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = nullptr;
  if (const ncclResult_t rc = CheckCallLocked(comm, "RedOpCreatePreMulSum", &c);
      rc != ncclSuccess) {
    return rc;
  }
  if (type != ncclFloat32 && type != ncclFloat64 && type != ncclBfloat16 && type != ncclFloat16) {
    return ncclInvalidArgument;
  }
  if (residence != ncclScalarHostImmediate && residence != ncclScalarDevice) {
    return ncclInvalidArgument;
  }
  const double value = DecodeScalar(scalar, type);  // fake device memory is host memory
  const int id = static_cast<int>(ncclNumOps) + c->next_premul++;
  c->premul[id] = {value, type};
  *op = static_cast<ncclRedOp_t>(id);
  ++premul_created_;
  premul_scalars_.push_back(value);
  cuda_->LogLocked(absl::StrCat("RedOpCreatePreMulSum(c", c->id, ")"));
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = nullptr;
  if (const ncclResult_t rc = CheckCallLocked(comm, "RedOpDestroy", &c); rc != ncclSuccess) {
    return rc;
  }
  if (c->premul.erase(static_cast<int>(op)) == 0) {
    ViolationLocked(absl::StrCat("RedOpDestroy of unknown op ", static_cast<int>(op)));
    return ncclInvalidArgument;
  }
  ++premul_destroyed_;
  cuda_->LogLocked(absl::StrCat("RedOpDestroy(c", c->id, ")"));
  return ncclSuccess;
}

void FakeNcclApi::SetInProgressPolls(int polls) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  in_progress_polls_ = polls;
}

void FakeNcclApi::InjectAsyncError(ncclComm_t comm, ncclResult_t rc, std::string text) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  if (c == nullptr) return;
  c->async = rc;
  c->last_error = std::move(text);
}

void FakeNcclApi::FailNextCall(std::string name, ncclResult_t rc) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  fail_next_[std::move(name)] = rc;
}

std::vector<std::string> FakeNcclApi::violations() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return violations_;
}
int FakeNcclApi::group_ends() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return group_ends_;
}
std::vector<int> FakeNcclApi::ops_per_group() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return ops_per_group_;
}
int FakeNcclApi::premul_created() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return premul_created_;
}
int FakeNcclApi::premul_destroyed() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return premul_destroyed_;
}
std::vector<double> FakeNcclApi::premul_scalars() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return premul_scalars_;
}
int FakeNcclApi::live_premul_ops() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  int n = 0;
  for (const auto& [p, c] : comms_) {
    if (!c->freed()) n += static_cast<int>(c->premul.size());
  }
  return n;
}
int FakeNcclApi::comms_created() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return comms_created_;
}
int FakeNcclApi::comms_finalized() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return comms_finalized_;
}
int FakeNcclApi::comms_aborted() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return comms_aborted_;
}
int FakeNcclApi::live_comms() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  int n = 0;
  for (const auto& [p, c] : comms_) n += c->freed() ? 0 : 1;
  return n;
}
int FakeNcclApi::executed_collectives() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return executed_;
}

}  // namespace braid::nccl::testing
