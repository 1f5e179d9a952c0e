#include "backends/gloo/gloo_backend.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "backends/gloo/gloo_errors.h"
#include "backends/rendezvous/launcher_rendezvous.h"
#include "backends/rendezvous/socket.h"
#include "backends/rendezvous/store_client.h"
#include "backends/rendezvous/store_server.h"
#include "comm/status_macros.h"
#include "gloo/transport/tcp/device.h"

namespace braid::gloo_backend {
namespace {

constexpr char kPrefix[] = "braid/gloo";

// A world of one's store: its own server and client (client destroyed first).
struct OwnStore {
  std::unique_ptr<rendezvous::StoreServer> server;
  std::unique_ptr<rendezvous::TcpStore> client;
};

absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> MakeDevice(const std::string& host) {
  std::shared_ptr<::gloo::transport::Device> device;
  RETURN_IF_ERROR(GlooCall(absl::StrCat("gloo backend: TCP device on ", host), [&] {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = host;
    device = ::gloo::transport::tcp::CreateDevice(attr);
  }));
  return device;
}

absl::Status CheckConfig(const GlooBackendConfig& c) {
  if (c.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo backend: the timeout must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooBackend>> GlooBackend::CreateFromLauncher(
    const rendezvous::LauncherEnv& env, const GlooBackendConfig& config) {
  RETURN_IF_ERROR(CheckConfig(config));
  ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::LauncherRendezvous> rv,
                   rendezvous::LauncherRendezvous::Join(env, kPrefix, config.timeout));
  absl::StatusOr<std::string> local =
      rendezvous::LocalAddressToward(env.master_addr, env.master_port);
  if (!local.ok())
    return WithContext(local.status(), absl::StrCat("gloo backend, ", env.Describe()));
  auto world = std::make_shared<GlooWorld>();
  ASSIGN_OR_RETURN(world->device, MakeDevice(*local));
  world->store = &rv->store();
  world->store_owner = std::shared_ptr<rendezvous::LauncherRendezvous>(std::move(rv));
  world->timeout = config.timeout;
  world->spin = config.spin;
  ASSIGN_OR_RETURN(world->aborts, GlooAbortLink::Start(world->store, env.rank, env.world_size,
                                                       config.abort_on_failure));
  return std::unique_ptr<GlooBackend>(new GlooBackend(std::move(world), env.rank, env.world_size));
}

absl::StatusOr<std::unique_ptr<GlooBackend>> GlooBackend::CreateSingleRank(
    const GlooBackendConfig& config) {
  RETURN_IF_ERROR(CheckConfig(config));
  auto own = std::make_shared<OwnStore>();
  ASSIGN_OR_RETURN(own->server, rendezvous::StoreServer::Start("127.0.0.1", 0));
  ASSIGN_OR_RETURN(own->client,
                   rendezvous::TcpStore::Connect("127.0.0.1", own->server->port(), config.timeout));
  auto world = std::make_shared<GlooWorld>();
  ASSIGN_OR_RETURN(world->device, MakeDevice("127.0.0.1"));
  world->store = own->client.get();
  world->store_owner = std::move(own);
  world->timeout = config.timeout;
  world->spin = config.spin;
  ASSIGN_OR_RETURN(world->aborts,
                   GlooAbortLink::Start(world->store, 0, 1, config.abort_on_failure));
  return std::unique_ptr<GlooBackend>(new GlooBackend(std::move(world), 0, 1));
}

absl::StatusOr<std::unique_ptr<Backend>> GlooBackend::Create(const Options& options) {
  GlooBackendConfig config;
  config.timeout = options.timeout;
  config.spin = options.spin;
  config.abort_on_failure = options.abort_on_failure;
  if (!options.rendezvous.has_value() && rendezvous::LaunchedByMpi()) {
    return absl::FailedPreconditionError(
        "gloo backend: this process was started by an MPI launcher (mpirun); use "
        "BRAID_BACKEND=mpi there, or launch with torchrun / srun");
  }
  ASSIGN_OR_RETURN(const std::optional<rendezvous::LauncherEnv> env,
                   rendezvous::LauncherEnvFor(options));
  if (env.has_value() && env->world_size > 1) {
    ASSIGN_OR_RETURN(std::unique_ptr<GlooBackend> b, CreateFromLauncher(*env, config));
    return std::unique_ptr<Backend>(std::move(b));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GlooBackend> b, CreateSingleRank(config));
  return std::unique_ptr<Backend>(std::move(b));
}

absl::StatusOr<std::unique_ptr<Group>> GlooBackend::CreateWorldGroup(int rank) {
  if (rank != rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: this process is world rank ", rank_,
                     "; it cannot create the world group of rank ", rank, " (see local_ranks())"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (world_handed_out_) {
      return absl::FailedPreconditionError(
          absl::StrCat("gloo backend: the world group of rank ", rank, " was already created"));
    }
    world_handed_out_ = true;
  }
  const std::string prefix = absl::StrCat(kPrefix, "/world");
  ASSIGN_OR_RETURN(std::shared_ptr<::gloo::Context> ctx,
                   ConnectContext(*world_, prefix, rank_, world_size_));
  return GlooGroup::Create(world_, std::move(ctx), "world", prefix);
}

}  // namespace braid::gloo_backend
