#include "comm/backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid {

absl::StatusOr<std::unique_ptr<Group>> Backend::WorldGroup(int rank) {
  ASSIGN_OR_RETURN(std::unique_ptr<Group> g, CreateWorldGroup(rank));
  g->AttachFlightRecorder(FlightRecorder::Create(flight_, rank, g->shared_abort_domain()));
  if (flight_.signal != 0 && g->flight_recorder() != nullptr) {
    RETURN_IF_ERROR(g->flight_recorder()->DumpOnSignal(flight_.signal));
  }
  return g;
}

BackendRegistry& BackendRegistry::Global() {
  static BackendRegistry* registry = new BackendRegistry;
  return *registry;
}

absl::Status BackendRegistry::Register(std::string name, std::string description,
                                       BackendFactory factory) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it != entries_.end() && !it->second.module) {
    return absl::AlreadyExistsError(absl::StrCat("backend '", name, "' is already registered"));
  }
  entries_.insert_or_assign(std::move(name), Entry{std::move(description), std::move(factory)});
  return absl::OkStatus();
}

absl::Status BackendRegistry::RegisterModule(std::string name, std::string description,
                                             BackendFactory factory) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    if (!it->second.module) return absl::OkStatus();  // linked in: the module is not needed
    return absl::AlreadyExistsError(
        absl::StrCat("backend module '", name, "' is already registered"));
  }
  entries_.emplace(std::move(name),
                   Entry{std::move(description), std::move(factory), /*module=*/true});
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> BackendRegistry::Create(absl::string_view name,
                                                                 const Options& options) const {
  BackendFactory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      std::vector<std::string> names;
      for (const auto& [n, e] : entries_) names.push_back(n);
      return absl::NotFoundError(absl::StrCat("unknown backend '", name,
                                              "' (registered: ", absl::StrJoin(names, ", "), ")"));
    }
    factory = it->second.factory;
  }
  return factory(options);
}

std::vector<std::string> BackendRegistry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [n, e] : entries_) names.push_back(n);
  return names;
}

BackendRegistration::BackendRegistration(std::string name, std::string description,
                                         BackendFactory factory) {
  absl::Status s = BackendRegistry::Global().Register(std::move(name), std::move(description),
                                                      std::move(factory));
  if (!s.ok()) Log().error("{}", s.ToString());
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const Options& options) {
  SetLogLevel(options.log_level);
  for (const std::string& u : options.unknown) {
    Log().warn("unknown environment variable {} ignored (see OptionSpecs())", u);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> b,
                   BackendRegistry::Global().Create(options.backend, options));
  b->set_flight_recorder_config(FlightRecorder::Config::FromOptions(options));
  return b;
}

}  // namespace braid
