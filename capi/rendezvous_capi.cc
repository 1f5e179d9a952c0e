// C API: the explicit rendezvous fields of braid_world_options_t (0.10).
#include "capi/rendezvous_capi.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::capi {
namespace {

constexpr size_t kLookupCapacity = 1024;  // braid.h promises >= 256

// A callback's braid_status_t as a Status naming the callback and the key.
absl::Status FromCallback(braid_status_t code, const char* callback, const std::string& key) {
  if (code == BRAID_OK) return absl::OkStatus();
  const std::string what =
      absl::StrCat(callback, " returned ", braid_status_name(code), " for key '", key, "'");
  switch (code) {
    case BRAID_TIMEOUT:
      return absl::DeadlineExceededError(what);
    case BRAID_INVALID_ARGUMENT:
      return absl::InvalidArgumentError(what);
    case BRAID_NOT_FOUND:
      return absl::NotFoundError(what);
    case BRAID_OUT_OF_RANGE:
      return absl::OutOfRangeError(what);
    case BRAID_PEER_ERROR:
      return absl::UnavailableError(what);
    default:
      return absl::InternalError(what);
  }
}

}  // namespace

bool ExplicitRendezvous(const braid_world_options_t& o) {
  return o.unique_id == nullptr && o.world_size != 0;
}

absl::Status ApplyRendezvousFields(const braid_world_options_t& o, Options& options) {
  if (o.store_port < -1 || o.store_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store_port must be -1 (default: BRAID_STORE_PORT), 0 (a port the OS picks) or a port "
        "up to 65535, got ",
        o.store_port));
  }
  if (o.store_port >= 0) options.store_port = o.store_port;
  if ((o.rendezvous_publish == nullptr) != (o.rendezvous_lookup == nullptr)) {
    const bool lookup_only = o.rendezvous_publish == nullptr;
    return absl::InvalidArgumentError(absl::StrCat(
        lookup_only ? "rendezvous_lookup" : "rendezvous_publish", " is set but ",
        lookup_only ? "rendezvous_publish" : "rendezvous_lookup",
        " is not: rank 0 publishes its store's address and the others look it up, so give "
        "both"));
  }
  if (!ExplicitRendezvous(o)) {
    std::vector<const char*> set;
    if (o.master_addr != nullptr) set.push_back("master_addr");
    if (o.rendezvous_publish != nullptr) set.push_back("rendezvous_publish");
    if (o.rendezvous_lookup != nullptr) set.push_back("rendezvous_lookup");
    if (!set.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          absl::StrJoin(set, ", "), " describe", set.size() == 1 ? "s" : "",
          " an explicit rendezvous, which needs world_size (>= 1) and rank",
          o.unique_id != nullptr ? " and no unique_id (an nccl unique id needs no store)" : ""));
    }
    return absl::OkStatus();  // world_size / rank with a unique_id: nccl_capi checks them
  }
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("explicit rendezvous: rank ", o.rank, " and world_size ", o.world_size,
                     " (want world_size >= 1 and rank in [0, world_size))"));
  }
  RendezvousSpec spec;
  spec.rank = o.rank;
  spec.world_size = o.world_size;
  if (o.master_addr != nullptr) {
    if (o.master_addr[0] == '\0') {
      return absl::InvalidArgumentError("master_addr is empty (NULL: MASTER_ADDR)");
    }
    spec.master_addr = o.master_addr;
  }
  if (o.rendezvous_publish != nullptr) {
    const braid_rendezvous_publish_fn publish = o.rendezvous_publish;
    const braid_rendezvous_lookup_fn lookup = o.rendezvous_lookup;
    void* const data = o.rendezvous_data;
    spec.exchange.publish = [publish, data](const std::string& key, const std::string& value) {
      return FromCallback(publish(key.c_str(), value.c_str(), data), "rendezvous_publish", key);
    };
    spec.exchange.lookup = [lookup, data](const std::string& key,
                                          absl::Duration timeout) -> absl::StatusOr<std::string> {
      std::vector<char> value(kLookupCapacity, '\0');
      const int64_t ms = std::max<int64_t>(
          1, absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1))));
      const absl::Status s = FromCallback(lookup(key.c_str(), ms, value.data(), value.size(), data),
                                          "rendezvous_lookup", key);
      if (!s.ok()) return s;
      if (std::memchr(value.data(), '\0', value.size()) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("rendezvous_lookup wrote no NUL-terminated value for key '", key, "'"));
      }
      return std::string(value.data());
    };
  }
  options.rendezvous = std::move(spec);
  return absl::OkStatus();
}

absl::Status CheckWorldMatchesRendezvous(const Options& options, const Backend& backend) {
  if (!options.rendezvous.has_value()) return absl::OkStatus();
  const RendezvousSpec& spec = *options.rendezvous;
  const std::vector<int> local = backend.local_ranks();
  if (backend.world_size() == spec.world_size && local.size() == 1 && local[0] == spec.rank) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the explicit rendezvous says rank ", spec.rank, " of ", spec.world_size,
      " (world_size, rank), but backend '", backend.name(), "' made a world of ",
      backend.world_size(), " ranks with ranks [", absl::StrJoin(local, ", "),
      "] in this process; name backend \"gloo\" or \"nccl\" to meet at the rendezvous, or "
      "leave world_size 0"));
}

}  // namespace braid::capi
