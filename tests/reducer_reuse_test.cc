// Tied and reused parameters (scheduler/reducer_marks.h) on the local backend against the serial
// reference (tests/reducer_reference.h): parameter p is marked 1 + p % 3 times per backward,
// each mark one contribution of its gradient, in a random order that differs per rank, from two
// threads; counts declared (ParamSpec::marks) or counted in the first synced backward
// (kCountMarks); every mode, no_sync and reduce_scatter_only windows, gradient views, values
// passed at the mark, the copy-in path and kept shards. Bit-exact: every contribution is a
// multiple of 1/64 below 1 in magnitude, so every partial sum of the contributions is exact
// and equals the reference's one gradient. Then the errors: a mark beyond the count (refused,
// nothing added), fewer marks than counted, and a bad declaration.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "tests/multirank.h"
#include "tests/reducer_reference.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;
using reference::Scenario;

uint64_t Mix(int r, int p, int m, int s, size_t i, int j) {
  uint64_t z = ((((((static_cast<uint64_t>(r) * 131 + p) * 17 + m) * 7 + s) * 5 + j) << 32) + i) +
               0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The whole gradient of one microbatch: k / 64 with k in [-32, 32).
double Coarse(int r, int p, int m, int s, size_t i) {
  return (static_cast<int>(Mix(r, p, m, s, i, 0) % 64) - 32) / 64.0;
}

int MarksOf(int p) { return 1 + p % 3; }

// Contribution j of MarksOf(p): the later ones small multiples of 1/64, the first the rest, so
// that they sum to Coarse() exactly in any order.
double Piece(int r, int p, int m, int s, size_t i, int j) {
  auto small = [&](int k) { return (static_cast<int>(Mix(r, p, m, s, i, k) % 17) - 8) / 64.0; };
  if (j > 0) return small(j);
  double rest = Coarse(r, p, m, s, i);
  for (int k = 1; k < MarksOf(p); ++k) rest -= small(k);
  return rest;
}

// view += contribution j, in the view's dtype (exact).
void AddPiece(const TensorView& v, int r, int p, int m, int s, int j) {
  char* base = static_cast<char*>(v.data);
  for (size_t i = 0; i < v.count; ++i) {
    StoreElement(base, v.dtype, i, LoadElement(base, v.dtype, i) + Piece(r, p, m, s, i, j));
  }
}

struct ReuseCase {
  Scenario sc;
  bool counted;  // kCountMarks for the parameters marked more than once, else declared
};

std::string CaseName(const ReuseCase& c) {
  return absl::StrCat(reference::ScenarioName(c.sc), c.counted ? "_counted" : "_declared");
}

// Three steps of c.sc.schedule, checked against the reference after each. With counted marks
// the first synced backward launches the buckets of counted parameters only at FinishBackward;
// every later synced backward launches every bucket before it (known counts).
absl::Status RunReuse(Group& world, const ReuseCase& c, absl::Duration timeout) {
  const Scenario& sc = c.sc;
  const int r = world.rank();
  Mesh mesh;
  ReducerGroups groups{&world, nullptr};
  if (sc.mode == ReduceMode::kHybrid) {
    ASSIGN_OR_RETURN(mesh, MakeMesh(world, sc.replicas, sc.shards));
    groups = {mesh.shard.get(), mesh.replica.get()};
  }
  ReducerConfig cfg;
  cfg.mode = sc.mode;
  cfg.first_bucket_cap_bytes = 256;
  cfg.bucket_cap_bytes = 4096;
  cfg.timeout = timeout;
  cfg.gradient_as_bucket_view = !sc.copy_in;
  cfg.shard_gradients = sc.shard_gradients;
  const bool values = sc.values || sc.shard_gradients;
  std::vector<ParamSpec> params = reference::MakeParams(sc.dtypes);
  for (size_t p = 0; p < params.size(); ++p) {
    const int n = MarksOf(static_cast<int>(p));
    params[p].marks = c.counted && n > 1 ? kCountMarks : n;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GradientReducer> red,
                   GradientReducer::Create(params, groups, cfg));
  std::vector<std::vector<char>> own(params.size());  // copy-in: the framework's buffers
  for (size_t p = 0; p < params.size(); ++p) {
    own[p].assign(params[p].count * DTypeSize(params[p].dtype), 0);
    if (sc.copy_in) RETURN_IF_ERROR(red->SetGradBuffer(params[p].id, own[p].data()));
  }
  std::mt19937 rng(99 + 31 * r);
  bool counts_known = !c.counted;
  for (int step = 0; step < 3; ++step) {
    RETURN_IF_ERROR(red->ZeroGrads());
    for (auto& o : own) std::fill(o.begin(), o.end(), 0);
    for (int m = 0; sc.schedule[m] != '\0'; ++m) {
      const SyncMode mode = reference::SyncModeOf(sc.schedule[m]);
      RETURN_IF_ERROR(red->BeginBackward(mode));
      std::vector<std::pair<int, int>> marks;  // (parameter, contribution)
      for (size_t p = 0; p < params.size(); ++p) {
        for (int j = 0; j < MarksOf(static_cast<int>(p)); ++j) marks.emplace_back(p, j);
      }
      std::shuffle(marks.begin(), marks.end(), rng);
      // Values: each contribution its own buffer, marked from either thread. Views and copy-in:
      // the framework adds into one buffer per parameter, so a parameter stays on one thread.
      std::vector<std::vector<char>> pieces(marks.size());
      auto mark_on = [&](int thread) -> absl::Status {
        for (size_t k = 0; k < marks.size(); ++k) {
          const auto [p, j] = marks[k];
          if ((values ? static_cast<int>(k) : p) % 2 != thread) continue;
          TensorView v{own[p].data(), params[p].count, params[p].dtype, params[p].device};
          if (values) {
            pieces[k].assign(own[p].size(), 0);
            v.data = pieces[k].data();
          } else if (!sc.copy_in) {
            ASSIGN_OR_RETURN(v, red->GradView(params[p].id));
          }
          AddPiece(v, r, p, m, step, j);
          RETURN_IF_ERROR(values ? red->MarkReady(params[p].id, DeviceEvent{}, v.data)
                                 : red->MarkReady(params[p].id));
        }
        return absl::OkStatus();
      };
      absl::Status other;
      std::thread t([&] { other = mark_on(1); });
      const absl::Status mine = mark_on(0);
      t.join();
      RETURN_IF_ERROR(mine);
      RETURN_IF_ERROR(other);
      if (mode != SyncMode::kNoSync) {
        for (size_t b = 0; b < red->plan().buckets().size(); ++b) {
          bool counting = false;
          for (int p : red->plan().buckets()[b].params) counting |= MarksOf(p) > 1;
          if (!counts_known && counting && red->BucketWork(static_cast<int>(b))->Done()) {
            return absl::InternalError(absl::StrCat("bucket ", b, " launched before its counts"));
          }
          if (counts_known) {  // launched on the last marks, before FinishBackward
            RETURN_IF_ERROR(red->BucketWork(static_cast<int>(b))->WaitUntil(absl::Now() + timeout));
          }
        }
      }
      RETURN_IF_ERROR(red->FinishBackward());
      if (mode != SyncMode::kNoSync) counts_known = true;
    }
    RETURN_IF_ERROR(reference::CheckStep(sc, *red, r, step, Coarse, values ? nullptr : &own));
  }
  return absl::OkStatus();
}

class ReuseVsReference : public ::testing::TestWithParam<ReuseCase> {};

TEST_P(ReuseVsReference, BitExact) {
  const ReuseCase c = GetParam();
  RunRanks(c.sc.replicas * c.sc.shards,
           [&](Group& g) { EXPECT_OK(RunReuse(g, c, absl::Seconds(60))); });
}

std::vector<ReuseCase> AllCases() {
  std::vector<ReuseCase> out;
  for (bool counted : {false, true}) {
    for (int dt : {0, 3}) {  // f32; f32, bf16 and f16 mixed
      for (const char* sched : {"S", "NS"}) {
        out.push_back({{ReduceMode::kAllReduce, 1, 3, dt, sched}, counted});
        out.push_back({{ReduceMode::kReduceScatter, 1, 2, dt, sched}, counted});
        out.push_back({{ReduceMode::kAllReduce, 1, 2, dt, sched, /*copy_in=*/true}, counted});
      }
      for (const char* sched : {"S", "NRS"})
        out.push_back({{ReduceMode::kHybrid, 2, 2, dt, sched}, counted});
    }
    for (const char* sched : {"S", "NS"}) {  // values passed at the marks, and kept shards
      Scenario v{ReduceMode::kAllReduce, 1, 2, 1, sched};
      v.values = true;
      out.push_back({v, counted});
      Scenario kept{ReduceMode::kReduceScatter, 1, 4, 1, sched};
      kept.shard_gradients = true;
      out.push_back({kept, counted});
    }
    Scenario hk{ReduceMode::kHybrid, 2, 2, 0, "RS"};
    hk.shard_gradients = true;
    out.push_back({hk, counted});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, ReuseVsReference, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<ReuseCase>& i) {
                           return CaseName(i.param);
                         });

std::vector<ParamSpec> Tied(int marks) {
  return {ParamSpec{1, 5, DType::kF32, Device::Cpu(), "wte.weight", 0, marks},
          ParamSpec{2, 3, DType::kF32, Device::Cpu(), "ln.bias"}};
}

// One synced backward marking "wte.weight" `n` times (each adding 1 on every rank) and
// "ln.bias" once; returns FinishBackward's status, `late` the status of the last mark.
absl::Status Backward(GradientReducer& red, int n, bool values, absl::Status* late) {
  RETURN_IF_ERROR(red.ZeroGrads());
  RETURN_IF_ERROR(red.BeginBackward(SyncMode::kSync));
  const std::vector<float> one(5, 1.0f);
  *late = absl::OkStatus();
  for (int k = 0; k < n; ++k) {
    if (values) {
      *late = red.MarkReady(1, DeviceEvent{}, one.data());
    } else {
      ASSIGN_OR_RETURN(TensorView v, red.GradView(1));
      for (int e = 0; e < 5; ++e) static_cast<float*>(v.data)[e] += 1.0f;
      *late = red.MarkReady(1);
    }
  }
  RETURN_IF_ERROR(red.MarkReady(2, DeviceEvent{}, one.data()));
  return red.FinishBackward();
}

TEST(ReuseErrors, MarkBeyondTheCountIsRefusedAndAddsNothing) {
  for (const bool counted : {false, true}) {
    RunRanks(2, [&](Group& g) {
      ReducerConfig cfg;
      cfg.mode = ReduceMode::kReduceScatter;
      cfg.shard_gradients = true;  // values at the marks: the refused one must not be added
      auto red = GradientReducer::Create(Tied(counted ? kCountMarks : 2), {&g, nullptr}, cfg);
      ASSERT_TRUE(red.ok()) << red.status();
      absl::Status late;
      ASSERT_OK(Backward(**red, 2, true, &late));  // counts 2 when counted
      ASSERT_OK(late);
      ASSERT_OK(Backward(**red, 3, true, &late));
      ExpectError(late, absl::StatusCode::kFailedPrecondition,
                  {"'wte.weight' (id 1)", "more than its 2",
                   counted ? "counted in the first synced backward" : "declared"});
      // The two accepted contributions, averaged over two ranks: 2 (the refused third adds 0).
      ASSERT_EQ((*red)->plan().buckets().size(), 1u);
      const Bucket& bk = (*red)->plan().buckets()[0];
      const float* shard = static_cast<const float*>((*red)->ShardView(0).data);
      const size_t lo = g.rank() * bk.shard_count, off = (*red)->plan().slot(0).offset;
      for (size_t e = lo; e < lo + bk.shard_count; ++e) {
        if (e >= off && e < off + 5) {
          EXPECT_EQ(shard[e - lo], 2.0f) << "element " << e;
        }
      }
    });
  }
}

TEST(ReuseErrors, FewerMarksThanCountedFailsFinishBackwardNamed) {
  RunRanks(2, [](Group& g) {
    ReducerConfig cfg;
    cfg.allow_unused = true;
    auto red = GradientReducer::Create(Tied(kCountMarks), {&g, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    absl::Status late;
    ASSERT_OK(Backward(**red, 2, false, &late));
    ASSERT_OK(Backward(**red, 2, false, &late));
    ASSERT_OK(Backward(**red, 0, false, &late));  // unused: allow_unused zero-fills it
    auto v = (*red)->GradView(1);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(static_cast<float*>(v->data)[0], 0.0f);
    ExpectError(Backward(**red, 1, false, &late), absl::StatusCode::kFailedPrecondition,
                {"'wte.weight' (id 1)", "marked ready 1 time(s)", "but 2 were counted"});
    // The next backward with the counted marks works again.
    ASSERT_OK(Backward(**red, 2, false, &late));
    EXPECT_EQ(static_cast<float*>(v->data)[0], 2.0f);
  });
}

TEST(ReuseErrors, DefaultOneMarkAndBadDeclarations) {
  RunRanks(1, [](Group& g) {
    auto red = GradientReducer::Create(Tied(1), {&g, nullptr}, ReducerConfig{});
    ASSERT_TRUE(red.ok());
    absl::Status late;
    ASSERT_OK(Backward(**red, 2, false, &late));
    ExpectError(late, absl::StatusCode::kFailedPrecondition,
                {"'wte.weight' (id 1)", "already marked", "param_marks"});
    ExpectError(GradientReducer::Create(Tied(-1), {&g, nullptr}, ReducerConfig{}).status(),
                absl::StatusCode::kInvalidArgument, {"'wte.weight' (id 1)", "got -1"});
  });
}

}  // namespace
}  // namespace braid::sched
