/* The used-map agreement of the C API (0.11: agree_unused, braid_reducer_declare_unused,
 * braid_reducer_param_used) from C99, 2 ranks on local threads.
 *
 * Four parameters. Rank 0 uses 0 and 1, rank 1 uses 1 and 2; nobody uses 3. Declared: each rank
 * declares the others before its first mark; at finish: nothing is declared. Either way the
 * agreed map is {1, 1, 1, 0} on both ranks and the gradients are the average with zeros from
 * the rank that did not use a parameter. static_graph keeps the first step's map when the
 * second step's use differs. Bad calls are named. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define P 4

static braid_group_t* world_groups[2];
static const size_t kCounts[P] = {3, 5, 2, 4};

static int uses(int rank, int step, int i) {
  if (step == 1) return i == 3; /* step 1: only parameter 3, on both ranks */
  return rank == 0 ? (i == 0 || i == 1) : (i == 1 || i == 2);
}

static braid_reducer_t* make(int rank, int agree, int static_graph) {
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  int i;
  for (i = 0; i < P; ++i) {
    params[i].id = 100 + i;
    params[i].count = kCounts[i];
    params[i].dtype = BRAID_DTYPE_F32;
    params[i].name = NULL;
  }
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_ALLREDUCE;
  ro.bucket_cap_bytes = 16;
  ro.first_bucket_cap_bytes = 8;
  ro.timeout_ms = 20000;
  ro.agree_unused = agree;
  ro.static_graph = static_graph;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  return red;
}

static void step(braid_reducer_t* red, int rank, int s, int agree) {
  int64_t unused[P];
  size_t n = 0, k, count = 0;
  int i;
  float* g = NULL;
  EXPECT_OK(braid_reducer_zero_grads(red));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  for (i = 0; i < P; ++i) {
    if (!uses(rank, s, i)) unused[n++] = 100 + i;
  }
  if (agree == BRAID_UNUSED_DECLARED) EXPECT_OK(braid_reducer_declare_unused(red, unused, n));
  for (i = P - 1; i >= 0; --i) {
    if (!uses(rank, s, i)) continue;
    EXPECT_OK(braid_reducer_grad(red, 100 + i, (void**)&g, &count));
    for (k = 0; k < count; ++k) g[k] = (float)((rank + 1) * (i + 1));
    EXPECT_OK(braid_reducer_mark_ready(red, 100 + i, NULL));
  }
  EXPECT_OK(braid_reducer_finish_backward(red));
}

static void check(braid_reducer_t* red, int s, const int* want_used) {
  int i, used = -1;
  size_t k, count = 0;
  float* g = NULL;
  for (i = 0; i < P; ++i) {
    float want = 0.0f;
    int r;
    for (r = 0; r < 2; ++r) want += uses(r, s, i) ? (float)((r + 1) * (i + 1)) : 0.0f;
    want /= 2.0f;
    EXPECT_OK(braid_reducer_param_used(red, 100 + i, &used));
    if (used != want_used[i]) {
      char d[96];
      snprintf(d, sizeof d, "step %d parameter %d: used %d, want %d", s, i, used, want_used[i]);
      test_fail(__FILE__, __LINE__, "agreed map", d);
    }
    EXPECT_OK(braid_reducer_grad(red, 100 + i, (void**)&g, &count));
    for (k = 0; k < count; ++k) EXPECT_TRUE(g[k] == want);
  }
}

static void* rank_main(void* arg) {
  const int rank = *(const int*)arg;
  static const int kMap0[P] = {1, 1, 1, 0}, kMap1[P] = {0, 0, 0, 1};
  braid_reducer_t* red;
  int agree, used = -1;
  int64_t id = 100;
  for (agree = BRAID_UNUSED_AT_FINISH; agree <= BRAID_UNUSED_DECLARED; ++agree) {
    red = make(rank, agree, 0);
    step(red, rank, 0, agree);
    check(red, 0, kMap0);
    step(red, rank, 1, agree);
    check(red, 1, kMap1);
    EXPECT_OK(braid_reducer_destroy(red));
  }
  red = make(rank, BRAID_UNUSED_DECLARED, 1); /* static_graph: the first map stays */
  step(red, rank, 0, BRAID_UNUSED_DECLARED);
  step(red, rank, 1, BRAID_UNUSED_DECLARED);
  EXPECT_OK(braid_reducer_param_used(red, 103, &used));
  EXPECT_TRUE(used == 0);
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "before braid_reducer_declare_unused",
               braid_reducer_mark_ready(red, 100, NULL));
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "ids", braid_reducer_declare_unused(red, NULL, 1));
  EXPECT_ERROR(BRAID_NOT_FOUND, "unknown parameter id 7",
               (id = 7, braid_reducer_declare_unused(red, &id, 1)));
  EXPECT_OK(braid_reducer_declare_unused(red, NULL, 0));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "twice", braid_reducer_declare_unused(red, NULL, 0));
  for (id = 100; id < 100 + P; ++id) EXPECT_OK(braid_reducer_mark_ready(red, id, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red));
  EXPECT_ERROR(BRAID_NOT_FOUND, "99", braid_reducer_param_used(red, 99, &used));
  EXPECT_OK(braid_reducer_destroy(red));
  {
    braid_reducer_options_t ro;
    braid_reducer_t* bad = NULL;
    braid_param_t p = {100, 3, BRAID_DTYPE_F32, NULL};
    braid_reducer_options_init(&ro);
    ro.agree_unused = BRAID_UNUSED_DECLARED_AT_FINISH + 1;
    EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "agree_unused",
                 braid_reducer_create(world_groups[rank], NULL, &p, 1, &ro, &bad));
  }
  return NULL;
}

int main(int argc, char** argv) {
  test_run_2_ranks(argc, argv, world_groups, rank_main);
  return test_finish("capi_unused_test");
}
