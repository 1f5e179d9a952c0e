/* Braid from C99: a local world of 2 ranks (threads of this process), one all-reduce each. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>

#include "braid.h" /* the SDK's include/ (pkg-config, CMake); capi/ in this tree */

static braid_group_t* groups[2];
static int failed = 0;

static void* rank_main(void* arg) {
  const int rank = *(const int*)arg;
  float grad[4] = {1.0f * rank, 2.0f, 3.0f, 4.0f};
  braid_work_t* work = NULL;
  if (braid_allreduce(groups[rank], grad, grad, 4, BRAID_DTYPE_F32, BRAID_OP_AVG, NULL, &work) !=
          BRAID_OK ||
      braid_work_wait(work, 10000) != BRAID_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, braid_last_error());
    failed = 1;
  }
  printf("rank %d: avg = [%g %g %g %g]\n", rank, grad[0], grad[1], grad[2], grad[3]);
  braid_work_destroy(work);
  return NULL;
}

int main(void) {
  braid_world_options_t opts;
  braid_world_t* world = NULL;
  pthread_t threads[2];
  int ranks[2] = {0, 1}, r;
  braid_world_options_init(&opts);
  opts.backend = "local";
  opts.local_ranks = 2;
  if (braid_world_create(&opts, &world) != BRAID_OK) {
    fprintf(stderr, "%s\n", braid_last_error());
    return 1;
  }
  for (r = 0; r < 2; ++r) braid_world_group(world, r, &groups[r]);
  for (r = 0; r < 2; ++r) pthread_create(&threads[r], NULL, rank_main, &ranks[r]);
  for (r = 0; r < 2; ++r) pthread_join(threads[r], NULL);
  for (r = 0; r < 2; ++r) braid_group_destroy(groups[r]);
  braid_world_destroy(world);
  printf("braid %s: %s\n", braid_version(), failed ? "FAILED" : "ok");
  return failed;
}
