// Backend: creates the world group(s) of one transport, and the registry that finds backends
// by name.
//
//   ASSIGN_OR_RETURN(Options opts, Options::FromEnv());
//   ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, CreateBackend(opts));   // opts.backend
//   for (int r : b->local_ranks()) {                // local: 0..N-1 (threads); mpi: this rank
//     ASSIGN_OR_RETURN(std::unique_ptr<Group> world, b->WorldGroup(r));
//     ...  // hand `world` to the thread that plays rank r
//   }
//
// Backends register themselves with a static BackendRegistration in their own library (link
// it with alwayslink); comm/ knows none of them by name. A backend that needs a system library
// (Open MPI, Gloo) may instead be registered as a *module*: a factory that loads the backend's
// own shared library at the first Create (backends/module/module_loader.h), so the host loads
// on machines without that system library. A backend linked into the binary takes precedence
// over a module of the same name, whichever registers first.
#ifndef BRAID_COMM_BACKEND_H_
#define BRAID_COMM_BACKEND_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/flight_recorder.h"
#include "comm/group.h"
#include "comm/options.h"

namespace braid {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::string_view name() const = 0;
  virtual Capabilities capabilities() const = 0;
  virtual int world_size() const = 0;
  // World ranks hosted by this process.
  virtual std::vector<int> local_ranks() const = 0;
  // The world group as rank `rank` (one of local_ranks()) sees it; once per rank. Groups keep
  // what they need alive: they may outlive the Backend object. Carries the rank's flight
  // recorder (comm/flight_recorder.h), configured by CreateBackend's options.
  absl::StatusOr<std::unique_ptr<Group>> WorldGroup(int rank);

  // The flight recorder settings of later WorldGroup calls (default: Options' defaults).
  void set_flight_recorder_config(FlightRecorder::Config c) { flight_ = std::move(c); }

 protected:
  virtual absl::StatusOr<std::unique_ptr<Group>> CreateWorldGroup(int rank) = 0;

 private:
  FlightRecorder::Config flight_;
};

using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<Backend>>(const Options&)>;

// The one registry of backends: small and locked.
class BackendRegistry {
 public:
  static BackendRegistry& Global();

  // AlreadyExists if `name` is taken by another linked-in backend; replaces a module entry.
  absl::Status Register(std::string name, std::string description, BackendFactory factory);
  // A backend loaded on first use (see the header comment): ignored (OK) when a linked-in
  // backend of that name is registered; AlreadyExists if another module has the name.
  absl::Status RegisterModule(std::string name, std::string description, BackendFactory factory);
  // NotFound naming the backend and listing the registered ones.
  absl::StatusOr<std::unique_ptr<Backend>> Create(absl::string_view name,
                                                  const Options& options) const;
  std::vector<std::string> Names() const;

 private:
  struct Entry {
    std::string description;
    BackendFactory factory;
    bool module = false;  // loaded on first use; a linked-in registration replaces it
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry, std::less<>> entries_;
};

// Registers a backend at static-initialization time.
struct BackendRegistration {
  BackendRegistration(std::string name, std::string description, BackendFactory factory);
};

// Creates `options.backend` from the global registry and applies options.log_level.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const Options& options);

}  // namespace braid

#endif  // BRAID_COMM_BACKEND_H_
