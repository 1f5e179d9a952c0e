#include "backends/plugin/plugin_backend.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/plugin/abi_convert.h"
#include "backends/plugin/plugin_group.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::plugin {
namespace {

absl::StatusOr<int> QueryWorldSize(const PluginContext& ctx) {
  braid_backend_error_v1 err;
  err.message[0] = '\0';
  int n = 0;
  const int rc = ctx.table().world_size(ctx.handle(), &n, &err);
  if (rc != BRAID_BACKEND_OK) return PluginError(ctx.library(), "world_size", rc, err);
  if (n < 1) {
    return absl::InternalError(
        absl::StrCat("plugin '", ctx.library().name(), "': world_size reported ", n));
  }
  return n;
}

absl::StatusOr<std::vector<int>> QueryLocalRanks(const PluginContext& ctx, int world_size) {
  braid_backend_error_v1 err;
  err.message[0] = '\0';
  std::vector<int> ranks(world_size, -1);
  int count = 0;
  const int rc = ctx.table().local_ranks(ctx.handle(), ranks.data(), world_size, &count, &err);
  if (rc != BRAID_BACKEND_OK) return PluginError(ctx.library(), "local_ranks", rc, err);
  if (count < 0 || count > world_size) {
    return absl::InternalError(absl::StrCat("plugin '", ctx.library().name(), "': local_ranks ",
                                            "reported ", count, " ranks in a world of ",
                                            world_size));
  }
  ranks.resize(count);
  for (int i = 0; i < count; ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InternalError(absl::StrCat(
          "plugin '", ctx.library().name(), "': local_ranks reported [", absl::StrJoin(ranks, ", "),
          "], not ascending ranks of a world of ", world_size));
    }
  }
  return ranks;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> PluginBackend::Create(const Options& options) {
  if (options.plugin_path.empty()) {
    return absl::InvalidArgumentError(
        "backend 'plugin' needs a plugin library: set BRAID_BACKEND_PLUGIN "
        "(Options::plugin_path) to the path of a shared library "
        "exporting " BRAID_BACKEND_PLUGIN_SYMBOL_V1);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const PluginLibrary> lib,
                   PluginLibrary::Load(options.plugin_path));
  ASSIGN_OR_RETURN(std::shared_ptr<PluginContext> ctx,
                   PluginContext::Create(lib, options.local_ranks, options.timeout));
  ASSIGN_OR_RETURN(const int world_size, QueryWorldSize(*ctx));
  ASSIGN_OR_RETURN(std::vector<int> local, QueryLocalRanks(*ctx, world_size));
  const braid_backend_v1& t = ctx->table();
  const uint64_t bits =
      t.capabilities != nullptr ? t.capabilities(ctx->handle()) : BRAID_BACKEND_CAP_HOST_MEMORY;
  const Capabilities caps = FromAbiCapabilities(bits, t.comm_split != nullptr);
  ASSIGN_OR_RETURN(std::shared_ptr<PluginAborter> aborter, PluginAborter::Create(lib->name()));
  Log().info("loaded backend plugin '{}' from {} (ABI version {}): world of {} ranks, {} here",
             lib->name(), lib->path(), BRAID_BACKEND_ABI_VERSION, world_size, local.size());
  return std::unique_ptr<Backend>(new PluginBackend(std::move(ctx), std::move(aborter), world_size,
                                                    std::move(local), caps, options.spin,
                                                    options.abort_on_failure));
}

PluginBackend::PluginBackend(std::shared_ptr<PluginContext> ctx,
                             std::shared_ptr<PluginAborter> aborter, int world_size,
                             std::vector<int> local_ranks, Capabilities caps, absl::Duration spin,
                             bool abort_on_failure)
    : ctx_(std::move(ctx)),
      aborter_(std::move(aborter)),
      abort_on_failure_(abort_on_failure),
      world_size_(world_size),
      local_ranks_(std::move(local_ranks)),
      caps_(caps),
      spin_(spin) {}

absl::StatusOr<std::unique_ptr<Group>> PluginBackend::CreateWorldGroup(int rank) {
  if (std::find(local_ranks_.begin(), local_ranks_.end(), rank) == local_ranks_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("plugin '", library().name(), "': rank ", rank,
                                                   " is not hosted by this process (local "
                                                   "ranks: ",
                                                   absl::StrJoin(local_ranks_, ", "), ")"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!handed_out_.insert(rank).second) {
      return absl::FailedPreconditionError(absl::StrCat("plugin '", library().name(),
                                                        "': the world group of rank ", rank,
                                                        " was already created"));
    }
  }
  ASSIGN_OR_RETURN(PluginComm comm, PluginComm::CreateWorld(ctx_, rank));
  return PluginGroup::Create(std::move(comm), "world", caps_, spin_,
                             GroupAbort{aborter_, rank, abort_on_failure_});
}

namespace {
const BackendRegistration kRegistration(
    "plugin",
    "a shared library (BRAID_BACKEND_PLUGIN) exporting the C table " BRAID_BACKEND_PLUGIN_SYMBOL_V1,
    &PluginBackend::Create);
}  // namespace

}  // namespace braid::plugin
