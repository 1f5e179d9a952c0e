/* The C API from C99: version query, and a local world of 2 ranks driven by 2 threads
 * (collectives block on their peers, so each rank needs its own thread): every collective,
 * split and mesh, works polled and waited. With argument "mpi": the same, one rank per process
 * under `mpirun -np 2`. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define N 1000

static braid_group_t* world_groups[2];

static void test_version(void) {
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", BRAID_VERSION_MAJOR, BRAID_VERSION_MINOR,
           BRAID_VERSION_PATCH);
  EXPECT_TRUE(strcmp(braid_version(), want) == 0);
  EXPECT_TRUE(braid_abi_version() == BRAID_ABI_VERSION);
  EXPECT_TRUE(strcmp(braid_status_name(BRAID_OK), "BRAID_OK") == 0);
  EXPECT_TRUE(strcmp(braid_status_name(BRAID_PEER_ERROR), "BRAID_PEER_ERROR") == 0);
  EXPECT_TRUE(strcmp(braid_status_name((braid_status_t)99), "BRAID_UNKNOWN_STATUS") == 0);
  EXPECT_TRUE(braid_dtype_size(BRAID_DTYPE_BF16) == 2 && braid_dtype_size(BRAID_DTYPE_I64) == 8);
  EXPECT_TRUE(braid_dtype_size((braid_dtype_t)42) == 0);
}

/* Waits by polling braid_work_test (then braid_work_wait), and destroys the work. */
static void finish(braid_work_t* w) {
  int done = 0;
  braid_status_t s;
  while ((s = braid_work_test(w, &done)) == BRAID_IN_PROGRESS) EXPECT_TRUE(done == 0);
  EXPECT_TRUE(s == BRAID_OK && done == 1);
  EXPECT_OK(braid_work_wait(w, 0));
  EXPECT_OK(braid_work_destroy(w));
}

static void* rank_main(void* arg) {
  const int rank = *(const int*)arg;
  braid_group_t* g = world_groups[rank];
  static float in[2][2 * N];
  float out[2 * N];
  braid_work_t* w = NULL;
  braid_collective_options_t co;
  braid_group_t *solo = NULL, *shard = NULL, *replica = NULL;
  int i, r = -1, size = -1;
  const char* name = NULL;

  EXPECT_OK(braid_group_rank(g, &r));
  EXPECT_OK(braid_group_size(g, &size));
  EXPECT_OK(braid_group_name(g, &name));
  EXPECT_TRUE(r == rank && size == 2 && name != NULL && strcmp(name, "world") == 0);
  for (i = 0; i < 2 * N; ++i) in[rank][i] = (float)(rank + 1) * (float)(i % 7);

  /* allreduce sum, out of place, then in place with avg */
  EXPECT_OK(braid_allreduce(g, in[rank], out, N, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &w));
  EXPECT_OK(braid_work_wait(w, 20000));
  EXPECT_OK(braid_work_destroy(w));
  for (i = 0; i < N; ++i) EXPECT_TRUE(out[i] == 3.0f * (float)(i % 7));
  memcpy(out, in[rank], sizeof(float) * N);
  EXPECT_OK(braid_allreduce(g, out, out, N, BRAID_DTYPE_F32, BRAID_OP_AVG, NULL, &w));
  finish(w);
  for (i = 0; i < N; ++i) EXPECT_TRUE(out[i] == 1.5f * (float)(i % 7));

  /* premul_sum: rank r scales by (r + 1) / 4 */
  braid_collective_options_init(&co);
  co.premul_scalar = (rank + 1) / 4.0;
  co.label = "premul";
  EXPECT_OK(braid_allreduce(g, in[rank], out, N, BRAID_DTYPE_F32, BRAID_OP_PREMUL_SUM, &co, &w));
  finish(w);
  for (i = 0; i < N; ++i) EXPECT_TRUE(out[i] == 1.25f * (float)(i % 7));

  /* reduce_scatter: rank r gets block r of the sum; allgather puts it back together */
  EXPECT_OK(braid_reduce_scatter(g, in[rank], out, N, BRAID_DTYPE_F32, BRAID_OP_MAX, NULL, &w));
  finish(w);
  for (i = 0; i < N; ++i) EXPECT_TRUE(out[i] == 2.0f * (float)((rank * N + i) % 7));
  {
    float gathered[2 * N];
    EXPECT_OK(braid_allgather(g, out, gathered, N, BRAID_DTYPE_F32, NULL, &w));
    finish(w);
    for (i = 0; i < 2 * N; ++i) EXPECT_TRUE(gathered[i] == 2.0f * (float)(i % 7));
  }

  /* broadcast from rank 1, then a barrier */
  memcpy(out, in[rank], sizeof(float) * N);
  EXPECT_OK(braid_broadcast(g, out, N, BRAID_DTYPE_F32, 1, NULL, &w));
  finish(w);
  for (i = 0; i < N; ++i) EXPECT_TRUE(out[i] == 2.0f * (float)(i % 7));
  EXPECT_OK(braid_barrier(g, NULL, &w));
  finish(w);

  /* split: one group per rank; rank 1 joins none */
  EXPECT_OK(braid_group_split(g, rank == 0 ? 0 : BRAID_NO_COLOR, 0, "solo", &solo));
  EXPECT_TRUE((rank == 0) == (solo != NULL));
  if (solo != NULL) {
    EXPECT_OK(braid_group_size(solo, &size));
    EXPECT_OK(braid_group_name(solo, &name));
    EXPECT_TRUE(size == 1 && strcmp(name, "solo") == 0);
    EXPECT_OK(braid_group_destroy(solo));
  }

  /* mesh: 1 replica x 2 shards */
  EXPECT_OK(braid_mesh_create(g, 1, 2, &shard, &replica));
  EXPECT_OK(braid_group_size(shard, &size));
  EXPECT_TRUE(size == 2);
  EXPECT_OK(braid_group_size(replica, &size));
  EXPECT_TRUE(size == 1);
  EXPECT_OK(braid_group_destroy(shard));
  EXPECT_OK(braid_group_destroy(replica));
  return NULL;
}

static void test_local_world_queries(void) {
  braid_group_t* groups[2];
  int local[4] = {-1, -1, -1, -1}, count = 0, size = 0, r;
  braid_world_t* world = test_local_world(2, groups);
  EXPECT_OK(braid_world_size(world, &size));
  EXPECT_OK(braid_world_local_ranks(world, NULL, 0, &count));
  EXPECT_TRUE(size == 2 && count == 2);
  EXPECT_OK(braid_world_local_ranks(world, local, 4, &count));
  EXPECT_TRUE(local[0] == 0 && local[1] == 1 && local[2] == -1);
  for (r = 0; r < 2; ++r) EXPECT_OK(braid_group_destroy(groups[r]));
  EXPECT_OK(braid_world_destroy(world));
}

/* argv[1] == "mpi": one rank of `mpirun -np 2` (tests/run_mpi.sh); else 2 local threads. */
int main(int argc, char** argv) {
  test_version();
  if (argc < 2) test_local_world_queries();
  test_run_2_ranks(argc, argv, world_groups, rank_main);
  return test_finish("capi_test");
}
