#include "backends/rendezvous/wire.h"

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::rendezvous {
namespace {

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutI64(std::string& out, int64_t s) {
  const uint64_t v = static_cast<uint64_t>(s);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutStr(std::string& out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out.append(s.data(), s.size());
}

// Reads fields front to back; every read checks what is left.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  absl::StatusOr<uint8_t> U8() {
    RETURN_IF_ERROR(Need(1, "u8"));
    const uint8_t v = static_cast<uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return v;
  }
  absl::StatusOr<uint32_t> U32() {
    RETURN_IF_ERROR(Need(4, "u32"));
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    in_.remove_prefix(4);
    return v;
  }
  absl::StatusOr<int64_t> I64() {
    RETURN_IF_ERROR(Need(8, "i64"));
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    in_.remove_prefix(8);
    return static_cast<int64_t>(v);
  }
  absl::StatusOr<std::string> Str() {
    ASSIGN_OR_RETURN(const uint32_t n, U32());
    RETURN_IF_ERROR(Need(n, "string"));
    std::string s(in_.substr(0, n));
    in_.remove_prefix(n);
    return s;
  }
  absl::StatusOr<std::vector<std::string>> Strs() {
    ASSIGN_OR_RETURN(const uint32_t n, U32());
    // Each string costs at least its 4-byte length: bounds n before reserving.
    if (n > in_.size() / 4) return absl::InvalidArgumentError("malformed frame: key count");
    std::vector<std::string> out;
    out.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(std::string s, Str());
      out.push_back(std::move(s));
    }
    return out;
  }
  absl::Status Done() const {
    if (!in_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed frame: ", in_.size(), " trailing bytes"));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Need(size_t n, absl::string_view what) const {
    if (in_.size() < n) {
      return absl::InvalidArgumentError(absl::StrCat("malformed frame: truncated ", what));
    }
    return absl::OkStatus();
  }
  absl::string_view in_;
};

std::string Frame(const std::string& payload) {
  std::string out;
  out.reserve(4 + payload.size());
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  return out;
}

}  // namespace

std::string EncodeRequest(const Request& r) {
  std::string p;
  p.push_back(static_cast<char>(r.op));
  PutI64(p, r.delta);
  PutStr(p, r.value);
  PutU32(p, static_cast<uint32_t>(r.keys.size()));
  for (const std::string& k : r.keys) PutStr(p, k);
  return Frame(p);
}

std::string EncodeReply(const Reply& r) {
  std::string p;
  p.push_back(static_cast<char>(r.code));
  PutI64(p, r.number);
  PutStr(p, r.value);
  PutU32(p, static_cast<uint32_t>(r.keys.size()));
  for (const std::string& k : r.keys) PutStr(p, k);
  return Frame(p);
}

absl::StatusOr<Request> DecodeRequest(absl::string_view payload) {
  Reader in(payload);
  Request r;
  ASSIGN_OR_RETURN(const uint8_t op, in.U8());
  if (op < static_cast<uint8_t>(StoreOp::kSet) || op > static_cast<uint8_t>(StoreOp::kCheck)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed frame: unknown operation ", op));
  }
  r.op = static_cast<StoreOp>(op);
  ASSIGN_OR_RETURN(r.delta, in.I64());
  ASSIGN_OR_RETURN(r.value, in.Str());
  ASSIGN_OR_RETURN(r.keys, in.Strs());
  RETURN_IF_ERROR(in.Done());
  return r;
}

absl::StatusOr<Reply> DecodeReply(absl::string_view payload) {
  Reader in(payload);
  Reply r;
  ASSIGN_OR_RETURN(const uint8_t code, in.U8());
  if (code > Reply::kError) {
    return absl::InvalidArgumentError(absl::StrCat("malformed frame: unknown reply code ", code));
  }
  r.code = static_cast<Reply::Code>(code);
  ASSIGN_OR_RETURN(r.number, in.I64());
  ASSIGN_OR_RETURN(r.value, in.Str());
  ASSIGN_OR_RETURN(r.keys, in.Strs());
  RETURN_IF_ERROR(in.Done());
  return r;
}

absl::StatusOr<std::string> ReadFrame(Socket& socket, absl::Time deadline) {
  char len_bytes[4];
  RETURN_IF_ERROR(socket.RecvAll(len_bytes, 4, deadline));
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<uint8_t>(len_bytes[i])) << (8 * i);
  if (n > kMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame of ", n, " bytes from ", socket.peer(),
                                                   " exceeds the limit of ", kMaxFrameBytes));
  }
  std::string payload(n, '\0');
  RETURN_IF_ERROR(socket.RecvAll(payload.data(), n, deadline));
  return payload;
}

}  // namespace braid::rendezvous
