#include "backends/rendezvous/launcher_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::rendezvous {
namespace {

constexpr const char* kVariables[] = {
    "MASTER_ADDR",          "MASTER_PORT",  "RANK",         "WORLD_SIZE",
    "LOCAL_RANK",           "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",     "PMIX_RANK",    "TORCHELASTIC_USE_AGENT_STORE",
};

const std::string* Find(const std::map<std::string, std::string>& vars, const char* name) {
  auto it = vars.find(name);
  return it == vars.end() ? nullptr : &it->second;
}

absl::StatusOr<int> ParseInt(const std::map<std::string, std::string>& vars, const char* name,
                             absl::string_view launcher) {
  const std::string* v = Find(vars, name);
  int out = 0;
  if (v == nullptr || !absl::SimpleAtoi(*v, &out) || out < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        launcher, " environment: ", name, "=",
        v == nullptr ? "(unset)" : absl::StrCat("'", *v, "'"), " is not a non-negative integer"));
  }
  return out;
}

}  // namespace

std::string LauncherEnv::Describe() const {
  std::string out = absl::StrCat(launcher, " rank ", rank, " of ", world_size, " (local ",
                                 local_rank, "), master ", master_addr);
  if (store_port > 0) {
    absl::StrAppend(&out, ", store port ", store_port, " (BRAID_STORE_PORT)");
  } else if (!exchange.empty()) {
    absl::StrAppend(&out, ", store address exchanged by the embedder");
  } else if (master_port > 0) {
    absl::StrAppend(
        &out, ":", master_port,
        agent_store ? " (MASTER_PORT + 1: torchrun's agent store holds MASTER_PORT)" : "");
  }
  return out;
}

absl::StatusOr<std::optional<LauncherEnv>> LauncherEnvFromMap(
    const std::map<std::string, std::string>& vars) {
  struct Names {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local;
  };
  const Names torchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
  const Names srun{"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
  const Names* names = nullptr;
  for (const Names* n : {&torchrun, &srun}) {
    const bool has_rank = Find(vars, n->rank) != nullptr;
    const bool has_size = Find(vars, n->size) != nullptr;
    if (has_rank != has_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(n->launcher, " environment: ", has_rank ? n->rank : n->size, " is set but ",
                       has_rank ? n->size : n->rank, " is not (a launcher sets both)"));
    }
    if (has_rank) {
      names = n;
      break;
    }
  }
  if (names == nullptr) return std::optional<LauncherEnv>();

  LauncherEnv env;
  env.launcher = names->launcher;
  ASSIGN_OR_RETURN(env.rank, ParseInt(vars, names->rank, env.launcher));
  ASSIGN_OR_RETURN(env.world_size, ParseInt(vars, names->size, env.launcher));
  if (env.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(env.launcher, " environment: ", names->size, "=0 (no ranks)"));
  }
  if (env.rank >= env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(env.launcher, " environment: ", names->rank, "=",
                                                   env.rank, " is not below ", names->size, "=",
                                                   env.world_size));
  }
  env.local_rank = env.rank;
  if (Find(vars, names->local) != nullptr) {
    ASSIGN_OR_RETURN(env.local_rank, ParseInt(vars, names->local, env.launcher));
    if (env.local_rank >= env.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(env.launcher, " environment: ", names->local,
                                                     "=", env.local_rank, " is not below ",
                                                     names->size, "=", env.world_size));
    }
  }
  const std::string* addr = Find(vars, "MASTER_ADDR");
  const std::string* port = Find(vars, "MASTER_PORT");
  if (addr == nullptr || addr->empty() || port == nullptr) {
    std::string missing = (addr == nullptr || addr->empty()) ? "MASTER_ADDR" : "";
    if (port == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : " and ", "MASTER_PORT");
    return absl::InvalidArgumentError(absl::StrCat(
        env.launcher, " environment (", names->rank, "=", env.rank, ", ", names->size, "=",
        env.world_size, "): ", missing, " not set; rank 0 serves the rendezvous store there",
        env.launcher == "srun"
            ? " (srun sets neither: export them in the batch script, e.g. the first host of "
              "SLURM_JOB_NODELIST and a free port)"
            : ""));
  }
  env.master_addr = *addr;
  ASSIGN_OR_RETURN(env.master_port, ParseInt(vars, "MASTER_PORT", env.launcher));
  if (env.master_port < 1 || env.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        env.launcher, " environment: MASTER_PORT=", env.master_port, " is not in 1..65535"));
  }
  if (const std::string* agent = Find(vars, "TORCHELASTIC_USE_AGENT_STORE");
      env.launcher == "torchrun" && agent != nullptr && *agent == "True") {
    if (env.master_port == 65535) {
      return absl::InvalidArgumentError(
          "torchrun environment: MASTER_PORT=65535 is held by torchrun's agent store "
          "(TORCHELASTIC_USE_AGENT_STORE=True) and Braid's store needs MASTER_PORT + 1");
    }
    env.master_port += 1;
    env.agent_store = true;
  }
  return std::optional<LauncherEnv>(std::move(env));
}

namespace {
std::map<std::string, std::string> LauncherVariables() {
  std::map<std::string, std::string> vars;
  for (const char* name : kVariables) {
    if (const char* v = std::getenv(name)) vars[name] = v;
  }
  return vars;
}
}  // namespace

absl::StatusOr<std::optional<LauncherEnv>> LauncherEnvFromEnv() {
  return LauncherEnvFromMap(LauncherVariables());
}

bool LaunchedByMpi(const std::map<std::string, std::string>& vars) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (Find(vars, name) != nullptr) return true;
  }
  return false;
}

bool LaunchedByMpi() { return LaunchedByMpi(LauncherVariables()); }

namespace {

// An explicit rendezvous names the rank and world size itself, so a world size exported alone
// (torch.distributed's own multi-process tests set WORLD_SIZE, never RANK) is no half-set
// launcher: it must agree with the explicit size, and is then left out of the launcher's
// variables. Without a rendezvous, or with the rank variable set too, `vars` as they are.
absl::StatusOr<std::map<std::string, std::string>> WithoutALoneSize(
    const Options& options, const std::map<std::string, std::string>& vars) {
  std::map<std::string, std::string> out = vars;
  if (!options.rendezvous.has_value()) return out;
  for (auto [rank, size] : {std::pair<const char*, const char*>{"RANK", "WORLD_SIZE"},
                            std::pair<const char*, const char*>{"SLURM_PROCID", "SLURM_NTASKS"}}) {
    if (Find(vars, rank) != nullptr || Find(vars, size) == nullptr) continue;
    ASSIGN_OR_RETURN(int n, ParseInt(vars, size, "launcher"));
    if (n != options.rendezvous->world_size) {
      return absl::InvalidArgumentError(absl::StrCat("explicit rendezvous world_size ",
                                                     options.rendezvous->world_size,
                                                     " disagrees with ", size, "=", n));
    }
    out.erase(size);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::optional<LauncherEnv>> LauncherEnvFor(
    const Options& options, const std::map<std::string, std::string>& given) {
  using Vars = std::map<std::string, std::string>;
  ASSIGN_OR_RETURN(const Vars vars, WithoutALoneSize(options, given));
  ASSIGN_OR_RETURN(std::optional<LauncherEnv> env, LauncherEnvFromMap(vars));
  if (options.rendezvous.has_value()) {
    const RendezvousSpec& spec = *options.rendezvous;
    if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("explicit rendezvous: rank ", spec.rank, " of world_size ", spec.world_size,
                       " (want world_size >= 1 and rank in [0, world_size))"));
    }
    if (static_cast<bool>(spec.exchange.publish) != static_cast<bool>(spec.exchange.lookup)) {
      return absl::InvalidArgumentError(
          "explicit rendezvous: an address exchange needs both publish and lookup");
    }
    if (env.has_value() && (env->rank != spec.rank || env->world_size != spec.world_size)) {
      const bool torchrun = env->launcher == "torchrun";
      return absl::InvalidArgumentError(absl::StrCat(
          "explicit rendezvous rank ", spec.rank, " of ", spec.world_size, " disagrees with the ",
          env->launcher, " environment (", torchrun ? "RANK=" : "SLURM_PROCID=", env->rank, ", ",
          torchrun ? "WORLD_SIZE=" : "SLURM_NTASKS=", env->world_size, ")"));
    }
    LauncherEnv out;
    out.launcher = "explicit";
    out.rank = spec.rank;
    out.world_size = spec.world_size;
    out.local_rank = env.has_value() ? env->local_rank : spec.rank;
    out.master_addr = !spec.master_addr.empty() ? spec.master_addr
                      : env.has_value()         ? env->master_addr
                                                : std::string();
    if (env.has_value()) {
      out.master_port = env->master_port;
      out.agent_store = env->agent_store;
    }
    out.exchange = spec.exchange;
    env = std::move(out);
  }
  if (!env.has_value()) return env;
  env->store_port = options.store_port;
  if (env->world_size > 1 && env->launcher == "explicit") {
    if (env->master_addr.empty()) {
      return absl::InvalidArgumentError(
          "explicit rendezvous: no master address (rank 0's host as every rank reaches it): "
          "give master_addr, or set MASTER_ADDR");
    }
    if (env->store_port == 0 && env->exchange.empty() && env->master_port == 0) {
      return absl::InvalidArgumentError(
          "explicit rendezvous: the other ranks cannot learn where rank 0's store listens: "
          "give a store port (BRAID_STORE_PORT / store_port), an address exchange, or set "
          "MASTER_PORT");
    }
  }
  return env;
}

absl::StatusOr<std::optional<LauncherEnv>> LauncherEnvFor(const Options& options) {
  return LauncherEnvFor(options, LauncherVariables());
}

}  // namespace braid::rendezvous
