// Test harness for ShardedOptimizer: a rank's whole stack (mesh, reducer, gather group,
// gatherer, optimizer) over a world group, the exact gradients every rank contributes, and the
// serial unsharded reference (optim/adamw_math.h applied to every element of every parameter).
//
// Exactness: gradients are k/8 with |k| <= 8, initial weights k/16; with world sizes that are
// powers of two, every sum, average, f16 pre/post divide and squared norm any rank or the
// reference forms is exact, so results compare bit for bit whatever the reduction order.
#ifndef BRAID_TESTS_OPTIM_OPTIMIZER_HARNESS_H_
#define BRAID_TESTS_OPTIM_OPTIMIZER_HARNESS_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "comm/mesh.h"
#include "optim/sharded_optimizer.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/param_gatherer.h"

namespace braid::optim::testing {

using sched::SyncMode;

struct OptScenario {
  int replicas = 1;  // > 1: hybrid mode on a replicas x shards mesh
  int shards = 2;
  DType dtype = DType::kF32;
  OptimizerConfig opt;
  std::vector<size_t> counts = {37, 128, 5, 300, 17, 64, 1, 250, 33, 90};
  size_t bucket_cap_bytes = 1024;
  int steps = 4;
  std::vector<SyncMode> schedule = {SyncMode::kSync};  // microbatches of one step
  int inf_step = -1;  // this step, the last rank puts bad_value into one gradient element
  float bad_value = std::numeric_limits<float>::infinity();  // or a NaN
  int lr_change_step = -1;  // before this step, group 0's lr is halved
  // Divergent control flow: ranks use different parameters (UsedIn); the reducer agrees on use
  // this way and the optimizer skips parameters no rank used (kNone: every rank uses all).
  sched::UnusedAgreement agree = sched::UnusedAgreement::kNone;
};

// A scenario with a name (gtest parameter), printed by its name.
struct NamedScenario {
  std::string name;
  OptScenario s;
};
void PrintTo(const NamedScenario& c, std::ostream* os);

// replicas x shards (hybrid when replicas > 1), two parameter groups (group 1: parameters 2, 6
// and 8, with their own AdamW / SGD hyper-parameters), 4 steps.
OptScenario TwoGroupScenario(int replicas, int shards);

// One rank's stack. Members are destroyed in reverse: optimizer, gatherer, groups.
struct RankStack {
  Mesh mesh;
  std::unique_ptr<Group> gather_group;
  std::unique_ptr<sched::GradientReducer> reducer;
  std::unique_ptr<sched::ParamGatherer> gatherer;
  std::unique_ptr<ShardedOptimizer> opt;
  int world_rank = 0;
  int world_size = 1;
};

// Where the stack's parameters live: host memory by default; device parameters (a device
// backend's world) need the optimizer's device step kernels.
struct StackPlacement {
  Device device = Device::Cpu();
  std::shared_ptr<DeviceStepKernels> kernels;
  absl::Duration timeout = absl::Seconds(60);  // reducer, gatherer and optimizer deadlines
};

// Builds the stack (collective over `world`) and sets every parameter's initial value.
absl::StatusOr<std::unique_ptr<RankStack>> BuildStack(Group& world, const OptScenario& s,
                                                      const StackPlacement& where = {});

// Gradient of element j of parameter i contributed by `rank` in microbatch u of step t.
float Grad(int rank, int t, int u, int i, size_t j, const OptScenario& s);
float InitialValue(int i, size_t j);
// Whether `rank` uses parameter i in microbatch u of step t (always, unless s.agree is set):
// rank-dependent sets, parameter 3 unused by every rank in odd steps, parameter 4 used by
// rank 0 only in step 2.
bool UsedIn(int rank, int t, int u, int i, const OptScenario& s);

// Runs steps [first, last) of `s` on this rank: backwards with random readiness orders (seeded
// by rank and step), Step() when overlap is off, then WaitAllParams.
absl::Status RunSteps(RankStack& st, const OptScenario& s, int first, int last);

// The full parameters (model dtype bytes) as the gatherer holds them.
absl::StatusOr<std::vector<std::vector<uint8_t>>> Params(RankStack& st, const OptScenario& s);

// Builds the stack on `world`, runs every step of `s` and compares the parameters with the
// reference after each step (bit for bit), then the step report and per-bucket step counts.
// The error names the rank, step and parameter that differ.
absl::Status CheckAgainstReference(Group& world, const OptScenario& s);

// After every step of `s` on this rank: the last step's report (rounds, error, skipped flag,
// gradient norm and clip factor against the reference's) and every bucket's step count.
absl::Status CheckReport(RankStack& st, const OptScenario& s);

// The reference's global gradient norm of step t (the averaged gradients; inf / NaN at
// s.inf_step).
double ReferenceNorm(const OptScenario& s, int t);

// Serial reference: the parameters (model dtype bytes) after steps [0, last) of `s`.
std::vector<std::vector<uint8_t>> ReferenceParams(const OptScenario& s, int last);

}  // namespace braid::optim::testing

#endif  // BRAID_TESTS_OPTIM_OPTIMIZER_HARNESS_H_
