/* braid_reducer_set_comm_hook (0.11) from C99, 2 ranks: local threads, or one rank per process
 * under `mpirun -np 2` (argument "mpi").
 *
 * Rank r's gradients are (r + 1) * 2049: with BRAID_COMM_HOOK_FP16 each is rounded to f16
 * (2049 -> 2048, 4098 -> 4096: ties to even), halved and summed: 3072 exactly, where the
 * default path gives the true average 3073.5 (and does again once the hook is removed). Bad
 * options are named; ranks that register different hooks both fail, naming each rank's.
 * BRAID_COMM_HOOK_POWERSGD with every parameter one row (1 x count, rank 1, worth compressing
 * at min_compression_rate 0.5): P normalizes to +-1, so P Q^T is the exact average, 3073.5,
 * on the uncompressed first step and on the compressed ones after it (error feedback 0). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define P 3

static braid_group_t* world_groups[2];
static const size_t kCounts[P] = {3, 5, 2};

/* One synced backward; every averaged gradient must equal `want`. */
static void step(braid_reducer_t* red, int rank, float want) {
  int i;
  size_t k, count = 0;
  float* g = NULL;
  EXPECT_OK(braid_reducer_zero_grads(red));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  for (i = 0; i < P; ++i) {
    EXPECT_OK(braid_reducer_grad(red, 100 + i, (void**)&g, &count));
    for (k = 0; k < count; ++k) g[k] = (float)((rank + 1) * 2049);
    EXPECT_OK(braid_reducer_mark_ready(red, 100 + i, NULL));
  }
  EXPECT_OK(braid_reducer_finish_backward(red));
  for (i = 0; i < P; ++i) {
    EXPECT_OK(braid_reducer_grad(red, 100 + i, (void**)&g, &count));
    for (k = 0; k < count; ++k) {
      if (g[k] != want) {
        char d[128];
        snprintf(d, sizeof d, "parameter %d element %d: %g, want %g", i, (int)k, (double)g[k],
                 (double)want);
        test_fail(__FILE__, __LINE__, "averaged gradient", d);
        return;
      }
    }
  }
}

static void* rank_main(void* arg) {
  const int rank = *(const int*)arg;
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_comm_hook_options_t h;
  braid_reducer_t* red = NULL;
  int i;
  for (i = 0; i < P; ++i) {
    params[i].id = 100 + i;
    params[i].count = kCounts[i];
    params[i].dtype = BRAID_DTYPE_F32;
    params[i].name = NULL;
  }
  braid_reducer_options_init(&ro);
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));

  braid_comm_hook_options_init(&h);
  EXPECT_TRUE(h.kind == BRAID_COMM_HOOK_NONE && h.replica_only == 0 && h.block == 256);
  h.kind = BRAID_COMM_HOOK_FP16;
  EXPECT_OK(braid_reducer_set_comm_hook(red, &h));
  step(red, rank, 3072.0f);
  step(red, rank, 3072.0f);                          /* the hook's buffers reused */
  EXPECT_OK(braid_reducer_set_comm_hook(red, NULL)); /* NULL: none */
  step(red, rank, 3073.5f);

  /* Local refusals (every rank alike: nothing collective runs). */
  h.kind = 9;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "kind is 9", braid_reducer_set_comm_hook(red, &h));
  h.kind = BRAID_COMM_HOOK_INT8;
  h.block = 0;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "block is 0", braid_reducer_set_comm_hook(red, &h));
  h.block = 64;
  h.replica_only = 1;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "hybrid", braid_reducer_set_comm_hook(red, &h));
  /* Different hooks across ranks: both fail, naming each rank's. */
  h.replica_only = 0;
  h.kind = rank == 0 ? BRAID_COMM_HOOK_BF16 : BRAID_COMM_HOOK_FP16;
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "'bf16_compress' on rank 0, 'fp16_compress' on rank 1",
               braid_reducer_set_comm_hook(red, &h));
  step(red, rank, 3073.5f); /* nothing was registered */

  /* join's divide by the contributing ranks cannot go through a hook (it averages over the
   * group's size): refused by name, and no hook while a join is open. */
  {
    braid_join_options_t jo;
    braid_join_options_init(&jo);
    jo.divide_by_initial_world_size = 0;
    h.kind = BRAID_COMM_HOOK_FP16;
    EXPECT_OK(braid_reducer_set_comm_hook(red, &h));
    EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "comm hook 'fp16_compress'",
                 braid_join_begin(red, &jo));
    EXPECT_OK(braid_reducer_set_comm_hook(red, NULL));
    EXPECT_OK(braid_join_begin(red, &jo));
    EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "a join is open", braid_reducer_set_comm_hook(red, &h));
    EXPECT_OK(braid_join_abort(red));
  }

  {
    const int64_t rows[P] = {1, 1, 1}, bad_rows[P] = {2, 1, 1};
    braid_comm_hook_options_init(&h);
    EXPECT_TRUE(h.matrix_approximation_rank == 1 && h.start_powerSGD_iter == 1000 &&
                h.use_error_feedback == 1 && h.warm_start == 1 && h.min_compression_rate == 2.0 &&
                h.orthogonalization_epsilon == 0.0 && h.random_seed == 0 && h.param_rows == NULL);
    h.kind = BRAID_COMM_HOOK_POWERSGD;
    h.param_rows = bad_rows;
    h.num_param_rows = P;
    EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "id 100", braid_reducer_set_comm_hook(red, &h));
    h.num_param_rows = 2;
    EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "rows has 2 entries for 3 parameters",
                 braid_reducer_set_comm_hook(red, &h));
    h.param_rows = rows;
    h.num_param_rows = P;
    h.matrix_approximation_rank = 0;
    EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "matrix_approximation_rank 0",
                 braid_reducer_set_comm_hook(red, &h));
    h.matrix_approximation_rank = 1;
    h.start_powerSGD_iter = 1;
    h.min_compression_rate = 0.5;
    EXPECT_OK(braid_reducer_set_comm_hook(red, &h));
    step(red, rank, 3073.5f); /* uncompressed: 1024.5 + 2049 */
    step(red, rank, 3073.5f); /* compressed */
    step(red, rank, 3073.5f); /* with the (zero-sum) error feedback */
    EXPECT_OK(braid_reducer_set_comm_hook(red, NULL));
  }
  { /* since 0.11: the hook's checkpoint state (exactness: tests/hook_state_test.cc) */
    size_t n = 99, m = 0;
    unsigned char buf[4096];
    EXPECT_OK(braid_reducer_comm_hook_state(red, NULL, 0, &n)); /* no hook: no state */
    EXPECT_TRUE(n == 0);
    EXPECT_OK(braid_reducer_comm_hook_load_state(red, NULL, 0));
    EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "no comm hook",
                 braid_reducer_comm_hook_load_state(red, "x", 1));
    braid_comm_hook_options_init(&h);
    h.kind = BRAID_COMM_HOOK_INT8;
    EXPECT_OK(braid_reducer_set_comm_hook(red, &h));
    EXPECT_OK(braid_reducer_comm_hook_state(red, NULL, 0, &n));
    EXPECT_TRUE(n > 0 && n < sizeof buf);
    EXPECT_ERROR(BRAID_OUT_OF_RANGE, "capacity is 1",
                 braid_reducer_comm_hook_state(red, buf, 1, &m));
    EXPECT_OK(braid_reducer_comm_hook_state(red, buf, sizeof buf, &m));
    EXPECT_TRUE(m == n);
    EXPECT_OK(braid_reducer_comm_hook_load_state(red, buf, m));
    EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "not a Braid comm hook state",
                 braid_reducer_comm_hook_load_state(red, "junk", 4));
    h.kind = BRAID_COMM_HOOK_FP16; /* stateless: refuses int8's state by name */
    EXPECT_OK(braid_reducer_set_comm_hook(red, &h));
    EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "'fp16_compress' comm hook keeps no state",
                 braid_reducer_comm_hook_load_state(red, buf, m));
    EXPECT_OK(braid_reducer_set_comm_hook(red, NULL));
  }
  EXPECT_OK(braid_reducer_destroy(red));
  return NULL;
}

int main(int argc, char** argv) {
  test_run_2_ranks(argc, argv, world_groups, rank_main);
  return test_finish("capi_comm_hook_test");
}
