#include "backends/nccl/nccl_backend.h"

#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "backends/nccl/completion_poller.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/kernel_api_real.h"
#include "backends/nccl/unique_id.h"
#include "comm/status_macros.h"

namespace braid::nccl {
namespace {

// OK with the number of devices; FailedPrecondition naming CUDA's error without a usable GPU.
absl::StatusOr<int> DeviceCount(CudaApi& cuda) {
  int n = 0;
  const cudaError_t rc = cuda.GetDeviceCount(&n);
  if (rc != cudaSuccess) {
    const absl::Status s = CudaStatus(cuda, rc, "cudaGetDeviceCount");
    return absl::FailedPreconditionError(
        absl::StrCat("nccl backend: no usable CUDA device: ", s.message()));
  }
  if (n < 1) return absl::FailedPreconditionError("nccl backend: no CUDA device (count 0)");
  return n;
}

// This process's rank among those on its node: the default device is that modulo the node's
// devices (ranks placed round-robin across nodes would otherwise share a GPU).
int NodeLocalRank(int world_rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMIX_LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != 0) return std::atoi(v);
  }
  return world_rank;
}

absl::StatusOr<std::shared_ptr<const NcclContext>> MakeContext(NcclApis apis,
                                                               const NcclBackendConfig& c,
                                                               int rank) {
  auto ctx = std::make_shared<NcclContext>();
  ASSIGN_OR_RETURN(ctx->poller, CompletionPoller::Create(apis.cuda, c.device));
  ctx->aborts = CommAbortHub::Create(c.abort_domain, rank, c.abort_on_failure);
  ctx->poller->SetFailureHandler(
      [hub = std::weak_ptr<CommAbortHub>(ctx->aborts)](const absl::Status& cause) {
        if (std::shared_ptr<CommAbortHub> h = hub.lock()) h->ReportFailure(cause);
      });
  ctx->apis = std::move(apis);
  ctx->timeout = c.timeout;
  ctx->spin = c.spin;
  ctx->blocking = c.blocking;
  ctx->device = c.device;
  return ctx;
}

}  // namespace

NcclApis RealApis(const std::string& nccl_library) {
  return NcclApis{RealCudaApi(), RealNcclApi(nccl_library), RealKernelApi()};
}

NcclBackendConfig NcclConfigFromOptions(const Options& options) {
  NcclBackendConfig config;
  config.blocking = options.nccl_blocking;
  config.timeout = options.timeout;
  config.spin = options.spin;
  config.device = options.cuda_device;  // -1: rank modulo the device count
  config.abort_on_failure = options.abort_on_failure;
  return config;
}

NcclBackend::~NcclBackend() = default;

absl::StatusOr<std::unique_ptr<NcclBackend>> NcclBackend::CreateFromUniqueId(
    NcclApis apis, absl::string_view unique_id, int world_size, int rank,
    const NcclBackendConfig& config) {
  if (apis.cuda == nullptr || apis.nccl == nullptr) {
    return absl::InvalidArgumentError("nccl backend: CUDA and NCCL APIs must both be given");
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl backend: rank ", rank, " is outside the world of size ", world_size));
  }
  if (config.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl backend: the timeout must be positive");
  }
  if (config.device < -1) {
    return absl::InvalidArgumentError(absl::StrCat("nccl backend: CUDA device ", config.device,
                                                   " is not valid (-1: rank modulo devices)"));
  }
  ASSIGN_OR_RETURN(const ncclUniqueId id, UniqueIdFromBytes(unique_id));
  RETURN_IF_ERROR(apis.nccl->Ready());
  ASSIGN_OR_RETURN(const int devices, DeviceCount(*apis.cuda));
  NcclBackendConfig resolved = config;
  if (resolved.device < 0) resolved.device = rank % devices;
  if (resolved.device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("nccl backend: CUDA device ", resolved.device,
                                                   " does not exist (", devices, " visible)"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const NcclContext> ctx,
                   MakeContext(std::move(apis), resolved, rank));
  return std::unique_ptr<NcclBackend>(new NcclBackend(std::move(ctx), id, world_size, rank));
}

absl::StatusOr<std::unique_ptr<NcclBackend>> NcclBackend::CreateWithBootstrap(
    NcclApis apis, Group& bootstrap, const NcclBackendConfig& config) {
  if (apis.nccl == nullptr) return absl::InvalidArgumentError("nccl backend: no NCCL API given");
  ASSIGN_OR_RETURN(const ncclUniqueId id, BroadcastUniqueId(bootstrap, *apis.nccl, config.timeout));
  NcclBackendConfig shared = config;
  if (shared.abort_domain == nullptr) shared.abort_domain = bootstrap.shared_abort_domain();
  return CreateFromUniqueId(std::move(apis), absl::string_view(id.internal, kUniqueIdBytes),
                            bootstrap.size(), bootstrap.rank(), shared);
}

absl::StatusOr<std::unique_ptr<NcclBackend>> NcclBackend::CreateSingleRank(NcclApis apis,
                                                                           const Options& options) {
  if (apis.nccl == nullptr) return absl::InvalidArgumentError("nccl backend: no NCCL API given");
  ASSIGN_OR_RETURN(const std::string id, NewUniqueIdBytes(*apis.nccl));
  return CreateFromUniqueId(std::move(apis), id, 1, 0, NcclConfigFromOptions(options));
}

absl::StatusOr<std::unique_ptr<NcclBackend>> NcclBackend::CreateFromLauncher(
    NcclApis apis, const rendezvous::LauncherEnv& env, const NcclBackendConfig& config) {
  if (apis.cuda == nullptr || apis.nccl == nullptr) {
    return absl::InvalidArgumentError("nccl backend: CUDA and NCCL APIs must both be given");
  }
  // Before the rendezvous: a rank without NCCL or a GPU fails at once, naming the cause.
  RETURN_IF_ERROR(apis.nccl->Ready());
  ASSIGN_OR_RETURN(const int devices, DeviceCount(*apis.cuda));
  NcclBackendConfig resolved = config;
  if (resolved.device < 0) resolved.device = env.local_rank % devices;
  ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::LauncherRendezvous> rv,
                   rendezvous::LauncherRendezvous::Join(env, "braid/nccl", config.timeout));
  absl::StatusOr<ncclUniqueId> id =
      ExchangeUniqueId(rv->store(), rv->prefix(), env.rank, env.world_size, *apis.nccl);
  if (!id.ok()) return WithContext(id.status(), absl::StrCat("nccl backend, ", env.Describe()));
  ASSIGN_OR_RETURN(
      std::unique_ptr<NcclBackend> b,
      CreateFromUniqueId(std::move(apis), absl::string_view(id->internal, kUniqueIdBytes),
                         env.world_size, env.rank, resolved));
  b->rendezvous_ = std::move(rv);
  return b;
}

absl::StatusOr<std::unique_ptr<Backend>> NcclBackend::Create(const Options& options) {
  NcclApis apis = RealApis(options.nccl_library);
  // Before MPI: a machine without NCCL or a GPU fails here, naming the library or CUDA's error.
  RETURN_IF_ERROR(apis.nccl->Ready());
  ASSIGN_OR_RETURN(const int devices, DeviceCount(*apis.cuda));
  if (options.rendezvous.has_value() || !rendezvous::LaunchedByMpi()) {
    ASSIGN_OR_RETURN(const std::optional<rendezvous::LauncherEnv> env,
                     rendezvous::LauncherEnvFor(options));
    if (env.has_value() && env->world_size > 1) {
      ASSIGN_OR_RETURN(std::unique_ptr<NcclBackend> b,
                       CreateFromLauncher(std::move(apis), *env, NcclConfigFromOptions(options)));
      return std::unique_ptr<Backend>(std::move(b));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<NcclBackend> b, CreateSingleRank(std::move(apis), options));
    return std::unique_ptr<Backend>(std::move(b));
  }
  Options mpi_options = options;
  mpi_options.backend = "mpi";
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> mpi,
                   BackendRegistry::Global().Create("mpi", mpi_options));
  const int rank = mpi->local_ranks().front();
  ASSIGN_OR_RETURN(std::unique_ptr<Group> world, mpi->WorldGroup(rank));
  NcclBackendConfig config = NcclConfigFromOptions(options);
  if (config.device < 0) config.device = NodeLocalRank(rank) % devices;
  ASSIGN_OR_RETURN(std::unique_ptr<NcclBackend> b,
                   CreateWithBootstrap(std::move(apis), *world, config));
  b->bootstrap_group_ = std::move(world);
  b->bootstrap_backend_ = std::move(mpi);
  return std::unique_ptr<Backend>(std::move(b));
}

absl::StatusOr<std::unique_ptr<Group>> NcclBackend::CreateWorldGroup(int rank) {
  if (rank != rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl backend: this process is world rank ", rank_,
                     "; it cannot create the world group of rank ", rank, " (see local_ranks())"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (world_handed_out_) {
      return absl::FailedPreconditionError(
          absl::StrCat("nccl backend: the world group of rank ", rank, " was already created"));
    }
    world_handed_out_ = true;
  }
  NcclComm::Config cfg{"world", ctx_->blocking, ctx_->device, ctx_->timeout};
  ASSIGN_OR_RETURN(std::shared_ptr<NcclComm> comm,
                   NcclComm::Init(ctx_->apis, id_, world_size_, rank_, std::move(cfg),
                                  absl::Now() + ctx_->timeout));
  ASSIGN_OR_RETURN(std::unique_ptr<NcclGroup> g, NcclGroup::Create(ctx_, std::move(comm), "world"));
  return std::unique_ptr<Group>(std::move(g));
}

namespace {
const BackendRegistration kRegistration(
    "nccl",
    "NCCL 2.28 on CUDA device buffers: one GPU per rank, bootstrapped over MPI under mpirun, "
    "through a TCP rendezvous store under torchrun / srun (one rank without a launcher)",
    &NcclBackend::Create);
}  // namespace

}  // namespace braid::nccl
