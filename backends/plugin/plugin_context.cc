#include "backends/plugin/plugin_context.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/plugin/abi_convert.h"
#include "comm/logging.h"

namespace braid::plugin {
namespace {

// The host log callback handed to init; `log_arg` is the context's log prefix.
extern "C" void BraidPluginHostLog(void* log_arg, int level, const char* message) {
  if (log_arg == nullptr || message == nullptr) return;
  const auto lvl = static_cast<spdlog::level::level_enum>(
      std::clamp(level, static_cast<int>(BRAID_BACKEND_LOG_TRACE),
                 static_cast<int>(BRAID_BACKEND_LOG_CRITICAL)));
  spdlog::logger& log = Log();
  if (!log.should_log(lvl)) return;
  const std::string& prefix = *static_cast<const std::string*>(log_arg);
  log.log(lvl, "{}{}", prefix, message);
}

// A cleared message buffer for one call.
braid_backend_error_v1 NoError() {
  braid_backend_error_v1 e;
  e.message[0] = '\0';
  return e;
}

}  // namespace

absl::Status PluginError(const PluginLibrary& lib, absl::string_view what, int code,
                         const char* message) {
  const absl::Status s = FromAbiStatus(code, message);
  return absl::Status(s.code(), absl::StrCat("plugin '", lib.name(), "': ", what, ": ",
                                             s.message().empty() ? "(no message)" : s.message()));
}

absl::Status PluginError(const PluginLibrary& lib, absl::string_view what, int code,
                         const braid_backend_error_v1& error) {
  return PluginError(lib, what, code, std::string(AbiErrorText(error)).c_str());
}

PluginContext::PluginContext(std::shared_ptr<const PluginLibrary> lib)
    : lib_(std::move(lib)), log_prefix_(absl::StrCat("plugin '", lib_->name(), "': ")) {}

absl::StatusOr<std::shared_ptr<PluginContext>> PluginContext::Create(
    std::shared_ptr<const PluginLibrary> lib, int world_size, absl::Duration timeout) {
  std::shared_ptr<PluginContext> ctx(new PluginContext(std::move(lib)));
  const int64_t timeout_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout));
  braid_backend_error_v1 err = NoError();
  void* handle = nullptr;
  const int rc = ctx->table().init(&BraidPluginHostLog, &ctx->log_prefix_, world_size, timeout_ms,
                                   &handle, &err);
  if (rc != BRAID_BACKEND_OK) {
    return PluginError(*ctx->lib_, absl::StrCat("init (world size ", world_size, ")"), rc, err);
  }
  ctx->handle_ = handle;
  return ctx;
}

PluginContext::~PluginContext() {
  if (handle_ == nullptr) return;  // init failed: finalize is not called
  braid_backend_error_v1 err = NoError();
  const int rc = table().finalize(handle_, &err);
  if (rc != BRAID_BACKEND_OK) {
    Log().warn("{}", PluginError(*lib_, "finalize", rc, err).ToString());
  }
}

absl::StatusOr<PluginComm> PluginComm::CreateWorld(std::shared_ptr<PluginContext> ctx, int rank) {
  braid_backend_error_v1 err = NoError();
  void* handle = nullptr;
  const int rc = ctx->table().comm_create_world(ctx->handle(), rank, &handle, &err);
  if (rc != BRAID_BACKEND_OK) {
    return PluginError(ctx->library(), absl::StrCat("comm_create_world (rank ", rank, ")"), rc,
                       err);
  }
  if (handle == nullptr) {
    return absl::InternalError(absl::StrCat("plugin '", ctx->library().name(),
                                            "': comm_create_world (rank ", rank,
                                            ") succeeded but returned a NULL comm"));
  }
  return PluginComm(std::move(ctx), handle);
}

PluginComm::PluginComm(std::shared_ptr<PluginContext> ctx, void* handle)
    : ctx_(std::move(ctx)), handle_(handle) {
  // Raw pointers: the comm is destroyed before this PluginComm lets its context go (~PluginComm
  // waits for a destroy in progress on the aborter's thread).
  const PluginContext* c = ctx_.get();
  gate_ = std::make_shared<CommGate>([c, handle] {
    braid_backend_error_v1 err = NoError();
    const int rc = c->table().comm_destroy(handle, &err);
    if (rc != BRAID_BACKEND_OK) {
      Log().warn("{}", PluginError(c->library(), "comm_destroy", rc, err).ToString());
    }
  });
}

PluginComm::PluginComm(PluginComm&& other) noexcept
    : ctx_(std::move(other.ctx_)),
      handle_(std::exchange(other.handle_, nullptr)),
      gate_(std::move(other.gate_)) {}

PluginComm& PluginComm::operator=(PluginComm&& other) noexcept {
  if (this != &other) {
    PluginComm dying(std::move(*this));
    ctx_ = std::move(other.ctx_);
    handle_ = std::exchange(other.handle_, nullptr);
    gate_ = std::move(other.gate_);
  }
  return *this;
}

PluginComm::~PluginComm() {
  if (gate_ != nullptr) gate_->Close();
}

}  // namespace braid::plugin
