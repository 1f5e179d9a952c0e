// Fuzz target: the BRAID_* options parser (comm/options.h, Options::FromMap).
//
// Input: a sequence of (name, value) pairs. A name is either one of the declared variables
// (chosen by a byte) or arbitrary bytes, with or without the BRAID_ prefix; a value is
// arbitrary bytes, or one of a few near-boundary numbers.
// Checks: FromMap never crashes; an error names a variable of the input that is declared;
// a success holds every field in its documented range, takes the value of each declared
// variable it was given (re-parsing that variable alone agrees), and lists exactly the
// undeclared BRAID_* names in `unknown`.
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "comm/options.h"
#include "tests/fuzz/fuzz_util.h"

namespace braid::fuzz {
namespace {

const char* const kValues[] = {"0",
                               "1",
                               "-1",
                               "4096",
                               "4097",
                               "1099511627776",
                               "1099511627777",
                               "10000000",
                               "10000001",
                               "65536",
                               "65537",
                               " 1",
                               "1 ",
                               "+1",
                               "0x10",
                               "",
                               "warn",
                               "off",
                               "trace",
                               "WARN",
                               "9223372036854775808"};

bool Declared(const std::string& name) {
  for (const OptionSpec& s : OptionSpecs()) {
    if (s.name == name) return true;
  }
  return false;
}

}  // namespace
}  // namespace braid::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace braid;
  using braid::fuzz::FuzzInput;
  FuzzInput in(data, size);
  std::map<std::string, std::string> vars;
  const std::vector<OptionSpec>& specs = OptionSpecs();
  while (!in.empty() && vars.size() < 32) {
    const uint8_t how = in.Byte();
    std::string name;
    switch (how % 4) {
      case 0:
      case 1:
        name = std::string(specs[in.Byte() % specs.size()].name);
        break;
      case 2:
        name = "BRAID_" + in.Str(16);
        break;
      default:
        name = in.Str(16);
        break;
    }
    std::string value =
        (how & 0x10) != 0
            ? std::string(
                  fuzz::kValues[in.Byte() % (sizeof(fuzz::kValues) / sizeof(*fuzz::kValues))])
            : in.Str(24);
    vars[name] = value;
  }
  absl::StatusOr<Options> o = Options::FromMap(vars);
  if (!o.ok()) {
    bool named = false;
    for (const auto& [name, value] : vars) {
      if (fuzz::Declared(name) && absl::StrContains(o.status().message(), name + "='"))
        named = true;
    }
    FUZZ_CHECK(named, "error names no declared input variable: %s", o.status().ToString().c_str());
    FUZZ_CHECK(o.status().code() == absl::StatusCode::kInvalidArgument, "code %s",
               o.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(o->local_ranks >= 1 && o->local_ranks <= 4096, "local_ranks %d", o->local_ranks);
  FUZZ_CHECK(o->timeout >= absl::Milliseconds(1), "timeout");
  FUZZ_CHECK(o->spin >= absl::ZeroDuration() && o->spin <= absl::Seconds(10), "spin");
  FUZZ_CHECK(o->cuda_device >= -1, "cuda_device %d", o->cuda_device);
  FUZZ_CHECK(!o->nccl_library.empty(), "empty nccl library");
  const std::set<std::string> levels = {"trace", "debug",    "info", "warn",
                                        "error", "critical", "off"};
  FUZZ_CHECK(levels.count(o->log_level) == 1, "log level %s", o->log_level.c_str());
  std::set<std::string> unknown;
  for (const auto& [name, value] : vars) {
    if (!absl::StartsWith(name, "BRAID_")) continue;
    if (!fuzz::Declared(name)) {
      unknown.insert(name);
      continue;
    }
    absl::StatusOr<Options> alone = Options::FromMap({{name, value}});
    FUZZ_CHECK(alone.ok(), "%s='%s' parses in company but not alone", name.c_str(), value.c_str());
  }
  FUZZ_CHECK(std::set<std::string>(o->unknown.begin(), o->unknown.end()) == unknown &&
                 o->unknown.size() == unknown.size(),
             "unknown list");
  if (vars.count("BRAID_BACKEND")) FUZZ_CHECK(o->backend == vars["BRAID_BACKEND"], "backend");
  if (vars.count("BRAID_TIMELINE")) FUZZ_CHECK(o->timeline == vars["BRAID_TIMELINE"], "timeline");
  return 0;
}
