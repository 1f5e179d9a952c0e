// C API: worlds, groups, meshes.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/nccl/nccl_backend.h"
#include "backends/rendezvous/launcher_env.h"
#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "capi/nccl_capi.h"
#include "capi/rendezvous_capi.h"
#include "comm/backend.h"
#include "comm/mesh.h"
#include "comm/options.h"
#include "comm/status_macros.h"

using braid::capi::CheckNotNull;
using braid::capi::Find;
using braid::capi::GroupImpl;
using braid::capi::Guard;
using braid::capi::Register;
using braid::capi::Tag;
using braid::capi::WorldImpl;

namespace braid::capi {
namespace {

// Whether this process could run the `nccl` backend: NCCL loads and a CUDA device is visible.
bool NcclUsable(const Options& opts) {
  nccl::NcclApis apis = nccl::RealApis(opts.nccl_library);
  int devices = 0;
  return apis.nccl->Ready().ok() && apis.cuda->GetDeviceCount(&devices) == cudaSuccess &&
         devices > 0;
}

// braid.h's launcher rule: with read_env, no backend named (field NULL, no plugin_path, no
// unique_id, BRAID_BACKEND unset or "local") the launcher picks it: an explicit rendezvous
// (world_size without unique_id) of more than one rank -> as torchrun; mpirun -> "mpi";
// torchrun / srun with more than one rank -> "nccl" where NCCL loads and a GPU is visible,
// else "gloo". A malformed torchrun / srun environment is an error naming the variable.
absl::Status ApplyLauncherRule(const braid_world_options_t& o, Options& opts) {
  if (!o.read_env || o.backend != nullptr || o.unique_id != nullptr || opts.backend != "local") {
    return absl::OkStatus();
  }
  if (opts.rendezvous.has_value()) {  // 0.10: an explicit rendezvous, before mpirun
    if (opts.rendezvous->world_size > 1) opts.backend = NcclUsable(opts) ? "nccl" : "gloo";
    return absl::OkStatus();
  }
  if (rendezvous::LaunchedByMpi()) {
    opts.backend = "mpi";
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const std::optional<rendezvous::LauncherEnv> env,
                   rendezvous::LauncherEnvFromEnv());
  if (env.has_value() && env->world_size > 1) opts.backend = NcclUsable(opts) ? "nccl" : "gloo";
  return absl::OkStatus();
}

absl::StatusOr<Options> ToOptions(const braid_world_options_t& o) {
  if (o.local_ranks < 0 || o.local_ranks > kMaxLocalRanks) {
    return absl::InvalidArgumentError(absl::StrCat("local_ranks must be in [0, ", kMaxLocalRanks,
                                                   "] (0: the default), got ", o.local_ranks));
  }
  RETURN_IF_ERROR(CheckTimeoutMs(o.timeout_ms, "timeout_ms"));
  if (o.read_env != 0 && o.read_env != 1) {
    return absl::InvalidArgumentError(absl::StrCat("read_env must be 0 or 1, got ", o.read_env));
  }
  Options opts;
  if (o.read_env) {
    ASSIGN_OR_RETURN(opts, Options::FromEnv());
  }
  if (o.plugin_path != nullptr && o.plugin_path[0] != '\0') {
    opts.plugin_path = o.plugin_path;
    opts.backend = "plugin";
  }
  if (o.backend != nullptr) opts.backend = o.backend;
  if (o.local_ranks > 0) opts.local_ranks = o.local_ranks;
  if (o.timeout_ms > 0) opts.timeout = absl::Milliseconds(o.timeout_ms);
  RETURN_IF_ERROR(ApplyRendezvousFields(o, opts));
  RETURN_IF_ERROR(ApplyLauncherRule(o, opts));
  RETURN_IF_ERROR(ApplyNcclFields(o, opts));
  return opts;
}

// A new group handle for `group` (null: no handle, *out = NULL), child of `world`.
absl::Status AddGroup(braid_world_t* world, int world_rank, std::unique_ptr<Group> group,
                      braid_group_t** out) {
  if (group == nullptr) {
    *out = nullptr;
    return absl::OkStatus();
  }
  auto impl = std::make_shared<GroupImpl>();
  impl->world = world;
  impl->world_rank = world_rank;
  impl->group = std::move(group);
  ASSIGN_OR_RETURN(*out, Register(std::move(impl), {world}));
  return absl::OkStatus();
}

}  // namespace
}  // namespace braid::capi

extern "C" {

void braid_world_options_init(braid_world_options_t* opts) {
  if (opts == nullptr) return;
  *opts = braid_world_options_t{};
  opts->struct_size = sizeof(*opts);
  opts->read_env = 1;
  opts->cuda_device = -1;
  opts->nccl_blocking = -1;
  opts->store_port = -1;
}

braid_status_t braid_world_create(const braid_world_options_t* opts, braid_world_t** out) {
  return Guard("braid_world_create", [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckNotNull(out, "out"));
    braid_world_options_t o;
    braid_world_options_init(&o);
    // 0.5's struct ended after timeout_ms, 0.6's to 0.9's after nccl_blocking.
    RETURN_IF_ERROR(braid::capi::ReadVersionedOptions(
        opts,
        {offsetof(braid_world_options_t, unique_id), offsetof(braid_world_options_t, master_addr)},
        "braid_world_options_t", &o));
    ASSIGN_OR_RETURN(braid::Options options, braid::capi::ToOptions(o));
    auto impl = std::make_shared<WorldImpl>();
    if (braid::capi::FromUniqueId(o)) {
      ASSIGN_OR_RETURN(impl->backend, braid::capi::CreateNcclFromUniqueId(o, options));
    } else {
      ASSIGN_OR_RETURN(impl->backend, braid::CreateBackend(options));
      RETURN_IF_ERROR(braid::capi::CheckWorldMatchesRendezvous(options, *impl->backend));
    }
    impl->backend_name = std::string(impl->backend->name());
    ASSIGN_OR_RETURN(*out, Register(std::move(impl), {}));
    return absl::OkStatus();
  });
}

braid_status_t braid_world_backend(braid_world_t* world, const char** name) {
  return Guard("braid_world_backend", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto w, Find<WorldImpl>(world, "world"));
    RETURN_IF_ERROR(CheckNotNull(name, "name"));
    *name = w->backend_name.c_str();
    return absl::OkStatus();
  });
}

braid_status_t braid_world_size(braid_world_t* world, int* size) {
  return Guard("braid_world_size", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto w, Find<WorldImpl>(world, "world"));
    RETURN_IF_ERROR(CheckNotNull(size, "size"));
    *size = w->backend->world_size();
    return absl::OkStatus();
  });
}

braid_status_t braid_world_local_ranks(braid_world_t* world, int* ranks, int capacity, int* count) {
  return Guard("braid_world_local_ranks", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto w, Find<WorldImpl>(world, "world"));
    RETURN_IF_ERROR(CheckNotNull(count, "count"));
    if (ranks != nullptr && capacity < 0) {
      return absl::InvalidArgumentError(absl::StrCat("capacity must be >= 0, got ", capacity));
    }
    const std::vector<int> local = w->backend->local_ranks();
    const int n = static_cast<int>(local.size());
    *count = n;
    if (ranks == nullptr) return absl::OkStatus();
    for (int i = 0; i < n && i < capacity; ++i) ranks[i] = local[i];
    if (capacity < n) {
      return absl::OutOfRangeError(
          absl::StrCat("this process hosts ", n, " ranks but 'ranks' has room for ", capacity));
    }
    return absl::OkStatus();
  });
}

braid_status_t braid_world_group(braid_world_t* world, int rank, braid_group_t** out) {
  return Guard("braid_world_group", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto w, Find<WorldImpl>(world, "world"));
    RETURN_IF_ERROR(CheckNotNull(out, "out"));
    ASSIGN_OR_RETURN(std::unique_ptr<braid::Group> g, w->backend->WorldGroup(rank));
    return braid::capi::AddGroup(world, rank, std::move(g), out);
  });
}

braid_status_t braid_world_destroy(braid_world_t* world) {
  return Guard("braid_world_destroy",
               [&] { return braid::capi::Destroy(world, Tag::kWorld, "world"); });
}

braid_status_t braid_flight_recorder_dump(braid_group_t* group, const char* path) {
  return Guard("braid_flight_recorder_dump", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto g, Find<GroupImpl>(group, "group"));
    braid::FlightRecorder* fr = g->group->flight_recorder();
    if (fr == nullptr) {
      return absl::FailedPreconditionError(
          "braid_flight_recorder_dump: recording is off (BRAID_FLIGHT_RECORDER_ENTRIES=0)");
    }
    if (path == nullptr && fr->auto_path().empty()) {
      return absl::FailedPreconditionError(
          "braid_flight_recorder_dump: path is NULL and BRAID_FLIGHT_RECORDER_DIR is not set");
    }
    return fr->DumpTo(path != nullptr ? std::string(path) : fr->auto_path(), "asked by the host");
  });
}

braid_status_t braid_group_rank(braid_group_t* group, int* rank) {
  return Guard("braid_group_rank", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto g, Find<GroupImpl>(group, "group"));
    RETURN_IF_ERROR(CheckNotNull(rank, "rank"));
    *rank = g->group->rank();
    return absl::OkStatus();
  });
}

braid_status_t braid_group_size(braid_group_t* group, int* size) {
  return Guard("braid_group_size", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto g, Find<GroupImpl>(group, "group"));
    RETURN_IF_ERROR(CheckNotNull(size, "size"));
    *size = g->group->size();
    return absl::OkStatus();
  });
}

braid_status_t braid_group_name(braid_group_t* group, const char** name) {
  return Guard("braid_group_name", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto g, Find<GroupImpl>(group, "group"));
    RETURN_IF_ERROR(CheckNotNull(name, "name"));
    *name = g->group->name().c_str();
    return absl::OkStatus();
  });
}

braid_status_t braid_group_abort(braid_group_t* group, const char* reason) {
  return Guard("braid_group_abort", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto g, Find<GroupImpl>(group, "group"));
    RETURN_IF_ERROR(CheckNotNull(reason, "reason"));
    if (*reason == '\0') return absl::InvalidArgumentError("reason is empty: say what failed");
    return g->group->AbortJob(absl::InternalError(reason));
  });
}

braid_status_t braid_group_split(braid_group_t* group, int color, int key, const char* name,
                                 braid_group_t** out) {
  return Guard("braid_group_split", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto g, Find<GroupImpl>(group, "group"));
    RETURN_IF_ERROR(CheckNotNull(out, "out"));
    std::unique_ptr<braid::Group> child;
    {
      std::lock_guard<std::mutex> lock(g->mu);
      ASSIGN_OR_RETURN(child, g->group->Split(color, key, name != nullptr ? name : ""));
    }
    return braid::capi::AddGroup(g->world, g->world_rank, std::move(child), out);
  });
}

braid_status_t braid_mesh_create(braid_group_t* world_group, int replicas, int shards,
                                 braid_group_t** shard, braid_group_t** replica) {
  return Guard("braid_mesh_create", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto g, Find<GroupImpl>(world_group, "world_group"));
    RETURN_IF_ERROR(CheckNotNull(shard, "shard"));
    RETURN_IF_ERROR(CheckNotNull(replica, "replica"));
    braid::Mesh mesh;
    {
      std::lock_guard<std::mutex> lock(g->mu);
      ASSIGN_OR_RETURN(mesh, braid::MakeMesh(*g->group, replicas, shards));
    }
    braid_group_t* s = nullptr;
    braid_group_t* r = nullptr;
    RETURN_IF_ERROR(braid::capi::AddGroup(g->world, g->world_rank, std::move(mesh.shard), &s));
    absl::Status st = braid::capi::AddGroup(g->world, g->world_rank, std::move(mesh.replica), &r);
    if (!st.ok()) {
      (void)braid::capi::Destroy(s, Tag::kGroup, "shard");
      return st;
    }
    *shard = s;
    *replica = r;
    return absl::OkStatus();
  });
}

braid_status_t braid_group_destroy(braid_group_t* group) {
  return Guard("braid_group_destroy",
               [&] { return braid::capi::Destroy(group, Tag::kGroup, "group"); });
}

}  // extern "C"
