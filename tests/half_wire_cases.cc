// The 2-byte half wire (CollectiveOptions::half_wire) on a CPU backend's world (mpi under
// mpirun: tests/mpi_half_wire_test.cc; gloo: tests/gloo/gloo_half_wire_test.cc), 2 to 4 ranks:
// bf16/f16 all-reduce and reduce-scatter, sum / avg / premul_sum.
//
// What the result equals, per element: a binary tree over the ranks' inputs h_r (premul:
// h_r = dtype(f32(x_r) * s_r)) whose every node is dtype(f32(left) + f32(right)) (rounded to
// nearest even at each hop, NCCL's half sum), in the association Open MPI's algorithm picks;
// avg then divides that by n once (dtype(f32(t) / n)). At 2 ranks there is one tree, so the
// result is checked bit for bit against it; at 3 and 4 ranks it must be bit for bit one of the
// trees (every association is enumerated), identical on every rank, and differ from the sum
// rounded once somewhere (it would not with an f32 wire). The data's sums are exact in f32, so
// the default f32 wire must give the once-rounded sum exactly: that path is checked unchanged.
#include "tests/half_wire_cases.h"

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/group.h"
#include "comm/reduce_kernels.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"

namespace braid::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

uint16_t Round(float x, DType t) {
  uint16_t h = 0;
  CastScale(&x, DType::kF32, &h, t, 1, ScaleSpec{});
  return h;
}
float Widen(uint16_t h, DType t) {
  float x = 0;
  CastScale(&h, t, &x, DType::kF32, 1, ScaleSpec{});
  return x;
}

// Rank r's input element i: an integer of the dtype's full precision (bf16: 8 bits, f16: 11)
// times a power of two that differs by rank, exact in the dtype; sums of 4 are exact in f32 but
// often not in the dtype.
uint16_t Input(int r, size_t i, DType t) {
  const int top = t == DType::kBF16 ? 255 : 2047;
  const int m =
      static_cast<int>((i * 7919 + static_cast<size_t>(r) * 104729) % (2 * top + 1)) - top;
  return Round(static_cast<float>(m) / static_cast<float>(1 << ((i + r) % 5)), t);
}

double Scalar(int r) { return 1.0 + 0.375 * r; }  // premul: each rank its own

// Every per-hop-rounded tree value over the ranks in `mask`.
std::set<uint16_t> Trees(const std::vector<uint16_t>& h, unsigned mask, DType t) {
  if ((mask & (mask - 1)) == 0) return {h[__builtin_ctz(mask)]};
  std::set<uint16_t> out;
  const unsigned low = mask & (~mask + 1);  // splits containing the lowest rank on the left
  for (unsigned left = (mask - 1) & mask; left != 0; left = (left - 1) & mask) {
    if ((left & low) == 0) continue;
    for (uint16_t a : Trees(h, left, t))
      for (uint16_t b : Trees(h, mask & ~left, t)) out.insert(Round(Widen(a, t) + Widen(b, t), t));
  }
  return out;
}

struct Case {
  CollectiveKind kind;
  DType dtype;
  ReduceKind op;
};

std::string Name(const Case& c) {
  return absl::StrCat(CollectiveName(c.kind), " ", DTypeName(c.dtype), " ", ReduceKindName(c.op));
}

class HalfWire : public ::testing::TestWithParam<Case> {};

TEST_P(HalfWire, IsAPerHopRoundedTreeOfTheHalves) {
  const Case c = GetParam();
  Group& g = *HalfWireWorld();
  const int n = g.size();
  const int me = g.rank();
  const bool rs = c.kind == CollectiveKind::kReduceScatter;
  const size_t count = rs ? 1031 : 4099;  // per rank's result
  const size_t total = rs ? count * n : count;
  const ReduceOp op =
      c.op == ReduceKind::kPreMulSum ? ReduceOp::PreMulSum(Scalar(me)) : ReduceOp{c.op, 1.0};
  std::vector<uint16_t> send(total), recv(count);
  for (size_t i = 0; i < total; ++i) send[i] = Input(me, i, c.dtype);
  for (bool half_wire : {true, false}) {
    if (!half_wire && c.op != ReduceKind::kSum) continue;
    CollectiveOptions o;
    o.half_wire = half_wire;
    auto w = rs ? g.ReduceScatter(send.data(), recv.data(), count, c.dtype, op, o)
                : g.AllReduce(send.data(), recv.data(), count, c.dtype, op, o);
    ASSERT_OK(w.status());
    ASSERT_OK((*w)->Wait(kTimeout));
    size_t once_differs = 0;
    for (size_t i = 0; i < count; ++i) {
      const size_t e = rs ? static_cast<size_t>(me) * count + i : i;
      std::vector<uint16_t> h(n);
      float exact = 0;  // in f32, exact for this data
      for (int r = 0; r < n; ++r) {
        h[r] = Input(r, e, c.dtype);
        if (c.op == ReduceKind::kPreMulSum) {
          float x = Widen(h[r], c.dtype) * static_cast<float>(Scalar(r));
          h[r] = Round(x, c.dtype);
        }
        exact += Widen(h[r], c.dtype);
      }
      std::set<uint16_t> want;
      for (uint16_t t : Trees(h, (1u << n) - 1, c.dtype)) {
        if (c.op == ReduceKind::kAvg) t = Round(Widen(t, c.dtype) / static_cast<float>(n), c.dtype);
        want.insert(t);
      }
      const uint16_t once = Round(exact, c.dtype);
      if (!half_wire) {
        ASSERT_EQ(recv[i], once) << Name(c) << " f32 wire, element " << i;
        continue;
      }
      ASSERT_TRUE(want.count(recv[i]) == 1)
          << Name(c) << " element " << i << ": 0x" << std::hex << recv[i] << " is no tree of " << n
          << " ranks (sum rounded once: 0x" << once << ")";
      if (n == 2) {
        ASSERT_EQ(want.size(), 1u);
      }
      once_differs += recv[i] != once;
    }
    if (half_wire && n >= 3 && c.op == ReduceKind::kSum) {
      EXPECT_GT(once_differs, count / 20) << Name(c) << ": the sum looks rounded once (f32 wire)";
    }
  }
  if (!rs) {  // every rank holds the same bits
    std::vector<uint16_t> all(count * n);
    auto w = g.AllGather(recv.data(), all.data(), count, c.dtype);
    ASSERT_OK(w.status());
    ASSERT_OK((*w)->Wait(kTimeout));
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(0, std::memcmp(all.data() + r * count, recv.data(), count * 2)) << "rank " << r;
  }
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter})
    for (DType t : {DType::kBF16, DType::kF16})
      for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kAvg, ReduceKind::kPreMulSum})
        out.push_back({k, t, op});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Wire, HalfWire, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string s = Name(info.param);
                           for (char& ch : s)
                             if (ch == ' ') ch = '_';
                           return s;
                         });

}  // namespace

Group*& HalfWireWorld() {
  static Group* world = nullptr;
  return world;
}

}  // namespace braid::testing
