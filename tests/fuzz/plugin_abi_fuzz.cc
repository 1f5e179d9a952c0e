// Fuzz target: the host's checks of a plugin's C table and of the values that cross the plugin
// ABI (backends/plugin/plugin_library.h ValidateTableV1, abi_convert.h).
//
// Input: abi_version and struct_size (each either a near-valid value or raw bytes), a bitmask
// of which entries are non-NULL, the name, then a run of ABI values to convert: dtypes, reduce
// kinds, status codes with messages (terminated or filling the whole error buffer), capability
// bits.
// Checks: ValidateTableV1 accepts exactly the tables with abi_version 1, a large enough
// struct_size, a name and every required entry, and otherwise names the path and the problem;
// conversions accept exactly the defined values and round-trip; an error buffer's text is read
// up to its end, never past it (AddressSanitizer sees an overread); ReportAbiError always
// leaves a NUL-terminated prefix of the message.
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "backends/plugin/abi_convert.h"
#include "backends/plugin/braid_backend_v1.h"
#include "backends/plugin/plugin_library.h"
#include "comm/dtype.h"
#include "tests/fuzz/fuzz_util.h"

namespace braid::fuzz {
namespace {

// Stand-ins for the entries: never called, only told apart from NULL.
int Init(braid_backend_log_fn_v1, void*, int, int64_t, void**, braid_backend_error_v1*) {
  return 0;
}
int Finalize(void*, braid_backend_error_v1*) { return 0; }
int WorldSize(void*, int*, braid_backend_error_v1*) { return 0; }
int LocalRanks(void*, int*, int, int*, braid_backend_error_v1*) { return 0; }
int CreateWorld(void*, int, void**, braid_backend_error_v1*) { return 0; }
int CommInfo(void*, int*, int*, braid_backend_error_v1*) { return 0; }
int CommDestroy(void*, braid_backend_error_v1*) { return 0; }

void CheckTable(FuzzInput& in) {
  braid_backend_v1 t;
  std::memset(&t, 0, sizeof(t));
  const uint8_t how = in.Byte();
  t.abi_version = (how & 1) != 0 ? static_cast<int>(in.Le(4)) : 1 - static_cast<int>(how >> 4) % 3;
  t.struct_size = (how & 2) != 0
                      ? static_cast<uint32_t>(in.Le(4))
                      : static_cast<uint32_t>(sizeof(braid_backend_v1) - 8 + 8 * ((how >> 2) % 3));
  const uint8_t present = in.Byte();
  const std::string name = in.Str(32);
  if ((how & 0x80) == 0) t.name = name.c_str();
  if (present & 1) t.init = Init;
  if (present & 2) t.finalize = Finalize;
  if (present & 4) t.world_size = WorldSize;
  if (present & 8) t.local_ranks = LocalRanks;
  if (present & 16) t.comm_create_world = CreateWorld;
  if (present & 32) t.comm_info = CommInfo;
  if (present & 64) t.comm_destroy = CommDestroy;
  const bool valid = t.abi_version == 1 && t.struct_size >= sizeof(braid_backend_v1) &&
                     t.name != nullptr && present % 128 == 127;
  const absl::Status s = plugin::ValidateTableV1("/fuzz/libplugin.so", t);
  FUZZ_CHECK(s.ok() == valid, "ValidateTableV1 said %s (abi %d, size %u, present %02x)",
             s.ToString().c_str(), t.abi_version, t.struct_size, present);
  if (!s.ok()) {
    FUZZ_CHECK(absl::StrContains(s.message(), "/fuzz/libplugin.so"), "no path: %s",
               s.ToString().c_str());
    FUZZ_CHECK(s.code() == absl::StatusCode::kFailedPrecondition, "code: %s", s.ToString().c_str());
  }
}

void CheckValues(FuzzInput& in) {
  while (!in.empty()) {
    switch (in.Byte() % 5) {
      case 0: {
        const int raw = static_cast<int>(in.Le(4));
        absl::StatusOr<DType> t = plugin::FromAbiDType(raw);
        bool defined = false;
        for (DType d : kAllDTypes) defined = defined || plugin::ToAbiDType(d) == raw;
        FUZZ_CHECK(t.ok() == defined, "dtype %d", raw);
        if (t.ok()) FUZZ_CHECK(plugin::ToAbiDType(*t) == raw, "dtype round trip %d", raw);
        if (!t.ok())
          FUZZ_CHECK(absl::StrContains(t.status().message(), std::to_string(raw)), "names %d", raw);
        break;
      }
      case 1: {
        const int raw = static_cast<int>(in.Le(4));
        absl::StatusOr<ReduceKind> k = plugin::FromAbiReduceKind(raw);
        if (k.ok())
          FUZZ_CHECK(plugin::ToAbiReduceKind(*k) == raw, "reduce kind round trip %d", raw);
        if (!k.ok())
          FUZZ_CHECK(absl::StrContains(k.status().message(), std::to_string(raw)), "names %d", raw);
        break;
      }
      case 2: {  // an error buffer as a plugin may leave it
        braid_backend_error_v1 err;
        const uint8_t fill = in.Byte();
        std::memset(err.message, fill, sizeof(err.message));
        const std::string text = in.Str(255);
        std::memcpy(err.message, text.data(), text.size());
        if (in.Byte() & 1) err.message[text.size()] = '\0';
        const absl::string_view seen = plugin::AbiErrorText(err);
        FUZZ_CHECK(seen.size() <= sizeof(err.message), "text longer than the buffer");
        const int code = static_cast<int>(in.Le(1)) - 8;
        const absl::Status s = plugin::FromAbiStatus(code, std::string(seen).c_str());
        FUZZ_CHECK(s.ok() == (code == BRAID_BACKEND_OK), "code %d gave %s", code,
                   s.ToString().c_str());
        break;
      }
      case 3: {  // plugin side: any status becomes a code and a terminated, truncated message
        const auto code = static_cast<absl::StatusCode>(in.Byte() % 17);
        const std::string msg = in.Str(255) + std::string(in.Byte() % 2 ? 2000 : 0, 'm');
        const absl::Status s(code, msg);
        braid_backend_error_v1 err;
        std::memset(err.message, 'z', sizeof(err.message));
        const int rc = plugin::ReportAbiError(s, &err);
        FUZZ_CHECK((rc == BRAID_BACKEND_OK) == s.ok(), "rc %d for %s", rc, s.ToString().c_str());
        if (!s.ok()) {
          const size_t n = strnlen(err.message, sizeof(err.message));
          FUZZ_CHECK(n < sizeof(err.message), "unterminated message");
          FUZZ_CHECK(absl::StartsWith(s.message(), absl::string_view(err.message, n)),
                     "not a prefix");
          FUZZ_CHECK(plugin::ToAbiStatus(plugin::FromAbiStatus(rc, err.message)) == rc,
                     "code round trip");
        }
        FUZZ_CHECK(plugin::ReportAbiError(s, nullptr) == rc, "rc without a buffer");
        break;
      }
      default: {
        const uint64_t bits = in.Le(8);
        const Capabilities c = plugin::FromAbiCapabilities(bits, (bits & 1) != 0);
        FUZZ_CHECK(!c.device_events, "v1 has no device events");
        FUZZ_CHECK(plugin::ToAbiCapabilities(c) == (bits & 0x7f), "capability bits");
        break;
      }
    }
  }
}

}  // namespace
}  // namespace braid::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  braid::fuzz::FuzzInput in(data, size);
  braid::fuzz::CheckTable(in);
  braid::fuzz::CheckValues(in);
  return 0;
}
