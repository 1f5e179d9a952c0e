// The rendezvous store's wire format: length-prefixed frames of little-endian fields, one
// request and one reply per round trip. Shared by store_server.cc and store_client.cc only.
//
//   frame   := u32 payload_length, payload            (payload_length <= kMaxFrameBytes)
//   request := u8 op, i64 delta, str value, u32 n, n * str key
//   reply   := u8 code, i64 number, str value, u32 n, n * str key
//   str     := u32 length, bytes
//
//   std::string frame = EncodeRequest({StoreOp::kSet, {"k"}, "v"});
//   RETURN_IF_ERROR(socket.SendAll(frame, deadline));
//   ASSIGN_OR_RETURN(std::string payload, ReadFrame(socket, deadline));
//   ASSIGN_OR_RETURN(Reply reply, DecodeReply(payload));
//
// Invariant: decoding never reads past the payload; a malformed or oversized frame is an
// InvalidArgument naming the peer, and the connection that sent it is dropped.
#ifndef BRAID_BACKENDS_RENDEZVOUS_WIRE_H_
#define BRAID_BACKENDS_RENDEZVOUS_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "backends/rendezvous/socket.h"

namespace braid::rendezvous {

inline constexpr uint32_t kMaxFrameBytes = 64u << 20;  // 64 MiB: ids and addresses, not data

enum class StoreOp : uint8_t {
  kSet = 1,    // keys[0] := value
  kGet = 2,    // value of keys[0]; kMissing when unset (never waits: clients poll)
  kAdd = 3,    // keys[0] := keys[0] + delta (unset counts as 0); the new value in `number`
  kCheck = 4,  // kOk when every key is set; else kMissing with the unset keys
};

struct Request {
  StoreOp op = StoreOp::kGet;
  std::vector<std::string> keys;
  std::string value;
  int64_t delta = 0;
};

struct Reply {
  enum Code : uint8_t { kOk = 0, kMissing = 1, kError = 2 };
  Code code = kOk;
  int64_t number = 0;
  std::string value;              // kGet: the value; kError: the message
  std::vector<std::string> keys;  // kCheck: the keys not set yet
};

std::string EncodeRequest(const Request& request);  // a whole frame
std::string EncodeReply(const Reply& reply);        // a whole frame
absl::StatusOr<Request> DecodeRequest(absl::string_view payload);
absl::StatusOr<Reply> DecodeReply(absl::string_view payload);
// Reads one frame's payload from `socket` by `deadline`.
absl::StatusOr<std::string> ReadFrame(Socket& socket, absl::Time deadline);

}  // namespace braid::rendezvous

#endif  // BRAID_BACKENDS_RENDEZVOUS_WIRE_H_
