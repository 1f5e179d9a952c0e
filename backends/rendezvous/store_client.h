// TcpStore: a rank's client of the rendezvous store (store_server.h), like PyTorch c10d's
// TCPStore client: set / get / wait(keys) / add(key, delta) / check(keys), every blocking call
// bounded by a timeout.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store,
//                    TcpStore::Connect("10.0.0.1", 29500, absl::Seconds(60)));
//   RETURN_IF_ERROR(store->Set("nccl/world/id", id_bytes));                 // rank 0
//   ASSIGN_OR_RETURN(std::string id, store->Get("nccl/world/id"));          // the others
//   ASSIGN_OR_RETURN(int64_t arrived, store->Add("arrived", 1));
//   RETURN_IF_ERROR(store->Wait({"rank/0", "rank/1"}, absl::Seconds(5)));
//
// Contract:
//   - Connect retries until `timeout` (the server may start after the client: every rank of a
//     torchrun job starts at once).
//   - Get and Wait wait for keys by polling the server (1 ms, doubling to 50 ms); they fail with
//     DeadlineExceeded naming the keys still missing and the server's address. Set, Add and
//     Check are single round trips bounded by the same timeout.
//   - Thread-safe: calls are serialized on the one connection.
//   - A transport failure (server gone, a reply not arriving in time) breaks the client: that
//     call and every later one return Unavailable naming the address and the first cause; a
//     broken connection is never reused, since a late reply would answer the wrong request.
#ifndef BRAID_BACKENDS_RENDEZVOUS_STORE_CLIENT_H_
#define BRAID_BACKENDS_RENDEZVOUS_STORE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "backends/rendezvous/socket.h"
#include "backends/rendezvous/wire.h"

namespace braid::rendezvous {

class TcpStore {
 public:
  // Connects to the server at host:port before `timeout` runs out; `timeout` also becomes the
  // default of every later call. InvalidArgument for a non-positive timeout; DeadlineExceeded
  // naming the address when the server never answered.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host, int port,
                                                           absl::Duration timeout);

  absl::Status Set(absl::string_view key, absl::string_view value);
  // The value of `key`, waiting up to `timeout` (0: the default) for it to be set.
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout = {});
  // Adds `delta` to the integer at `key` (unset: 0) and returns the new value.
  // FailedPrecondition naming the key when it holds something other than an integer.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  // The keys among `keys` that are not set yet (empty: all set). Never waits for them.
  absl::StatusOr<std::vector<std::string>> Missing(absl::Span<const std::string> keys);
  // Waits up to `timeout` (0: the default) until every key is set.
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout = {});

  const std::string& address() const { return address_; }
  absl::Duration timeout() const { return timeout_; }

 private:
  TcpStore(Socket socket, std::string address, absl::Duration timeout)
      : socket_(std::move(socket)), address_(std::move(address)), timeout_(timeout) {}
  // One request and its reply, by `deadline`. A transport error breaks the client.
  absl::StatusOr<Reply> RoundTrip(const Request& request, absl::Time deadline);
  absl::Duration Or(absl::Duration timeout) const {
    return timeout > absl::ZeroDuration() ? timeout : timeout_;
  }

  std::mutex mu_;
  Socket socket_;        // guarded by mu_
  absl::Status broken_;  // guarded by mu_: the first transport failure
  const std::string address_;
  const absl::Duration timeout_;
};

}  // namespace braid::rendezvous

#endif  // BRAID_BACKENDS_RENDEZVOUS_STORE_CLIENT_H_
