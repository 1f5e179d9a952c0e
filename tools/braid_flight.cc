// braid_flight: merges the ranks' flight recorder dumps (comm/flight_recorder.h) and names the
// collective where they went apart: the first call the ranks disagree on (a skip, another order,
// other arguments), the rank that never arrived, or the rank that stalled.
//
//   braid_flight /tmp/fr                      # every braid_flight.rank*.jsonl in the directory
//   braid_flight a.rank0.jsonl a.rank1.jsonl  # or the files themselves
//
// Prints one line per rank read, then the findings, most likely culprit first. Exit status:
// 0 when it read the dumps (with or without findings), 1 on a usage error or an unreadable dump.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tools/flight_analysis.h"

namespace {

constexpr char kUsage[] =
    "usage: braid_flight DIR | DUMP...\n"
    "\n"
    "Merges Braid flight recorder dumps (one per rank: braid_flight.rank<R>.jsonl, written when a\n"
    "collective fails or the job aborts with BRAID_FLIGHT_RECORDER_DIR set, or by\n"
    "braid_flight_recorder_dump) and names, per group:\n"
    "  skipped/reordered/diverged  the first sequence number where the ranks' calls differ\n"
    "                              (op, dtype or count), and the ranks that differ;\n"
    "  never_arrived               a rank that stopped issuing before the others' last call;\n"
    "  stalled                     a rank that issued a call and never joined or completed it\n"
    "                              while the others did;\n"
    "  all_pending                 every rank issued a call and none completed it.\n"
    "The first finding printed is the likely culprit. Format: docs/hardening.md#flight-recorder.\n"
    "\n"
    "  DIR    a directory: reads every braid_flight.rank*.jsonl in it\n"
    "  DUMP   dump files, one per rank\n"
    "  -h, --help  this text\n";

std::vector<std::string> DumpsIn(const std::string& dir) {
  std::vector<std::string> paths;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (absl::StartsWith(name, "braid_flight.rank") && absl::EndsWith(name, ".jsonl")) {
        paths.push_back(dir + "/" + name);
      }
    }
    closedir(d);
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (argv[i][0] == '-') {
      std::fprintf(stderr, "braid_flight: unknown flag %s\n%s", argv[i], kUsage);
      return 1;
    }
    struct stat st;
    if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
      std::vector<std::string> in_dir = DumpsIn(argv[i]);
      if (in_dir.empty()) {
        std::fprintf(stderr, "braid_flight: no braid_flight.rank*.jsonl in %s\n", argv[i]);
        return 1;
      }
      paths.insert(paths.end(), in_dir.begin(), in_dir.end());
    } else {
      paths.push_back(argv[i]);
    }
  }
  if (paths.empty()) {
    std::fputs(kUsage, stderr);
    return 1;
  }
  std::vector<braid::flight::FlightDump> dumps;
  for (const std::string& p : paths) {
    absl::StatusOr<braid::flight::FlightDump> d = braid::flight::ReadFlightDump(p);
    if (!d.ok()) {
      std::fprintf(stderr, "braid_flight: %s\n", std::string(d.status().message()).c_str());
      return 1;
    }
    std::printf("rank %d: %zu records from %s (%s)\n", d->rank, d->entries.size(), p.c_str(),
                d->reason.c_str());
    dumps.push_back(*std::move(d));
  }
  const std::vector<braid::flight::FlightFinding> findings = braid::flight::AnalyzeFlight(dumps);
  if (findings.empty()) {
    std::printf("no divergence, missing rank or stall found in the records\n");
    return 0;
  }
  for (const braid::flight::FlightFinding& f : findings) {
    std::printf("%s: %s\n", std::string(braid::flight::FindingKindName(f.kind)).c_str(),
                f.message.c_str());
  }
  return 0;
}
