// A serial reference for GradientReducer results, shared by reducer tests on any backend.
//
//   const Scenario sc{ReduceMode::kHybrid, /*replicas=*/2, /*shards=*/2, /*dtypes=*/1, "NRNS"};
//   ... run sc.schedule's backwards, each rank accumulating grad(rank, p, m, step, i) ...
//   EXPECT_OK(CheckStep(sc, reducer, world_rank, step, grad));
//
// The reference replays each reduction stage in group-rank order with the arithmetic a
// backend uses (sum in f32 for f32/bf16/f16, one rounding to the gradient dtype at the end of
// a stage) and the divide rule of scheduler/divide.h, written out independently here. Where
// the backend reduces in group-rank order (local) any gradients compare bit for bit; where it
// picks its own order (MPI) the gradients must make every partial sum exact (see
// tests/mpi_reducer_test.cc).
//
#ifndef BRAID_TESTS_REDUCER_REFERENCE_H_
#define BRAID_TESTS_REDUCER_REFERENCE_H_

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/dtype.h"
#include "comm/group.h"
#include "comm/tensor.h"
#include "scheduler/bucket_plan.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/op_scheduler.h"

namespace braid::sched::reference {

struct Scenario {
  ReduceMode mode;
  int replicas, shards;     // world = replicas * shards; all-reduce/reduce-scatter use replicas = 1
  int dtypes;               // 0 f32, 1 bf16, 2 f16, 3 mixed (parameter i gets dtype i % 3)
  const char* schedule;     // one letter per microbatch: N no_sync, R reduce_scatter_only, S sync
  bool copy_in = false;     // framework-owned gradient buffers (gradient_as_bucket_view = false)
  bool reduce_f32 = false;  // bf16/f16 gradients reduced in f32 (ReducerConfig::reduce_dtype)
  // The framework keeps each microbatch's gradient and passes it at MarkReady(id, ready, grad)
  // (the reducer copies / adds it into the slot). Bit-exact with the reference when grad()
  // returns values representable in the gradient dtype (the reference adds grad() unrounded).
  bool values = false;
  // ReducerConfig::shard_gradients (implies values): results read from the kept shards, and
  // the MemoryStats figures checked after every synced step (see RunScenario).
  bool shard_gradients = false;
  // > 0: the reducer goes through an OpScheduler (scheduler/op_scheduler.h) with this credit,
  // so every bucket larger than it is reduced as several partitions; results must not change.
  size_t credit = 0;
};

// "hybrid_2x2_bf16_NRNS": usable as a gtest parameter name.
std::string ScenarioName(const Scenario& sc);
// Lets gtest print a Scenario parameter by name (found by argument-dependent lookup).
inline void PrintTo(const Scenario& sc, std::ostream* os) { *os << ScenarioName(sc); }
SyncMode SyncModeOf(char letter);

// Eight parameters with odd sizes (they straddle shards and fill several buckets when the
// caps are small), named "layer<i>.weight", ids 1000 + 7 i.
std::vector<ParamSpec> MakeParams(int dtypes);

// Element i of the gradient of parameter index p on world rank r, microbatch m of step s.
using GradFn = double (*)(int rank, int param, int microbatch, int step, size_t i);

// What the framework does in backward: view += grad, in the view's dtype.
void Accumulate(const TensorView& view, GradFn grad, int rank, int param, int microbatch, int step);

// Compares what `reducer` holds on world rank `rank` after step `step` of sc.schedule (the
// averaged gradients in all-reduce mode; this rank's shard of every bucket, padding included,
// otherwise) with the reference, byte for byte. The error names rank, step, bucket, dtype and
// the first differing element. The reference's divide table covers groups of 1, 2, 3, 4 and 8.
// With sc.copy_in, all-reduce mode results are read from `copy_in_grads` (the framework's
// buffers, one per parameter index) instead of the reducer's views. With `bucket_copies`
// (host copies of each bucket's bytes, e.g. read back from a device), the reducer's results are
// read from those instead of its own memory.
absl::Status CheckStep(const Scenario& sc, const GradientReducer& reducer, int rank, int step,
                       GradFn grad, const std::vector<std::vector<char>>* copy_in_grads = nullptr,
                       const std::vector<std::vector<char>>* bucket_copies = nullptr);

// Runs sc on `world` as rank world.rank(): builds the mesh (hybrid) and a reducer with small
// bucket caps (several buckets per dtype), then two steps of sc.schedule's backwards, each
// accumulating grad() into the gradients (views, or the framework's buffers with sc.copy_in)
// in a random readiness order that differs per rank, marked from two threads, and checks
// every step with CheckStep. Collective: every rank of `world` calls it with the same sc.
// With sc.shard_gradients, after every synced step: MemoryUse::kGradShards current equals the
// kept shards' bytes (plus hybrid's f32 shards with reduce_f32) exactly, and kGradBuckets
// current is at most every bucket's storage (and staging) once: the pool never holds more.
absl::Status RunScenario(Group& world, const Scenario& sc, GradFn grad, absl::Duration timeout);

}  // namespace braid::sched::reference

#endif  // BRAID_TESTS_REDUCER_REFERENCE_H_
