#include "backends/gloo/gloo_collectives.h"

#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/gloo/gloo_errors.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"

namespace braid::gloo_backend {
namespace {

std::chrono::milliseconds Millis(absl::Duration d) {
  // At least 1 ms: Gloo reads 0 as "no timeout".
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

template <typename T>
void SumFn(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = static_cast<T>(x[i] + y[i]);
}
template <typename T>
void MaxFn(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = y[i] > x[i] ? y[i] : x[i];
}
template <typename T>
void MinFn(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = y[i] < x[i] ? y[i] : x[i];
}

// bf16/f16 on the 2-byte wire (CollectiveOptions::half_wire): out = half(f32(a) + f32(b)),
// rounded once per hop (ReduceInto of two inputs).
template <DType kHalf>
void HalfSumFn(void* out, const void* a, const void* b, size_t n) {
  const void* inputs[] = {a, b};
  ReduceInto(inputs, 2, out, n, kHalf, ReduceOp::Sum(), 2);
}

template <typename T>
void GlooAllreduce(const std::shared_ptr<::gloo::Context>& ctx, void* buf, size_t count,
                   ReduceKind kind, uint32_t tag, std::chrono::milliseconds timeout) {
  ::gloo::AllreduceOptions o(ctx);
  o.setOutput<T>(static_cast<T*>(buf), count);  // no input: in place
  switch (kind) {
    case ReduceKind::kMax:
      o.setReduceFunction(&MaxFn<T>);
      break;
    case ReduceKind::kMin:
      o.setReduceFunction(&MinFn<T>);
      break;
    default:
      o.setReduceFunction(&SumFn<T>);
      break;  // sum, avg, premul_sum
  }
  o.setTag(tag);
  o.setTimeout(timeout);
  ::gloo::allreduce(o);
}

// Gloo's all-reduce in place on `count` elements of the wire dtype `wire`.
absl::Status AllreduceWire(const std::shared_ptr<::gloo::Context>& ctx, void* buf, size_t count,
                           DType wire, ReduceKind kind, uint32_t tag, absl::Duration timeout,
                           absl::string_view what) {
  const auto ms = Millis(timeout);
  return GlooCall(what, [&] {
    switch (wire) {
      case DType::kF32:
        return GlooAllreduce<float>(ctx, buf, count, kind, tag, ms);
      case DType::kF64:
        return GlooAllreduce<double>(ctx, buf, count, kind, tag, ms);
      case DType::kI32:
        return GlooAllreduce<int32_t>(ctx, buf, count, kind, tag, ms);
      case DType::kI64:
        return GlooAllreduce<int64_t>(ctx, buf, count, kind, tag, ms);
      case DType::kU8:
        return GlooAllreduce<uint8_t>(ctx, buf, count, kind, tag, ms);
      case DType::kBF16:
      case DType::kF16: {  // the half wire: sums only (Reduce plans max/min through f32)
        ::gloo::AllreduceOptions o(ctx);
        o.setOutput<uint16_t>(static_cast<uint16_t*>(buf), count);
        o.setReduceFunction(wire == DType::kBF16 ? &HalfSumFn<DType::kBF16>
                                                 : &HalfSumFn<DType::kF16>);
        o.setTag(tag);
        o.setTimeout(ms);
        return ::gloo::allreduce(o);
      }
      default:
        throw std::logic_error("half dtypes are reduced through f32");
    }
  });
}

// All-reduce (`rs` false) or reduce-scatter (`rs` true) per the table in the header.
absl::Status Reduce(const std::shared_ptr<::gloo::Context>& ctx, const CollectiveArgs& a, bool rs,
                    uint32_t tag, absl::Duration timeout, absl::string_view what) {
  const int n = ctx->size;
  const size_t total = rs ? a.count * static_cast<size_t>(n) : a.count;
  const DType dtype = a.dtype;
  const bool premul = a.op.kind == ReduceKind::kPreMulSum;
  const bool avg = a.op.kind == ReduceKind::kAvg;
  const bool half_wire =
      IsHalf(dtype) && a.options.half_wire && (a.op.kind == ReduceKind::kSum || avg || premul);
  const bool half = IsHalf(dtype) && !half_wire;  // staged in f32
  const DType wire = half ? DType::kF32 : dtype;
  const size_t wsize = DTypeSize(wire);
  // An all-reduce in the caller's dtype works in recv itself; otherwise in owned staging (the
  // send buffer is never written).
  const bool in_recv = !rs && !half;
  std::vector<uint8_t> staging;
  void* buf = a.recv;
  if (!in_recv) {
    staging.resize(total * wsize);
    buf = staging.data();
  }
  if (half || premul) {
    CastScale(a.send, dtype, buf, wire, total, ScaleSpec{premul, a.op.scalar, 0});
  } else if (buf != a.send) {
    std::memcpy(buf, a.send, total * wsize);
  }
  const ReduceKind gloo_kind = (avg || premul) ? ReduceKind::kSum : a.op.kind;
  if (total > 0) {
    absl::Status s = AllreduceWire(ctx, buf, total, wire, gloo_kind, tag, timeout, what);
    if (!s.ok()) return s;
  }
  const size_t offset = rs ? static_cast<size_t>(ctx->rank) * a.count : 0;
  const uint8_t* result = static_cast<const uint8_t*>(buf) + offset * wsize;
  if (half || avg) {
    CastScale(result, wire, a.recv, dtype, a.count, ScaleSpec{false, 1.0, avg ? n : 0});
  } else if (result != a.recv) {
    std::memcpy(a.recv, result, a.count * wsize);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF64:
    case DType::kBF16:
    case DType::kF16:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("the gloo backend does not support dtype ", static_cast<int>(dtype)));
}

absl::Status RunCollective(const std::shared_ptr<::gloo::Context>& ctx, const CollectiveArgs& a,
                           uint32_t tag, absl::Duration timeout, absl::string_view what) {
  if (a.kind != CollectiveKind::kBarrier) {
    absl::Status s = CheckDType(a.dtype);
    if (!s.ok()) return WithContext(s, what);
  }
  const auto ms = Millis(timeout);
  switch (a.kind) {
    case CollectiveKind::kBarrier:
      return GlooCall(what, [&] {
        ::gloo::BarrierOptions o(ctx);
        o.setTag(tag);
        o.setTimeout(ms);
        ::gloo::barrier(o);
      });
    case CollectiveKind::kBroadcast: {
      const size_t bytes = a.count * DTypeSize(a.dtype);
      if (bytes == 0) return absl::OkStatus();  // every rank skips alike
      return GlooCall(what, [&] {
        ::gloo::BroadcastOptions o(ctx);
        o.setOutput<uint8_t>(static_cast<uint8_t*>(a.recv), bytes);
        o.setRoot(a.root);
        o.setTag(tag);
        o.setTimeout(ms);
        ::gloo::broadcast(o);
      });
    }
    case CollectiveKind::kAllGather: {
      const size_t bytes = a.count * DTypeSize(a.dtype);
      if (bytes == 0) return absl::OkStatus();
      return GlooCall(what, [&] {
        ::gloo::AllgatherOptions o(ctx);
        // In place (send == recv + rank * count): no input; Gloo sends the block in place.
        if (!a.in_place)
          o.setInput<uint8_t>(static_cast<uint8_t*>(const_cast<void*>(a.send)), bytes);
        o.setOutput<uint8_t>(static_cast<uint8_t*>(a.recv), bytes * static_cast<size_t>(ctx->size));
        o.setTag(tag);
        o.setTimeout(ms);
        ::gloo::allgather(o);
      });
    }
    case CollectiveKind::kAllReduce:
      return Reduce(ctx, a, /*rs=*/false, tag, timeout, what);
    case CollectiveKind::kReduceScatter:
      return Reduce(ctx, a, /*rs=*/true, tag, timeout, what);
  }
  return absl::InternalError(absl::StrCat(what, ": unknown collective kind"));
}

}  // namespace braid::gloo_backend
