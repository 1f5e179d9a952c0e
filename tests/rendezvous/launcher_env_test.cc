// The launcher environment parser: torchrun's and srun's variables, which wins, and an error
// naming the variable for every inconsistent or missing value; LauncherEnvFor: an embedder's
// explicit rendezvous over (and checked against) the launcher's variables, BRAID_STORE_PORT.
#include "backends/rendezvous/launcher_env.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::rendezvous {
namespace {

using ::testing::HasSubstr;
using Vars = std::map<std::string, std::string>;

Vars Torchrun() {
  return {{"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"RANK", "3"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"}};
}

LauncherEnv Parse(const Vars& v) {
  auto env = LauncherEnvFromMap(v);
  EXPECT_TRUE(env.ok()) << env.status();
  EXPECT_TRUE(env->has_value());
  return **env;
}

std::string Error(const Vars& v) {
  auto env = LauncherEnvFromMap(v);
  EXPECT_FALSE(env.ok()) << (env.ok() && env->has_value() ? (*env)->Describe() : "no launcher");
  if (env.ok()) return "";
  EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(env.status().message());
}

TEST(LauncherEnvTest, NoLauncherIsNotAnError) {
  auto env = LauncherEnvFromMap({{"MASTER_ADDR", "h"}, {"PATH", "/bin"}});
  ASSERT_TRUE(env.ok());
  EXPECT_FALSE(env->has_value());
}

TEST(LauncherEnvTest, Torchrun) {
  const LauncherEnv e = Parse(Torchrun());
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.Describe(), "torchrun rank 3 of 8 (local 1), master 10.0.0.1:29500");
  Vars no_local = Torchrun();
  no_local.erase("LOCAL_RANK");
  EXPECT_EQ(Parse(no_local).local_rank, 3);
}

// torchrun's agent serving its own store at MASTER_PORT: Braid's takes the next port.
TEST(LauncherEnvTest, TorchrunAgentStoreMovesBraidsStoreToTheNextPort) {
  Vars v = Torchrun();
  v["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  LauncherEnv e = Parse(v);
  EXPECT_EQ(e.master_port, 29501);
  EXPECT_TRUE(e.agent_store);
  EXPECT_THAT(e.Describe(), HasSubstr("10.0.0.1:29501 (MASTER_PORT + 1"));
  v["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(Parse(v).master_port, 29500);
  v["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  v["MASTER_PORT"] = "65535";
  EXPECT_THAT(Error(v), HasSubstr("MASTER_PORT + 1"));
}

TEST(LauncherEnvTest, SrunWithTheMasterFromTheEnvironment) {
  const LauncherEnv e = Parse({{"SLURM_PROCID", "5"},
                               {"SLURM_NTASKS", "6"},
                               {"SLURM_LOCALID", "2"},
                               {"MASTER_ADDR", "node01"},
                               {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.launcher, "srun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 6);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.master_addr, "node01");
  const std::string err = Error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  EXPECT_THAT(err, HasSubstr("MASTER_ADDR and MASTER_PORT not set"));
  EXPECT_THAT(err, HasSubstr("SLURM_JOB_NODELIST"));
  EXPECT_THAT(Error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"MASTER_ADDR", "h"}}),
              HasSubstr("MASTER_PORT not set"));
  EXPECT_THAT(Error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"MASTER_PORT", "5"}}),
              HasSubstr("MASTER_ADDR not set"));
}

TEST(LauncherEnvTest, TorchrunWinsOverTheSlurmAllocationItRunsIn) {
  Vars v = Torchrun();
  v["SLURM_PROCID"] = "0";
  v["SLURM_NTASKS"] = "2";
  v["SLURM_LOCALID"] = "0";
  const LauncherEnv e = Parse(v);
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
}

TEST(LauncherEnvTest, InconsistentValuesNameTheVariables) {
  Vars v = Torchrun();
  v["RANK"] = "8";
  EXPECT_THAT(Error(v), HasSubstr("RANK=8 is not below WORLD_SIZE=8"));
  v = Torchrun();
  v["RANK"] = "two";
  EXPECT_THAT(Error(v), HasSubstr("RANK='two' is not a non-negative integer"));
  v = Torchrun();
  v["WORLD_SIZE"] = "-1";
  EXPECT_THAT(Error(v), HasSubstr("WORLD_SIZE='-1'"));
  v = Torchrun();
  v["WORLD_SIZE"] = "0";
  v["RANK"] = "0";
  EXPECT_THAT(Error(v), HasSubstr("WORLD_SIZE=0"));
  v = Torchrun();
  v["LOCAL_RANK"] = "9";
  EXPECT_THAT(Error(v), HasSubstr("LOCAL_RANK=9 is not below WORLD_SIZE=8"));
  v = Torchrun();
  v["MASTER_PORT"] = "70000";
  EXPECT_THAT(Error(v), HasSubstr("MASTER_PORT=70000 is not in 1..65535"));
  v = Torchrun();
  v["MASTER_PORT"] = "http";
  EXPECT_THAT(Error(v), HasSubstr("MASTER_PORT='http'"));
  v = Torchrun();
  v.erase("WORLD_SIZE");
  EXPECT_THAT(Error(v), HasSubstr("RANK is set but WORLD_SIZE is not"));
  EXPECT_THAT(Error({{"SLURM_NTASKS", "4"}}), HasSubstr("SLURM_NTASKS is set but SLURM_PROCID"));
  v = Torchrun();
  v["MASTER_ADDR"] = "";
  EXPECT_THAT(Error(v), HasSubstr("MASTER_ADDR not set"));
}

TEST(LauncherEnvTest, MpiLaunchers) {
  EXPECT_FALSE(LaunchedByMpi(Torchrun()));
  EXPECT_TRUE(LaunchedByMpi({{"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_TRUE(LaunchedByMpi({{"PMIX_RANK", "0"}}));
  EXPECT_TRUE(LaunchedByMpi({{"PMI_SIZE", "4"}}));
}

Options Explicit(int rank, int world_size, std::string master_addr = "") {
  Options o;
  RendezvousSpec spec;
  spec.rank = rank;
  spec.world_size = world_size;
  spec.master_addr = std::move(master_addr);
  o.rendezvous = spec;
  return o;
}

TEST(LauncherEnvTest, StorePortComesFromTheOptions) {
  Options o;
  o.store_port = 29600;
  auto env = LauncherEnvFor(o, Torchrun());
  ASSERT_TRUE(env.ok() && env->has_value()) << env.status();
  EXPECT_EQ((*env)->store_port, 29600);
  EXPECT_EQ((*env)->launcher, "torchrun");
  EXPECT_THAT((*env)->Describe(), HasSubstr("store port 29600 (BRAID_STORE_PORT)"));
  auto none = LauncherEnvFor(o, {});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(LauncherEnvTest, AnExplicitRendezvousTakesTheLaunchersMasterAndLocalRank) {
  auto env = LauncherEnvFor(Explicit(3, 8), Torchrun());
  ASSERT_TRUE(env.ok() && env->has_value()) << env.status();
  const LauncherEnv& e = **env;
  EXPECT_EQ(e.launcher, "explicit");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);  // LOCAL_RANK
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  // Its own master address wins; without a launcher, local rank = rank and no MASTER_PORT.
  Options o = Explicit(2, 4, "192.168.1.7");
  o.rendezvous->exchange.publish = [](const std::string&, const std::string&) {
    return absl::OkStatus();
  };
  o.rendezvous->exchange.lookup = [](const std::string&, absl::Duration) {
    return absl::StatusOr<std::string>("h:1");
  };
  auto bare = LauncherEnvFor(o, {});
  ASSERT_TRUE(bare.ok() && bare->has_value()) << bare.status();
  EXPECT_EQ((*bare)->master_addr, "192.168.1.7");
  EXPECT_EQ((*bare)->local_rank, 2);
  EXPECT_EQ((*bare)->master_port, 0);
  EXPECT_FALSE((*bare)->exchange.empty());
}

TEST(LauncherEnvTest, AnExplicitRendezvousTakesAWorldSizeExportedAlone) {
  // torch.distributed's own multi-process tests export WORLD_SIZE without RANK, then init
  // torch from a file; Braid's world meets through torch (an explicit rendezvous).
  auto with_port = [](int rank, int world_size) {
    Options o = Explicit(rank, world_size, "127.0.0.1");
    o.store_port = 4000;
    return o;
  };
  const Vars lone = {{"WORLD_SIZE", "2"}};
  auto env = LauncherEnvFor(with_port(1, 2), lone);
  ASSERT_TRUE(env.ok() && env->has_value()) << env.status();
  EXPECT_EQ((*env)->launcher, "explicit");
  EXPECT_EQ((*env)->rank, 1);
  EXPECT_EQ((*env)->world_size, 2);
  EXPECT_EQ((*env)->local_rank, 1);
  EXPECT_TRUE(LauncherEnvFor(with_port(0, 4), {{"SLURM_NTASKS", "4"}}).ok());
  auto wrong = LauncherEnvFor(with_port(1, 4), lone);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("explicit rendezvous world_size 4 disagrees with WORLD_SIZE=2"));
  // Without an explicit rendezvous it is still a half-set launcher, named.
  EXPECT_THAT(Error(lone), HasSubstr("WORLD_SIZE is set but RANK is not"));
}

TEST(LauncherEnvTest, AnExplicitRendezvousThatCannotMeetIsNamed) {
  auto error = [](const Options& o, const Vars& v) {
    auto env = LauncherEnvFor(o, v);
    EXPECT_FALSE(env.ok());
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(env.status().message());
  };
  EXPECT_THAT(error(Explicit(1, 8), Torchrun()),
              HasSubstr("rank 1 of 8 disagrees with the torchrun environment (RANK=3, "
                        "WORLD_SIZE=8)"));
  EXPECT_THAT(error(Explicit(0, 2), {}), HasSubstr("no master address"));
  EXPECT_THAT(error(Explicit(0, 2, "h"), {}),
              HasSubstr("cannot learn where rank 0's store listens"));
  EXPECT_THAT(error(Explicit(2, 2, "h"), {}), HasSubstr("rank 2 of world_size 2"));
  Options half = Explicit(0, 2, "h");
  half.rendezvous->exchange.publish = [](const std::string&, const std::string&) {
    return absl::OkStatus();
  };
  EXPECT_THAT(error(half, {}), HasSubstr("needs both publish and lookup"));
  // A fixed store port is enough; a world of one needs nothing.
  Options fixed = Explicit(0, 2, "h");
  fixed.store_port = 4000;
  EXPECT_TRUE(LauncherEnvFor(fixed, {}).ok());
  EXPECT_TRUE(LauncherEnvFor(Explicit(0, 1), {}).ok());
}

}  // namespace
}  // namespace braid::rendezvous
