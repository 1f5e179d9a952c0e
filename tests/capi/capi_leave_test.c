/* A C program one of whose ranks returns from main without destroying its world, right after
 * an all-reduce both ranks finished (issue 23 item 3): the other rank's pending all-reduce must
 * fail within 2 s naming the rank that left, and its next call too, through the leave notice
 * libbraid sends at process exit (mpi: the runtime's atexit handler; gloo:
 * backends/gloo/leave_at_exit.h).
 *
 *   capi_leave_test [mpi|gloo] [leaver]   leaver 0 or 1 (default 1); -1: both ranks return
 *                                          after the all-reduce (a normal end, nothing fails)
 *
 * Run by capi_leave_test.sh: under mpirun -np 2 (the leaver exits without MPI_Finalize, so
 * mpirun ends the job with an error whatever happens) or as two processes with torchrun's
 * variables on gloo. The surviving rank's "capi_leave_test: rank R passed" line is the
 * verdict. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  braid_world_options_t o;
  braid_world_t* w = NULL;
  braid_group_t* g = NULL;
  braid_work_t* k = NULL;
  float x[4] = {1, 1, 1, 1};
  int rank = -1, count = 0;
  const int leaver = argc > 2 ? atoi(argv[2]) : 1;
  char left[64];
  double start, took;
  braid_status_t s;
  braid_world_options_init(&o);
  o.backend = argc > 1 ? argv[1] : "mpi";
  o.timeout_ms = 30000;
  EXPECT_OK(braid_world_create(&o, &w));
  EXPECT_OK(braid_world_local_ranks(w, &rank, 1, &count));
  EXPECT_OK(braid_world_group(w, rank, &g));
  EXPECT_OK(braid_allreduce(g, x, x, 4, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &k));
  EXPECT_OK(braid_work_wait(k, -1));
  EXPECT_OK(braid_work_destroy(k));
  EXPECT_TRUE(x[0] == 2.0f);
  if (leaver < 0) {
    if (test_failures == 0) printf("capi_leave_test: rank %d passed (a normal end)\n", rank);
    fflush(stdout);
    return test_finish("capi_leave_test"); /* the world, its group (and MPI) left alive */
  }
  if (rank == leaver) return 0; /* leaves: the world, its group and MPI are never shut down */
  snprintf(left, sizeof left, "rank %d left the job: its process ended", leaver);
  start = now_s();
  EXPECT_OK(braid_allreduce(g, x, x, 4, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &k));
  s = braid_work_wait(k, -1);
  took = now_s() - start;
  printf("rank %d: %s after %.3f s: %s\n", rank, braid_status_name(s), took, braid_last_error());
  EXPECT_TRUE(s == BRAID_PEER_ERROR);
  EXPECT_TRUE(strstr(braid_last_error(), left) != NULL);
  EXPECT_TRUE(took < 2.0);
  EXPECT_OK(braid_work_destroy(k));
  /* The next call is refused (or its work fails) at once, naming the same rank. */
  k = NULL;
  braid_clear_error();
  start = now_s();
  s = braid_allreduce(g, x, x, 4, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &k);
  if (s == BRAID_OK) s = braid_work_wait(k, -1);
  took = now_s() - start;
  printf("rank %d, next call: %s after %.3f s: %s\n", rank, braid_status_name(s), took,
         braid_last_error());
  EXPECT_TRUE(s == BRAID_PEER_ERROR);
  EXPECT_TRUE(strstr(braid_last_error(), left) != NULL);
  EXPECT_TRUE(took < 2.0);
  if (k != NULL) EXPECT_OK(braid_work_destroy(k));
  if (test_failures == 0) printf("capi_leave_test: rank %d passed\n", rank);
  fflush(stdout);
  return test_finish("capi_leave_test");
}
