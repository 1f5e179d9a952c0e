#include "tests/nccl/mpi_fake_nccl_api.h"

#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "comm/dtype.h"
#include "comm/half.h"
#include "tests/nccl/fake_nccl_reduce.h"

namespace braid::nccl::testing {

struct MpiFakeNcclApi::Comm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0;
  int size = 0;
  uint64_t calls = 0;    // collectives called (each gets the next sequence number)
  uint64_t started = 0;  // collectives whose MPI operation started, in call order
  bool freed = false;
  int next_premul = 0;
  std::map<int, double> premul;  // pre-mul-sum op -> its scalar (already in the dtype)
};

struct MpiFakeNcclApi::Op {
  enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast } kind;
  const void* send;
  void* recv;
  size_t count;  // per-rank output elements (all-gather: input elements)
  DType dtype;
  FakeRedOp rop;
  double scalar;
  int root;
  uint64_t seq = 0;
  bool started = false;
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<char> mine;      // this rank's contribution (input bytes, then the scalar)
  std::vector<char> gathered;  // every rank's contribution, in rank order
};

namespace {

bool ToDType(ncclDataType_t t, DType* out) {
  switch (t) {
    case ncclFloat32:
      *out = DType::kF32;
      return true;
    case ncclFloat64:
      *out = DType::kF64;
      return true;
    case ncclBfloat16:
      *out = DType::kBF16;
      return true;
    case ncclFloat16:
      *out = DType::kF16;
      return true;
    case ncclInt32:
      *out = DType::kI32;
      return true;
    case ncclInt64:
      *out = DType::kI64;
      return true;
    case ncclUint8:
      *out = DType::kU8;
      return true;
    default:
      return false;
  }
}

uint32_t IdColor(const ncclUniqueId& id) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (size_t i = 0; i < sizeof id.internal; ++i) {
    h = (h ^ static_cast<unsigned char>(id.internal[i])) * 16777619u;
  }
  return h & 0x7fffffffu;
}

}  // namespace

MpiFakeNcclApi::MpiFakeNcclApi(std::shared_ptr<FakeCudaApi> cuda) : cuda_(std::move(cuda)) {}

MpiFakeNcclApi::~MpiFakeNcclApi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (auto& [p, c] : comms_) {
    if (!c->freed && !finalized) MPI_Comm_free(&c->mpi);
  }
}

MpiFakeNcclApi::Comm* MpiFakeNcclApi::FindLocked(ncclComm_t c) const {
  auto it = comms_.find(reinterpret_cast<Comm*>(c));
  return it == comms_.end() || it->second->freed ? nullptr : it->second.get();
}

ncclResult_t MpiFakeNcclApi::NewComm(MPI_Comm mpi, ncclComm_t* out) {
  auto c = std::make_unique<Comm>();
  c->mpi = mpi;
  MPI_Comm_rank(mpi, &c->rank);
  MPI_Comm_size(mpi, &c->size);
  std::lock_guard<std::mutex> lock(cuda_->mu());
  *out = reinterpret_cast<ncclComm_t>(c.get());
  comms_[c.get()] = std::move(c);
  return ncclSuccess;
}

ncclResult_t MpiFakeNcclApi::GetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid()));
  for (size_t i = 0; i < sizeof id->internal; ++i) id->internal[i] = static_cast<char>(gen());
  return ncclSuccess;
}

ncclResult_t MpiFakeNcclApi::CommInitRankConfig(ncclComm_t* comm, int nranks,
                                                const ncclUniqueId& id, int rank, ncclConfig_t*) {
  MPI_Comm mpi = MPI_COMM_NULL;  // collective over MPI_COMM_WORLD; without the device lock
  if (MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(IdColor(id)), rank, &mpi) != MPI_SUCCESS) {
    return ncclSystemError;
  }
  int size = 0, me = -1;
  MPI_Comm_size(mpi, &size);
  MPI_Comm_rank(mpi, &me);
  if (size != nranks || me != rank) {
    MPI_Comm_free(&mpi);
    return ncclInvalidUsage;
  }
  return NewComm(mpi, comm);
}

ncclResult_t MpiFakeNcclApi::CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* child,
                                       ncclConfig_t*) {
  MPI_Comm parent = MPI_COMM_NULL;
  {
    std::lock_guard<std::mutex> lock(cuda_->mu());
    Comm* c = FindLocked(comm);
    if (c == nullptr) return ncclInvalidArgument;
    parent = c->mpi;
  }
  MPI_Comm mpi = MPI_COMM_NULL;
  if (MPI_Comm_split(parent, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &mpi) !=
      MPI_SUCCESS) {
    return ncclSystemError;
  }
  if (mpi == MPI_COMM_NULL) {
    *child = nullptr;
    return ncclSuccess;
  }
  return NewComm(mpi, child);
}

ncclResult_t MpiFakeNcclApi::CommFinalize(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return FindLocked(comm) != nullptr ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t MpiFakeNcclApi::CommDestroy(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  if (c == nullptr) return ncclInvalidArgument;
  c->freed = true;  // kept: an item still queued for it must not touch freed memory
  MPI_Comm_free(&c->mpi);
  return ncclSuccess;
}

ncclResult_t MpiFakeNcclApi::CommAbort(ncclComm_t comm) { return CommDestroy(comm); }

ncclResult_t MpiFakeNcclApi::CommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  if (FindLocked(comm) == nullptr) return ncclInvalidArgument;
  *async_error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t MpiFakeNcclApi::CommCount(ncclComm_t comm, int* count) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  if (c == nullptr) return ncclInvalidArgument;
  *count = c->size;
  return ncclSuccess;
}

ncclResult_t MpiFakeNcclApi::CommUserRank(ncclComm_t comm, int* rank) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  if (c == nullptr) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

const char* MpiFakeNcclApi::GetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error" : "MpiFakeNcclApi error";
}

const char* MpiFakeNcclApi::GetLastError(ncclComm_t) { return ""; }

ncclResult_t MpiFakeNcclApi::GroupStart() { return ncclSuccess; }  // calls keep their order
ncclResult_t MpiFakeNcclApi::GroupEnd() { return ncclSuccess; }

ncclResult_t MpiFakeNcclApi::EnqueueLocked(Comm* c, std::shared_ptr<Op> op, cudaStream_t stream) {
  op->seq = c->calls++;
  cuda_->EnqueueLocked(stream, [this, c, op] { return StepLocked(c, op.get()); });
  return ncclSuccess;
}

bool MpiFakeNcclApi::StepLocked(Comm* c, Op* op) {
  const size_t es = DTypeSize(op->dtype);
  if (!op->started) {
    if (c->freed || op->seq != c->started) return false;  // earlier calls start first
    switch (op->kind) {
      case Op::Kind::kAllReduce:
      case Op::Kind::kReduceScatter: {
        const size_t in = op->count * es * (op->kind == Op::Kind::kAllReduce ? 1 : c->size);
        op->mine.resize(in + sizeof(double));
        if (in > 0) std::memcpy(op->mine.data(), op->send, in);  // (send may be null when empty)
        std::memcpy(op->mine.data() + in, &op->scalar, sizeof(double));
        op->gathered.resize(op->mine.size() * c->size);
        MPI_Iallgather(op->mine.data(), static_cast<int>(op->mine.size()), MPI_BYTE,
                       op->gathered.data(), static_cast<int>(op->mine.size()), MPI_BYTE, c->mpi,
                       &op->req);
        break;
      }
      case Op::Kind::kAllGather: {
        const size_t in = op->count * es;
        op->mine.assign(static_cast<const char*>(op->send),
                        static_cast<const char*>(op->send) + in);
        MPI_Iallgather(op->mine.data(), static_cast<int>(in), MPI_BYTE, op->recv,
                       static_cast<int>(in), MPI_BYTE, c->mpi, &op->req);
        break;
      }
      case Op::Kind::kBroadcast:
        if (c->rank == op->root && op->send != op->recv && op->count > 0)
          std::memmove(op->recv, op->send, op->count * es);
        MPI_Ibcast(op->recv, static_cast<int>(op->count * es), MPI_BYTE, op->root, c->mpi,
                   &op->req);
        break;
    }
    op->started = true;
    ++c->started;
  }
  int done = 0;
  MPI_Test(&op->req, &done, MPI_STATUS_IGNORE);
  if (!done) return false;
  if (op->kind == Op::Kind::kAllReduce || op->kind == Op::Kind::kReduceScatter) {
    const size_t contrib = op->mine.size();
    const size_t in = contrib - sizeof(double);
    std::vector<const void*> inputs(c->size);
    std::vector<double> scalars(c->size);
    const size_t offset = op->kind == Op::Kind::kAllReduce ? 0 : c->rank * op->count * es;
    for (int r = 0; r < c->size; ++r) {
      const char* base = op->gathered.data() + r * contrib;
      inputs[r] = base + offset;
      std::memcpy(&scalars[r], base + in, sizeof(double));
    }
    void* out = op->recv;
    FakeNcclReduce(inputs.data(), c->size, &out, 1, op->count, op->dtype, op->rop, scalars.data());
  }
  ++executed_;
  return true;
}

namespace {

// The op and its scalar for a reduction; false for an unknown op.
bool ReductionOf(ncclRedOp_t op, const std::map<int, double>& premul, FakeRedOp* rop,
                 double* scalar) {
  *scalar = 1.0;
  if (op >= ncclNumOps) {
    auto it = premul.find(static_cast<int>(op));
    if (it == premul.end()) return false;
    *rop = FakeRedOp::kPreMulSum;
    *scalar = it->second;
    return true;
  }
  switch (op) {
    case ncclSum:
      *rop = FakeRedOp::kSum;
      return true;
    case ncclAvg:
      *rop = FakeRedOp::kAvg;
      return true;
    case ncclMax:
      *rop = FakeRedOp::kMax;
      return true;
    case ncclMin:
      *rop = FakeRedOp::kMin;
      return true;
    default:
      return false;
  }
}

}  // namespace

ncclResult_t MpiFakeNcclApi::ReductionLocked(bool scatter, const void* send, void* recv,
                                             size_t count, ncclDataType_t type, ncclRedOp_t op,
                                             ncclComm_t comm, cudaStream_t stream) {
  Comm* c = FindLocked(comm);
  auto o = std::make_shared<Op>();
  if (c == nullptr || !ToDType(type, &o->dtype) ||
      !ReductionOf(op, c->premul, &o->rop, &o->scalar)) {
    return ncclInvalidArgument;
  }
  o->kind = scatter ? Op::Kind::kReduceScatter : Op::Kind::kAllReduce;
  o->send = send;
  o->recv = recv;
  o->count = count;
  o->root = 0;
  return EnqueueLocked(c, std::move(o), stream);
}

ncclResult_t MpiFakeNcclApi::AllReduce(const void* send, void* recv, size_t count,
                                       ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return ReductionLocked(false, send, recv, count, type, op, comm, stream);
}

ncclResult_t MpiFakeNcclApi::ReduceScatter(const void* send, void* recv, size_t recvcount,
                                           ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return ReductionLocked(true, send, recv, recvcount, type, op, comm, stream);
}

ncclResult_t MpiFakeNcclApi::AllGather(const void* send, void* recv, size_t sendcount,
                                       ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  auto o = std::make_shared<Op>();
  if (c == nullptr || !ToDType(type, &o->dtype)) return ncclInvalidArgument;
  o->kind = Op::Kind::kAllGather;
  o->send = send;
  o->recv = recv;
  o->count = sendcount;
  o->rop = FakeRedOp::kSum;
  o->scalar = 1.0;
  o->root = 0;
  return EnqueueLocked(c, std::move(o), stream);
}

ncclResult_t MpiFakeNcclApi::Broadcast(const void* send, void* recv, size_t count,
                                       ncclDataType_t type, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  auto o = std::make_shared<Op>();
  if (c == nullptr || !ToDType(type, &o->dtype) || root < 0 || root >= c->size) {
    return ncclInvalidArgument;
  }
  o->kind = Op::Kind::kBroadcast;
  o->send = send;
  o->recv = recv;
  o->count = count;
  o->rop = FakeRedOp::kSum;
  o->scalar = 1.0;
  o->root = root;
  return EnqueueLocked(c, std::move(o), stream);
}

ncclResult_t MpiFakeNcclApi::RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                  ncclDataType_t type, ncclScalarResidence_t,
                                                  ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  if (c == nullptr) return ncclInvalidArgument;
  double value = 0;  // fake device memory is host memory: both residences read the same
  switch (type) {
    case ncclFloat32:
      value = *static_cast<const float*>(scalar);
      break;
    case ncclFloat64:
      value = *static_cast<const double*>(scalar);
      break;
    case ncclBfloat16:
      value = ToFloat(*static_cast<const BF16*>(scalar));
      break;
    case ncclFloat16:
      value = ToFloat(*static_cast<const F16*>(scalar));
      break;
    default:
      return ncclInvalidArgument;
  }
  const int id = static_cast<int>(ncclNumOps) + c->next_premul++;
  c->premul[id] = value;
  *op = static_cast<ncclRedOp_t>(id);
  return ncclSuccess;
}

ncclResult_t MpiFakeNcclApi::RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  Comm* c = FindLocked(comm);
  if (c == nullptr || c->premul.erase(static_cast<int>(op)) == 0) return ncclInvalidArgument;
  return ncclSuccess;
}

int MpiFakeNcclApi::executed_collectives() const {
  std::lock_guard<std::mutex> lock(cuda_->mu());
  return executed_;
}

}  // namespace braid::nccl::testing
