#include "tools/flight_analysis.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace braid::flight {
namespace {

// A flat JSON object of string and integer values (the dump's lines); values kept as text.
absl::StatusOr<std::map<std::string, std::string>> ParseFlatObject(absl::string_view s) {
  std::map<std::string, std::string> out;
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) ++i;
  };
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(what, " at column ", i + 1));
  };
  auto parse_string = [&](std::string* v) -> absl::Status {
    if (i >= s.size() || s[i] != '"') return bad("expected a string");
    for (++i; i < s.size() && s[i] != '"'; ++i) {
      if (s[i] != '\\') {
        v->push_back(s[i]);
        continue;
      }
      if (++i >= s.size()) break;
      switch (s[i]) {
        case 'n':
          v->push_back('\n');
          break;
        case 'r':
          v->push_back('\r');
          break;
        case 't':
          v->push_back('\t');
          break;
        case 'u': {
          uint32_t code = 0;
          if (i + 4 >= s.size() || !absl::SimpleHexAtoi(s.substr(i + 1, 4), &code)) {
            return bad("bad \\u escape");
          }
          v->push_back(code < 0x80 ? static_cast<char>(code) : '?');
          i += 4;
          break;
        }
        default:
          v->push_back(s[i]);
      }
    }
    if (i >= s.size()) return bad("unterminated string");
    ++i;
    return absl::OkStatus();
  };
  skip_ws();
  if (i >= s.size() || s[i] != '{') return bad("expected '{'");
  ++i;
  skip_ws();
  if (i < s.size() && s[i] == '}') return out;
  while (true) {
    skip_ws();
    std::string key, value;
    if (absl::Status st = parse_string(&key); !st.ok()) return st;
    skip_ws();
    if (i >= s.size() || s[i] != ':') return bad("expected ':'");
    ++i;
    skip_ws();
    if (i < s.size() && s[i] == '"') {
      if (absl::Status st = parse_string(&value); !st.ok()) return st;
    } else {
      const size_t start = i;
      while (i < s.size() && (s[i] == '-' || (s[i] >= '0' && s[i] <= '9'))) ++i;
      if (i == start) return bad("expected a string or an integer");
      value = std::string(s.substr(start, i - start));
    }
    out[key] = std::move(value);
    skip_ws();
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    if (i < s.size() && s[i] == '}') return out;
    return bad("expected ',' or '}'");
  }
}

template <typename T>
bool GetInt(const std::map<std::string, std::string>& m, const char* key, T* v) {
  auto it = m.find(key);
  return it != m.end() && absl::SimpleAtoi(it->second, v);
}

std::string Get(const std::map<std::string, std::string>& m, const char* key) {
  auto it = m.find(key);
  return it == m.end() ? std::string() : it->second;
}

bool SameCall(const Entry& a, const Entry& b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count;
}

std::string Call(const Entry& e) {
  std::string s = absl::StrCat(e.op, " #", e.seq, " (");
  if (e.dtype != "none") absl::StrAppend(&s, e.count, " x ", e.dtype, ", ", e.bytes, " bytes");
  if (!e.label.empty()) absl::StrAppend(&s, e.dtype != "none" ? ", " : "", e.label);
  s.push_back(')');
  return s;
}

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","));
}

using SeqMap = std::map<uint64_t, const Entry*>;

const Entry* At(const SeqMap& m, uint64_t seq) {
  auto it = m.find(seq);
  return it == m.end() ? nullptr : it->second;
}
const Entry* After(const SeqMap& m, uint64_t seq) {
  auto it = m.upper_bound(seq);
  return it == m.end() ? nullptr : it->second;
}

// The first seq at which the ranks' calls differ, or none.
bool FindDivergence(const std::string& group, const std::map<int, SeqMap>& by_rank,
                    const std::vector<uint64_t>& seqs, std::vector<FlightFinding>* out) {
  for (uint64_t seq : seqs) {
    // Ranks grouped by the call they recorded at `seq` (a rank without one: its own class).
    std::vector<std::pair<const Entry*, std::vector<int>>> classes;
    for (const auto& [rank, m] : by_rank) {
      const Entry* e = At(m, seq);
      auto it = std::find_if(classes.begin(), classes.end(), [&](const auto& c) {
        return c.first == nullptr || e == nullptr ? c.first == e : SameCall(*c.first, *e);
      });
      if (it == classes.end()) {
        classes.push_back({e, {rank}});
      } else {
        it->second.push_back(rank);
      }
    }
    if (classes.size() < 2) continue;
    // The majority's call is the expected one; on a tie, the class whose call the others
    // recorded one seq later is the odd one (it skipped ahead), else the higher ranks are.
    std::stable_sort(classes.begin(), classes.end(), [](const auto& a, const auto& b) {
      return a.second.size() > b.second.size();
    });
    const auto& expected = classes.front();
    const SeqMap& ref = by_rank.at(expected.second.front());
    FlightFinding f;
    f.group = group;
    f.seq = seq;
    const Entry* want = expected.first;
    std::string why;
    for (size_t c = 1; c < classes.size(); ++c) {
      const auto& [got, ranks] = classes[c];
      f.ranks.insert(f.ranks.end(), ranks.begin(), ranks.end());
      const SeqMap& odd = by_rank.at(ranks.front());
      const Entry* ref_next = After(ref, seq);
      const Entry* odd_next = After(odd, seq);
      if (got == nullptr) {
        f.kind = FlightFinding::Kind::kDiverged;
        absl::StrAppend(&why, Ranks(ranks), " recorded no call at #", seq, " while ",
                        Ranks(expected.second), " issued ", Call(*want), "; ");
      } else if (want != nullptr && ref_next != nullptr && SameCall(*got, *ref_next) &&
                 odd_next != nullptr && SameCall(*odd_next, *want)) {
        f.kind = FlightFinding::Kind::kReordered;
        absl::StrAppend(&why, Ranks(ranks), " issued calls in another order: ", got->op, " #", seq,
                        " is the others' ", Call(*ref_next), ", and its #", odd_next->seq,
                        " is the others' ", Call(*want), "; ");
      } else if (want != nullptr && ref_next != nullptr && SameCall(*got, *ref_next)) {
        f.kind = FlightFinding::Kind::kSkipped;
        absl::StrAppend(&why, Ranks(ranks), " skipped ", Call(*want), " issued by ",
                        Ranks(expected.second), ": its #", seq, " is the others' next call, ",
                        Call(*ref_next), "; ");
      } else {
        f.kind = FlightFinding::Kind::kDiverged;
        absl::StrAppend(&why, Ranks(ranks), " issued ", Call(*got), " where ",
                        Ranks(expected.second), " issued ",
                        want == nullptr ? std::string("nothing") : Call(*want), "; ");
      }
    }
    why.resize(why.size() - 2);
    f.message = absl::StrCat("group '", group, "' diverges at #", seq, ": ", why);
    out->push_back(std::move(f));
    return true;
  }
  return false;
}

}  // namespace

absl::string_view FindingKindName(FlightFinding::Kind k) {
  switch (k) {
    case FlightFinding::Kind::kSkipped:
      return "skipped";
    case FlightFinding::Kind::kReordered:
      return "reordered";
    case FlightFinding::Kind::kDiverged:
      return "diverged";
    case FlightFinding::Kind::kNeverArrived:
      return "never_arrived";
    case FlightFinding::Kind::kStalled:
      return "stalled";
    case FlightFinding::Kind::kAllPending:
      return "all_pending";
  }
  return "invalid";
}

absl::StatusOr<FlightDump> ParseFlightDump(absl::string_view text) {
  FlightDump d;
  int line_no = 0;
  bool header = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (line.empty()) continue;
    absl::StatusOr<std::map<std::string, std::string>> m = ParseFlatObject(line);
    if (!m.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", m.status().message()));
    }
    if (!header) {
      int version = 0;
      if (!GetInt(*m, "braid_flight_recorder", &version) || version != 1 ||
          !GetInt(*m, "rank", &d.rank)) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_no,
                         ": not a flight recorder dump (want a header with "
                         "\"braid_flight_recorder\":1 and \"rank\")"));
      }
      d.reason = Get(*m, "reason");
      header = true;
      continue;
    }
    Entry e;
    e.group = Get(*m, "group");
    e.op = Get(*m, "op");
    e.dtype = Get(*m, "dtype");
    e.label = Get(*m, "label");
    e.state = Get(*m, "state");
    e.error = Get(*m, "error");
    if (!GetInt(*m, "seq", &e.seq) || !GetInt(*m, "count", &e.count) ||
        !GetInt(*m, "bytes", &e.bytes) || !GetInt(*m, "issued_ns", &e.issued_ns) ||
        !GetInt(*m, "started_ns", &e.started_ns) || !GetInt(*m, "completed_ns", &e.completed_ns) ||
        e.group.empty() || e.op.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": a record lacks group, op, seq, count, bytes or times"));
    }
    d.entries.push_back(std::move(e));
  }
  if (!header) return absl::InvalidArgumentError("empty dump: no header line");
  return d;
}

absl::StatusOr<FlightDump> ReadFlightDump(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<FlightDump> d = ParseFlightDump(ss.str());
  if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", d.status().message()));
  return d;
}

std::vector<FlightFinding> AnalyzeFlight(const std::vector<FlightDump>& dumps) {
  // group -> rank -> seq -> entry (a later record of the same seq wins).
  std::map<std::string, std::map<int, SeqMap>> groups;
  for (const FlightDump& d : dumps) {
    for (const Entry& e : d.entries) groups[e.group][d.rank][e.seq] = &e;
  }
  std::vector<FlightFinding> out;
  for (const auto& [group, by_rank] : groups) {
    if (by_rank.size() < 2) continue;
    // Only the seqs every rank's ring still covers can be compared.
    uint64_t lo = 0, common_hi = UINT64_MAX, top = 0;
    for (const auto& [rank, m] : by_rank) {
      lo = std::max(lo, m.begin()->first);
      common_hi = std::min(common_hi, m.rbegin()->first);
      top = std::max(top, m.rbegin()->first);
    }
    std::set<uint64_t> seq_set;
    for (const auto& [rank, m] : by_rank) {
      for (auto it = m.lower_bound(lo); it != m.end() && it->first <= common_hi; ++it) {
        seq_set.insert(it->first);
      }
    }
    const std::vector<uint64_t> seqs(seq_set.begin(), seq_set.end());
    if (FindDivergence(group, by_rank, seqs, &out)) continue;

    // Ranks that stopped issuing before the others' last call.
    std::vector<int> behind;
    uint64_t first_missing = UINT64_MAX;
    const Entry* missing = nullptr;
    std::vector<int> ahead;
    for (const auto& [rank, m] : by_rank) {
      if (m.rbegin()->first < top) behind.push_back(rank);
    }
    if (!behind.empty()) {
      for (const auto& [rank, m] : by_rank) {
        if (m.rbegin()->first == top) ahead.push_back(rank);
      }
      for (int r : behind) {
        const uint64_t last = by_rank.at(r).rbegin()->first;
        const Entry* next = After(by_rank.at(ahead.front()), last);
        if (next != nullptr && next->seq < first_missing) {
          first_missing = next->seq;
          missing = next;
        }
      }
      FlightFinding f;
      f.kind = FlightFinding::Kind::kNeverArrived;
      f.group = group;
      f.seq = first_missing;
      f.ranks = behind;
      f.message = absl::StrCat(Ranks(behind), " never arrived at ",
                               missing == nullptr ? std::string("the next call") : Call(*missing),
                               " on group '", group, "': ", Ranks(ahead), " issued it (and up to #",
                               top, "); the last call of ");
      for (size_t k = 0; k < behind.size(); ++k) {
        absl::StrAppend(&f.message, k ? ", " : "", "rank ", behind[k], " was #",
                        by_rank.at(behind[k]).rbegin()->first);
      }
      out.push_back(std::move(f));
      continue;
    }

    // Every rank issued every call: find the first one some rank did not finish.
    for (uint64_t seq : seqs) {
      std::vector<int> done, not_done, started, not_started;
      for (const auto& [rank, m] : by_rank) {
        const Entry* e = At(m, seq);
        if (e == nullptr) continue;
        (e->completed() ? done : not_done).push_back(rank);
        (e->started_ns != 0 ? started : not_started).push_back(rank);
      }
      if (not_done.empty()) continue;
      const Entry& e = *At(by_rank.begin()->second, seq);
      FlightFinding f;
      f.group = group;
      f.seq = seq;
      if (!done.empty()) {
        f.kind = FlightFinding::Kind::kStalled;
        f.ranks = not_done;
        f.message =
            absl::StrCat(Ranks(not_done), " stalled in ", Call(e), " on group '", group,
                         "': issued but never completed, while ", Ranks(done), " completed it");
      } else if (!started.empty() && !not_started.empty()) {
        f.kind = FlightFinding::Kind::kStalled;
        f.ranks = not_started;
        f.message = absl::StrCat(Ranks(not_started), " stalled before ", Call(e), " on group '",
                                 group, "': issued it but never joined it, while ", Ranks(started),
                                 " did (none completed)");
      } else {
        f.kind = FlightFinding::Kind::kAllPending;
        f.ranks = not_done;
        f.message = absl::StrCat("every rank issued ", Call(e), " on group '", group,
                                 "' and none completed it: no rank stands out in the records "
                                 "(a transport or device hang?)");
      }
      out.push_back(std::move(f));
      break;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const FlightFinding& a, const FlightFinding& b) {
    return static_cast<int>(a.kind) < static_cast<int>(b.kind);
  });
  return out;
}

}  // namespace braid::flight
