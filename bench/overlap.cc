// overlap: how much of the gradient communication Braid hides behind the backward, on a
// simulated training step with GPT-2-small parameter shapes.
//
//   tools/bazelw run //bench:overlap                                   # 2 and 4 ranks, all-reduce
//   bazel-bin/bench/overlap --csv --ranks=2,4 --mode=reduce_scatter --iters=31
//
// Flags: kUsage below (--help). The default run takes about a minute on 2 vCPUs.
//
// Ranks are threads on the `local` backend, or with --backend=mpi processes of mpirun on the
// `mpi` backend (one rank count per run; start line and results over raw MPI, overlap_mpi.h;
//   bazel-bin/bench/overlap --backend=mpi --ranks=2   relaunches itself under mpirun).
// Each rank owns a GradientReducer over the model of
// bench/overlap_model.h (f32, scaled by --scale; buckets capped at DDP's 25 MiB / 1 MiB times
// --scale, so the scaled model has as many buckets as the real one would). A layer's backward
// is a fixed amount of real CPU work writing its gradients into their GradViews, calibrated
// to take --layer_compute_us on one uncontended thread (bench/overlap_compute.h); under
// contention (more ranks than cores, communication threads) it takes longer, and that is part
// of what is measured. --compute=sleep instead models an accelerator: the rank thread writes
// the layer's gradients once, then sleeps out the rest of --layer_compute_us (a host thread
// waiting on its device), which leaves the cores to the communication threads and so shows
// the scheduling alone. Layers run last to first. Four step modes, interleaved (their order
// rotates every iteration) so that machine noise hits them alike:
//   compute_only          the backward's compute, no Braid at all
//   comm_only             BeginBackward, MarkReady of every parameter, FinishBackward: the
//                         communication alone
//   sync_after_backward   all the compute, then the marks and FinishBackward: communication
//                         after backward, the baseline seed 000 (modded-nanogpt #149) improved on
//   overlapped            MarkReady of each layer's parameters as soon as its compute ends
//                         (as a post-accumulate-grad hook does), FinishBackward at the end
//   priority              overlapped, on the same reducer with an OpScheduler attached for the
//                         step (scheduler/op_scheduler.h): reductions in partitions of at most
//                         --credit bytes, a credit in flight, gathers (fully sharded) first
//   autotuned             overlapped with what the Autotuner (scheduler/autotuner.h) adopted
//                         among (bucket cap, credit) = (cap, 0) [the default = overlapped],
//                         (cap/2, 0), (2 cap, 0), (cap, credit), (cap, 4 credit); its trials are
//                         real autotuned steps run before the timed iterations, and the trial table
//                         is printed. Candidates with the default cap run on the same reducer.
// --mode=fully_sharded (ZeRO-3, bench/overlap_sharded.h): one unit per layer, a gatherer on its
// own group with fully_sharded, a UnitScheduler (prefetch 1) and a reduce-scatter reducer; a
// step is the forward (half a layer's compute per unit, gathers as the units are entered) and
// the backward (gathers again, reductions as layers finish); compute_only has the forward and
// backward compute, comm_only the gathers and reductions, sync_after_backward marks after the
// backward loop (gathers stay where the model needs them). --aa runs the priority mode without
// its scheduler: an A/A check of the noise between two modes on the same buffers.
// With --optimizer=adamw, two more (each with its own ShardedOptimizer, gatherer and group):
//   optim_after_backward  overlapped reduction, then Step() of every shard once FinishBackward
//                         returned, then WaitAllParams: the seeds' baseline (step after backward)
//   optim_overlapped      each shard stepped (and its all-gather started) as soon as its
//                         reduction completes, during the rest of the backward; then
//                         FinishBackward and WaitAllParams
// and the summary reports the exposed optimizer time: step_ms minus `overlapped` (the same
// backward and reduction without an optimizer).
// A step's time is the slowest rank's, from a common start (a barrier outside Braid) to the
// end of its FinishBackward (or compute). Reported: the median over --iters iterations after
// --warmup, compute_ms = median compute_only, comm_ms = median comm_only, and
// exposed_frac = (step_ms - compute_ms) / comm_ms: 0 for perfect overlap; about 1 when the
// communication is fully exposed (sync_after_backward). The embeddings are ready last (see
// overlap_model.h), so even perfect scheduling leaves their reduction exposed.
//
// --csv prints exactly: ranks,mode,step_ms,compute_ms,comm_ms,exposed_frac (one row per rank
// count x mode). Otherwise: the configuration, a table with min/max and the step split into
// backward_ms (the slowest rank's compute + marks) and tail_ms (from the last rank's end of
// backward to the end of the step: the reduction left after the last mark), so exposed time
// reads as "compute slowed down by communication threads" + "tail"; a summary per rank count,
// then the same CSV. After the timed iterations every rank runs one more overlapped step and
// checks its reduced gradients exactly (bench fails on any wrong element). Progress on stderr.
// ZeroGrads is not called: every step's compute overwrites the gradients it then reduces.
//
// Files: this one drives the run (rank threads or processes, the start line, the interleaved
// modes, the autotuner's trials, the exactness check); overlap_steps.h is one step of each
// mode on one rank; overlap_report.h turns the recorded times into rows and prints them.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "bench/bench_flags.h"
#include "bench/overlap_compute.h"
#include "bench/overlap_config.h"
#include "bench/overlap_model.h"
#include "bench/overlap_mpi.h"
#include "bench/overlap_report.h"
#include "bench/overlap_sharded.h"
#include "bench/overlap_steps.h"
#include "comm/backend.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "optim/training_stack.h"
#include "scheduler/autotuner.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/op_scheduler.h"

namespace braid::bench {
namespace {

using sched::GradientReducer;
using sched::ReduceMode;
using sched::SyncMode;

// The rank threads' start line, outside Braid (compute_only must not touch it). Abort()
// releases every waiter with false, so one failed rank never leaves the others waiting here.
class StartBarrier {
 public:
  explicit StartBarrier(int n) : n_(n) {}
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return false;
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    return !aborted_;
  }
  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

// Results of one rank count, filled by the rank threads (each writes only its own slots).
struct Shared {
  Shared(int ranks, int iters, int modes)
      : barrier(ranks),
        times(modes, std::vector<std::vector<StepTimes>>(iters, std::vector<StepTimes>(ranks))),
        wrong(ranks, 0) {}
  StartBarrier barrier;
  ProcessSync* procs = nullptr;  // --backend=mpi: the start line is across processes
  std::vector<std::vector<std::vector<StepTimes>>> times;  // [mode][iteration][rank]
  std::vector<int64_t> wrong;                              // per rank, from the final check
  int buckets = 0;
  // Rank 0's OpScheduler (the priority mode) over the whole run.
  int64_t partitions = 0, reductions = 0, holds = 0, hold_expiries = 0;
  std::string tune_table;  // rank 0's autotuner trial table

  bool Wait() {
    if (procs == nullptr) return barrier.Wait();
    procs->Barrier();
    return true;
  }
};

void Progress(int ranks, int iter, int total, bool tty) {
  if (tty) {
    std::fprintf(stderr, "\r[overlap] ranks=%d iteration %d/%d   ", ranks, iter, total);
  } else {
    std::fprintf(stderr, "[overlap] ranks=%d iteration %d/%d\n", ranks, iter, total);
  }
}

absl::Status RunRank(Group& world, const Config& c, const OverlapModel& model,
                     const std::vector<size_t>& writes, Shared* shared) {
  const int n = world.size(), rank = world.rank();
  sched::ReducerConfig rc;
  rc.mode = c.reduce;
  rc.bucket_cap_bytes = static_cast<size_t>(c.bucket_cap);
  rc.first_bucket_cap_bytes = static_cast<size_t>(c.first_bucket_cap);
  rc.timeout = absl::Seconds(120);
  Mesh mesh;
  sched::ReducerGroups groups{&world, nullptr};
  if (c.reduce == ReduceMode::kHybrid) {
    const int shards = c.shards > 0 ? c.shards : std::max(1, n / 2);
    ASSIGN_OR_RETURN(mesh, MakeMesh(world, n / shards, shards));
    groups = sched::ReducerGroups{mesh.shard.get(), mesh.replica.get()};
  }
  // The priority mode's scheduler (shared by its reducer and, fully sharded, its gatherer).
  // --timeline: the priority mode's scheduler records its partitions, holds and gathers.
  std::unique_ptr<sched::Timeline> timeline;
  if (!c.timeline.empty()) {
    ASSIGN_OR_RETURN(timeline,
                     sched::Timeline::Create(absl::StrCat(c.timeline, ".", n, "ranks"), rank));
  }
  sched::OpSchedulerConfig oc;
  oc.timeline = timeline.get();
  oc.credit_bytes = static_cast<size_t>(c.credit);
  oc.priorities = c.priorities;
  oc.hold = c.hold_waited ? sched::OpSchedulerConfig::Hold::kWaited
                          : sched::OpSchedulerConfig::Hold::kInFlight;
  oc.timeout = absl::Seconds(120);
  ASSIGN_OR_RETURN(std::unique_ptr<sched::OpScheduler> scheduler,
                   sched::OpScheduler::Create(oc, &world));
  // One reducer (fully sharded: one stack) for every mode: the priority mode attaches the
  // scheduler for its steps only, so both modes run on the same buffers (separately allocated
  // reducers differ by up to ~20% on their own: an A/A check, --aa, shows it).
  // Built by the assembler (optim/training_stack.h), as a framework's would be.
  auto make_stack = [&](size_t cap) -> absl::StatusOr<std::unique_ptr<optim::TrainingStack>> {
    if (c.fully_sharded) {
      return MakeShardedStack(world, model, absl::Seconds(120), cap, rc.first_bucket_cap_bytes);
    }
    optim::StackOptions so;
    so.reducer = rc;
    so.reducer.bucket_cap_bytes = cap;
    return optim::TrainingStack::Create(model.params, groups, so);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<optim::TrainingStack> stack, make_stack(rc.bucket_cap_bytes));
  GradientReducer* reducer = &stack->reducer();
  sched::OpScheduler* const prio_sched = c.aa ? nullptr : scheduler.get();
  if (rank == 0) shared->buckets = static_cast<int>(reducer->plan().buckets().size());
  RankOptimizers opts;
  if (c.optimizer) {
    optim::OptimizerConfig ocfg;
    ocfg.threads = c.optimizer_threads;
    ocfg.timeout = absl::Seconds(120);
    optim::ParamOptions po;
    po.timeout = absl::Seconds(120);
    ocfg.overlap = false;
    po.optimizer = ocfg;
    ASSIGN_OR_RETURN(opts.after, stack->BuildParamSide(po));
    po.optimizer->overlap = true;
    ASSIGN_OR_RETURN(opts.overlapped, stack->BuildParamSide(po));
    RETURN_IF_ERROR(opts.after->optimizer->WaitAllParams());
    RETURN_IF_ERROR(opts.overlapped->optimizer->WaitAllParams());
  }

  auto layers_of = [&](GradientReducer& red) -> absl::StatusOr<std::vector<RankLayer>> {
    std::vector<RankLayer> backward;  // last layer first
    for (int l = static_cast<int>(model.layers.size()) - 1; l >= 0; --l) {
      RankLayer rl;
      const std::vector<int>& ps = model.layers[l].params;
      for (auto it = ps.rbegin(); it != ps.rend(); ++it) {
        const sched::ParamId id = model.params[*it].id;
        ASSIGN_OR_RETURN(TensorView v, red.GradView(id));
        rl.spans.push_back(GradSpan{static_cast<float*>(v.data), v.count});
        rl.ids.push_back(id);
      }
      rl.elems = model.layers[l].elems;
      rl.writes = writes[l];
      backward.push_back(std::move(rl));
    }
    return backward;
  };
  ASSIGN_OR_RETURN(const std::vector<RankLayer> backward, layers_of(*reducer));
  // The autotuned mode's stack: candidates with the default bucket cap run on the same stack
  // with a scheduler of their credit attached; others on a stack of their own. Every stack and
  // scheduler a candidate used is kept (the tuner switches candidates every step), and dropped
  // once the tuner is done.
  struct Tuned {
    std::map<size_t, std::unique_ptr<sched::OpScheduler>> schedulers;  // by credit
    std::map<size_t, std::unique_ptr<optim::TrainingStack>> stacks;    // by bucket cap
    std::map<size_t, std::vector<RankLayer>> layers;                   // by bucket cap
    sched::OpScheduler* scheduler = nullptr;
    optim::TrainingStack* stack = nullptr;
    const std::vector<RankLayer>* backward = nullptr;
  } tuned;
  auto build_tuned = [&](const sched::TuneCandidate& cand) -> absl::Status {
    tuned.scheduler = nullptr;
    if (cand.credit_bytes > 0) {
      auto& sch = tuned.schedulers[cand.credit_bytes];
      if (sch == nullptr) {  // collective: every rank runs the same candidates in the same order
        sched::OpSchedulerConfig toc = oc;
        toc.credit_bytes = cand.credit_bytes;
        ASSIGN_OR_RETURN(sch, sched::OpScheduler::Create(toc, &world));
      }
      tuned.scheduler = sch.get();
    }
    if (cand.bucket_cap_bytes == rc.bucket_cap_bytes) {
      tuned.stack = stack.get();
      tuned.backward = &backward;
      return absl::OkStatus();
    }
    const size_t cap = cand.bucket_cap_bytes;
    if (tuned.layers.count(cap) == 0) {
      ASSIGN_OR_RETURN(tuned.stacks[cap], make_stack(cap));
      ASSIGN_OR_RETURN(tuned.layers[cap], layers_of(tuned.stacks[cap]->reducer()));
    }
    tuned.stack = tuned.stacks[cap].get();
    tuned.backward = &tuned.layers[cap];
    return absl::OkStatus();
  };
  auto run = [&](StepMode mode, StepTimes* t) -> absl::Status {
    const bool prio = mode == StepMode::kPriority;
    const bool tune = mode == StepMode::kAutotuned;
    optim::TrainingStack* stk = tune ? tuned.stack : stack.get();
    GradientReducer* red = &stk->reducer();
    auto attach_to = [&](sched::OpScheduler* s) { return stk->SetScheduler(s); };
    if (prio || tune) RETURN_IF_ERROR(attach_to(prio ? prio_sched : tuned.scheduler));
    const StepMode as = prio || tune ? StepMode::kOverlapped : mode;
    const absl::Status st =
        c.fully_sharded ? RunShardedStep(as, stk, tune ? *tuned.backward : backward, c, rank, t)
                        : RunStep(as, *red, &opts, tune ? *tuned.backward : backward, c, rank, t);
    if (prio || tune) RETURN_IF_ERROR(attach_to(nullptr));
    return st;
  };
  // --autotune: the tuner's trials are real autotuned steps, run (in lockstep, from a common
  // start) before the timed iterations; the autotuned mode then runs what it adopted.
  if (c.autotune) {
    sched::AutotunerConfig ac;
    const size_t cap = rc.bucket_cap_bytes, credit = static_cast<size_t>(c.credit);
    ac.candidates = {{cap, 0}, {cap / 2, 0}, {cap * 2, 0}, {cap, credit}, {cap, credit * 4}};
    ac.timeout = absl::Seconds(120);
    ASSIGN_OR_RETURN(std::unique_ptr<sched::Autotuner> tuner, sched::Autotuner::Create(&world, ac));
    RETURN_IF_ERROR(build_tuned(tuner->current()));
    while (!tuner->done()) {
      if (!shared->Wait()) return absl::AbortedError("another rank failed");
      StepTimes t;
      t.start = Clock::now();
      RETURN_IF_ERROR(run(StepMode::kAutotuned, &t));
      ASSIGN_OR_RETURN(bool replan, tuner->EndStep(absl::FromChrono(t.end - t.start)));
      if (replan) RETURN_IF_ERROR(build_tuned(tuner->current()));
    }
    if (rank == 0) shared->tune_table = tuner->Table();
    // Keep only what the adopted candidate uses (in destruction order: stacks, schedulers).
    for (auto it = tuned.stacks.begin(); it != tuned.stacks.end();) {
      it = it->second.get() == tuned.stack ? std::next(it) : tuned.stacks.erase(it);
    }
    for (auto it = tuned.layers.begin(); it != tuned.layers.end();) {
      it = &it->second == tuned.backward ? std::next(it) : tuned.layers.erase(it);
    }
    for (auto it = tuned.schedulers.begin(); it != tuned.schedulers.end();) {
      it = it->second.get() == tuned.scheduler ? std::next(it) : tuned.schedulers.erase(it);
    }
  }
  const bool tty = isatty(2);
  const int total = c.warmup + c.iters;
  const std::vector<StepMode> modes = c.Modes();
  const int num_modes = static_cast<int>(modes.size());
  for (int it = 0; it < total; ++it) {
    if (rank == 0) Progress(n, it + 1, total, tty);
    // A fresh order every iteration, the same on every rank (seeded by the iteration): no mode
    // always runs first, or always right after another one.
    std::vector<int> order(num_modes);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(),
                 std::mt19937(static_cast<uint32_t>(it) * 2654435761u + 7));
    for (int k = 0; k < num_modes; ++k) {
      const int m = order[k];
      if (!shared->Wait()) return absl::AbortedError("another rank failed");
      StepTimes t;
      t.start = Clock::now();
      RETURN_IF_ERROR(run(modes[m], &t));
      if (it >= c.warmup) shared->times[m][it - c.warmup][rank] = t;
    }
  }
  // Exactness check of one more overlapped step.
  if (!shared->Wait()) return absl::AbortedError("another rank failed");
  StepTimes unused;
  RETURN_IF_ERROR(run(StepMode::kOverlapped, &unused));
  const int64_t wrong_overlapped = CountWrong(
      *reducer, c.reduce, c.reduce == ReduceMode::kAllReduce ? 0 : groups.shard->rank(), n);
  if (!shared->Wait()) return absl::AbortedError("another rank failed");
  RETURN_IF_ERROR(run(StepMode::kPriority, &unused));
  int64_t wrong_tuned = 0;
  if (c.autotune) {
    const int64_t wrong_priority = CountWrong(
        *reducer, c.reduce, c.reduce == ReduceMode::kAllReduce ? 0 : groups.shard->rank(), n);
    if (!shared->Wait()) return absl::AbortedError("another rank failed");
    RETURN_IF_ERROR(run(StepMode::kAutotuned, &unused));
    wrong_tuned = wrong_priority +
                  CountWrong(tuned.stack->reducer(), c.reduce,
                             c.reduce == ReduceMode::kAllReduce ? 0 : groups.shard->rank(), n);
  }
  const int shard_rank = c.reduce == ReduceMode::kAllReduce ? 0 : groups.shard->rank();
  shared->wrong[rank] =
      wrong_overlapped + (c.autotune ? wrong_tuned : CountWrong(*reducer, c.reduce, shard_rank, n));
  if (rank == 0) {
    shared->partitions = scheduler->partitions_issued();
    shared->reductions = scheduler->reductions_submitted();
    shared->holds = scheduler->holds();
    shared->hold_expiries = scheduler->hold_expiries();
  }
  return absl::OkStatus();
}

// Under --backend=mpi each process fills only its own rank's slots; this gives every process
// every rank's step times and wrong counts.
void GatherAcrossProcesses(ProcessSync& procs, Shared* shared) {
  const int n = procs.size(), me = procs.rank();
  std::vector<int64_t> mine;
  for (const auto& mode : shared->times) {
    for (const auto& iter : mode) {
      const StepTimes& t = iter[me];
      for (Clock::time_point p : {t.start, t.backward_end, t.end})
        mine.push_back(p.time_since_epoch().count());
    }
  }
  mine.push_back(shared->wrong[me]);
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(n));
  procs.AllGather(mine.data(), mine.size(), all.data());
  for (int r = 0; r < n; ++r) {
    const int64_t* v = all.data() + static_cast<size_t>(r) * mine.size();
    for (auto& mode : shared->times) {
      for (auto& iter : mode) {
        StepTimes& t = iter[r];
        for (Clock::time_point* p : {&t.start, &t.backward_end, &t.end})
          *p = Clock::time_point(Clock::duration(*v++));
      }
    }
    shared->wrong[r] = *v;
  }
}

// Runs every iteration for `ranks` rank threads; appends one row per mode. `mpi_backend` and
// `procs`: --backend=mpi (this process is one of `ranks` processes); otherwise a local backend
// with `ranks` rank threads is made here.
absl::Status MeasureRanks(int ranks, const Config& c, const OverlapModel& model,
                          const std::vector<size_t>& writes, std::vector<Row>* rows, int* buckets,
                          std::string* note, Backend* mpi_backend = nullptr,
                          ProcessSync* procs = nullptr) {
  std::unique_ptr<Backend> local;
  Backend* backend = mpi_backend;
  if (backend == nullptr) {
    Options o;
    o.backend = "local";
    o.local_ranks = ranks;
    o.timeout = absl::Seconds(120);
    ASSIGN_OR_RETURN(local, CreateBackend(o));
    backend = local.get();
  }
  std::vector<std::unique_ptr<Group>> worlds;
  for (int r : backend->local_ranks()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Group> g, backend->WorldGroup(r));
    worlds.push_back(std::move(g));
  }
  const std::vector<StepMode> modes = c.Modes();
  const int num_modes = static_cast<int>(modes.size());
  Shared shared(ranks, c.iters, num_modes);
  shared.procs = procs;
  std::vector<absl::Status> status(worlds.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < worlds.size(); ++r) {
    threads.emplace_back([&, r] {
      status[r] = RunRank(*worlds[r], c, model, writes, &shared);
      if (!status[r].ok()) shared.barrier.Abort();
    });
  }
  for (auto& t : threads) t.join();
  if (procs != nullptr) GatherAcrossProcesses(*procs, &shared);
  if (isatty(2)) std::fprintf(stderr, "\r%60s\r", "");
  for (const absl::Status& s : status) {
    if (!s.ok() && !absl::IsAborted(s)) return s;
  }
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  int64_t wrong = 0;
  for (int64_t w : shared.wrong) wrong += w;
  if (wrong != 0) {
    return absl::DataLossError(
        absl::StrCat(ranks, " ranks: ", wrong, " wrong gradient elements after reduction"));
  }
  *buckets = shared.buckets;
  *note = absl::StrCat(
      "# ", ranks,
      " ranks, priority mode's scheduler (rank 0, whole run incl. warm-up): ", shared.partitions,
      " partitions for ", shared.reductions, " reductions, ", shared.holds,
      " holds behind gathers, ", shared.hold_expiries, " ended by max_hold");
  if (!shared.tune_table.empty()) {
    absl::StrAppend(note, "\n# ", ranks,
                    " ranks, autotuner trials (rank 0; slowest rank's medians):\n#   ",
                    absl::StrReplaceAll(shared.tune_table, {{"\n", "\n#   "}}));
  }
  const std::vector<Row> summary = SummarizeSteps(ranks, modes, shared.times);
  rows->insert(rows->end(), summary.begin(), summary.end());
  return absl::OkStatus();
}

constexpr char kUsage[] =
    R"(overlap: how much of the gradient communication Braid hides behind the backward, on a
simulated step with GPT-2-small shapes (ranks as threads on local, or --backend=mpi).

usage: overlap [flags]
  --ranks=2,4              rank counts to run (one with --backend=mpi)
  --backend=local          local | mpi (relaunches itself under mpirun)
  --mode=all_reduce        all_reduce | reduce_scatter | hybrid | fully_sharded
  --shards=0               hybrid: ranks per shard group (0: ranks/2)
  --scale=0.25             fraction of the 124M parameters
  --blocks=12              transformer blocks
  --layer_compute_us=2000  one layer's backward compute
  --compute=busy           busy (real CPU work) | sleep (an accelerator's host thread)
  --iters=21               timed iterations (medians reported)
  --warmup=2               untimed iterations first
  --bucket_cap=0           bytes (0: 25 MiB x scale)
  --first_bucket_cap=0     bytes (0: 1 MiB x scale)
  --optimizer=none         none | adamw (reduce_scatter / hybrid: two more modes)
  --optimizer_threads=1    the optimizer's kernel threads
  --credit=0               priority mode's partition bytes (0: 4 MiB x scale)
  --priorities=true        urgent gathers hold reductions back
  --hold=in_flight         in_flight | waited
  --autotune=true          run the autotuned mode
  --aa=false               priority mode without its scheduler (an A/A noise check)
  --timeline=              PREFIX: the priority mode's trace, PREFIX.<n>ranks.rank<r>.json
  --csv                    CSV only
)";

absl::Status Main(int argc, char** argv) {
  ASSIGN_OR_RETURN(Flags flags, Flags::Parse(argc, argv));
  if (PrintHelp(flags, kUsage)) return absl::OkStatus();
  ASSIGN_OR_RETURN(Config c, ParseConfig(flags));
  const OverlapModel model = Gpt2LikeModel(c.blocks, c.scale);
  const bool mpi = c.backend == "mpi";
  std::unique_ptr<Backend> mpi_backend;  // before `procs`: MPI is finalized after its comm
  std::unique_ptr<ProcessSync> procs;
  std::string mpi_engine;
  if (mpi) {
    RelaunchUnderMpirun("overlap", c.ranks.front(), argc, argv);
    ASSIGN_OR_RETURN(Options o, Options::FromEnv());  // BRAID_MPI_ENGINE and the like apply
    o.backend = "mpi";
    o.timeout = absl::Seconds(120);
    mpi_engine = o.mpi_engine;
    ASSIGN_OR_RETURN(mpi_backend, CreateBackend(o));
    procs = std::make_unique<ProcessSync>();
    if (procs->size() != c.ranks.front()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ranks=", c.ranks.front(), " but mpirun started ", procs->size(), " processes"));
    }
  }

  // Calibrate on a buffer the size of one block's gradients, before any rank thread exists
  // (--backend=mpi: every process at once; rank 0's figure is used by all).
  std::fprintf(stderr, "[overlap] calibrating the compute...\n");
  double writes_per_us = CalibrateWritesPerUs(model.layers[1].elems);
  if (procs != nullptr) writes_per_us = procs->Broadcast(writes_per_us);
  std::vector<size_t> writes;
  int floored = 0;
  for (const OverlapLayer& l : model.layers) {
    const size_t w = static_cast<size_t>(writes_per_us * static_cast<double>(c.layer_compute_us));
    floored += w < l.elems;
    writes.push_back(std::max(w, l.elems));  // at least one full pass over the gradients
  }

  std::vector<Row> rows;
  std::vector<int> buckets;
  std::vector<std::string> notes;
  for (int n : c.ranks) {
    int b = 0;
    std::string note;
    RETURN_IF_ERROR(
        MeasureRanks(n, c, model, writes, &rows, &b, &note, mpi_backend.get(), procs.get()));
    buckets.push_back(b);
    notes.push_back(std::move(note));
  }
  if (procs != nullptr && procs->rank() != 0) return absl::OkStatus();  // rank 0 prints

  RunReport report;
  report.rows = std::move(rows);
  report.buckets = std::move(buckets);
  report.notes = std::move(notes);
  report.mpi = mpi;
  report.mpi_engine = mpi_engine;
  report.writes = std::move(writes);
  report.writes_per_us = writes_per_us;
  report.floored = floored;
  PrintReport(c, model, report);
  return absl::OkStatus();
}

}  // namespace
}  // namespace braid::bench

int main(int argc, char** argv) {
  absl::Status s = braid::bench::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "overlap: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
