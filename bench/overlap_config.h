// bench/overlap's configuration: its step modes and flags (bench/overlap.cc's header says what
// each mode and flag means).
//
//   ASSIGN_OR_RETURN(Flags flags, Flags::Parse(argc, argv));
//   ASSIGN_OR_RETURN(Config c, ParseConfig(flags));   // errors name the flag
//   for (StepMode m : c.Modes()) std::printf("%s\n", ModeName(m));
#ifndef BRAID_BENCH_OVERLAP_CONFIG_H_
#define BRAID_BENCH_OVERLAP_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/bench_flags.h"
#include "scheduler/gradient_reducer.h"

namespace braid::bench {

using sched::ReduceMode;

enum class StepMode {
  kComputeOnly,
  kCommOnly,
  kSyncAfterBackward,
  kOverlapped,
  kOptimAfterBackward,  // --optimizer: overlapped reduction, then every shard stepped, then wait
  kOptimOverlapped,     // --optimizer: each shard stepped as its reduction completes
  kPriority,            // overlapped, through an OpScheduler (partitions, urgent gathers first)
  kAutotuned,           // overlapped, with the configuration the Autotuner adopted (--autotune)
};

const char* ModeName(StepMode m);
const char* ReduceName(ReduceMode m);

struct Config {
  std::string backend = "local";  // --backend=mpi: one process per rank (bench/overlap_mpi.h)
  std::vector<int> ranks;
  ReduceMode reduce = ReduceMode::kAllReduce;
  bool fully_sharded = false;  // --mode=fully_sharded: ZeRO-3 units (bench/overlap_sharded.h)
  int64_t credit = 0;          // --credit: the priority mode's OpScheduler credit (bytes)
  bool priorities = true;      // --priorities=false: the priority mode with partitions only
  bool hold_waited = false;    // --hold=waited: reductions wait only while a gather is waited for
  bool aa = false;             // --aa: the priority mode without its scheduler (an A/A check)
  bool autotune = true;        // --autotune=false: no autotuned mode (its tuning steps run first)
  std::string timeline;        // --timeline=PREFIX: the priority scheduler's trace, per rank
  int shards = 0;              // hybrid: ranks per shard group (0: ranks / 2)
  double scale = 0.25;
  int blocks = 12;
  int64_t layer_compute_us = 2000;
  int iters = 21, warmup = 2;
  int64_t bucket_cap = 0, first_bucket_cap = 0;  // bytes; 0: DDP's defaults x scale
  bool sleep_compute = false;                    // --compute=sleep
  bool csv = false;
  bool optimizer = false;  // --optimizer=adamw: the two optimizer modes too
  int optimizer_threads = 1;

  std::vector<StepMode> Modes() const {
    std::vector<StepMode> m = {StepMode::kComputeOnly, StepMode::kCommOnly,
                               StepMode::kSyncAfterBackward, StepMode::kOverlapped};
    if (optimizer) {
      m.push_back(StepMode::kOptimAfterBackward);
      m.push_back(StepMode::kOptimOverlapped);
    }
    m.push_back(StepMode::kPriority);
    if (autotune) m.push_back(StepMode::kAutotuned);
    return m;
  }
};

absl::StatusOr<Config> ParseConfig(const Flags& f);

}  // namespace braid::bench

#endif  // BRAID_BENCH_OVERLAP_CONFIG_H_
