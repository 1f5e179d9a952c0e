/* braid_optimizer_get_state / braid_optimizer_set_state (0.10) from C99, 2 ranks: local
 * threads, or one rank per process under `mpirun -np 2` (argument "mpi").
 *
 * AdamW over 3 parameters in several buckets (small caps) takes 3 steps; get_state gives every
 * rank the whole state, which must be the inline reference of optim/adamw_math.h bit for bit
 * (master weights, both moments, step counts). A second optimizer over another bucket plan
 * (one bucket, so other shard boundaries) sets that state, gets it back unchanged, holds the
 * reference's parameters and takes step 4 exactly as the reference does. Refused input is
 * named and changes nothing on any rank: a wrong num_values, a NULL entry on one rank only
 * (the other rank fails too instead of waiting), step counts that differ within a bucket, and
 * values == NULL (a caller that refused its own input). Gradients are k/8 (|k| <= 8) and
 * weights k/16, so the average over 2 ranks is exact. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define P 3
#define B 3 /* AdamW's state buffers: master, exp_avg, exp_avg_sq */
#define STEPS 3
static const size_t kCounts[P] = {37, 128, 20};
static const double kLr = 1e-2, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWd = 0.1;

static braid_group_t* world_groups[2];

static float grad(int rank, int t, int i, size_t j) {
  const int k = (int)((rank * 7 + t * 3 + i * 11 + (int)(j % 1000) * 13) % 17) - 8;
  return (float)k / 8.0f;
}

static float initial(int i, size_t j) {
  return (float)((int)((i * 31 + (int)(j % 1000) * 7) % 23) - 11) / 16.0f;
}

/* The reference state after `steps` steps: ref[k * P + i] as get_state lays it out. */
static void reference(int steps, float* ref[B * P]) {
  int i, t;
  size_t j;
  for (i = 0; i < P; ++i) {
    for (j = 0; j < kCounts[i]; ++j) {
      float p = initial(i, j), m = 0.0f, v = 0.0f;
      for (t = 0; t < steps; ++t) {
        const float g = (grad(0, t, i, j) + grad(1, t, i, j)) / 2.0f;
        test_adamw_element(&p, &m, &v, g, t, kLr, kBeta1, kBeta2, kEps, kWd);
      }
      ref[i][j] = p;
      ref[P + i][j] = m;
      ref[2 * P + i][j] = v;
    }
  }
}

static void step(braid_reducer_t* red, braid_optimizer_t* opt, int rank, int t) {
  int i;
  EXPECT_OK(braid_optimizer_begin_backward(opt, BRAID_SYNC));
  for (i = 0; i < P; ++i) {
    float* g = NULL;
    size_t count = 0, j;
    EXPECT_OK(braid_reducer_grad(red, i, (void**)&g, &count));
    for (j = 0; j < count; ++j) g[j] += grad(rank, t, i, j);
    EXPECT_OK(braid_reducer_mark_ready(red, i, NULL));
  }
  EXPECT_OK(braid_optimizer_finish_backward(opt));
  EXPECT_OK(braid_optimizer_wait_all_params(opt));
}

/* A reducer with the given bucket cap and its AdamW optimizer, parameters set to `init`. */
static void build(int rank, size_t cap, float init, braid_reducer_t** red,
                  braid_optimizer_t** opt) {
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_optimizer_options_t oo;
  int i;
  size_t j;
  for (i = 0; i < P; ++i) {
    params[i].id = i;
    params[i].count = kCounts[i];
    params[i].dtype = BRAID_DTYPE_F32;
    params[i].name = NULL;
  }
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.bucket_cap_bytes = cap;
  ro.first_bucket_cap_bytes = cap / 2;
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, red));
  braid_optimizer_options_init(&oo);
  oo.lr = kLr;
  oo.beta1 = kBeta1;
  oo.beta2 = kBeta2;
  oo.eps = kEps;
  oo.weight_decay = kWd;
  oo.timeout_ms = 20000;
  EXPECT_OK(braid_optimizer_create(*red, &oo, opt));
  for (i = 0; i < P; ++i) {
    float values[128];
    for (j = 0; j < kCounts[i]; ++j) values[j] = init != 0.0f ? init : initial(i, j);
    EXPECT_OK(braid_optimizer_set_param(*opt, i, values));
  }
  EXPECT_OK(braid_optimizer_wait_all_params(*opt));
}

/* Every buffer of `a` equals `b` bit for bit; names the first that differs. */
static int same(float* const a[B * P], float* const b[B * P], int rank, const char* when) {
  int k;
  for (k = 0; k < B * P; ++k) {
    if (memcmp(a[k], b[k], kCounts[k % P] * sizeof(float)) != 0) {
      fprintf(stderr, "rank %d, %s: buffer %d of parameter %d differs\n", rank, when, k / P, k % P);
      return 0;
    }
  }
  return 1;
}

static void run(int rank) {
  braid_reducer_t* red = NULL;
  braid_optimizer_t* opt = NULL;
  float* ref[B * P];
  float* got[B * P];
  float* fresh[B * P];
  const float* in[B * P];
  int64_t steps[P] = {-1, -1, -1}, bad_steps[P] = {STEPS, STEPS - 1, STEPS}, count = -1;
  int buckets = 0, i, k, t;

  for (k = 0; k < B * P; ++k) {
    ref[k] = calloc(kCounts[k % P], sizeof(float));
    got[k] = calloc(kCounts[k % P], sizeof(float));
    fresh[k] = calloc(kCounts[k % P], sizeof(float));
  }
  /* Plan A: small caps, several buckets. */
  build(rank, 256, 0.0f, &red, &opt);
  EXPECT_OK(braid_reducer_num_buckets(red, &buckets));
  EXPECT_TRUE(buckets >= 3);
  for (t = 0; t < STEPS; ++t) step(red, opt, rank, t);
  reference(STEPS, ref);
  EXPECT_OK(braid_optimizer_get_state(opt, got, B * P, steps, &count));
  EXPECT_TRUE(same(got, ref, rank, "get_state after 3 steps"));
  for (i = 0; i < P; ++i) EXPECT_TRUE(steps[i] == STEPS);
  EXPECT_TRUE(count == STEPS);
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT,
               "num_values is 2; this optimizer has 3 state buffers x 3 "
               "parameters = 9",
               braid_optimizer_get_state(opt, got, 2, NULL, NULL));
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(red));

  /* Plan B: one bucket (other shard boundaries), parameters all 1 and a fresh state. */
  build(rank, 1 << 20, 1.0f, &red, &opt);
  EXPECT_OK(braid_reducer_num_buckets(red, &buckets));
  EXPECT_TRUE(buckets == 1);
  EXPECT_OK(braid_optimizer_get_state(opt, fresh, B * P, NULL, NULL));
  for (k = 0; k < B * P; ++k) in[k] = got[k];
  in[4] = rank == 0 ? NULL : got[4]; /* only rank 0's input is bad: rank 1 fails with it */
  if (rank == 0) {
    EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "values[4] (exp_avg of id 1) is NULL",
                 braid_optimizer_set_state(opt, in, B * P, steps, STEPS));
  } else {
    EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "1 other rank(s) could not load",
                 braid_optimizer_set_state(opt, in, B * P, steps, STEPS));
  }
  in[4] = got[4];
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION,
               "share bucket 0 of the target plan but were stepped 3 "
               "and 2 times",
               braid_optimizer_set_state(opt, in, B * P, bad_steps, STEPS));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, rank == 1 ? "values is NULL" : "1 other rank(s)",
               braid_optimizer_set_state(opt, rank == 1 ? NULL : in, B * P, steps, STEPS));
  {
    /* Nothing was loaded on any rank. */
    float* now[B * P];
    int64_t zero[P] = {-1, -1, -1};
    for (k = 0; k < B * P; ++k) now[k] = calloc(kCounts[k % P], sizeof(float));
    EXPECT_OK(braid_optimizer_get_state(opt, now, B * P, zero, &count));
    EXPECT_TRUE(same(now, fresh, rank, "after refused set_state calls"));
    EXPECT_TRUE(zero[0] == 0 && zero[1] == 0 && zero[2] == 0 && count == 0);
    for (k = 0; k < B * P; ++k) free(now[k]);
  }

  EXPECT_OK(braid_optimizer_set_state(opt, in, B * P, steps, STEPS));
  memset(steps, 0xff, sizeof steps);
  for (k = 0; k < B * P; ++k) memset(got[k], 0, kCounts[k % P] * sizeof(float));
  EXPECT_OK(braid_optimizer_get_state(opt, got, B * P, steps, &count));
  EXPECT_TRUE(same(got, ref, rank, "get_state after set_state under another plan"));
  EXPECT_TRUE(steps[0] == STEPS && steps[1] == STEPS && steps[2] == STEPS && count == STEPS);
  EXPECT_OK(braid_optimizer_last_step(opt, &count, NULL, NULL));
  EXPECT_TRUE(count == STEPS);
  for (i = 0; i < P; ++i) {
    float* p = NULL;
    size_t n = 0;
    EXPECT_OK(braid_optimizer_param(opt, i, (void**)&p, &n));
    EXPECT_TRUE(n == kCounts[i] && memcmp(p, ref[i], n * sizeof(float)) == 0);
  }
  /* Step 4 continues the reference (bias correction from the loaded step count). */
  step(red, opt, rank, STEPS);
  reference(STEPS + 1, ref);
  EXPECT_OK(braid_optimizer_get_state(opt, got, B * P, NULL, NULL));
  EXPECT_TRUE(same(got, ref, rank, "step 4 after set_state"));
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(red));
  for (k = 0; k < B * P; ++k) {
    free(ref[k]);
    free(got[k]);
    free(fresh[k]);
  }
}

static void* rank_main(void* arg) {
  run(*(const int*)arg);
  return NULL;
}

/* argv[1] == "mpi": one rank of `mpirun -np 2` (tests/run_mpi.sh); else 2 local threads. */
int main(int argc, char** argv) {
  test_run_2_ranks(argc, argv, world_groups, rank_main);
  return test_finish("capi_state_test");
}
