// braid_ckpt: inspect, verify and re-shard optimizer checkpoints (per-rank state files written
// by ShardedOptimizer::Save / braid_optimizer_save).
//
//   braid_ckpt info FILE                 header, sections and recorded layout of one file
//   braid_ckpt verify FILE...            reads every file fully (magic, lengths, CRC-32C) and,
//                                        when they are all ranks of one checkpoint, checks them
//                                        together as `convert` would
//   braid_ckpt convert --to-ranks M [--shards S] IN... OUT_PREFIX
//                                        writes OUT_PREFIX<r>.braid for r in 0..M-1: the same
//                                        state laid out for M ranks in shard groups of S
//                                        (default M; S < M: hybrid, M/S replicas)
//
// Exit status 0 on success, 1 when a file is refused (the error names it), 2 on bad usage.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "comm/dtype.h"
#include "optim/checkpoint_layout.h"
#include "optim/reshard.h"
#include "optim/state_file.h"

namespace braid::optim {
namespace {

constexpr char kUsage[] =
    "usage: braid_ckpt info FILE\n"
    "       braid_ckpt verify FILE...\n"
    "       braid_ckpt convert --to-ranks M [--shards S] IN... OUT_PREFIX\n";

int Usage(const char* problem) {
  std::fprintf(stderr, "braid_ckpt: %s\n%s", problem, kUsage);
  return 2;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "braid_ckpt: %s\n", s.ToString().c_str());
  return 1;
}

int Info(const std::string& path) {
  absl::StatusOr<LoadedState> f = ReadStateFile(path);
  if (!f.ok()) return Fail(f.status());
  const StateHeader& h = f->header();
  std::printf(
      "file: %s\nkind: %s\nstep: %lld\nrank: %d of %d (%d replicas x %d shards)\n"
      "plan fingerprint: %016llx\n",
      path.c_str(), h.kind.c_str(), static_cast<long long>(h.step), h.rank, h.world_size,
      h.replica_group_size, h.shard_group_size,
      static_cast<unsigned long long>(h.plan_fingerprint));
  for (const auto& [name, value] : h.scalars)
    std::printf("scalar %s = %.17g\n", name.c_str(), value);
  for (const LoadedSection& s : f->sections()) {
    std::printf(
        "section %s: %llu x %s (%zu bytes)\n", s.name.c_str(),
        static_cast<unsigned long long>(s.count),
        IsValidDType(s.dtype) ? std::string(DTypeName(static_cast<DType>(s.dtype))).c_str() : "?",
        s.bytes);
  }
  if (!HasLayout(*f)) {
    std::printf("layout: none (saved before layouts were recorded: cannot be re-sharded)\n");
    return 0;
  }
  absl::StatusOr<sched::BucketPlan> plan = ReadLayout(*f);
  if (!plan.ok()) return Fail(plan.status());
  std::printf("layout: %zu parameters in %zu buckets (caps %zu / %zu bytes, align %zu)\n",
              plan->params().size(), plan->buckets().size(), plan->options().bucket_cap_bytes,
              plan->options().first_bucket_cap_bytes, plan->options().align_bytes);
  for (size_t i = 0; i < plan->params().size(); ++i) {
    const sched::ParamSpec& p = plan->params()[i];
    const sched::ParamSlot& slot = plan->slot(static_cast<int>(i));
    std::printf("  param %s: %zu x %s, bucket %d offset %zu\n", p.Label().c_str(), p.count,
                std::string(DTypeName(p.dtype)).c_str(), slot.bucket, slot.offset);
  }
  return 0;
}

int Verify(const std::vector<std::string>& paths) {
  int bad = 0;
  for (const std::string& p : paths) {
    absl::StatusOr<LoadedState> f = ReadStateFile(p);
    if (f.ok()) {
      std::printf("ok: %s (rank %d of %d, step %lld)\n", p.c_str(), f->header().rank,
                  f->header().world_size, static_cast<long long>(f->header().step));
    } else {
      std::printf("BAD: %s\n", f.status().ToString().c_str());
      ++bad;
    }
  }
  if (bad > 0) return 1;
  absl::StatusOr<Checkpoint> c = ReadCheckpoint(paths);
  if (!c.ok()) {
    std::printf("not one complete re-shardable checkpoint: %s\n", c.status().ToString().c_str());
    return 0;  // every file is sound; a partial set is not an error of `verify`
  }
  std::printf("ok: %zu files form one checkpoint of %zu parameters at step %lld\n", paths.size(),
              c->plan.params().size(), static_cast<long long>(c->header.step));
  return 0;
}

int Convert(const std::vector<std::string>& args) {
  int ranks = 0, shards = 0;
  std::vector<std::string> files;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--to-ranks" || args[i] == "--shards") {
      int v = 0;
      if (i + 1 >= args.size() || !absl::SimpleAtoi(args[i + 1], &v) || v < 1) {
        return Usage((args[i] + " needs a positive integer").c_str());
      }
      (args[i] == "--to-ranks" ? ranks : shards) = v;
      ++i;
    } else {
      files.push_back(args[i]);
    }
  }
  if (ranks == 0) return Usage("convert needs --to-ranks M");
  if (files.size() < 2) return Usage("convert needs input files and an output prefix");
  const std::string prefix = files.back();
  files.pop_back();
  absl::StatusOr<Checkpoint> c = ReadCheckpoint(files);
  if (!c.ok()) return Fail(c.status());
  absl::StatusOr<std::vector<std::string>> out =
      WriteCheckpoint(*c, ranks, shards == 0 ? ranks : shards, prefix);
  if (!out.ok()) return Fail(out.status());
  for (const std::string& p : *out) std::printf("wrote %s\n", p.c_str());
  return 0;
}

}  // namespace
}  // namespace braid::optim

int main(int argc, char** argv) {
  using namespace braid::optim;
  if (argc < 2) return Usage("no command");
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "info" && args.size() == 1) return Info(args[0]);
  if (cmd == "verify" && !args.empty()) return Verify(args);
  if (cmd == "convert") return Convert(args);
  return Usage(("unknown command or arguments: " + cmd).c_str());
}
