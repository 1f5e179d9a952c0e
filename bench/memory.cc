// memory: what a rank holds, and how long its step takes, for DDP, ZeRO-2 and fully sharded
// (ZeRO-3 / FSDP) training of the GPT-2-small shapes of bench/overlap, every byte counted by
// scheduler/memory_stats.h.
//
//   tools/bazelw run //bench:memory -- --csv
//   bazel-bin/bench/memory --ranks=2,4 --scale=1 --iters=3 --layer_compute_us=20000
//   bazel-bin/bench/memory --ranks=4 --modes=zero2,fully_sharded --pool_limit=0  # unbounded
//
// Flags: kUsage below (--help). Each layer's forward sleeps --layer_compute_us and its backward
// twice as long: an accelerator's host thread waiting on its device, so the cores stay free
// for the communication threads.
//
// Ranks are threads on the `local` backend, so "host" memory here plays the device's part;
// peak_device_bytes is 0 on this machine. Parameters are f32 (the master weights of the
// sharded optimizer are a separate f32 copy, as with bf16 models). Each rank runs, per step:
// the forward (layers in order), the backward (layers last to first, each layer's gradient
// values handed to Braid as soon as its compute ends), and the optimizer (AdamW) step. Modes:
//   ddp                     all-reduce; full parameters and full AdamW state (m, v) per rank,
//                           stepped after the backward (a framework's own optimizer)
//   zero2                   reduce-scatter + Braid's sharded AdamW (master/m/v shards), full
//                           parameters all-gathered after each bucket's step
//   fully_sharded           units = layers; parameters live as shards, gathered per unit
//                           before its forward and its backward and released after (in the
//                           backward as soon as the unit's compute is done, before its
//                           gradients are handed over, as FSDP2's post-backward does);
//                           gradients computed in place into the pooled buckets
//                           (GradientReducer::GradSlot) and kept only as shards after their
//                           reduce-scatter; one BufferPool shared by the
//                           gathered parameters and the gradient storage, bounded by
//                           --pool_limit (backpressure: buffer_pool.h); prefetch of the
//                           next unit
//   fully_sharded_noprefetch  the same without prefetch
//   fully_sharded_int8 / _fp8  fully_sharded with quantized unit gathers (ZeRO++'s qwZ: 1-byte
//                           codes + an f32 scale per 4096 elements; not in the default --modes);
//                           the check reads the exact master weights through GatherAll
//   fully_sharded_bf16      fully_sharded gathering bf16 (a param_dtype's wire, FSDP2's bytes)
//   fully_sharded_copy      fully_sharded with each unit's gradients computed into a scratch
//                           buffer and copied in at the mark (autograd's hand-over, as
//                           braid.pytorch and FSDP2's reduce-scatter input copy do)
// Memory per rank is everything the rank holds: Braid's buffers plus the framework's
// (ddp's parameters and AdamW state, fully_sharded_copy's gradient scratch), all
// through one MemoryStats per rank. Columns:
//   ranks,mode,params,peak_host_bytes,peak_device_bytes,model_state_bytes,
//   largest_unit_bytes,step_ms
// peak_*: the most one rank held at once during the timed steps (the largest over ranks);
// model_state_bytes: the whole model's training state as Braid keeps it sharded (f32
// parameters, gradients, master weights, m and v: 20 bytes per parameter); largest_unit_bytes:
// the largest unit's f32 parameter bytes; step_ms: the median over --iters of the slowest rank.
// Targets (issues 12, 22): fully_sharded peak <= model_state_bytes / ranks + 2 x
// largest_unit_bytes + 10 %, and fully_sharded step_ms <= 1.05 x zero2 step_ms at 2 ranks,
// <= 1.15 x at 4. BRAID_MEMORY_DEBUG=1 adds rank 0's memory by use and where its thread spends
// a timed step, by call. After the timed steps every rank
// checks one parameter of every unit against the serial AdamW result (bench fails otherwise).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_flags.h"
#include "bench/overlap_model.h"
#include "comm/backend.h"
#include "comm/status_macros.h"
#include "optim/adamw_kernel.h"
#include "optim/sharded_optimizer.h"
#include "optim/training_stack.h"

namespace braid::bench {
namespace {

using Clock = std::chrono::steady_clock;
using sched::MemoryStats;
using sched::MemoryUse;

enum class Mode {
  kDdp,
  kZero2,
  kFullySharded,
  kFullyShardedNoPrefetch,
  kFullyShardedInt8,
  kFullyShardedFp8,
  kFullyShardedBf16,
  kFullyShardedCopy
};
const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kDdp:
      return "ddp";
    case Mode::kZero2:
      return "zero2";
    case Mode::kFullySharded:
      return "fully_sharded";
    case Mode::kFullyShardedNoPrefetch:
      return "fully_sharded_noprefetch";
    case Mode::kFullyShardedInt8:
      return "fully_sharded_int8";
    case Mode::kFullyShardedFp8:
      return "fully_sharded_fp8";
    case Mode::kFullyShardedBf16:
      return "fully_sharded_bf16";
    case Mode::kFullyShardedCopy:
      return "fully_sharded_copy";
  }
  return "?";
}

struct Config {
  std::vector<int> ranks = {2, 4};
  std::vector<Mode> modes = {Mode::kDdp, Mode::kZero2, Mode::kFullySharded,
                             Mode::kFullyShardedNoPrefetch};
  double scale = 1.0;
  int blocks = 12;
  int iters = 3, warmup = 1;
  int64_t layer_compute_us = 20000;
  bool csv = false;
  // Fully sharded: the shared pool's limit (ReducerConfig::pool_limit_bytes). -1: what the
  // target allows (below); 0: none.
  int64_t pool_limit = -1;
};

// What the issue's bound leaves the pool of a fully sharded rank: the target, less the sharded
// state and the framework's gradient scratch (one largest unit; none when gradients are
// written into the pool), which the rank holds anyway.
int64_t TargetPoolLimit(int ranks, const OverlapModel& model, int64_t largest_unit, bool scratch) {
  const double state = static_cast<double>(model.elems()) * 20 / ranks;
  return static_cast<int64_t>((state + 2.0 * largest_unit) * 1.1 - state -
                              (scratch ? largest_unit : 0));
}

constexpr double kLr = 1e-3;
constexpr absl::Duration kTimeout = absl::Seconds(300);

// Initial weight and per-rank gradient of element j of parameter `id` (small integers / 64,
// so the averaged gradient is exact in f32).
float InitValue(sched::ParamId id, size_t j) {
  return static_cast<float>(static_cast<int>((j * 7 + id) % 17) - 8) / 64;
}
float GradValue(sched::ParamId id, size_t j, int rank) {
  return static_cast<float>(static_cast<int>((j * 5 + id * 3 + rank) % 13) - 6) / 64;
}

void SleepUs(int64_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

// What one rank count's threads share: the rows' measurements.
struct Measured {
  explicit Measured(int ranks, int iters)
      : step_ns(iters, std::vector<int64_t>(ranks, 0)), peak(ranks, 0) {}
  std::vector<std::vector<int64_t>> step_ns;  // [iteration][rank]
  std::vector<int64_t> peak;                  // per rank
  std::vector<int64_t> device_peak;
};

// The rank's step loop for one mode. Counts every buffer in `mem`.
absl::Status RunRank(Group& world, Mode mode, const Config& c, const OverlapModel& model,
                     int64_t largest_unit, Measured* out) {
  const int rank = world.rank(), n = world.size();
  std::vector<sched::ParamSpec> params = model.params;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    for (int i : model.layers[l].params) params[i].unit = static_cast<int>(l);
  }
  const bool quant = mode == Mode::kFullyShardedInt8 || mode == Mode::kFullyShardedFp8 ||
                     mode == Mode::kFullyShardedBf16;
  const bool fsdp = mode == Mode::kFullySharded || mode == Mode::kFullyShardedNoPrefetch ||
                    mode == Mode::kFullyShardedCopy || quant;
  // Fully sharded gradients: written in place into the pooled buckets (GradSlot), or computed
  // into a scratch buffer and copied in at the mark (autograd's hand-over, braid.pytorch's).
  const bool copy_in = mode == Mode::kFullyShardedCopy;
  // The stack, as the assembler builds it (optim/training_stack.h). Fully sharded: one pool for
  // gathered parameters and gradient storage (a unit's released parameter buffer becomes its
  // gradient bucket, as PyTorch's caching allocator does for FSDP), one bucket per unit (FSDP's
  // flat parameter per wrapping unit).
  optim::StackOptions so;
  so.reducer.mode =
      mode == Mode::kDdp ? sched::ReduceMode::kAllReduce : sched::ReduceMode::kReduceScatter;
  so.reducer.timeout = kTimeout;
  so.reducer.shard_gradients = fsdp;
  if (fsdp) {
    so.reducer.pool_limit_bytes =
        c.pool_limit >= 0 ? c.pool_limit : TargetPoolLimit(n, model, largest_unit, copy_in);
    so.reducer.bucket_cap_bytes = size_t{1} << 40;
    so.reducer.first_bucket_cap_bytes = size_t{1} << 40;
  }
  ASSIGN_OR_RETURN(auto stack, optim::TrainingStack::Create(params, {&world, nullptr}, so));
  MemoryStats& mem = stack->memory();  // the rank's one count: Braid's buffers and the bench's
  sched::GradientReducer* reducer = &stack->reducer();
  BufferOps& host = HostBufferOps();

  // ddp: the framework's full parameters and AdamW state.
  std::vector<OwnedBuffer> ddp_p, ddp_m, ddp_v;
  OwnedBuffer scratch;  // fully sharded: one layer's gradients, as autograd would produce them
  if (mode == Mode::kDdp) {
    for (const sched::ParamSpec& p : params) {
      const size_t bytes = p.count * sizeof(float);
      ASSIGN_OR_RETURN(OwnedBuffer w,
                       mem.Allocate(host, bytes, MemoryUse::kParamGather, "ddp parameter"));
      float* f = reinterpret_cast<float*>(w.get());
      for (size_t j = 0; j < p.count; ++j) f[j] = InitValue(p.id, j);
      ASSIGN_OR_RETURN(OwnedBuffer m,
                       mem.Allocate(host, bytes, MemoryUse::kOptimizerState, "ddp adamw m"));
      ASSIGN_OR_RETURN(OwnedBuffer v,
                       mem.Allocate(host, bytes, MemoryUse::kOptimizerState, "ddp adamw v"));
      std::memset(m.get(), 0, bytes);
      std::memset(v.get(), 0, bytes);
      ddp_p.push_back(std::move(w));
      ddp_m.push_back(std::move(m));
      ddp_v.push_back(std::move(v));
    }
  } else {
    // zero2 / fully sharded: Braid's gatherer and sharded optimizer (and units).
    optim::ParamOptions po;
    po.timeout = kTimeout;
    po.optimizer = optim::OptimizerConfig{};
    po.optimizer->groups[0].adamw.lr = kLr;
    po.optimizer->timeout = kTimeout;
    po.fully_sharded = fsdp;
    po.units.timeout = kTimeout;
    po.units.prefetch = mode == Mode::kFullyShardedNoPrefetch ? 0 : 1;
    if (quant) {
      po.gather_quant.dtype = mode == Mode::kFullyShardedInt8  ? sched::GatherDType::kInt8
                              : mode == Mode::kFullyShardedFp8 ? sched::GatherDType::kFp8E4M3
                                                               : sched::GatherDType::kBF16;
    }
    po.units.max_live_bytes = 0;  // 2 x the largest unit
    RETURN_IF_ERROR(stack->AddParamSide(po));
    std::vector<float> init;
    for (const sched::ParamSpec& p : params) {
      init.resize(p.count);
      for (size_t j = 0; j < p.count; ++j) init[j] = InitValue(p.id, j);
      RETURN_IF_ERROR(stack->optimizer()->SetParam(p.id, init.data()));
    }
    if (copy_in) {
      ASSIGN_OR_RETURN(scratch, mem.Allocate(host, static_cast<size_t>(largest_unit),
                                             MemoryUse::kStaging, "backward gradient scratch"));
    } else {
      RETURN_IF_ERROR(stack->optimizer()->WaitAllParams());
    }
  }
  optim::ShardedOptimizer* opt = stack->optimizer();
  sched::UnitScheduler* units = stack->units();
  sched::ParamGatherer* gatherer = stack->gatherer();

  const int num_layers = static_cast<int>(model.layers.size());
  int64_t adamw_steps = 0;
  // BRAID_MEMORY_DEBUG: where the rank's thread spends a timed step, by call (ns, summed).
  enum Phase { kFwdBegin, kFwdEnd, kBwdBegin, kGradWrite, kBwdEnd, kMark, kFinish, kStep, kPhases };
  static constexpr const char* kPhaseName[kPhases] = {
      "BeginForward", "EndForward", "BeginBackward",  "gradient write (compute)",
      "EndBackward",  "MarkReady",  "FinishBackward", "step (WaitAllParams+EndStep / adamw)"};
  int64_t phase_ns[kPhases] = {};
  std::vector<int64_t> fwd_wait(model.layers.size()), bwd_wait(model.layers.size());
  Clock::time_point mark_t = Clock::now();
  const auto lap = [&](Phase p, bool timed) {
    const Clock::time_point now = Clock::now();
    if (timed) phase_ns[p] += (now - mark_t).count();
    mark_t = now;
  };
  for (int it = 0; it < c.warmup + c.iters; ++it) {
    if (it == c.warmup) mem.ResetPeaks();
    {  // a common start (nothing of Braid's is in flight on the world group now)
      ASSIGN_OR_RETURN(WorkPtr b, world.Barrier());
      RETURN_IF_ERROR(b->Wait(kTimeout));
    }
    const Clock::time_point start = Clock::now();
    const bool timed = it >= c.warmup;
    mark_t = start;
    // Forward.
    for (int l = 0; l < num_layers; ++l) {
      if (units) RETURN_IF_ERROR(units->BeginForward(l));
      if (timed) fwd_wait[l] += (Clock::now() - mark_t).count();
      lap(kFwdBegin, timed);
      SleepUs(c.layer_compute_us);
      mark_t = Clock::now();
      if (units) RETURN_IF_ERROR(units->EndForward(l));
      lap(kFwdEnd, timed);
    }
    // Backward.
    RETURN_IF_ERROR(stack->BeginBackward(sched::SyncMode::kSync));
    for (int l = num_layers - 1; l >= 0; --l) {
      if (units) RETURN_IF_ERROR(units->BeginBackward(l));
      if (timed) bwd_wait[l] += (Clock::now() - mark_t).count();
      lap(kBwdBegin, timed);
      const auto end = Clock::now() + std::chrono::microseconds(2 * c.layer_compute_us);
      size_t offset = 0;
      for (int i : model.layers[l].params) {
        const sched::ParamSpec& p = params[i];
        float* g;
        if (copy_in) {
          g = reinterpret_cast<float*>(scratch.get()) + offset;
          offset += p.count;
        } else if (fsdp) {
          ASSIGN_OR_RETURN(TensorView v, reducer->GradSlot(p.id));
          g = static_cast<float*>(v.data);
        } else {
          ASSIGN_OR_RETURN(TensorView v, reducer->GradView(p.id));
          g = static_cast<float*>(v.data);
        }
        for (size_t j = 0; j < p.count; ++j) g[j] = GradValue(p.id, j, rank);
      }
      lap(kGradWrite, timed);
      std::this_thread::sleep_until(end);
      mark_t = Clock::now();  // the compute's wait is not a call's
      // FSDP2's post-backward order: the unit's parameters are released as soon as its
      // compute is done, then its gradients go to the reduction.
      if (units) RETURN_IF_ERROR(units->EndBackward(l));
      lap(kBwdEnd, timed);
      offset = 0;
      for (int i : model.layers[l].params) {
        const sched::ParamSpec& p = params[i];
        if (copy_in) {
          RETURN_IF_ERROR(reducer->MarkReady(p.id, DeviceEvent{},
                                             reinterpret_cast<float*>(scratch.get()) + offset));
          offset += p.count;
        } else {
          RETURN_IF_ERROR(reducer->MarkReady(p.id));
        }
      }
      lap(kMark, timed);
    }
    RETURN_IF_ERROR(stack->FinishBackward());
    lap(kFinish, timed);
    if (opt) {
      RETURN_IF_ERROR(opt->WaitAllParams());
      if (units) RETURN_IF_ERROR(units->EndStep());  // after every forward + backward pass
    } else {
      const optim::AdamWScalars s = optim::StepScalars(optim::AdamWHyper{kLr}, ++adamw_steps);
      for (size_t i = 0; i < params.size(); ++i) {
        ASSIGN_OR_RETURN(TensorView g, reducer->GradView(params[i].id));
        optim::AdamWRange(
            s, reinterpret_cast<float*>(ddp_p[i].get()), reinterpret_cast<float*>(ddp_m[i].get()),
            reinterpret_cast<float*>(ddp_v[i].get()), g.data, DType::kF32, params[i].count);
      }
    }
    lap(kStep, timed);
    if (it >= c.warmup) out->step_ns[it - c.warmup][rank] = (Clock::now() - start).count();
  }
  const sched::MemorySnapshot snap = mem.Snapshot();
  out->peak[rank] = snap.host.peak;
  if (getenv("BRAID_MEMORY_DEBUG") != nullptr && rank == 0) {
    for (int p = 0; p < kPhases; ++p) {
      std::fprintf(stderr, "  %s time in %s: %.1f ms per step\n", ModeName(mode), kPhaseName[p],
                   phase_ns[p] / 1e6 / c.iters);
    }
    for (int l = 0; l < num_layers; ++l) {
      std::fprintf(stderr, "  %s layer %d waits: forward %.1f ms, backward %.1f ms\n",
                   ModeName(mode), l, fwd_wait[l] / 1e6 / c.iters, bwd_wait[l] / 1e6 / c.iters);
    }
    for (int u = 0; u < sched::kMemoryUses; ++u) {
      std::fprintf(stderr, "  %s %s: current %.1f MB peak %.1f MB\n", ModeName(mode),
                   sched::MemoryUseName(static_cast<MemoryUse>(u)), snap.by_use[u].current / 1e6,
                   snap.by_use[u].peak / 1e6);
    }
  }
  out->device_peak[rank] = snap.device.peak;
  if (fsdp && rank == 0) {
    std::fprintf(stderr,
                 "[memory]   rank 0: pool limit %.1f MB, %lld waits for a reduction's storage "
                 "(%.1f ms), %lld growths past the limit\n",
                 so.reducer.pool_limit_bytes / 1e6, static_cast<long long>(snap.pool_waits),
                 snap.pool_wait_ns / 1e6, static_cast<long long>(snap.pool_over_limit));
  }
  // Check: the first element of every layer's first parameter against the serial AdamW of the
  // averaged gradient over the same number of steps (every step sees the same gradients).
  const int steps = c.warmup + c.iters;
  // Quantized gathers: the exact master weights, through GatherAll (exact gathers).
  if (quant) RETURN_IF_ERROR(units->GatherAll());
  for (int l = 0; l < num_layers; ++l) {
    const sched::ParamSpec& p = params[model.layers[l].params[0]];
    float avg = 0;
    for (int r = 0; r < n; ++r) avg += GradValue(p.id, 0, r);
    avg /= static_cast<float>(n);
    float w = InitValue(p.id, 0), m = 0, v = 0;
    for (int t = 1; t <= steps; ++t) {
      optim::AdamWRange(optim::StepScalars(optim::AdamWHyper{kLr}, t), &w, &m, &v, &avg,
                        DType::kF32, 1);
    }
    float got;
    if (mode == Mode::kDdp) {
      got = reinterpret_cast<const float*>(ddp_p[model.layers[l].params[0]].get())[0];
    } else {
      if (units && !quant) RETURN_IF_ERROR(units->BeginForward(l));
      if (!units) RETURN_IF_ERROR(opt->WaitAllParams());
      ASSIGN_OR_RETURN(TensorView view, gatherer->ParamView(p.id));
      got = static_cast<const float*>(view.data)[0];
      if (units && !quant) RETURN_IF_ERROR(units->EndForward(l));
    }
    if (got != w) {
      if (quant) (void)units->ReleaseAll();
      return absl::InternalError(absl::StrCat("rank ", rank, " mode ", ModeName(mode),
                                              ": parameter ", p.Label(), "[0] is ", got, " after ",
                                              steps, " steps, the serial AdamW gives ", w));
    }
  }
  if (quant) RETURN_IF_ERROR(units->ReleaseAll());
  return absl::OkStatus();
}

struct Row {
  int ranks;
  Mode mode;
  size_t params;
  int64_t peak_host, peak_device, model_state, largest_unit;
  double step_ms;
};

absl::StatusOr<Row> Measure(int ranks, Mode mode, const Config& c, const OverlapModel& model,
                            int64_t largest_unit) {
  Options o;
  o.backend = "local";
  o.local_ranks = ranks;
  o.timeout = kTimeout;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(o));
  std::vector<std::unique_ptr<Group>> worlds;
  for (int r : backend->local_ranks()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Group> g, backend->WorldGroup(r));
    worlds.push_back(std::move(g));
  }
  Measured m(ranks, c.iters);
  m.device_peak.assign(ranks, 0);
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back(
        [&, r] { status[r] = RunRank(*worlds[r], mode, c, model, largest_unit, &m); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  std::vector<double> slowest;
  for (const auto& it : m.step_ns) slowest.push_back(*std::max_element(it.begin(), it.end()) / 1e6);
  std::sort(slowest.begin(), slowest.end());
  Row row;
  row.ranks = ranks;
  row.mode = mode;
  row.params = model.elems();
  row.peak_host = *std::max_element(m.peak.begin(), m.peak.end());
  row.peak_device = *std::max_element(m.device_peak.begin(), m.device_peak.end());
  row.model_state = static_cast<int64_t>(model.elems()) * 20;
  row.largest_unit = largest_unit;
  row.step_ms = slowest[slowest.size() / 2];
  return row;
}

absl::Status ParseModes(const std::string& s, std::vector<Mode>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    bool found = false;
    for (Mode m : {Mode::kDdp, Mode::kZero2, Mode::kFullySharded, Mode::kFullyShardedNoPrefetch,
                   Mode::kFullyShardedInt8, Mode::kFullyShardedFp8, Mode::kFullyShardedBf16,
                   Mode::kFullyShardedCopy}) {
      if (part == ModeName(m)) {
        out->push_back(m);
        found = true;
      }
    }
    if (!found)
      return absl::InvalidArgumentError(absl::StrCat("--modes: unknown mode '", part, "'"));
  }
  return absl::OkStatus();
}

absl::Status ParseRanks(const std::string& s, std::vector<int>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int v;
    if (!absl::SimpleAtoi(part, &v) || v < 1)
      return absl::InvalidArgumentError(absl::StrCat("--ranks: bad value '", part, "'"));
    out->push_back(v);
  }
  return absl::OkStatus();
}

constexpr char kUsage[] =
    R"(memory: per-rank memory (every byte counted) and step time of DDP, ZeRO-2 and fully
sharded training on the GPT-2-small shapes; ranks are threads on the local backend.

usage: memory [flags]
  --ranks=2,4               rank counts to run
  --modes=ddp,zero2,fully_sharded,fully_sharded_noprefetch
                            (also: fully_sharded_int8, fully_sharded_fp8, fully_sharded_bf16,
                            fully_sharded_copy)
                            modes to run, in this order (vs_ddp / vs_zero2 need those rows)
  --scale=1                 fraction of the 124M parameters (smaller for a quick run)
  --blocks=12               transformer blocks
  --iters=3                 timed steps (the median is reported)
  --warmup=1                untimed steps first
  --layer_compute_us=20000  each layer's forward sleep (its backward sleeps twice as long)
  --pool_limit=auto         fully sharded: bytes the shared buffer pool may hold (auto: the
                            target less the sharded state and fully_sharded_copy's scratch;
                            0: no limit)
  --csv                     CSV only
)";

absl::Status Main(int argc, char** argv) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(argc, argv));
  if (PrintHelp(f, kUsage)) return absl::OkStatus();
  Config c;
  RETURN_IF_ERROR(ParseRanks(f.Str("ranks", "2,4"), &c.ranks));
  RETURN_IF_ERROR(
      ParseModes(f.Str("modes", "ddp,zero2,fully_sharded,fully_sharded_noprefetch"), &c.modes));
  if (!absl::SimpleAtod(f.Str("scale", "1"), &c.scale) || !(c.scale > 0)) {
    return absl::InvalidArgumentError("--scale must be a number > 0");
  }
  ASSIGN_OR_RETURN(int64_t blocks, f.Int("blocks", 12));
  ASSIGN_OR_RETURN(int64_t iters, f.Int("iters", 3));
  ASSIGN_OR_RETURN(int64_t warmup, f.Int("warmup", 1));
  ASSIGN_OR_RETURN(c.layer_compute_us, f.Int("layer_compute_us", 20000));
  c.csv = f.Bool("csv", false);
  const std::string pool_limit = f.Str("pool_limit", "auto");
  if (pool_limit != "auto" && (!absl::SimpleAtoi(pool_limit, &c.pool_limit) || c.pool_limit < 0)) {
    return absl::InvalidArgumentError("--pool_limit must be auto or a number of bytes >= 0");
  }
  if (blocks < 1 || iters < 1 || warmup < 0 || c.layer_compute_us < 0) {
    return absl::InvalidArgumentError(
        "--blocks and --iters must be >= 1, --warmup and --layer_compute_us >= 0");
  }
  if (!f.Unused().empty())
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", f.Unused()[0]));
  c.blocks = static_cast<int>(blocks);
  c.iters = static_cast<int>(iters);
  c.warmup = static_cast<int>(warmup);
  const OverlapModel model = Gpt2LikeModel(c.blocks, c.scale);
  int64_t largest_unit = 0;
  for (const OverlapLayer& l : model.layers)
    largest_unit = std::max<int64_t>(largest_unit, l.elems * sizeof(float));
  if (!c.csv) {
    std::printf(
        "# memory: %zu parameters (f32), %zu units (layers), largest unit %.1f MB, layer compute "
        "%lld us (sleep)\n",
        model.elems(), model.layers.size(), largest_unit / 1e6,
        static_cast<long long>(c.layer_compute_us));
  }
  std::vector<Row> rows;
  for (int ranks : c.ranks) {
    for (Mode mode : c.modes) {
      std::fprintf(stderr, "[memory] ranks=%d mode=%s\n", ranks, ModeName(mode));
      ASSIGN_OR_RETURN(Row r, Measure(ranks, mode, c, model, largest_unit));
      rows.push_back(r);
    }
  }
  if (!c.csv) {
    std::printf("%5s %-26s %12s %14s %14s %12s %10s %11s\n", "ranks", "mode", "peak_host_MB",
                "state/ranks_MB", "target_MB", "vs_ddp", "step_ms", "vs_zero2");
    for (const Row& r : rows) {
      const Row* ddp = nullptr;
      const Row* zero2 = nullptr;
      for (const Row& q : rows) {
        if (q.ranks == r.ranks && q.mode == Mode::kDdp) ddp = &q;
        if (q.ranks == r.ranks && q.mode == Mode::kZero2) zero2 = &q;
      }
      const double target =
          (static_cast<double>(r.model_state) / r.ranks + 2.0 * r.largest_unit) * 1.1;
      std::printf("%5d %-26s %12.1f %14.1f %14.1f %12.2f %10.1f %11.2f\n", r.ranks,
                  ModeName(r.mode), r.peak_host / 1e6,
                  static_cast<double>(r.model_state) / r.ranks / 1e6, target / 1e6,
                  ddp ? static_cast<double>(r.peak_host) / ddp->peak_host : 0.0, r.step_ms,
                  zero2 ? r.step_ms / zero2->step_ms : 0.0);
    }
    std::printf("\n");
  }
  std::printf(
      "ranks,mode,params,peak_host_bytes,peak_device_bytes,model_state_bytes,largest_unit_bytes,"
      "step_ms\n");
  for (const Row& r : rows) {
    std::printf("%d,%s,%zu,%lld,%lld,%lld,%lld,%.1f\n", r.ranks, ModeName(r.mode), r.params,
                static_cast<long long>(r.peak_host), static_cast<long long>(r.peak_device),
                static_cast<long long>(r.model_state), static_cast<long long>(r.largest_unit),
                r.step_ms);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace braid::bench

int main(int argc, char** argv) {
  const absl::Status s = braid::bench::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "memory: %s\n", s.ToString().c_str());
    return absl::IsInvalidArgument(s) ? 2 : 1;
  }
  return 0;
}
