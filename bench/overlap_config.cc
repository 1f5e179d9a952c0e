#include "bench/overlap_config.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/status_macros.h"

namespace braid::bench {

const char* ModeName(StepMode m) {
  switch (m) {
    case StepMode::kComputeOnly:
      return "compute_only";
    case StepMode::kCommOnly:
      return "comm_only";
    case StepMode::kSyncAfterBackward:
      return "sync_after_backward";
    case StepMode::kOverlapped:
      return "overlapped";
    case StepMode::kOptimAfterBackward:
      return "optim_after_backward";
    case StepMode::kOptimOverlapped:
      return "optim_overlapped";
    case StepMode::kPriority:
      return "priority";
    case StepMode::kAutotuned:
      return "autotuned";
  }
  return "?";
}

const char* ReduceName(ReduceMode m) {
  switch (m) {
    case ReduceMode::kAllReduce:
      return "all_reduce";
    case ReduceMode::kReduceScatter:
      return "reduce_scatter";
    case ReduceMode::kHybrid:
      return "hybrid";
  }
  return "?";
}

absl::StatusOr<Config> ParseConfig(const Flags& f) {
  Config c;
  for (absl::string_view s : absl::StrSplit(f.Str("ranks", "2,4"), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ranks: '", s, "' is not a rank count >= 1"));
    }
    c.ranks.push_back(n);
  }
  c.backend = f.Str("backend", "local");
  if (c.backend != "local" && c.backend != "mpi") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend='", c.backend, "': expected local or mpi"));
  }
  if (c.backend == "mpi" && c.ranks.size() != 1) {
    return absl::InvalidArgumentError(
        "--backend=mpi takes one rank count (--ranks=2): one process per rank");
  }
  const std::string mode = f.Str("mode", "all_reduce");
  if (mode == "all_reduce" || mode == "allreduce") {
    c.reduce = ReduceMode::kAllReduce;
  } else if (mode == "reduce_scatter") {
    c.reduce = ReduceMode::kReduceScatter;
  } else if (mode == "hybrid") {
    c.reduce = ReduceMode::kHybrid;
  } else if (mode == "fully_sharded") {
    c.reduce = ReduceMode::kReduceScatter;
    c.fully_sharded = true;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mode='", mode, "': expected all_reduce, reduce_scatter, hybrid or fully_sharded"));
  }
  ASSIGN_OR_RETURN(int64_t shards, f.Int("shards", 0));
  c.shards = static_cast<int>(shards);
  const std::string scale = f.Str("scale", "0.25");
  if (!absl::SimpleAtod(scale, &c.scale) || !(c.scale > 0) || c.scale > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--scale='", scale, "': expected a number in (0, 1]"));
  }
  ASSIGN_OR_RETURN(int64_t blocks, f.Int("blocks", 12));
  c.blocks = static_cast<int>(blocks);
  ASSIGN_OR_RETURN(c.layer_compute_us, f.Int("layer_compute_us", 2000));
  ASSIGN_OR_RETURN(int64_t iters, f.Int("iters", 21));
  ASSIGN_OR_RETURN(int64_t warmup, f.Int("warmup", 2));
  c.iters = static_cast<int>(iters);
  c.warmup = static_cast<int>(warmup);
  ASSIGN_OR_RETURN(c.bucket_cap, f.Int("bucket_cap", 0));
  ASSIGN_OR_RETURN(c.first_bucket_cap, f.Int("first_bucket_cap", 0));
  // DDP's defaults scaled with the model, kept a multiple of the plan's 64-byte alignment.
  auto scaled = [&](double bytes) {
    return std::max<int64_t>(64, static_cast<int64_t>(bytes * c.scale) / 64 * 64);
  };
  if (c.bucket_cap == 0) c.bucket_cap = scaled(25.0 * (1 << 20));
  if (c.first_bucket_cap == 0) c.first_bucket_cap = scaled(1.0 * (1 << 20));
  ASSIGN_OR_RETURN(c.credit, f.Int("credit", 0));
  if (c.credit == 0) c.credit = scaled(4.0 * (1 << 20));
  c.priorities = f.Bool("priorities", true);
  const std::string hold = f.Str("hold", "in_flight");
  if (hold != "in_flight" && hold != "waited") {
    return absl::InvalidArgumentError(
        absl::StrCat("--hold='", hold, "': expected in_flight or waited"));
  }
  c.hold_waited = hold == "waited";
  c.aa = f.Bool("aa", false);
  c.autotune = f.Bool("autotune", true);
  c.timeline = f.Str("timeline", "");
  const std::string compute = f.Str("compute", "busy");
  if (compute != "busy" && compute != "sleep") {
    return absl::InvalidArgumentError(
        absl::StrCat("--compute='", compute, "': expected busy or sleep"));
  }
  c.sleep_compute = compute == "sleep";
  c.csv = f.Bool("csv", false);
  const std::string opt = f.Str("optimizer", "none");
  if (opt != "none" && opt != "adamw") {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer='", opt, "': expected none or adamw"));
  }
  c.optimizer = opt == "adamw";
  ASSIGN_OR_RETURN(int64_t othreads, f.Int("optimizer_threads", 1));
  c.optimizer_threads = static_cast<int>(othreads);
  if (c.optimizer && c.fully_sharded) {
    return absl::InvalidArgumentError(
        "--optimizer=adamw is not implemented for --mode=fully_sharded");
  }
  if (c.optimizer && c.reduce == ReduceMode::kAllReduce) {
    return absl::InvalidArgumentError(
        "--optimizer=adamw needs --mode=reduce_scatter or hybrid (a sharded step)");
  }
  for (const auto& [bad, what] : std::vector<std::pair<bool, const char*>>{
           {c.blocks < 1, "--blocks must be >= 1"},
           {c.layer_compute_us < 0, "--layer_compute_us must be >= 0"},
           {c.iters < 1, "--iters must be >= 1"},
           {c.warmup < 0, "--warmup must be >= 0"},
           {c.shards < 0, "--shards must be >= 0"},
           {c.optimizer_threads < 1, "--optimizer_threads must be >= 1"},
           {c.bucket_cap < 64 || c.first_bucket_cap < 64, "bucket caps must be >= 64 bytes"},
           {c.credit < 64, "--credit must be >= 64 bytes"}}) {
    if (bad) return absl::InvalidArgumentError(what);
  }
  for (int n : c.ranks) {
    const int shards = c.shards > 0 ? c.shards : std::max(1, n / 2);
    if (c.reduce == ReduceMode::kHybrid && n % shards != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shards=", shards, " does not divide --ranks ", n));
    }
  }
  for (const std::string& u : f.Unused()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", u));
  }
  return c;
}

}  // namespace braid::bench
