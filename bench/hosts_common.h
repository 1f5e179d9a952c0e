// What the slow-link benches (hsdp_hosts, hooks_hosts) share: the flags that size the model and
// the run, the bytes on the inter-host link, and a barrier with the benches' deadline.
//
//   ASSIGN_OR_RETURN(HostsFlags hf, HostsFlags::Read(f, /*default_iters=*/7));
//   const int64_t b0 = LinkBytes(hf.link);   // -1 when the interface has no counters
//   ASSIGN_OR_RETURN(HostsWorld w, OpenMpiWorld());   // the mpirun world, kHostsTimeout
//   RETURN_IF_ERROR(HostsBarrier(*w.world));
//
// Contract: Read consumes --scale (in (0, 1]), --blocks, --iters, --warmup, --csv, --link and
// refuses bad values by flag name; the caller refuses the flags left unused.
#ifndef BRAID_BENCH_HOSTS_COMMON_H_
#define BRAID_BENCH_HOSTS_COMMON_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/bench_flags.h"
#include "comm/backend.h"
#include "comm/group.h"
#include "comm/options.h"
#include "comm/status_macros.h"

namespace braid::bench {

inline constexpr absl::Duration kHostsTimeout = absl::Seconds(300);

struct HostsFlags {
  double scale = 0.0625;  // fraction of GPT-2 small's 124M parameters
  int64_t blocks = 12, iters = 7, warmup = 1;
  bool csv = false;
  std::string link;  // network interface whose bytes are counted (none)

  static absl::StatusOr<HostsFlags> Read(const Flags& f, int64_t default_iters) {
    HostsFlags h;
    const std::string scale = f.Str("scale", "0.0625");
    if (!absl::SimpleAtod(scale, &h.scale) || !(h.scale > 0) || h.scale > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--scale='", scale, "': expected a number in (0, 1]"));
    }
    ASSIGN_OR_RETURN(h.blocks, f.Int("blocks", 12));
    ASSIGN_OR_RETURN(h.iters, f.Int("iters", default_iters));
    ASSIGN_OR_RETURN(h.warmup, f.Int("warmup", 1));
    h.csv = f.Bool("csv", false);
    h.link = f.Str("link", "");
    if (h.blocks < 1 || h.iters < 1 || h.warmup < 0)
      return absl::InvalidArgumentError("--blocks, --iters >= 1, --warmup >= 0");
    return h;
  }
};

// Bytes sent plus received on network interface `dev` of this process's namespace, or -1.
inline int64_t LinkBytes(const std::string& dev) {
  int64_t total = 0;
  for (const char* what : {"tx_bytes", "rx_bytes"}) {
    std::ifstream in(absl::StrCat("/sys/class/net/", dev, "/statistics/", what));
    int64_t v = 0;
    if (!(in >> v)) return -1;
    total += v;
  }
  return total;
}

// The `mpi` backend's world under mpirun (this process's first local rank), with the benches'
// deadline; or another backend's. Destroyed backend first, then the world group (the last group
// finalizes MPI).
struct HostsWorld {
  std::unique_ptr<Group> world;
  std::unique_ptr<Backend> backend;
};

// backend "gloo": torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) read
// by Options::FromEnv; under mpirun a wrapper sets RANK and WORLD_SIZE from OMPI_COMM_WORLD_*.
inline absl::StatusOr<HostsWorld> OpenMpiWorld(const std::string& backend = "mpi") {
  Options options;
  if (backend != "mpi") {
    ASSIGN_OR_RETURN(options, Options::FromEnv());
  }
  options.backend = backend;
  options.timeout = kHostsTimeout;
  HostsWorld w;
  ASSIGN_OR_RETURN(w.backend, CreateBackend(options));
  ASSIGN_OR_RETURN(w.world, w.backend->WorldGroup(w.backend->local_ranks().at(0)));
  return w;
}

inline absl::Status HostsBarrier(Group& g) {
  ASSIGN_OR_RETURN(WorkPtr w, g.Barrier());
  return w->Wait(kHostsTimeout);
}

}  // namespace braid::bench

#endif  // BRAID_BENCH_HOSTS_COMMON_H_
