#include "comm/options.h"

#include <csignal>
#include <cstdlib>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

extern char** environ;

namespace braid {
namespace {

using Setter = std::function<absl::Status(Options&, absl::string_view)>;

struct Entry {
  OptionSpec spec;
  Setter set;
};

absl::Status BadValue(absl::string_view name, absl::string_view value, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, "='", value, "' is not valid: expected ", want));
}

absl::StatusOr<int64_t> ParseInt(absl::string_view name, absl::string_view v, int64_t lo,
                                 int64_t hi) {
  int64_t x = 0;
  if (!absl::SimpleAtoi(v, &x) || x < lo || x > hi) {
    return BadValue(name, v, absl::StrCat("an integer in [", lo, ", ", hi, "]"));
  }
  return x;
}

const std::vector<Entry>& Entries() {
  static const auto* entries = new std::vector<Entry>{
      {{"BRAID_BACKEND", "local", "backend to create: local, mpi, nccl, plugin"},
       [](Options& o, absl::string_view v) {
         o.backend = std::string(v);
         return absl::OkStatus();
       }},
      {{"BRAID_BACKEND_PLUGIN", "",
        "path of a shared library exporting braidBackendPlugin_v1 (used by backend 'plugin')"},
       [](Options& o, absl::string_view v) {
         o.plugin_path = std::string(v);
         return absl::OkStatus();
       }},
      {{"BRAID_LOCAL_RANKS", "1", "ranks (threads) of a world on the local backend"},
       [](Options& o, absl::string_view v) -> absl::Status {
         ASSIGN_OR_RETURN(int64_t x, ParseInt("BRAID_LOCAL_RANKS", v, 1, kMaxLocalRanks));
         o.local_ranks = static_cast<int>(x);
         return absl::OkStatus();
       }},
      {{"BRAID_TIMEOUT_MS", "300000",
        "deadline of every collective and internal wait, in milliseconds"},
       [](Options& o, absl::string_view v) -> absl::Status {
         ASSIGN_OR_RETURN(int64_t x, ParseInt("BRAID_TIMEOUT_MS", v, 1, int64_t{1} << 40));
         o.timeout = absl::Milliseconds(x);
         return absl::OkStatus();
       }},
      {{"BRAID_SPIN_US", "20", "busy-poll budget before a waiting thread sleeps, microseconds"},
       [](Options& o, absl::string_view v) -> absl::Status {
         ASSIGN_OR_RETURN(int64_t x, ParseInt("BRAID_SPIN_US", v, 0, 10'000'000));
         o.spin = absl::Microseconds(x);
         return absl::OkStatus();
       }},
      {{"BRAID_LOG_LEVEL", "warn", "trace, debug, info, warn, error, critical or off"},
       [](Options& o, absl::string_view v) -> absl::Status {
         for (absl::string_view l :
              {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
           if (v == l) {
             o.log_level = std::string(v);
             return absl::OkStatus();
           }
         }
         return BadValue("BRAID_LOG_LEVEL", v, "trace|debug|info|warn|error|critical|off");
       }},
      {{"BRAID_VALIDATE_COLLECTIVES", "0",
        "1: backends that cannot see peers' arguments for free (mpi) exchange and compare them "
        "before every collective, turning a mismatch into an error instead of a hang"},
       [](Options& o, absl::string_view v) -> absl::Status {
         if (v != "0" && v != "1") return BadValue("BRAID_VALIDATE_COLLECTIVES", v, "0 or 1");
         o.validate_collectives = v == "1";
         return absl::OkStatus();
       }},
      {{"BRAID_ABORT_ON_FAILURE", "1",
        "1: a failure on any group of any rank (deadline, transport error, braid_group_abort) "
        "fails every "
        "group of every rank at once, naming the rank (comm/abort_domain.h); 0: only the failed "
        "group fails, and the other ranks learn of it at their own deadlines"},
       [](Options& o, absl::string_view v) -> absl::Status {
         if (v != "0" && v != "1") return BadValue("BRAID_ABORT_ON_FAILURE", v, "0 or 1");
         o.abort_on_failure = v == "1";
         return absl::OkStatus();
       }},
      {{"BRAID_NCCL_BLOCKING", "1",
        "nccl backend: 1 blocking communicators, 0 nonblocking (every NCCL call returns at once "
        "and ncclInProgress is polled under the deadline, so a hung peer never blocks a thread "
        "inside NCCL)"},
       [](Options& o, absl::string_view v) -> absl::Status {
         if (v != "0" && v != "1") return BadValue("BRAID_NCCL_BLOCKING", v, "0 or 1");
         o.nccl_blocking = v == "1";
         return absl::OkStatus();
       }},
      {{"BRAID_MPI_ENGINE", "auto",
        "mpi backend: how collectives run. blocking: blocking MPI calls on a communication "
        "thread per group; nonblocking: MPI_I* calls progressed by the engine; sized: per call, "
        "whichever measured faster (blocking from 4 KiB); auto: sized where each rank on the "
        "node has a spare core for its comm thread, else nonblocking (backends/mpi/comm_thread.h)"},
       [](Options& o, absl::string_view v) -> absl::Status {
         if (v != "auto" && v != "sized" && v != "blocking" && v != "nonblocking") {
           return BadValue("BRAID_MPI_ENGINE", v, "auto, sized, blocking or nonblocking");
         }
         o.mpi_engine = std::string(v);
         return absl::OkStatus();
       }},
      {{"BRAID_CUDA_DEVICE", "-1",
        "nccl backend: CUDA device of this process's rank (-1: the node-local rank under mpirun, "
        "else the world rank, modulo the number of visible devices)"},
       [](Options& o, absl::string_view v) -> absl::Status {
         ASSIGN_OR_RETURN(int64_t x, ParseInt("BRAID_CUDA_DEVICE", v, -1, 1 << 16));
         o.cuda_device = static_cast<int>(x);
         return absl::OkStatus();
       }},
      {{"BRAID_NCCL_LIBRARY", "libnccl.so.2",
        "nccl backend: the NCCL library to dlopen when a world first needs it (a path, or a "
        "name found through LD_LIBRARY_PATH and the ld.so cache); nothing links NCCL"},
       [](Options& o, absl::string_view v) -> absl::Status {
         if (v.empty()) return BadValue("BRAID_NCCL_LIBRARY", v, "a library name or path");
         o.nccl_library = std::string(v);
         return absl::OkStatus();
       }},
      {{"BRAID_BACKEND_MODULE_DIR", "",
        "directory of the backend modules (libbraid-mpi.so, libbraid-gloo.so) a world loads "
        "when it first needs that backend (empty: the directory libbraid.so was loaded from; "
        "backends/module/module_loader.h)"},
       [](Options& o, absl::string_view v) {
         o.backend_module_dir = std::string(v);
         return absl::OkStatus();
       }},
      {{"BRAID_STORE_PORT", "0",
        "port of rank 0's rendezvous store (gloo, nccl under torchrun / srun); 0: a free one "
        "the OS picks, handed to the other ranks through MASTER_PORT while the world is "
        "created (or through torch.distributed's store when that is initialized)"},
       [](Options& o, absl::string_view v) {
         ASSIGN_OR_RETURN(int64_t x, ParseInt("BRAID_STORE_PORT", v, 0, 65535));
         o.store_port = static_cast<int>(x);
         return absl::OkStatus();
       }},
      {{"BRAID_FLIGHT_RECORDER_ENTRIES", "2048",
        "collectives each rank keeps in its flight recorder, a fixed ring written out when a "
        "collective fails or the job aborts (BRAID_FLIGHT_RECORDER_DIR); 0: no recorder "
        "(comm/flight_recorder.h)"},
       [](Options& o, absl::string_view v) -> absl::Status {
         ASSIGN_OR_RETURN(int64_t x, ParseInt("BRAID_FLIGHT_RECORDER_ENTRIES", v, 0, 1 << 20));
         o.flight_recorder_entries = static_cast<size_t>(x);
         return absl::OkStatus();
       }},
      {{"BRAID_FLIGHT_RECORDER_DIR", "",
        "directory each rank writes its flight recorder to (braid_flight.rank<R>.jsonl) when a "
        "collective fails or the job aborts; empty: only on request (braid_flight_recorder_dump)"},
       [](Options& o, absl::string_view v) {
         o.flight_recorder_dir = std::string(v);
         return absl::OkStatus();
       }},
      {{"BRAID_FLIGHT_RECORDER_SIGNAL", "",
        "SIGUSR1 or SIGUSR2: every rank of the process also writes its flight recorder to "
        "BRAID_FLIGHT_RECORDER_DIR each time the process receives that signal (comm/"
        "flight_signal.h); empty: Braid installs no signal handler"},
       [](Options& o, absl::string_view v) -> absl::Status {
         if (v.empty()) {
           o.flight_recorder_signal = 0;
         } else if (v == "SIGUSR1" || v == "USR1") {
           o.flight_recorder_signal = SIGUSR1;
         } else if (v == "SIGUSR2" || v == "USR2") {
           o.flight_recorder_signal = SIGUSR2;
         } else {
           return absl::InvalidArgumentError(absl::StrCat(
               "BRAID_FLIGHT_RECORDER_SIGNAL='", v, "': expected SIGUSR1 or SIGUSR2 (or empty)"));
         }
         return absl::OkStatus();
       }},
      {{"BRAID_TIMELINE", "", "path prefix for per-rank Chrome-trace timelines (off when empty)"},
       [](Options& o, absl::string_view v) {
         o.timeline = std::string(v);
         return absl::OkStatus();
       }},
  };
  return *entries;
}

}  // namespace

const std::vector<OptionSpec>& OptionSpecs() {
  static const auto* specs = [] {
    auto* v = new std::vector<OptionSpec>;
    for (const Entry& e : Entries()) v->push_back(e.spec);
    return v;
  }();
  return *specs;
}

absl::StatusOr<Options> Options::FromMap(const std::map<std::string, std::string>& vars) {
  Options o;
  for (const auto& [name, value] : vars) {
    if (!absl::StartsWith(name, "BRAID_")) continue;
    bool known = false;
    for (const Entry& e : Entries()) {
      if (e.spec.name == name) {
        RETURN_IF_ERROR(e.set(o, value));
        known = true;
        break;
      }
    }
    if (!known) o.unknown.push_back(name);
  }
  return o;
}

absl::StatusOr<Options> Options::FromEnv() {
  std::map<std::string, std::string> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view kv(*e);
    if (!absl::StartsWith(kv, "BRAID_")) continue;
    const size_t eq = kv.find('=');
    if (eq == absl::string_view::npos) continue;
    vars.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return FromMap(vars);
}

}  // namespace braid
