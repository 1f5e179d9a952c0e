// The `plugin` backend: a backend that lives in a shared library implementing the versioned C
// ABI of braid_backend_v1.h, loaded at run time.
//
//   Options o;                                   // or Options::FromEnv() with
//   o.backend = "plugin";                        //   BRAID_BACKEND=plugin
//   o.plugin_path = "/opt/acme/libacme_braid.so";//   BRAID_BACKEND_PLUGIN=/opt/acme/...
//   o.local_ranks = 4;                           //   world size request (BRAID_LOCAL_RANKS)
//   ASSIGN_OR_RETURN(auto backend, CreateBackend(o));
//   for (int r : backend->local_ranks()) { ... backend->WorldGroup(r) ... }
//
// Creating it loads and checks the library (plugin_library.h), calls init with Braid's logger,
// the world size request and Options::timeout, and asks the plugin for the world size, the
// ranks hosted here and its capabilities. Groups keep the plugin loaded: the library is
// finalized and unloaded when the backend and every group are gone. Its groups share one abort
// domain (plugin_abort.h, plugin_group.h).
#ifndef BRAID_BACKENDS_PLUGIN_PLUGIN_BACKEND_H_
#define BRAID_BACKENDS_PLUGIN_PLUGIN_BACKEND_H_

#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "backends/plugin/plugin_abort.h"
#include "backends/plugin/plugin_context.h"
#include "comm/backend.h"

namespace braid::plugin {

class PluginBackend final : public Backend {
 public:
  // InvalidArgument (naming BRAID_BACKEND_PLUGIN) when options.plugin_path is empty; else
  // every error of PluginLibrary::Load and of the plugin's init, naming the file or plugin.
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const Options& options);

  absl::string_view name() const override { return "plugin"; }
  Capabilities capabilities() const override { return caps_; }
  int world_size() const override { return world_size_; }
  std::vector<int> local_ranks() const override { return local_ranks_; }
  // Once per local rank.
  absl::StatusOr<std::unique_ptr<Group>> CreateWorldGroup(int rank) override;

  const PluginLibrary& library() const { return ctx_->library(); }

 private:
  PluginBackend(std::shared_ptr<PluginContext> ctx, std::shared_ptr<PluginAborter> aborter,
                int world_size, std::vector<int> local_ranks, Capabilities caps,
                absl::Duration spin, bool abort_on_failure);

  const std::shared_ptr<PluginContext> ctx_;
  // The job's abort domain, shared by every group of every rank (plugin_abort.h).
  const std::shared_ptr<PluginAborter> aborter_;
  const bool abort_on_failure_;
  const int world_size_;
  const std::vector<int> local_ranks_;
  const Capabilities caps_;
  const absl::Duration spin_;
  std::mutex mu_;
  std::set<int> handed_out_;  // guarded by mu_
};

}  // namespace braid::plugin

#endif  // BRAID_BACKENDS_PLUGIN_PLUGIN_BACKEND_H_
