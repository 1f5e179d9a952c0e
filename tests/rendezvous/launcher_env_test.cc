// The launcher environment parser: torchrun's and srun's variables, which wins, and an error
// naming the variable for every inconsistent or missing value.
#include "backends/rendezvous/launcher_env.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::rendezvous {
namespace {

using ::testing::HasSubstr;
using Vars = std::map<std::string, std::string>;

Vars Torchrun() {
  return {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"RANK", "3"},
          {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}};
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
  const LauncherEnv e = Parse({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"},
                               {"SLURM_LOCALID", "2"}, {"MASTER_ADDR", "node01"},
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

}  // namespace
}  // namespace braid::rendezvous
