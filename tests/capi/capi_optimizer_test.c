/* The reducer (reduce-scatter mode) and the sharded AdamW through the C API, on a local world
 * of 2 ranks (2 threads), against an inline C reference of optim/adamw_math.h, bit for bit.
 * Gradients are k/8 (|k| <= 8) and weights k/16, so the average over 2 ranks is exact. Also:
 * save after 3 steps, step 4, load, step 4 again: the same parameters (resume is bit-exact).
 * All of it twice: plainly, then with communication scheduling (0.9: credit_bytes = 64, so
 * every bucket is reduced in 64-byte partitions packed through staging blocks, and priorities,
 * so the optimizer's all-gathers hold partitions back): the same reference, bit for bit. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define P 5
#define STEPS 4
static const size_t kCounts[P] = {37, 128, 5, 300, 17};
static const double kLr = 1e-2, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWd = 0.1;

static braid_group_t* world_groups[2];
static char state_prefix[512];

static float grad(int rank, int t, int i, size_t j) {
  const int k = (int)((rank * 7 + t * 3 + i * 11 + (int)(j % 1000) * 13) % 17) - 8;
  return (float)k / 8.0f;
}

static float initial(int i, size_t j) {
  return (float)((int)((i * 31 + (int)(j % 1000) * 7) % 23) - 11) / 16.0f;
}

/* optim/adamw_math.h, StepScalars + AdamWElement, in C: step scalars in double rounded to
 * float once, then float operations in the same order (built with -ffp-contract=off). */
static void reference(int steps, float* out[P]) {
  int i, t;
  size_t j;
  for (i = 0; i < P; ++i) {
    for (j = 0; j < kCounts[i]; ++j) {
      float p = initial(i, j), m = 0.0f, v = 0.0f;
      for (t = 0; t < steps; ++t) {
        const float g = (grad(0, t, i, j) + grad(1, t, i, j)) / 2.0f;
        test_adamw_element(&p, &m, &v, g, t, kLr, kBeta1, kBeta2, kEps, kWd);
      }
      out[i][j] = p;
    }
  }
}

/* One synced step t: gradients into the bucket views, marked in a rank-dependent order. */
static void run_step(braid_reducer_t* red, braid_optimizer_t* opt, int rank, int t) {
  int n, i;
  EXPECT_OK(braid_optimizer_begin_backward(opt, BRAID_SYNC));
  for (n = 0; n < P; ++n) {
    float* g = NULL;
    size_t count = 0, j;
    i = (n * (rank == 0 ? 2 : 3) + t) % P; /* a permutation of 0..P-1 (P is prime) */
    EXPECT_OK(braid_reducer_grad(red, i, (void**)&g, &count));
    EXPECT_TRUE(count == kCounts[i]);
    for (j = 0; j < count; ++j) g[j] += grad(rank, t, i, j);
    EXPECT_OK(braid_reducer_mark_ready(red, i, NULL));
  }
  EXPECT_OK(braid_optimizer_finish_backward(opt));
  EXPECT_OK(braid_optimizer_wait_all_params(opt));
}

/* The optimizer's parameters against `want` (bit for bit); returns 1 if equal. */
static int params_equal(braid_optimizer_t* opt, float* want[P], int rank, const char* when) {
  int i, ok = 1;
  for (i = 0; i < P; ++i) {
    float* p = NULL;
    size_t count = 0;
    EXPECT_OK(braid_optimizer_param(opt, i, (void**)&p, &count));
    if (p == NULL || count != kCounts[i] || memcmp(p, want[i], count * sizeof(float)) != 0) {
      fprintf(stderr, "rank %d, %s: parameter %d differs from the reference\n", rank, when, i);
      ok = 0;
    }
  }
  return ok;
}

/* braid_memory_stats: host only, the per-use figures add up, the sizes match the model
 * (f32 parameters: buckets hold at least every gradient; AdamW keeps master, m and v of equal
 * size); with_optimizer == 0 after its destroy: its state is freed, its peak remembered. */
static void check_memory(braid_reducer_t* red, int with_optimizer) {
  braid_memory_stats_t m;
  size_t grads = 0;
  int i;
  int64_t sum = 0;
  for (i = 0; i < P; ++i) grads += kCounts[i] * sizeof(float);
  memset(&m, 0xff, sizeof m);
  m.struct_size = sizeof m;
  EXPECT_OK(braid_memory_stats(red, &m));
  EXPECT_TRUE(m.struct_size == sizeof m);
  EXPECT_TRUE(m.device.current == 0 && m.device.peak == 0);
  for (i = 0; i < BRAID_MEMORY_USES; ++i) {
    sum += m.by_use[i].current;
    EXPECT_TRUE(m.by_use[i].peak >= m.by_use[i].current);
  }
  EXPECT_TRUE(sum == m.host.current);
  EXPECT_TRUE(m.by_use[BRAID_MEMORY_GRAD_BUCKETS].current >= (int64_t)grads);
  EXPECT_TRUE(m.host.peak >= m.host.current && m.allocations > 0);
  if (with_optimizer) {
    /* ZeRO-2: the gatherer keeps every full bucket; AdamW three shard-size f32 buffers. */
    EXPECT_TRUE(m.by_use[BRAID_MEMORY_PARAM_GATHER].current >= (int64_t)grads);
    EXPECT_TRUE(m.by_use[BRAID_MEMORY_OPTIMIZER_STATE].current > 0);
    EXPECT_TRUE(m.by_use[BRAID_MEMORY_OPTIMIZER_STATE].current % 3 == 0);
  } else {
    EXPECT_TRUE(m.by_use[BRAID_MEMORY_OPTIMIZER_STATE].current == 0);
    EXPECT_TRUE(m.by_use[BRAID_MEMORY_PARAM_GATHER].current == 0);
    EXPECT_TRUE(m.by_use[BRAID_MEMORY_OPTIMIZER_STATE].peak > 0);
    EXPECT_OK(braid_memory_reset_peaks(red));
    EXPECT_OK(braid_memory_stats(red, &m));
    EXPECT_TRUE(m.by_use[BRAID_MEMORY_OPTIMIZER_STATE].peak == 0);
    EXPECT_TRUE(m.host.peak == m.host.current);
    m.struct_size = 8;
    EXPECT_TRUE(braid_memory_stats(red, &m) == BRAID_INVALID_ARGUMENT);
    EXPECT_TRUE(strstr(braid_last_error(), "struct_size 8 is too small") != NULL);
    EXPECT_TRUE(braid_memory_stats(NULL, &m) == BRAID_INVALID_ARGUMENT);
  }
}

static void run(int rank, int scheduled) {
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_optimizer_options_t oo;
  braid_reducer_t* red = NULL;
  braid_optimizer_t* opt = NULL;
  float* want[P];
  float* after4[P];
  char path[600];
  int i, t, buckets = 0, skipped = -1;
  int64_t rounds = -1;
  double norm = 0;
  size_t j;

  for (i = 0; i < P; ++i) {
    params[i].id = i;
    params[i].count = kCounts[i];
    params[i].dtype = BRAID_DTYPE_F32;
    params[i].name = NULL;
    want[i] = malloc(kCounts[i] * sizeof(float));
    after4[i] = malloc(kCounts[i] * sizeof(float));
  }
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.bucket_cap_bytes = 512;
  ro.first_bucket_cap_bytes = 256;
  ro.timeout_ms = 20000;
  if (scheduled) {
    ro.priorities = 2;
    EXPECT_TRUE(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red) ==
                BRAID_INVALID_ARGUMENT);
    EXPECT_TRUE(strstr(braid_last_error(), "opts->priorities must be 0 or 1, got 2") != NULL);
    ro.priorities = 1;
    ro.credit_bytes = 64;
  }
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  EXPECT_OK(braid_reducer_num_buckets(red, &buckets));
  EXPECT_TRUE(buckets > 2);
  braid_optimizer_options_init(&oo);
  oo.lr = kLr;
  oo.beta1 = kBeta1;
  oo.beta2 = kBeta2;
  oo.eps = kEps;
  oo.weight_decay = kWd;
  oo.timeout_ms = 20000;
  EXPECT_OK(braid_optimizer_create(red, &oo, &opt));
  for (i = 0; i < P; ++i) {
    for (j = 0; j < kCounts[i]; ++j) want[i][j] = initial(i, j);
    EXPECT_OK(braid_optimizer_set_param(opt, i, want[i]));
  }
  EXPECT_OK(braid_optimizer_wait_all_params(opt));
  EXPECT_TRUE(params_equal(opt, want, rank, "initial"));

  snprintf(path, sizeof path, "%s.rank%d.state", state_prefix, rank);
  for (t = 0; t < STEPS; ++t) {
    if (t == 3) EXPECT_OK(braid_optimizer_save(opt, path));
    run_step(red, opt, rank, t);
    reference(t + 1, want);
    if (!params_equal(opt, want, rank, "after a step")) break;
  }
  EXPECT_OK(braid_optimizer_last_step(opt, &rounds, &skipped, &norm));
  EXPECT_TRUE(rounds == STEPS && skipped == 0);

  /* Resume: back to the state after 3 steps, step 4 again. */
  for (i = 0; i < P; ++i) memcpy(after4[i], want[i], kCounts[i] * sizeof(float));
  EXPECT_OK(braid_optimizer_load(opt, path));
  run_step(red, opt, rank, 3);
  EXPECT_TRUE(params_equal(opt, after4, rank, "resumed step 4"));

  check_memory(red, 1);
  {
    /* Reduce-scatter partitions are packed into staging blocks of at most credit_bytes: used
     * only when scheduled (the plain path stages nothing on the host here). */
    braid_memory_stats_t m;
    m.struct_size = sizeof m;
    EXPECT_OK(braid_memory_stats(red, &m));
    if (scheduled) {
      EXPECT_TRUE(m.by_use[BRAID_MEMORY_STAGING].peak >= 64);
    } else {
      EXPECT_TRUE(m.by_use[BRAID_MEMORY_STAGING].peak == 0);
    }
  }
  EXPECT_OK(braid_optimizer_destroy(opt));
  check_memory(red, 0);
  EXPECT_OK(braid_reducer_destroy(red));
  for (i = 0; i < P; ++i) {
    free(want[i]);
    free(after4[i]);
  }
  remove(path);
}

static void* rank_main(void* arg) {
  const int rank = *(const int*)arg;
  run(rank, 0);
  run(rank, 1);
  return NULL;
}

/* argv[1] == "mpi": one rank of `mpirun -np 2` (tests/run_mpi.sh); else 2 local threads. */
int main(int argc, char** argv) {
  const char* tmp = getenv("TEST_TMPDIR");
  snprintf(state_prefix, sizeof state_prefix, "%s/capi_optimizer", tmp != NULL ? tmp : "/tmp");
  test_run_2_ranks(argc, argv, world_groups, rank_main);
  return test_finish("capi_optimizer_test");
}
