// Flight analysis: reads the ranks' flight recorder dumps (comm/flight_recorder.h) and names
// what broke the rank-order contract (comm/group.h), for tools/braid_flight.cc and tests.
//
//   ASSIGN_OR_RETURN(FlightDump d0, ReadFlightDump("/tmp/fr/braid_flight.rank0.jsonl"));
//   ...
//   for (const FlightFinding& f : AnalyzeFlight({d0, d1, d2})) std::cout << f.message << "\n";
//
// Per group, over the sequence numbers every rank's ring still holds, in this order of blame:
//   kSkipped / kReordered / kDiverged: the first seq where ranks recorded different calls (op,
//     dtype, count); the ranks that differ from the majority are named, and the call is
//     explained as a skip (its seq holds the others' next call) or a swap where it is one;
//   kNeverArrived: every rank agrees, but a rank stopped issuing before the others' last seq;
//   kStalled: a rank issued a seq and never started or completed it while the others did;
//   kAllPending: every rank issued a seq and none completed it (no rank stands out).
// Findings are sorted by that order, then by issue time: the first is the likely culprit.
#ifndef BRAID_TOOLS_FLIGHT_ANALYSIS_H_
#define BRAID_TOOLS_FLIGHT_ANALYSIS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::flight {

struct Entry {  // one line of a dump
  std::string group, op, dtype, label, state, error;
  uint64_t seq = 0, count = 0, bytes = 0;
  int64_t issued_ns = 0, started_ns = 0, completed_ns = 0;
  bool completed() const { return state == "completed"; }
};

struct FlightDump {
  int rank = -1;
  std::string reason;
  std::vector<Entry> entries;  // oldest first
};

// Parses a dump's text; errors name the line.
absl::StatusOr<FlightDump> ParseFlightDump(absl::string_view text);
absl::StatusOr<FlightDump> ReadFlightDump(const std::string& path);

struct FlightFinding {
  enum class Kind { kSkipped, kReordered, kDiverged, kNeverArrived, kStalled, kAllPending };
  Kind kind = Kind::kDiverged;
  std::string group;
  uint64_t seq = 0;
  std::vector<int> ranks;  // the culprits (every rank for kAllPending)
  std::string message;     // one line naming group, seq, call and ranks
};
absl::string_view FindingKindName(FlightFinding::Kind k);  // "skipped", "never_arrived", ...

std::vector<FlightFinding> AnalyzeFlight(const std::vector<FlightDump>& dumps);

}  // namespace braid::flight

#endif  // BRAID_TOOLS_FLIGHT_ANALYSIS_H_
