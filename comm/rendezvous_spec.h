// RendezvousSpec: a world's rendezvous given by the embedder instead of read from a launcher's
// environment, for the backends whose ranks meet at rank 0's TCP store (gloo; nccl without a
// unique id). The typical embedder is braid.pytorch beside an initialized torch.distributed:
// torch already knows the rank, the world size and a store every rank reaches, so Braid takes
// them instead of opening MASTER_PORT a second time.
//
//   RendezvousSpec spec;
//   spec.rank = 1;  spec.world_size = 4;  spec.master_addr = "10.0.0.1";
//   spec.exchange.publish = [&](const std::string& key, const std::string& value) {...};
//   spec.exchange.lookup = [&](const std::string& key, absl::Duration timeout) {...};
//   options.rendezvous = spec;  CreateBackend(options);
//
// Contract of the exchange (both functions set, or neither):
//   - rank 0 calls publish(key, "host:port") once, after its store listens on a port the OS
//     picked and before it waits for the others; every other rank calls lookup(key, timeout)
//     once and connects to the address it returns. lookup waits up to `timeout` for the key
//     and fails (DeadlineExceeded) when it does not appear.
//   - both are called only on the thread creating the backend, and never after it returned:
//     nothing keeps them (or what they capture) beyond creation.
//   - keys are distinct per world creation and prefix (the caller's channel may carry several
//     Braid worlds, one after another, each of which must see only its own key).
// Without an exchange the ranks meet at a fixed port (Options::store_port), or rank 0 hands its
// store's address out at MASTER_PORT while the world is created (backends/rendezvous).
#ifndef BRAID_COMM_RENDEZVOUS_SPEC_H_
#define BRAID_COMM_RENDEZVOUS_SPEC_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid {

struct AddressExchange {
  std::function<absl::Status(const std::string& key, const std::string& value)> publish;
  std::function<absl::StatusOr<std::string>(const std::string& key, absl::Duration timeout)> lookup;
  bool empty() const { return !publish && !lookup; }
};

struct RendezvousSpec {
  int rank = 0;
  int world_size = 0;       // >= 1
  std::string master_addr;  // rank 0's host as every rank reaches it ("": MASTER_ADDR)
  AddressExchange exchange;
};

}  // namespace braid

#endif  // BRAID_COMM_RENDEZVOUS_SPEC_H_
