/* braid_world_create picking the launcher up from the environment (braid.h's rule).
 *
 *   capi_launcher_test              as a rank of a torchrun-style world (tests/gloo/run_ranks.sh
 *                                   sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK;
 *                                   or, srun-style, SLURM_PROCID / NTASKS / LOCALID):
 *                                   default options give "gloo" (no GPU) or "nccl"; the world
 *                                   has WORLD_SIZE ranks, this process is RANK, and an
 *                                   all-reduce / all-gather of host buffers is exact.
 *   capi_launcher_test env          one process: no launcher -> "local"; srun without a master,
 *                                   RANK >= WORLD_SIZE -> INVALID_ARGUMENT naming the variable;
 *                                   a named backend is never overridden. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

static int env_int(const char* name) {
  const char* v = getenv(name);
  return v == NULL ? -1 : atoi(v);
}

static void run_rank(void) {
  braid_world_options_t wo;
  braid_world_t* world = NULL;
  braid_group_t* g = NULL;
  braid_work_t* w = NULL;
  const char* backend = NULL;
  int size = 0, count = 0, rank = -1, i;
  /* torchrun's variables, else srun's (tests/gloo/run_ranks.sh sets one set or the other). */
  const int want_size = getenv("WORLD_SIZE") ? env_int("WORLD_SIZE") : env_int("SLURM_NTASKS");
  const int want_rank = getenv("RANK") ? env_int("RANK") : env_int("SLURM_PROCID");
  int64_t x[5];
  float mine[3], all[3 * 8];
  braid_world_options_init(&wo);
  wo.timeout_ms = 60000;
  EXPECT_OK(braid_world_create(&wo, &world));
  if (world == NULL) return;
  EXPECT_OK(braid_world_backend(world, &backend));
  if (backend != NULL && strcmp(backend, "nccl") == 0) {
    printf("a GPU and NCCL are present: the rule chose nccl; host-buffer checks skipped\n");
    EXPECT_OK(braid_world_destroy(world));
    return;
  }
  EXPECT_TRUE(backend != NULL && strcmp(backend, "gloo") == 0);
  EXPECT_OK(braid_world_size(world, &size));
  EXPECT_TRUE(size == want_size);
  EXPECT_OK(braid_world_local_ranks(world, &rank, 1, &count));
  EXPECT_TRUE(count == 1 && rank == want_rank);
  EXPECT_OK(braid_world_group(world, rank, &g));
  for (i = 0; i < 5; ++i) x[i] = (int64_t)(rank + 1) * (i + 1);
  EXPECT_OK(braid_allreduce(g, x, x, 5, BRAID_DTYPE_I64, BRAID_OP_SUM, NULL, &w));
  EXPECT_OK(braid_work_wait(w, 60000));
  EXPECT_OK(braid_work_destroy(w));
  for (i = 0; i < 5; ++i) EXPECT_TRUE(x[i] == (int64_t)size * (size + 1) / 2 * (i + 1));
  for (i = 0; i < 3; ++i) mine[i] = (float)(rank * 10 + i);
  EXPECT_TRUE(size <= 8);
  EXPECT_OK(braid_allgather(g, mine, all, 3, BRAID_DTYPE_F32, NULL, &w));
  EXPECT_OK(braid_work_wait(w, 60000));
  EXPECT_OK(braid_work_destroy(w));
  for (i = 0; i < 3 * size; ++i) EXPECT_TRUE(all[i] == (float)((i / 3) * 10 + i % 3));
  /* Everyone done before rank 0's store goes away with its world. */
  EXPECT_OK(braid_barrier(g, NULL, &w));
  EXPECT_OK(braid_work_wait(w, 60000));
  EXPECT_OK(braid_work_destroy(w));
  EXPECT_OK(braid_group_destroy(g));
  EXPECT_OK(braid_world_destroy(world));
}

static const char* const kLauncherVars[] = {"MASTER_ADDR",  "MASTER_PORT",  "RANK",
                                            "WORLD_SIZE",   "LOCAL_RANK",   "SLURM_PROCID",
                                            "SLURM_NTASKS", "SLURM_LOCALID", "BRAID_BACKEND"};

static void check_env_rule(void) {
  braid_world_options_t wo;
  braid_world_t* world = NULL;
  const char* backend = NULL;
  size_t i;
  for (i = 0; i < sizeof kLauncherVars / sizeof kLauncherVars[0]; ++i) unsetenv(kLauncherVars[i]);
  braid_world_options_init(&wo);
  /* No launcher: local. */
  EXPECT_OK(braid_world_create(&wo, &world));
  EXPECT_OK(braid_world_backend(world, &backend));
  EXPECT_TRUE(backend != NULL && strcmp(backend, "local") == 0);
  EXPECT_OK(braid_world_destroy(world));
  /* srun without a master address: the error names what is missing. */
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "2", 1);
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "MASTER_ADDR and MASTER_PORT not set",
               braid_world_create(&wo, &world));
  /* torchrun's variables win; RANK >= WORLD_SIZE is refused naming both. */
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1", 1);
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "2", 1);
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "RANK=2 is not below WORLD_SIZE=2",
               braid_world_create(&wo, &world));
  /* A named backend is taken as named, whatever the launcher says. */
  wo.backend = "local";
  wo.local_ranks = 2;
  EXPECT_OK(braid_world_create(&wo, &world));
  EXPECT_OK(braid_world_backend(world, &backend));
  EXPECT_TRUE(backend != NULL && strcmp(backend, "local") == 0);
  EXPECT_OK(braid_world_destroy(world));
  /* read_env = 0 ignores the launcher too. */
  braid_world_options_init(&wo);
  wo.read_env = 0;
  EXPECT_OK(braid_world_create(&wo, &world));
  EXPECT_OK(braid_world_backend(world, &backend));
  EXPECT_TRUE(backend != NULL && strcmp(backend, "local") == 0);
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "name", braid_world_backend(world, NULL));
  EXPECT_OK(braid_world_destroy(world));
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "env") == 0) {
    check_env_rule();
  } else {
    run_rank();
  }
  if (test_failures) {
    fprintf(stderr, "%d check(s) failed\n", test_failures);
    return 1;
  }
  printf("capi_launcher_test: all checks passed\n");
  return 0;
}
