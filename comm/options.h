// BRAID_* settings, each declared once (name, default, description) and read once from the
// environment into an Options struct that is then passed explicitly. No getenv elsewhere.
//
//   ASSIGN_OR_RETURN(Options opts, Options::FromEnv());
//   opts.timeout = absl::Seconds(5);  // tests and embedders may override fields directly
//   for (const OptionSpec& s : Options::Specs()) std::cout << s.name << ": " << s.help << "\n";
//
// A malformed value is an error naming the variable; an unknown BRAID_* variable is reported
// in `unknown` (a typo in a knob should not pass silently).
#ifndef BRAID_COMM_OPTIONS_H_
#define BRAID_COMM_OPTIONS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/rendezvous_spec.h"

namespace braid {

// Ranks (threads) of a local world: BRAID_LOCAL_RANKS and braid_world_options_t.local_ranks.
inline constexpr int kMaxLocalRanks = 4096;

struct Options {
  std::string backend = "local";                 // BRAID_BACKEND
  std::string plugin_path;                       // BRAID_BACKEND_PLUGIN
  int local_ranks = 1;                           // BRAID_LOCAL_RANKS
  absl::Duration timeout = absl::Seconds(300);   // BRAID_TIMEOUT_MS
  absl::Duration spin = absl::Microseconds(20);  // BRAID_SPIN_US
  std::string log_level = "warn";                // BRAID_LOG_LEVEL
  bool validate_collectives = false;             // BRAID_VALIDATE_COLLECTIVES
  bool abort_on_failure = true;                  // BRAID_ABORT_ON_FAILURE (comm/abort_domain.h)
  std::string timeline;                          // BRAID_TIMELINE
  size_t flight_recorder_entries = 2048;         // BRAID_FLIGHT_RECORDER_ENTRIES (0: off)
  std::string flight_recorder_dir;               // BRAID_FLIGHT_RECORDER_DIR (empty: no dumps)
  int flight_recorder_signal = 0;                // BRAID_FLIGHT_RECORDER_SIGNAL (SIGUSR1/2; 0: off)
  bool nccl_blocking = true;                     // BRAID_NCCL_BLOCKING
  std::string mpi_engine = "auto";  // BRAID_MPI_ENGINE: auto, sized, blocking, nonblocking
  int cuda_device = -1;             // BRAID_CUDA_DEVICE (-1: node-local rank % device count)
  std::string nccl_library = "libnccl.so.2";  // BRAID_NCCL_LIBRARY (opened with dlopen)
  std::string backend_module_dir;             // BRAID_BACKEND_MODULE_DIR (empty: libbraid.so's own)
  // BRAID_STORE_PORT: the port rank 0's rendezvous store listens on (gloo, nccl under torchrun
  // / srun). 0: one the OS picks, whose address the ranks exchange (backends/rendezvous).
  int store_port = 0;
  // Never from the environment: the embedder's rendezvous (braid_world_options_t 0.10), used
  // instead of the launcher's variables by the backends that meet at a store.
  std::optional<RendezvousSpec> rendezvous;
  std::vector<std::string> unknown;  // BRAID_* names seen in the environment but not known

  // Parses `environ` once.
  static absl::StatusOr<Options> FromEnv();
  // Parses an explicit name -> value map (tests, embedders with their own config).
  static absl::StatusOr<Options> FromMap(const std::map<std::string, std::string>& vars);
};

struct OptionSpec {
  absl::string_view name;
  absl::string_view default_value;
  absl::string_view help;
};

// Every BRAID_* variable, for documentation and --help output.
const std::vector<OptionSpec>& OptionSpecs();

}  // namespace braid

#endif  // BRAID_COMM_OPTIONS_H_
