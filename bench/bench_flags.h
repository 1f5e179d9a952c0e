// Minimal --name=value flag parsing for the bench binaries (no flag library dependency), and
// their --help:
//
//   ASSIGN_OR_RETURN(Flags f, Flags::Parse(argc, argv));
//   if (PrintHelp(f, kUsage)) return absl::OkStatus();   // --help / -h: usage, exit 0
#ifndef BRAID_BENCH_BENCH_FLAGS_H_
#define BRAID_BENCH_BENCH_FLAGS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace braid::bench {

class Flags {
 public:
  // Accepts --name=value, --name (value "1") and --help / -h (help()); anything else is an
  // error naming it.
  static absl::StatusOr<Flags> Parse(int argc, char** argv);
  bool help() const { return help_; }

  std::string Str(const std::string& name, const std::string& def) const;
  // Integers accept K/M/G suffixes (powers of 1024): --maxbytes=64M.
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t def) const;
  bool Bool(const std::string& name, bool def) const;
  // Names given but never read: reported as unknown flags.
  std::vector<std::string> Unused() const;

 private:
  bool help_ = false;
  std::map<std::string, std::string> values_;
  mutable std::map<std::string, bool> used_;
};

// With --help / -h: prints `usage` (what the bench measures, its flags and defaults) to stdout
// and returns true; the bench then exits 0 without running.
bool PrintHelp(const Flags& f, const char* usage);

// The flags both GPU kernel benches take: --iters (>= 1, default 20), --warmup (>= 0, default 5)
// and --n (0: the sizes 10M and 100M; else that one size). Read a bench's own flags from `f`
// before calling this: it also refuses any flag that was never read.
struct KernelBenchFlags {
  int iters = 20;
  int warmup = 5;
  std::vector<size_t> sizes;
};
absl::StatusOr<KernelBenchFlags> ParseKernelBenchFlags(const Flags& f);

}  // namespace braid::bench

#endif  // BRAID_BENCH_BENCH_FLAGS_H_
