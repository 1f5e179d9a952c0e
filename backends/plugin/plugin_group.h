// PluginGroup: a Group whose collectives run in a backend plugin (braid_backend_v1.h).
//
// RANK-ORDER CONTRACT (see comm/group.h): every rank issues this group's collectives and
// splits in the same order; the plugin relies on it to match calls across ranks.
//
// Each Launch becomes one call of the table's launch entry. The Work it returns is completed
// by the plugin's completion callback with the plugin's status converted (abi_convert.h) and
// its message prefixed, e.g. "plugin 'acme': allreduce #12 on group 'world' (bucket 3): ...".
// A launch the plugin refuses is an error status right away and consumes no sequence number.
// A NULL entry is Unimplemented naming it. Split calls comm_split (a blocking collective, as
// in local and NCCL). rank() and size() are what comm_info reported.
//
// Abort domain (plugin_abort.h): the groups of one PluginBackend share a domain. An operation
// the plugin fails through its callback aborts the job (unless BRAID_ABORT_ON_FAILURE=0), as
// does AbortJob; the aborter then destroys every live comm, whose pending Works fail with
// Aborted "plugin 'p': allreduce #3 on group 'world': job aborted: rank R reported ...", and
// every later call and Split is refused. A launch the plugin refuses does not abort.
//
// Not carried by ABI v1: CollectiveOptions::timeout (the plugin applies the timeout given to
// init to every operation) and ready_event (capabilities never claim device_events).
#ifndef BRAID_BACKENDS_PLUGIN_PLUGIN_GROUP_H_
#define BRAID_BACKENDS_PLUGIN_PLUGIN_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/plugin/plugin_context.h"
#include "comm/group.h"

namespace braid::plugin {

// How a group takes part in its backend's abort domain.
struct GroupAbort {
  std::shared_ptr<PluginAborter> aborter;
  int world_rank = 0;            // the rank this process's rank of the group reports as
  bool abort_on_failure = true;  // Options::abort_on_failure (BRAID_ABORT_ON_FAILURE)
};

class PluginGroup final : public Group {
 public:
  // Takes `comm`, asks the plugin for this rank's position in it (comm_info) and registers it
  // with the aborter (the domain's refusal when the job has aborted).
  static absl::StatusOr<std::unique_ptr<Group>> Create(PluginComm comm, std::string name,
                                                       Capabilities caps, absl::Duration spin,
                                                       GroupAbort abort);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  absl::string_view backend_name() const override { return "plugin"; }
  Capabilities capabilities() const override { return caps_; }

 protected:
  int world_rank() const override { return abort_.world_rank; }
  absl::StatusOr<WorkPtr> Launch(const CollectiveArgs& args) override;
  absl::StatusOr<std::unique_ptr<Group>> DoSplit(int color, int key, std::string name) override;

 private:
  PluginGroup(PluginComm comm, std::string name, int rank, int size, Capabilities caps,
              absl::Duration spin, GroupAbort abort);

  const PluginLibrary& library() const { return comm_.context().library(); }
  const braid_backend_v1& table() const { return comm_.context().table(); }

  // Declared first, so destroyed last. Its comm_destroy runs pending callbacks, which touch
  // only their own Work and the library (kept alive by the comm), never this group's members.
  PluginComm comm_;
  const std::string name_;
  const int rank_;
  const int size_;
  const Capabilities caps_;
  const absl::Duration spin_;
  const GroupAbort abort_;  // its aborter's thread is joined before comm_ is destroyed
  uint64_t next_seq_ = 0;   // calls on a Group are serialized (comm/group.h)
};

}  // namespace braid::plugin

#endif  // BRAID_BACKENDS_PLUGIN_PLUGIN_GROUP_H_
