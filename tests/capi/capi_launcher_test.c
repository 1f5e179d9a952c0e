/* braid_world_create picking the launcher up from the environment (braid.h's rule).
 *
 *   capi_launcher_test              as a rank of a torchrun-style world (tests/gloo/run_ranks.sh
 *                                   sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK;
 *                                   or, srun-style, SLURM_PROCID / NTASKS / LOCALID):
 *                                   default options give "gloo" (no GPU) or "nccl"; the world
 *                                   has WORLD_SIZE ranks, this process is RANK, and an
 *                                   all-reduce / all-gather of host buffers is exact.
 *   capi_launcher_test explicit     as a rank started the same way, but the world comes from
 *                                   an explicit rendezvous (0.10): the launcher's variables
 *                                   are read, then unset (MASTER_PORT included: nothing may
 *                                   need it), and world_size / rank / master_addr and a file
 *                                   exchange (rendezvous_publish / rendezvous_lookup over a
 *                                   directory the ranks share) give the same world; the same
 *                                   checks.
 *   capi_launcher_test env          one process: no launcher -> "local"; srun without a master,
 *                                   RANK >= WORLD_SIZE -> INVALID_ARGUMENT naming the variable;
 *                                   a named backend is never overridden; the explicit
 *                                   rendezvous fields' errors, each naming the field. */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

static int env_int(const char* name) {
  const char* v = getenv(name);
  return v == NULL ? -1 : atoi(v);
}

static void run_rank(const braid_world_options_t* given) {
  braid_world_options_t wo;
  braid_world_t* world = NULL;
  braid_group_t* g = NULL;
  braid_work_t* w = NULL;
  const char* backend = NULL;
  int size = 0, count = 0, rank = -1, i;
  /* torchrun's variables, else srun's (tests/gloo/run_ranks.sh sets one set or the other). */
  const int want_size = given != NULL          ? given->world_size
                        : getenv("WORLD_SIZE") ? env_int("WORLD_SIZE")
                                               : env_int("SLURM_NTASKS");
  const int want_rank = given != NULL    ? given->rank
                        : getenv("RANK") ? env_int("RANK")
                                         : env_int("SLURM_PROCID");
  int64_t x[5];
  float mine[3], all[3 * 8];
  if (given != NULL) {
    wo = *given;
  } else {
    braid_world_options_init(&wo);
    wo.timeout_ms = 60000;
  }
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

/* A file exchange: the key's value in <dir>/<key with '/' -> '_'>, written whole by a rename. */
static void exchange_path(const char* dir, const char* key, char* out, size_t size) {
  size_t n;
  snprintf(out, size, "%s/", dir);
  n = strlen(out);
  for (; *key != '\0' && n + 1 < size; ++key) out[n++] = *key == '/' ? '_' : *key;
  out[n] = '\0';
}

static braid_status_t file_publish(const char* key, const char* value, void* dir) {
  char path[512], tmp[520];
  FILE* f;
  exchange_path((const char*)dir, key, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  f = fopen(tmp, "w");
  if (f == NULL) return BRAID_INTERNAL;
  fputs(value, f);
  fclose(f);
  return rename(tmp, path) == 0 ? BRAID_OK : BRAID_INTERNAL;
}

static braid_status_t file_lookup(const char* key, int64_t timeout_ms, char* value, size_t capacity,
                                  void* dir) {
  char path[512];
  const struct timespec pause = {0, 10 * 1000 * 1000};
  int64_t waited = 0;
  FILE* f;
  size_t n;
  exchange_path((const char*)dir, key, path, sizeof path);
  while ((f = fopen(path, "r")) == NULL) {
    if (waited >= timeout_ms) return BRAID_TIMEOUT;
    nanosleep(&pause, NULL);
    waited += 10;
  }
  n = fread(value, 1, capacity - 1, f);
  fclose(f);
  value[n] = '\0';
  return BRAID_OK;
}

static const char* const kLauncherVars[] = {"MASTER_ADDR",  "MASTER_PORT",   "RANK",
                                            "WORLD_SIZE",   "LOCAL_RANK",    "SLURM_PROCID",
                                            "SLURM_NTASKS", "SLURM_LOCALID", "BRAID_BACKEND"};

/* The explicit rendezvous fields (0.10), no launcher variable set: errors name the field; an
 * explicit world of one makes a world; one that another backend contradicts is refused. */
static void check_explicit_fields(void) {
  braid_world_options_t wo;
  braid_world_t* world = NULL;
  const char* backend = NULL;
  int size = 0;
  size_t i;
  const braid_status_t inval = BRAID_INVALID_ARGUMENT;
  for (i = 0; i < sizeof kLauncherVars / sizeof kLauncherVars[0]; ++i) unsetenv(kLauncherVars[i]);
  braid_world_options_init(&wo);
  EXPECT_TRUE(wo.store_port == -1 && wo.master_addr == NULL && wo.rendezvous_lookup == NULL);
  wo.master_addr = "127.0.0.1";
  EXPECT_ERROR(inval, "master_addr describes an explicit rendezvous, which needs world_size",
               braid_world_create(&wo, &world));
  braid_world_options_init(&wo);
  wo.world_size = 2;
  wo.rendezvous_lookup = file_lookup;
  EXPECT_ERROR(inval, "rendezvous_lookup is set but rendezvous_publish is not",
               braid_world_create(&wo, &world));
  braid_world_options_init(&wo);
  wo.store_port = 65536;
  EXPECT_ERROR(inval, "store_port must be -1", braid_world_create(&wo, &world));
  braid_world_options_init(&wo);
  wo.world_size = 2;
  wo.rank = 2;
  EXPECT_ERROR(inval, "explicit rendezvous: rank 2 and world_size 2",
               braid_world_create(&wo, &world));
  braid_world_options_init(&wo);
  wo.world_size = 2;
  EXPECT_ERROR(inval, "no master address", braid_world_create(&wo, &world));
  wo.master_addr = "127.0.0.1";
  EXPECT_ERROR(inval, "cannot learn where rank 0's store listens", braid_world_create(&wo, &world));
  /* A named backend that makes another world than the rendezvous says. */
  wo.backend = "local";
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION,
               "the explicit rendezvous says rank 0 of 2 (world_size, rank), but backend 'local'",
               braid_world_create(&wo, &world));
  /* A world of one needs no store address: the rule gives what no launcher gives. */
  braid_world_options_init(&wo);
  wo.world_size = 1;
  EXPECT_OK(braid_world_create(&wo, &world));
  EXPECT_OK(braid_world_backend(world, &backend));
  EXPECT_OK(braid_world_size(world, &size));
  EXPECT_TRUE(size == 1);
  EXPECT_OK(braid_world_destroy(world));
  /* A 0.9 caller's struct (it ends at nccl_blocking) is a known version. */
  braid_world_options_init(&wo);
  wo.struct_size = offsetof(braid_world_options_t, master_addr);
  wo.read_env = 0;
  EXPECT_OK(braid_world_create(&wo, &world));
  EXPECT_OK(braid_world_destroy(world));
}

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
  check_explicit_fields();
}

/* The same world from an explicit rendezvous, with no launcher variable left. */
static void run_explicit_rank(void) {
  braid_world_options_t wo;
  char dir[256];
  size_t i;
  const char* tmp = getenv("TEST_TMPDIR");
  /* One directory per run: the ranks share MASTER_PORT, a free port run_ranks.sh picked. */
  snprintf(dir, sizeof dir, "%s/capi_launcher_exchange.%s", tmp != NULL ? tmp : "/tmp",
           getenv("MASTER_PORT") != NULL ? getenv("MASTER_PORT") : "none");
  mkdir(dir, 0700);
  braid_world_options_init(&wo);
  wo.timeout_ms = 60000;
  wo.world_size = getenv("WORLD_SIZE") ? env_int("WORLD_SIZE") : env_int("SLURM_NTASKS");
  wo.rank = getenv("RANK") ? env_int("RANK") : env_int("SLURM_PROCID");
  wo.master_addr = "127.0.0.1";
  wo.rendezvous_publish = file_publish;
  wo.rendezvous_lookup = file_lookup;
  wo.rendezvous_data = dir;
  for (i = 0; i < sizeof kLauncherVars / sizeof kLauncherVars[0]; ++i) unsetenv(kLauncherVars[i]);
  run_rank(&wo);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "env") == 0) {
    check_env_rule();
  } else if (argc > 1 && strcmp(argv[1], "explicit") == 0) {
    run_explicit_rank();
  } else {
    run_rank(NULL);
  }
  if (test_failures) {
    fprintf(stderr, "%d check(s) failed\n", test_failures);
    return 1;
  }
  printf("capi_launcher_test: all checks passed\n");
  return 0;
}
