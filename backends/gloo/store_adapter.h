// Gloo's rendezvous store interface over Braid's TCP store (backends/rendezvous), with a key
// prefix per group: how a Gloo context finds its peers' addresses (connectFullMesh).
//
//   StoreAdapter store(tcp_store, "braid/gloo/world");
//   context->connectFullMesh(store, device);   // keys "braid/gloo/world/<gloo's key>"
//
// Gloo's Store reports failures by throwing; this adapter throws gloo::IoException carrying
// our status message (the key, the store's address, the deadline), which GlooCall
// (gloo_errors.h) turns back into a status. wait() honours Gloo's timeout, and the one-argument
// wait() and get() use the TcpStore's own timeout: nothing waits forever.
#ifndef BRAID_BACKENDS_GLOO_STORE_ADAPTER_H_
#define BRAID_BACKENDS_GLOO_STORE_ADAPTER_H_

#include <chrono>
#include <string>
#include <vector>

#include "backends/rendezvous/store_client.h"
#include "gloo/rendezvous/store.h"

namespace braid::gloo_backend {

class StoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(rendezvous::TcpStore& store, std::string prefix)
      : store_(store), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  rendezvous::TcpStore& store_;
  const std::string prefix_;
};

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_STORE_ADAPTER_H_
