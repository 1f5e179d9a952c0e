#include "bench/collective_table.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/raw_baselines.h"
#include "comm/buffer_ops.h"
#include "comm/element.h"
#include "comm/status_macros.h"

namespace braid::bench {
namespace {

constexpr absl::Duration kWaitLimit = absl::Seconds(300);

// --- exact check data: small integers, exact in every dtype and any reduction order -------
double Pattern(size_t i, int rank) { return static_cast<double>((i * 3 + rank * 5) % 13); }

// The value `v` as the dtype stores it (so avg's rounding is compared like for like).
double Rounded(DType t, double v) {
  unsigned char tmp[8];
  StoreElement(tmp, t, 0, v);
  return LoadElement(tmp, t, 0);
}

// premul_sum's scalar: a power of two, so products and sums stay exact in any order.
constexpr double kPremulScalar = 0.5;

double Expected(ReduceKind op, DType t, size_t i, int n) {
  const double s = op == ReduceKind::kPreMulSum ? kPremulScalar : 1.0;
  double acc = s * Pattern(i, 0);
  for (int r = 1; r < n; ++r) {
    const double v = s * Pattern(i, r);
    if (op == ReduceKind::kMax)
      acc = std::max(acc, v);
    else if (op == ReduceKind::kMin)
      acc = std::min(acc, v);
    else
      acc += v;
  }
  if (op == ReduceKind::kAvg) {
    acc = t == DType::kF64 ? acc / n
                           : static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
  }
  return Rounded(t, acc);
}

// One rank's buffers, sized for the largest message. Host groups: the collectives use `host`
// directly. Device groups: they use `dev` (from the group's BufferOps) and `host` is staging
// for the check.
class Buffers {
 public:
  static absl::StatusOr<Buffers> Create(Group& g, size_t bytes) {
    Buffers b;
    b.ops_ = &g.buffer_ops();
    b.device_ = !b.ops_->synchronous();
    for (int i = 0; i < 2; ++i) {
      b.host_[i].assign(bytes, 0);
      if (b.device_) {
        ASSIGN_OR_RETURN(
            b.dev_[i], b.ops_->Allocate(bytes, i == 0 ? "bench send buffer" : "bench recv buffer"));
        RETURN_IF_ERROR(b.ops_->Zero(b.dev_[i].get(), bytes));
      }
    }
    if (b.device_) {
      ASSIGN_OR_RETURN(b.scalar_, b.ops_->Allocate(sizeof(double), "bench scalar"));
    }
    return b;
  }

  // What the collectives read and write.
  unsigned char* send() { return Data(0); }
  unsigned char* recv() { return Data(1); }
  // Host views for filling and checking (the same memory on host groups).
  unsigned char* host_send() { return host_[0].data(); }
  unsigned char* host_recv() { return host_[1].data(); }

  // Device groups: copies host bytes [offset, offset + bytes) of buffer `which` (0 send,
  // 1 recv) to the device (queued before later collectives) / back to the host (waited for).
  absl::Status Upload(int which, size_t offset, size_t bytes) {
    if (!device_) return absl::OkStatus();
    return ops_->Copy(dev_[which].get() + offset, host_[which].data() + offset, bytes);
  }
  absl::Status Download(int which, size_t offset, size_t bytes) {
    if (!device_) return absl::OkStatus();
    RETURN_IF_ERROR(ops_->Copy(host_[which].data() + offset, dev_[which].get() + offset, bytes));
    return ops_->Synchronize(absl::Now() + kWaitLimit);
  }

  // Sum (or max) of a scalar over the group, through the group itself (in its memory).
  absl::StatusOr<double> GroupReduce(Group& g, double v, ReduceOp op) {
    void* p = &v;
    if (device_) {
      p = scalar_.get();
      RETURN_IF_ERROR(ops_->Copy(p, &v, sizeof v));
    }
    ASSIGN_OR_RETURN(WorkPtr w, g.AllReduce(p, p, 1, DType::kF64, op));
    RETURN_IF_ERROR(w->Wait(kWaitLimit));
    if (device_) {
      RETURN_IF_ERROR(ops_->Copy(&v, p, sizeof v));
      RETURN_IF_ERROR(ops_->Synchronize(absl::Now() + kWaitLimit));
    }
    return v;
  }

 private:
  unsigned char* Data(int i) {
    return device_ ? reinterpret_cast<unsigned char*>(dev_[i].get()) : host_[i].data();
  }

  BufferOps* ops_ = nullptr;
  bool device_ = false;
  std::vector<unsigned char> host_[2];
  OwnedBuffer dev_[2];
  OwnedBuffer scalar_;
};

struct Shape {
  size_t count = 0;  // NCCL-style count passed to the call
  size_t send_elems = 0, recv_elems = 0;
};

Shape ShapeFor(CollectiveKind k, size_t bytes, DType t, int n) {
  const size_t es = DTypeSize(t);
  Shape s;
  switch (k) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
      s.count = bytes / es;
      s.send_elems = s.recv_elems = s.count;
      break;
    case CollectiveKind::kReduceScatter:
      s.count = bytes / es / n;
      s.send_elems = s.count * n;
      s.recv_elems = s.count;
      break;
    case CollectiveKind::kAllGather:
      s.count = bytes / es / n;
      s.send_elems = s.count;
      s.recv_elems = s.count * n;
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  return s;
}

absl::StatusOr<WorkPtr> Issue(Group& g, const CollectiveConfig& c, CollectiveKind k, const Shape& s,
                              Buffers& b) {
  const size_t es = DTypeSize(c.dtype);
  unsigned char* send = b.send();
  unsigned char* recv = b.recv();
  const ReduceOp op{c.redop, kPremulScalar};
  switch (k) {
    case CollectiveKind::kAllReduce:
      return g.AllReduce(send, c.in_place ? send : recv, s.count, c.dtype, op);
    case CollectiveKind::kReduceScatter:
      return g.ReduceScatter(send, c.in_place ? send + g.rank() * s.count * es : recv, s.count,
                             c.dtype, op);
    case CollectiveKind::kAllGather:
      return g.AllGather(c.in_place ? recv + g.rank() * s.count * es : send, recv, s.count,
                         c.dtype);
    case CollectiveKind::kBroadcast:
      return g.Broadcast(send, s.count, c.dtype, 0);
    case CollectiveKind::kBarrier:
      return g.Barrier();
  }
  return absl::InternalError("unreachable");
}

// Where op k reads this rank's input and writes its output: buffer (0 send, 1 recv), byte
// offset and bytes.
struct Span {
  int which = 0;
  size_t offset = 0, bytes = 0;
};

Span InputSpan(const CollectiveConfig& c, CollectiveKind k, const Shape& s, int rank) {
  const size_t es = DTypeSize(c.dtype);
  if (k == CollectiveKind::kAllGather && c.in_place) return {1, rank * s.count * es, s.count * es};
  return {0, 0, s.send_elems * es};
}

Span OutputSpan(const CollectiveConfig& c, CollectiveKind k, const Shape& s, int rank) {
  const size_t es = DTypeSize(c.dtype);
  switch (k) {
    case CollectiveKind::kAllReduce:
      return {c.in_place ? 0 : 1, 0, s.count * es};
    case CollectiveKind::kReduceScatter:
      return c.in_place ? Span{0, rank * s.count * es, s.count * es} : Span{1, 0, s.count * es};
    case CollectiveKind::kAllGather:
      return {1, 0, s.recv_elems * es};
    case CollectiveKind::kBroadcast:
      return {0, 0, s.count * es};
    default:
      return {};
  }
}

// Runs op `k` once on exact data; returns this rank's wrong-element count.
absl::StatusOr<int64_t> CheckOnce(Group& g, const CollectiveConfig& c, CollectiveKind k,
                                  const Shape& s, Buffers& b) {
  const int n = g.size(), r = g.rank();
  if (k == CollectiveKind::kBarrier) return 0;
  const Span in = InputSpan(c, k, s, r);
  unsigned char* host_in = (in.which == 0 ? b.host_send() : b.host_recv()) + in.offset;
  const size_t in_elems = in.bytes / DTypeSize(c.dtype);
  for (size_t i = 0; i < in_elems; ++i) StoreElement(host_in, c.dtype, i, Pattern(i, r));
  RETURN_IF_ERROR(b.Upload(in.which, in.offset, in.bytes));
  ASSIGN_OR_RETURN(WorkPtr w, Issue(g, c, k, s, b));
  RETURN_IF_ERROR(w->Wait(kWaitLimit));
  const Span out = OutputSpan(c, k, s, r);
  RETURN_IF_ERROR(b.Download(out.which, out.offset, out.bytes));
  const unsigned char* o = (out.which == 0 ? b.host_send() : b.host_recv()) + out.offset;
  int64_t wrong = 0;
  switch (k) {
    case CollectiveKind::kAllReduce:
      for (size_t i = 0; i < s.count; ++i)
        wrong += LoadElement(o, c.dtype, i) != Expected(c.redop, c.dtype, i, n);
      break;
    case CollectiveKind::kReduceScatter:
      for (size_t i = 0; i < s.count; ++i) {
        wrong += LoadElement(o, c.dtype, i) != Expected(c.redop, c.dtype, r * s.count + i, n);
      }
      break;
    case CollectiveKind::kAllGather:
      for (int k2 = 0; k2 < n; ++k2) {
        for (size_t i = 0; i < s.count; ++i) {
          wrong += LoadElement(o, c.dtype, k2 * s.count + i) != Rounded(c.dtype, Pattern(i, k2));
        }
      }
      break;
    case CollectiveKind::kBroadcast:
      for (size_t i = 0; i < s.count; ++i)
        wrong += LoadElement(o, c.dtype, i) != Rounded(c.dtype, Pattern(i, 0));
      break;
    default:
      break;
  }
  return wrong;
}

int ItersFor(int base, size_t bytes, int floor) {
  const size_t mib = size_t{1} << 20;
  if (bytes <= mib) return base;
  return std::max<int>(floor, static_cast<int>(base * static_cast<double>(mib) / bytes));
}

}  // namespace

double BusFactor(CollectiveKind k, int n) {
  switch (k) {
    case CollectiveKind::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
      return static_cast<double>(n - 1) / n;
    case CollectiveKind::kBroadcast:
      return 1.0;
    default:
      return 0.0;
  }
}

absl::Status RunCollectiveSweep(Group& g, const CollectiveConfig& c,
                                std::vector<CollectiveRow>* rows, bool progress) {
  const bool tty = isatty(2);
  const int n = g.size();
  ASSIGN_OR_RETURN(Buffers b, Buffers::Create(g, static_cast<size_t>(c.maxbytes) + 64));
  std::vector<size_t> sizes;
  for (int64_t s = c.minbytes; s <= c.maxbytes; s *= c.step)
    sizes.push_back(static_cast<size_t>(s));
  size_t done = 0;
  const size_t total = sizes.size() * c.ops.size();
  for (CollectiveKind k : c.ops) {
    for (size_t bytes : (k == CollectiveKind::kBarrier ? std::vector<size_t>{0} : sizes)) {
      const Shape s = ShapeFor(k, bytes, c.dtype, n);
      if (k != CollectiveKind::kBarrier && s.count == 0) continue;
      ++done;
      if (progress && tty) {
        std::fprintf(stderr, "\r[collective_latency] %-14s %10zu B  (%zu/%zu)   ",
                     std::string(CollectiveName(k)).c_str(), bytes, done, total);
      } else if (progress && (bytes == sizes.front() || k == CollectiveKind::kBarrier)) {
        std::fprintf(stderr, "[collective_latency] %s ...\n",
                     std::string(CollectiveName(k)).c_str());
      }
      int64_t wrong = 0;
      if (c.check) {
        ASSIGN_OR_RETURN(int64_t my_wrong, CheckOnce(g, c, k, s, b));
        ASSIGN_OR_RETURN(double all_wrong,
                         b.GroupReduce(g, static_cast<double>(my_wrong), ReduceOp::Sum()));
        wrong = static_cast<int64_t>(all_wrong);
      }
      const int iters = ItersFor(c.iters, bytes, 3);
      const int warmup = ItersFor(c.warmup, bytes, 1);
      for (int i = 0; i < warmup; ++i) {
        ASSIGN_OR_RETURN(WorkPtr w, Issue(g, c, k, s, b));
        RETURN_IF_ERROR(w->Wait(kWaitLimit));
      }
      ASSIGN_OR_RETURN(WorkPtr sync, g.Barrier());
      RETURN_IF_ERROR(sync->Wait(kWaitLimit));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        ASSIGN_OR_RETURN(WorkPtr w, Issue(g, c, k, s, b));
        RETURN_IF_ERROR(w->Wait(kWaitLimit));
      }
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          iters;
      ASSIGN_OR_RETURN(double slowest, b.GroupReduce(g, us, ReduceOp::Max()));
      if (rows != nullptr) {
        CollectiveRow row;
        row.op = std::string(CollectiveName(k));
        const size_t es = DTypeSize(c.dtype);
        // As nccl-tests: bytes of the larger buffer, and NCCL's per-call count (recvcount for
        // reduce-scatter, sendcount for all-gather).
        row.bytes = k == CollectiveKind::kBarrier ? 0 : std::max(s.send_elems, s.recv_elems) * es;
        row.count = s.count;
        row.dtype = std::string(DTypeName(c.dtype));
        row.redop = (k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduceScatter)
                        ? std::string(ReduceKindName(c.redop))
                        : "none";
        row.time_us = slowest;
        row.algbw = row.bytes / (slowest * 1e-6) / 1e9;
        row.busbw = row.algbw * BusFactor(k, n);
        row.wrong = wrong;
        rows->push_back(row);
      }
    }
  }
  if (progress && tty) std::fprintf(stderr, "\r%80s\r", "");
  return absl::OkStatus();
}

absl::StatusOr<CollectiveRow> CopyBaselineRow(Group& g, size_t bytes) {
  BufferOps& ops = g.buffer_ops();
  CollectiveRow row;
  row.bytes = row.count = bytes;
  row.dtype = "u8";
  row.redop = "none";
  if (ops.synchronous()) {
    const RawRow m = MemcpyRow(bytes);
    row.op = m.op;
    row.time_us = m.time_us;
  } else {
    row.op = "d2d_copy";
    ASSIGN_OR_RETURN(OwnedBuffer src, ops.Allocate(bytes, "copy baseline source"));
    ASSIGN_OR_RETURN(OwnedBuffer dst, ops.Allocate(bytes, "copy baseline destination"));
    RETURN_IF_ERROR(ops.Zero(src.get(), bytes));
    constexpr int kCopies = 10;
    double best = 0;
    for (int round = 0; round < 6; ++round) {  // round 0 warms up
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kCopies; ++i) RETURN_IF_ERROR(ops.Copy(dst.get(), src.get(), bytes));
      RETURN_IF_ERROR(ops.Synchronize(absl::Now() + kWaitLimit));
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          kCopies;
      if (round > 0 && (best == 0 || us < best)) best = us;
    }
    row.time_us = best;
  }
  row.algbw = row.busbw = bytes / (row.time_us * 1e-6) / 1e9;
  return row;
}

void PrintCollectiveTable(const CollectiveConfig& c, int n,
                          const std::vector<CollectiveRow>& rows) {
  if (c.csv) {
    std::printf("op,bytes,count,dtype,time_us,algbw_gbps,busbw_gbps,wrong\n");
    for (const CollectiveRow& r : rows) {
      std::printf("%s,%zu,%zu,%s,%.3f,%.4f,%.4f,%lld\n", r.op.c_str(), r.bytes, r.count,
                  r.dtype.c_str(), r.time_us, r.algbw, r.busbw, static_cast<long long>(r.wrong));
    }
    return;
  }
  std::printf(
      "# Braid collective_latency: backend=%s ranks=%d dtype=%s redop=%s iters=%d warmup=%d %s\n",
      c.backend.c_str(), n, std::string(DTypeName(c.dtype)).c_str(),
      std::string(ReduceKindName(c.redop)).c_str(), c.iters, c.warmup,
      c.in_place ? "in-place" : "out-of-place");
  std::printf(
      "# time = mean issue+wait per op of the slowest rank; busbw factors as nccl-tests\n#\n");
  std::printf("# %-28s %12s %12s %6s %6s %11s %12s %12s %7s\n", "op", "size(B)", "count", "type",
              "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  for (const CollectiveRow& r : rows) {
    std::printf("  %-28s %12zu %12zu %6s %6s %11.2f %12.3f %12.3f %7lld\n", r.op.c_str(), r.bytes,
                r.count, r.dtype.c_str(), r.redop.c_str(), r.time_us, r.algbw, r.busbw,
                static_cast<long long>(r.wrong));
  }
}

}  // namespace braid::bench
