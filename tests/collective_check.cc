#include "tests/collective_check.h"

#include <cstring>
#include <random>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "comm/half.h"
#include "comm/status_macros.h"

namespace braid::testing {
namespace {

// --- independent scalar reference --------------------------------------------------------

template <typename T>
double Widen(T x) {
  if constexpr (std::is_same_v<T, BF16> || std::is_same_v<T, F16>) {
    return ToFloat(x);
  } else {
    return static_cast<double>(x);
  }
}

template <typename T>
T FromDouble(double v) {
  if constexpr (std::is_same_v<T, BF16>) {
    return ToBF16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, F16>) {
    return ToF16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
std::vector<uint8_t> FillTyped(size_t elems, int rank, uint64_t seed, bool exact) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(rank) * 7919u + elems);
  std::vector<uint8_t> bytes(elems * sizeof(T));
  T* p = reinterpret_cast<T*>(bytes.data());
  for (size_t i = 0; i < elems; ++i) {
    if constexpr (std::is_integral_v<T>) {
      p[i] = static_cast<T>(static_cast<int64_t>(rng() % 200) - (std::is_signed_v<T> ? 100 : 0));
    } else if (exact) {
      p[i] = FromDouble<T>(static_cast<double>(static_cast<int64_t>(rng() % 401) - 200) / 4.0);
    } else {
      const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
      p[i] = FromDouble<T>(u * 8.0 - 4.0);
    }
  }
  return bytes;
}

// One reduction step in the accumulation type of T, written out plainly.
template <typename T>
struct Ref {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<std::is_integral_v<T>, T, float>>;
  static Acc Load(T x) {
    if constexpr (std::is_same_v<T, BF16> || std::is_same_v<T, F16>) {
      return ToFloat(x);
    } else {
      return x;
    }
  }
  static T Store(Acc a) {
    if constexpr (std::is_same_v<T, BF16>) {
      return ToBF16(a);
    } else if constexpr (std::is_same_v<T, F16>) {
      return ToF16(a);
    } else {
      return a;
    }
  }
};

template <typename T>
void ReduceRef(const std::vector<std::vector<uint8_t>>& inputs, size_t offset, size_t count,
               ReduceKind op, int n, bool exact, T* out) {
  using R = Ref<T>;
  using A = typename R::Acc;
  for (size_t i = 0; i < count; ++i) {
    A acc{};
    for (int k = 0; k < n; ++k) {
      const T x = reinterpret_cast<const T*>(inputs[k].data())[offset + i];
      A v = R::Load(x);
      if constexpr (std::is_floating_point_v<A>) {
        if (op == ReduceKind::kPreMulSum) v = static_cast<A>(PremulScalar(k, exact)) * v;
      }
      if (k == 0) {
        acc = v;
      } else if (op == ReduceKind::kMax) {
        acc = v > acc ? v : acc;
      } else if (op == ReduceKind::kMin) {
        acc = v < acc ? v : acc;
      } else if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        acc = static_cast<A>(static_cast<U>(acc) + static_cast<U>(v));
      } else {
        acc = acc + v;
      }
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (op == ReduceKind::kAvg) acc = acc / static_cast<A>(n);
    }
    out[i] = R::Store(acc);
  }
}

// NCCL 2.28's arithmetic (CollectiveCase::nccl_arithmetic), written out from NCCL's source
// (src/enqueue.cc hostToDevRedOp, src/device/reduce_kernel.h): avg on floating types is a
// pre-multiplied sum with the scalar 1/n (double 1.0/n, converted to the dtype through float),
// pre-mul-sum multiplies each input by its scalar in the dtype (bf16/f16: rounded to the dtype
// after the multiply), and every addition is in the dtype (bf16/f16 round after each add).
template <typename T>
T NcclMul(T a, T b) {
  if constexpr (std::is_same_v<T, BF16> || std::is_same_v<T, F16>) {
    return FromDouble<T>(static_cast<double>(ToFloat(a) * ToFloat(b)));
  } else {
    return a * b;
  }
}
template <typename T>
T NcclAdd(T a, T b) {
  if constexpr (std::is_same_v<T, BF16> || std::is_same_v<T, F16>) {
    return FromDouble<T>(static_cast<double>(ToFloat(a) + ToFloat(b)));
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <typename T>
void NcclReduceRef(const std::vector<std::vector<uint8_t>>& inputs, size_t offset, size_t count,
                   ReduceKind op, int n, bool exact, T* out) {
  constexpr bool kFloating = !std::is_integral_v<T>;
  if (!kFloating || op == ReduceKind::kMax || op == ReduceKind::kMin) {
    return ReduceRef(inputs, offset, count, op, n, exact, out);  // no rounding to differ
  }
  std::vector<T> scalar(n);
  for (int k = 0; k < n; ++k) {
    const double inv = 1.0 / n;
    scalar[k] = op == ReduceKind::kAvg
                    ? (std::is_same_v<T, double> ? FromDouble<T>(inv)
                                                 : FromDouble<T>(static_cast<float>(inv)))
                    : FromDouble<T>(PremulScalar(k, exact));
  }
  const bool premul = op == ReduceKind::kAvg || op == ReduceKind::kPreMulSum;
  for (size_t i = 0; i < count; ++i) {
    T acc{};
    for (int k = 0; k < n; ++k) {
      T v = reinterpret_cast<const T*>(inputs[k].data())[offset + i];
      if (premul) v = NcclMul(v, scalar[k]);
      acc = k == 0 ? v : NcclAdd(acc, v);
    }
    out[i] = acc;
  }
}

void ReduceRefDispatch(DType t, const std::vector<std::vector<uint8_t>>& in, size_t off,
                       size_t count, ReduceKind op, int n, bool exact, void* out, bool nccl) {
  if (nccl) {
    switch (t) {
      case DType::kF32:
        return NcclReduceRef(in, off, count, op, n, exact, static_cast<float*>(out));
      case DType::kF64:
        return NcclReduceRef(in, off, count, op, n, exact, static_cast<double*>(out));
      case DType::kBF16:
        return NcclReduceRef(in, off, count, op, n, exact, static_cast<BF16*>(out));
      case DType::kF16:
        return NcclReduceRef(in, off, count, op, n, exact, static_cast<F16*>(out));
      default:
        break;  // integers: sum, max, min as below (avg and premul are refused)
    }
  }
  switch (t) {
    case DType::kF32:
      return ReduceRef(in, off, count, op, n, exact, static_cast<float*>(out));
    case DType::kF64:
      return ReduceRef(in, off, count, op, n, exact, static_cast<double*>(out));
    case DType::kBF16:
      return ReduceRef(in, off, count, op, n, exact, static_cast<BF16*>(out));
    case DType::kF16:
      return ReduceRef(in, off, count, op, n, exact, static_cast<F16*>(out));
    case DType::kI32:
      return ReduceRef(in, off, count, op, n, exact, static_cast<int32_t*>(out));
    case DType::kI64:
      return ReduceRef(in, off, count, op, n, exact, static_cast<int64_t*>(out));
    case DType::kU8:
      return ReduceRef(in, off, count, op, n, exact, static_cast<uint8_t*>(out));
  }
}

size_t InputElems(const CollectiveCase& c, int n) {
  return c.kind == CollectiveKind::kReduceScatter ? c.count * static_cast<size_t>(n) : c.count;
}

std::string ElementText(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return absl::StrCat(v);
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, p, 8);
      return absl::StrCat(v);
    }
    case DType::kBF16: {
      BF16 v;
      std::memcpy(&v, p, 2);
      return absl::StrCat(ToFloat(v), " (bf16 0x", absl::Hex(v.bits), ")");
    }
    case DType::kF16: {
      F16 v;
      std::memcpy(&v, p, 2);
      return absl::StrCat(ToFloat(v), " (f16 0x", absl::Hex(v.bits), ")");
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return absl::StrCat(v);
    }
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return absl::StrCat(v);
    }
    case DType::kU8:
      return absl::StrCat(static_cast<int>(*p));
  }
  return "?";
}

absl::Status Compare(const CollectiveCase& c, int rank, const uint8_t* got,
                     const std::vector<uint8_t>& want, const char* what) {
  if (want.empty() || std::memcmp(got, want.data(), want.size()) == 0) return absl::OkStatus();
  const size_t es = DTypeSize(c.dtype);
  size_t i = 0;
  while (std::memcmp(got + i * es, want.data() + i * es, es) == 0) ++i;
  return absl::InternalError(absl::StrCat(
      CaseName(c), " rank ", rank, ": ", what, " differs at element ", i, ": got ",
      ElementText(c.dtype, got + i * es), ", want ", ElementText(c.dtype, want.data() + i * es)));
}

}  // namespace

std::string CaseName(const CollectiveCase& c) {
  std::string s = absl::StrCat(CollectiveName(c.kind));
  if (Reduces(c.kind)) {
    absl::StrAppend(&s, "_", ReduceKindName(c.op));
  }
  absl::StrAppend(&s, "_", DTypeName(c.dtype), "_n", c.count, c.in_place ? "_inplace" : "");
  return s;
}

double PremulScalar(int rank, bool exact) {
  if (exact) return (rank % 2) ? 0.5 : 0.25;
  return 1.0 / (3.0 + rank);
}

std::vector<uint8_t> MakeInput(DType dtype, size_t elems, int rank, uint64_t seed, bool exact) {
  switch (dtype) {
    case DType::kF32:
      return FillTyped<float>(elems, rank, seed, exact);
    case DType::kF64:
      return FillTyped<double>(elems, rank, seed, exact);
    case DType::kBF16:
      return FillTyped<BF16>(elems, rank, seed, exact);
    case DType::kF16:
      return FillTyped<F16>(elems, rank, seed, exact);
    case DType::kI32:
      return FillTyped<int32_t>(elems, rank, seed, exact);
    case DType::kI64:
      return FillTyped<int64_t>(elems, rank, seed, exact);
    case DType::kU8:
      return FillTyped<uint8_t>(elems, rank, seed, exact);
  }
  return {};
}

std::vector<uint8_t> ReferenceOutput(const CollectiveCase& c, int n, int rank) {
  const size_t es = DTypeSize(c.dtype);
  std::vector<std::vector<uint8_t>> in;
  for (int k = 0; k < n; ++k)
    in.push_back(MakeInput(c.dtype, InputElems(c, n), k, c.seed, c.exact_data));
  switch (c.kind) {
    case CollectiveKind::kAllReduce: {
      std::vector<uint8_t> out(c.count * es);
      ReduceRefDispatch(c.dtype, in, 0, c.count, c.op, n, c.exact_data, out.data(),
                        c.nccl_arithmetic);
      return out;
    }
    case CollectiveKind::kReduceScatter: {
      std::vector<uint8_t> out(c.count * es);
      ReduceRefDispatch(c.dtype, in, static_cast<size_t>(rank) * c.count, c.count, c.op, n,
                        c.exact_data, out.data(), c.nccl_arithmetic);
      return out;
    }
    case CollectiveKind::kAllGather: {
      std::vector<uint8_t> out;
      for (int k = 0; k < n; ++k) out.insert(out.end(), in[k].begin(), in[k].end());
      return out;
    }
    case CollectiveKind::kBroadcast:
      return in[c.root];
    case CollectiveKind::kBarrier:
      return {};
  }
  return {};
}

const char* MatrixSkipReason(const CollectiveVariant& k, DType dtype, bool in_place) {
  if ((k.kind == CollectiveKind::kBroadcast || k.kind == CollectiveKind::kBarrier) && in_place) {
    return "broadcast and barrier have a single form";
  }
  if (k.kind == CollectiveKind::kBarrier && dtype != DType::kF32) return "a barrier has no dtype";
  return nullptr;
}

bool RefusedUpFront(const CollectiveVariant& k, DType dtype) {
  return Reduces(k.kind) && (k.op == ReduceKind::kAvg || k.op == ReduceKind::kPreMulSum) &&
         !IsFloating(dtype);
}

absl::Status CheckAllSizes(Group& g, const CollectiveVariant& k, DType dtype, bool in_place) {
  uint64_t seed = 1;
  for (size_t count : kCheckSizes) {
    CollectiveCase c{k.kind, k.op, dtype, count, in_place, false, seed++, g.size() - 1};
    RETURN_IF_ERROR(RunAndCheck(g, c));
  }
  return absl::OkStatus();
}

std::string MatrixCaseName(const CollectiveVariant& k, DType dtype, int ranks, bool in_place) {
  std::string s(CollectiveName(k.kind));
  if (Reduces(k.kind)) absl::StrAppend(&s, "_", ReduceKindName(k.op));
  absl::StrAppend(&s, "_", DTypeName(dtype), "_r", ranks, in_place ? "_inplace" : "");
  return s;
}

absl::Status LaunchStatus(Group& g, CollectiveKind kind, DType dtype, ReduceKind op) {
  std::vector<int64_t> buf(4 * static_cast<size_t>(g.size()));
  const ReduceOp rop{op, 0.5};
  absl::StatusOr<WorkPtr> w;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      w = g.AllReduce(buf.data(), buf.data(), 4, dtype, rop);
      break;
    case CollectiveKind::kReduceScatter:
      w = g.ReduceScatter(buf.data(), buf.data(), 1, dtype, rop);
      break;
    case CollectiveKind::kAllGather:
      w = g.AllGather(buf.data(), buf.data(), 1, dtype);
      break;
    case CollectiveKind::kBroadcast:
      w = g.Broadcast(buf.data(), 4, dtype, 0);
      break;
    case CollectiveKind::kBarrier:
      w = g.Barrier();
      break;
  }
  if (w.ok()) RETURN_IF_ERROR((*w)->Wait(absl::Seconds(60)));  // don't leave it in flight
  return w.status();
}

absl::Status RunAndCheck(Group& g, const CollectiveCase& c, absl::Duration timeout) {
  const int n = g.size();
  const int r = g.rank();
  const size_t es = DTypeSize(c.dtype);
  const std::vector<uint8_t> input = MakeInput(c.dtype, InputElems(c, n), r, c.seed, c.exact_data);
  const std::vector<uint8_t> want = ReferenceOutput(c, n, r);
  ReduceOp op{c.op, PremulScalar(r, c.exact_data)};
  std::vector<uint8_t> send = input;
  std::vector<uint8_t> recv;
  const uint8_t* out = nullptr;
  absl::StatusOr<WorkPtr> w;
  switch (c.kind) {
    case CollectiveKind::kAllReduce:
      if (c.in_place) {
        w = g.AllReduce(send.data(), send.data(), c.count, c.dtype, op);
        out = send.data();
      } else {
        recv.assign(c.count * es, 0xAB);
        w = g.AllReduce(send.data(), recv.data(), c.count, c.dtype, op);
        out = recv.data();
      }
      break;
    case CollectiveKind::kReduceScatter:
      if (c.in_place) {
        uint8_t* at = send.data() + static_cast<size_t>(r) * c.count * es;
        w = g.ReduceScatter(send.data(), at, c.count, c.dtype, op);
        out = at;
      } else {
        recv.assign(c.count * es, 0xAB);
        w = g.ReduceScatter(send.data(), recv.data(), c.count, c.dtype, op);
        out = recv.data();
      }
      break;
    case CollectiveKind::kAllGather:
      recv.assign(static_cast<size_t>(n) * c.count * es, 0xAB);
      if (c.in_place) {
        uint8_t* at = recv.data() + static_cast<size_t>(r) * c.count * es;
        if (!input.empty()) std::memcpy(at, input.data(), input.size());
        w = g.AllGather(at, recv.data(), c.count, c.dtype);
      } else {
        w = g.AllGather(send.data(), recv.data(), c.count, c.dtype);
      }
      out = recv.data();
      break;
    case CollectiveKind::kBroadcast:
      w = g.Broadcast(send.data(), c.count, c.dtype, c.root);
      out = send.data();
      break;
    case CollectiveKind::kBarrier:
      w = g.Barrier();
      break;
  }
  if (!w.ok()) return w.status();
  RETURN_IF_ERROR((*w)->Wait(timeout));
  if (!(*w)->Done()) return absl::InternalError("Wait returned OK but the work is not done");
  RETURN_IF_ERROR(Compare(c, r, out, want, "output"));
  const bool send_is_separate = !c.in_place && c.kind != CollectiveKind::kBroadcast;
  if (send_is_separate)
    RETURN_IF_ERROR(Compare(c, r, send.data(), input, "send buffer (must be unchanged)"));
  return absl::OkStatus();
}

}  // namespace braid::testing
