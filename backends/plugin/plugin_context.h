// PluginContext and PluginComm: the plugin's two kinds of handle, each owned by an object.
//
//   ASSIGN_OR_RETURN(auto ctx, PluginContext::Create(lib, /*world_size=*/4, absl::Seconds(60)));
//   ASSIGN_OR_RETURN(PluginComm world, PluginComm::CreateWorld(ctx, /*rank=*/0));
//   ... world.handle() goes to the table's launch entries ...
//   // ~PluginComm: comm_destroy; last ~PluginContext: finalize, then the library is unloaded
//
// A comm's comm_destroy runs once, through its gate (plugin_abort.h): by ~PluginComm, or
// earlier by the job's abort, which destroys live comms to end their operations.
//
// Ownership runs one way, so teardown order is right by construction: a PluginComm holds its
// PluginContext, which holds the PluginLibrary. A comm is destroyed before the context that
// made it is finalized, and the library is unloaded only after finalize returns.
//
// The context hands the plugin Braid's logger (comm/logging.h) through the host log callback:
// the plugin's lines appear in Braid's log as "plugin '<name>': <line>", at Braid's level.
#ifndef BRAID_BACKENDS_PLUGIN_PLUGIN_CONTEXT_H_
#define BRAID_BACKENDS_PLUGIN_PLUGIN_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "backends/plugin/plugin_abort.h"
#include "backends/plugin/plugin_library.h"

namespace braid::plugin {

// An error status for a failed plugin call: `code` converted (abi_convert.h), the message
// "plugin '<name>': <what>: <plugin's message>".
absl::Status PluginError(const PluginLibrary& lib, absl::string_view what, int code,
                         const char* message);
// The same for an entry's error buffer: its text is read only up to the buffer's end
// (AbiErrorText), so a plugin that filled it without a NUL cannot make Braid read past it.
absl::Status PluginError(const PluginLibrary& lib, absl::string_view what, int code,
                         const braid_backend_error_v1& error);

class PluginContext {
 public:
  // Calls init. `world_size` is the host's request (see braid_backend_v1::init).
  static absl::StatusOr<std::shared_ptr<PluginContext>> Create(
      std::shared_ptr<const PluginLibrary> lib, int world_size, absl::Duration timeout);

  PluginContext(const PluginContext&) = delete;
  PluginContext& operator=(const PluginContext&) = delete;
  ~PluginContext();  // finalize; a failure is logged

  const PluginLibrary& library() const { return *lib_; }
  const braid_backend_v1& table() const { return lib_->table(); }
  void* handle() const { return handle_; }

 private:
  explicit PluginContext(std::shared_ptr<const PluginLibrary> lib);

  const std::shared_ptr<const PluginLibrary> lib_;
  // The host log callback's argument: "plugin '<name>': ", at a fixed address until finalize.
  std::string log_prefix_;
  void* handle_ = nullptr;
};

class PluginComm {
 public:
  // comm_create_world(rank).
  static absl::StatusOr<PluginComm> CreateWorld(std::shared_ptr<PluginContext> ctx, int rank);
  // Takes ownership of `handle`, a comm of `ctx` (e.g. a comm_split child).
  PluginComm(std::shared_ptr<PluginContext> ctx, void* handle);

  PluginComm(PluginComm&& other) noexcept;
  PluginComm& operator=(PluginComm&& other) noexcept;
  PluginComm(const PluginComm&) = delete;
  PluginComm& operator=(const PluginComm&) = delete;
  ~PluginComm();  // comm_destroy unless the job's abort did; a failure is logged

  void* handle() const { return handle_; }
  // Every table entry on the comm goes through it (Enter / Leave); shared with the aborter.
  CommGate& gate() const { return *gate_; }
  const std::shared_ptr<CommGate>& shared_gate() const { return gate_; }
  PluginContext& context() const { return *ctx_; }
  const std::shared_ptr<PluginContext>& shared_context() const { return ctx_; }

 private:
  std::shared_ptr<PluginContext> ctx_;
  void* handle_ = nullptr;
  std::shared_ptr<CommGate> gate_;  // null once moved from
};

}  // namespace braid::plugin

#endif  // BRAID_BACKENDS_PLUGIN_PLUGIN_CONTEXT_H_
