#include "bench/bench_flags.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace braid::bench {

absl::StatusOr<Flags> Flags::Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      f.help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0)
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    a = a.substr(2);
    const size_t eq = a.find('=');
    if (eq == std::string::npos) {
      f.values_[a] = "1";
    } else {
      f.values_[a.substr(0, eq)] = a.substr(eq + 1);
    }
  }
  return f;
}

std::string Flags::Str(const std::string& name, const std::string& def) const {
  used_[name] = true;
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second;
}

absl::StatusOr<int64_t> Flags::Int(const std::string& name, int64_t def) const {
  used_[name] = true;
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  std::string v = it->second;
  int64_t mult = 1;
  if (!v.empty()) {
    switch (v.back()) {
      case 'K':
      case 'k':
        mult = int64_t{1} << 10;
        v.pop_back();
        break;
      case 'M':
      case 'm':
        mult = int64_t{1} << 20;
        v.pop_back();
        break;
      case 'G':
      case 'g':
        mult = int64_t{1} << 30;
        v.pop_back();
        break;
      default:
        break;
    }
  }
  int64_t x = 0;
  if (!absl::SimpleAtoi(v, &x)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "='", it->second, "' is not an integer"));
  }
  return x * mult;
}

bool Flags::Bool(const std::string& name, bool def) const {
  used_[name] = true;
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  return it->second == "1" || it->second == "true" || it->second == "yes";
}

bool PrintHelp(const Flags& f, const char* usage) {
  if (!f.help()) return false;
  std::fputs(usage, stdout);
  return true;
}

absl::StatusOr<KernelBenchFlags> ParseKernelBenchFlags(const Flags& f) {
  const absl::StatusOr<int64_t> iters = f.Int("iters", 20);
  const absl::StatusOr<int64_t> warmup = f.Int("warmup", 5);
  const absl::StatusOr<int64_t> only_n = f.Int("n", 0);
  for (const absl::Status& st : {iters.status(), warmup.status(), only_n.status()}) {
    if (!st.ok()) return st;
  }
  for (const std::string& u : f.Unused()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", u));
  }
  if (*iters < 1 || *warmup < 0 || *only_n < 0) {
    return absl::InvalidArgumentError("--iters must be >= 1, --warmup and --n >= 0");
  }
  KernelBenchFlags k;
  k.iters = static_cast<int>(*iters);
  k.warmup = static_cast<int>(*warmup);
  k.sizes = *only_n > 0 ? std::vector<size_t>{static_cast<size_t>(*only_n)}
                        : std::vector<size_t>{size_t{10} * 1000 * 1000, size_t{100} * 1000 * 1000};
  return k;
}

std::vector<std::string> Flags::Unused() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : values_) {
    if (!used_.count(k)) out.push_back(k);
  }
  return out;
}

}  // namespace braid::bench
