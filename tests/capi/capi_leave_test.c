/* A C program whose rank 1 returns from main without destroying its world, right after an
 * all-reduce both ranks finished (issue 23 item 3): rank 0's pending all-reduce must fail
 * within 2 s naming rank 1, through the leave notice libbraid sends at process exit. Run by
 * capi_leave_test.sh under mpirun -np 2: rank 1 exits without MPI_Finalize, so mpirun ends
 * the job with an error whatever happens; rank 0's "capi_leave_test: rank 0 passed" line is
 * the verdict. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
  braid_world_options_t o;
  braid_world_t* w = NULL;
  braid_group_t* g = NULL;
  braid_work_t* k = NULL;
  float x[4] = {1, 1, 1, 1};
  int rank = -1, count = 0;
  double start, took;
  braid_status_t s;
  braid_world_options_init(&o);
  o.backend = "mpi";
  o.timeout_ms = 30000;
  EXPECT_OK(braid_world_create(&o, &w));
  EXPECT_OK(braid_world_local_ranks(w, &rank, 1, &count));
  EXPECT_OK(braid_world_group(w, rank, &g));
  EXPECT_OK(braid_allreduce(g, x, x, 4, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &k));
  EXPECT_OK(braid_work_wait(k, -1));
  EXPECT_OK(braid_work_destroy(k));
  EXPECT_TRUE(x[0] == 2.0f);
  if (rank == 1) return 0; /* leaves: the world, its group and MPI are never shut down */
  start = now_s();
  EXPECT_OK(braid_allreduce(g, x, x, 4, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &k));
  s = braid_work_wait(k, -1);
  took = now_s() - start;
  printf("rank 0: %s after %.3f s: %s\n", braid_status_name(s), took, braid_last_error());
  EXPECT_TRUE(s == BRAID_PEER_ERROR);
  EXPECT_TRUE(strstr(braid_last_error(), "rank 1 left the job: its process ended") != NULL);
  EXPECT_TRUE(took < 2.0);
  if (test_failures == 0) printf("capi_leave_test: rank 0 passed\n");
  fflush(stdout);
  return test_finish("capi_leave_test");
}
