/* braid_reducer_rebuild_buckets (torch DDP's one-time bucket rebuild) from C99, 2 ranks: local
 * threads, or one rank per process under `mpirun -np 2` (argument "mpi").
 *
 * Six parameters, one per bucket, registered 0..5: the initial plan is reverse registration
 * (parameter 5 in bucket 0). Each rank marks them in its own order in the first synced
 * backward; the rebuild adopts world rank 0's (2, 0, 4, 1, 5, 3): parameter 2 lands in bucket
 * 0. The averaged gradients move with their parameters; a second step reduces right in the
 * new buckets; a second rebuild does nothing. Bad calls are named: during a backward, with an
 * optimizer built on the reducer, on a shard_gradients reducer.
 *
 * braid_reducer_autotune on simulated step times that fall with the number of buckets (rank 1
 * reports half of rank 0's time, so only the all-reduced maximum keeps the ranks in step): it
 * settles within 300 steps on caps giving one bucket per parameter, re-plans the buckets on the
 * way (gradient values move with them) and then stays local and settled. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define P 6

static braid_group_t* world_groups[2];
static const size_t kCounts[P] = {3, 5, 2, 7, 4, 6};
static const int kOrder[2][P] = {{2, 0, 4, 1, 5, 3}, {5, 4, 3, 2, 1, 0}};

static void make_params(braid_param_t* params) {
  int i;
  for (i = 0; i < P; ++i) {
    params[i].id = 100 + i;
    params[i].count = kCounts[i];
    params[i].dtype = BRAID_DTYPE_F32;
    params[i].name = NULL;
  }
}

/* Rank r's gradient of parameter i in step t: (r + 1) * (t + 1) * (10 i + k + 1). */
static float grad_value(int rank, int t, int i, size_t k) {
  return (float)((rank + 1) * (t + 1)) * (float)(10 * i + (int)k + 1);
}

/* One synced backward: every gradient written into its bucket view, marked in `order`. */
static void step(braid_reducer_t* red, int rank, int t, const int* order) {
  int j;
  size_t k, count = 0;
  float* g = NULL;
  EXPECT_OK(braid_reducer_zero_grads(red));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  for (j = 0; j < P; ++j) {
    const int i = order[j];
    EXPECT_OK(braid_reducer_grad(red, 100 + i, (void**)&g, &count));
    EXPECT_TRUE(count == kCounts[i]);
    for (k = 0; k < count; ++k) g[k] = grad_value(rank, t, i, k);
    EXPECT_OK(braid_reducer_mark_ready(red, 100 + i, NULL));
  }
  EXPECT_OK(braid_reducer_finish_backward(red));
}

/* The average of both ranks' gradients of step t: 1.5 * (t + 1) * (10 i + k + 1), exact. */
static void check_grads(braid_reducer_t* red, int t) {
  int i;
  size_t k, count = 0;
  float* g = NULL;
  for (i = 0; i < P; ++i) {
    EXPECT_OK(braid_reducer_grad(red, 100 + i, (void**)&g, &count));
    EXPECT_TRUE(count == kCounts[i]);
    for (k = 0; k < count; ++k) {
      if (g[k] != 1.5f * (float)(t + 1) * (float)(10 * i + (int)k + 1)) {
        char d[128];
        snprintf(d, sizeof d, "step %d parameter %d element %d: %g", t, i, (int)k, (double)g[k]);
        test_fail(__FILE__, __LINE__, "averaged gradient", d);
        break;
      }
    }
  }
}

/* The autotuner: 6 parameters of 8-28 KB, default caps 32 KiB (first 16 KiB). */
static void autotune(int rank) {
  static const size_t kBig[P] = {3000, 5000, 2000, 7000, 4000, 6000};
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  int i, t, buckets = 0, replanned = 0, done = 0, replans = 0, settled_at = -1;
  make_params(params);
  for (i = 0; i < P; ++i) params[i].count = kBig[i];
  braid_reducer_options_init(&ro);
  ro.bucket_cap_bytes = 32768;
  ro.first_bucket_cap_bytes = 16384;
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  EXPECT_OK(braid_reducer_num_buckets(red, &buckets));
  EXPECT_TRUE(buckets < P);
  for (t = 0; t < 300 && !done; ++t) {
    int j;
    size_t k, count = 0;
    float* g = NULL;
    double seconds;
    EXPECT_OK(braid_reducer_zero_grads(red));
    EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
    for (j = 0; j < P; ++j) {
      EXPECT_OK(braid_reducer_grad(red, 100 + j, (void**)&g, &count));
      for (k = 0; k < count; ++k) g[k] = (float)((rank + 1) * (t + 1) + j);
      EXPECT_OK(braid_reducer_mark_ready(red, 100 + j, NULL));
    }
    EXPECT_OK(braid_reducer_finish_backward(red));
    EXPECT_OK(braid_reducer_num_buckets(red, &buckets));
    seconds = 0.010 - 0.001 * buckets;
    EXPECT_OK(braid_reducer_autotune(red, rank == 0 ? seconds : seconds / 2, &replanned, &done));
    replans += replanned;
    /* Re-planned or not, every gradient holds this step's average (1.5 (t + 1) + j). */
    for (j = 0; j < P; ++j) {
      EXPECT_OK(braid_reducer_grad(red, 100 + j, (void**)&g, &count));
      EXPECT_TRUE(count == kBig[j]);
      EXPECT_TRUE(g[0] == 1.5f * (float)(t + 1) + (float)j && g[count - 1] == g[0]);
    }
    if (done) settled_at = t;
  }
  EXPECT_TRUE(done == 1 && settled_at > 10);
  /* Round-robin trials re-plan between steps (8 and 16 KiB give the 4 KiB plan: no re-plan). */
  EXPECT_TRUE(replans >= 2);
  EXPECT_OK(braid_reducer_num_buckets(red, &buckets));
  EXPECT_TRUE(buckets == P); /* the fastest simulated configuration */
  EXPECT_OK(braid_reducer_autotune(red, 1.0, &replanned, &done)); /* settled: local, no-op */
  EXPECT_TRUE(replanned == 0 && done == 1);
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "backward is in progress",
               (braid_reducer_begin_backward(red, BRAID_NO_SYNC),
                braid_reducer_autotune(red, 1.0, NULL, NULL)));
  for (i = 0; i < P; ++i) EXPECT_OK(braid_reducer_mark_ready(red, 100 + i, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red));
  EXPECT_OK(braid_reducer_destroy(red));
}

/* ZeRO-2 under re-plans (0.9): AdamW's state (master weights, moments, step counts) follows the
 * buckets through a rebuild and through the autotuner's re-plans. AdamW is elementwise, so the
 * parameters after T steps are the ones of a run that never re-planned, bit for bit. */
enum { kPlain = 0, kRebuild = 1, kAutotune = 2 };
static const size_t kOptCounts[P] = {3000, 5000, 2000, 7000, 4000, 6000};

static float opt_grad(int rank, int t, int i, size_t k) {
  return (float)((rank * 7 + t * 3 + i * 11 + (int)(k % 1000) * 13) % 17 - 8) / 8.0f;
}

/* Runs `steps` steps (kAutotune: until the tuner settles; *steps is then how many) and leaves
 * the parameters in out[i]. */
static void opt_run(int rank, int how, int* steps, float* out[P]) {
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  braid_optimizer_t* opt = NULL;
  int i, j, t, buckets = 0, rebuilt = 0, replanned = 0, done = 0, replans = 0;
  size_t k, count = 0;
  float* v = NULL;
  make_params(params);
  for (i = 0; i < P; ++i) params[i].count = kOptCounts[i];
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.bucket_cap_bytes = how == kRebuild ? 1 : 32768;
  ro.first_bucket_cap_bytes = how == kRebuild ? 1 : 16384;
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  EXPECT_OK(braid_optimizer_create(red, NULL, &opt));
  for (i = 0; i < P; ++i) {
    float* init = malloc(kOptCounts[i] * sizeof(float));
    for (k = 0; k < kOptCounts[i]; ++k)
      init[k] = (float)((int)((i * 31 + (int)k * 7) % 23) - 11) / 16.0f;
    EXPECT_OK(braid_optimizer_set_param(opt, 100 + i, init));
    free(init);
  }
  for (t = 0; how == kAutotune ? (t < 300 && !done) : t < *steps; ++t) {
    EXPECT_OK(braid_optimizer_begin_backward(opt, BRAID_SYNC));
    for (j = 0; j < P; ++j) {
      const int pi = kOrder[rank][j];
      EXPECT_OK(braid_reducer_grad(red, 100 + pi, (void**)&v, &count));
      for (k = 0; k < count; ++k) v[k] = opt_grad(rank, t, pi, k);
      EXPECT_OK(braid_reducer_mark_ready(red, 100 + pi, NULL));
    }
    EXPECT_OK(braid_optimizer_finish_backward(opt));
    if (how == kRebuild && t == 0) {
      EXPECT_OK(braid_reducer_rebuild_buckets(red, &rebuilt));
      EXPECT_TRUE(rebuilt == 1);
      EXPECT_OK(braid_reducer_param_bucket(red, 100 + kOrder[0][0], &i));
      EXPECT_TRUE(i == 0); /* world rank 0's first mark leads the new plan */
    }
    if (how == kAutotune) {
      void* before = NULL;
      void* after = NULL;
      EXPECT_OK(braid_optimizer_param(opt, 100, &before, &count));
      EXPECT_OK(braid_reducer_num_buckets(red, &buckets));
      EXPECT_OK(braid_reducer_autotune(red, 0.010 - 0.001 * buckets, &replanned, &done));
      replans += replanned;
      /* replanned == 0 promises that every pointer is still the one fetched before. */
      EXPECT_OK(braid_optimizer_param(opt, 100, &after, &count));
      EXPECT_TRUE(replanned == 1 || after == before);
    }
  }
  if (how == kAutotune) {
    EXPECT_TRUE(done == 1 && replans >= 2);
    *steps = t;
  }
  EXPECT_OK(braid_optimizer_wait_all_params(opt));
  for (i = 0; i < P; ++i) {
    EXPECT_OK(braid_optimizer_param(opt, 100 + i, (void**)&v, &count));
    EXPECT_TRUE(count == kOptCounts[i]);
    memcpy(out[i], v, kOptCounts[i] * sizeof(float));
  }
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(red));
}

static void optimizer_carried(int rank) {
  float *got[P], *want[P];
  int i, how, steps;
  for (i = 0; i < P; ++i) {
    got[i] = malloc(kOptCounts[i] * sizeof(float));
    want[i] = malloc(kOptCounts[i] * sizeof(float));
  }
  for (how = kRebuild; how <= kAutotune; ++how) {
    steps = 4;
    opt_run(rank, how, &steps, got);
    opt_run(rank, kPlain, &steps, want);
    for (i = 0; i < P; ++i) {
      if (memcmp(got[i], want[i], kOptCounts[i] * sizeof(float)) != 0) {
        char d[96];
        snprintf(d, sizeof d, "%s, %d steps: parameter %d",
                 how == kRebuild ? "rebuild" : "autotune", steps, i);
        test_fail(__FILE__, __LINE__, "parameters differ from a run without re-plans", d);
      }
    }
  }
  for (i = 0; i < P; ++i) {
    free(got[i]);
    free(want[i]);
  }
}

static void* rank_main(void* arg) {
  const int rank = *(const int*)arg;
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  int i, b = -1, rebuilt = -1;

  make_params(params);
  braid_reducer_options_init(&ro);
  ro.bucket_cap_bytes = 1; /* one parameter per bucket */
  ro.first_bucket_cap_bytes = 1;
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  for (i = 0; i < P; ++i) {
    EXPECT_OK(braid_reducer_param_bucket(red, 100 + i, &b));
    EXPECT_TRUE(b == P - 1 - i);
  }
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "rebuilt", braid_reducer_rebuild_buckets(red, NULL));
  /* Nothing recorded yet: no rebuild, no communication. */
  EXPECT_OK(braid_reducer_rebuild_buckets(red, &rebuilt));
  EXPECT_TRUE(rebuilt == 0);

  step(red, rank, 0, kOrder[rank]);
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_NO_SYNC));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "backward is in progress",
               braid_reducer_rebuild_buckets(red, &rebuilt));
  for (i = 0; i < P; ++i) EXPECT_OK(braid_reducer_mark_ready(red, 100 + i, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red)); /* no_sync: marks nothing, reduces nothing */
  check_grads(red, 0);

  EXPECT_OK(braid_reducer_rebuild_buckets(red, &rebuilt));
  EXPECT_TRUE(rebuilt == 1);
  for (i = 0; i < P; ++i) {
    EXPECT_OK(braid_reducer_param_bucket(red, 100 + kOrder[0][i], &b));
    EXPECT_TRUE(b == i); /* world rank 0's readiness order, on both ranks */
  }
  check_grads(red, 0); /* the values moved with their parameters */
  step(red, rank, 1, kOrder[rank]);
  check_grads(red, 1);
  EXPECT_OK(braid_reducer_rebuild_buckets(red, &rebuilt));
  EXPECT_TRUE(rebuilt == 0); /* once per reducer */
  EXPECT_OK(braid_reducer_destroy(red));

  /* A fully sharded optimizer's state does not follow a re-plan (yet): refused, named. */
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  {
    braid_optimizer_t* opt = NULL;
    braid_optimizer_options_t oo;
    braid_optimizer_options_init(&oo);
    oo.fully_sharded = 1;
    EXPECT_OK(braid_optimizer_create(red, &oo, &opt));
    EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "fully_sharded",
                 braid_reducer_rebuild_buckets(red, &rebuilt));
    EXPECT_OK(braid_optimizer_destroy(opt));
  }
  EXPECT_OK(braid_reducer_destroy(red));
  optimizer_carried(rank);

  ro.shard_gradients = 1;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "shard_gradients",
               braid_reducer_rebuild_buckets(red, &rebuilt));
  EXPECT_OK(braid_reducer_destroy(red));
  autotune(rank);
  return NULL;
}

int main(int argc, char** argv) {
  test_run_2_ranks(argc, argv, world_groups, rank_main);
  return test_finish("capi_rebuild_test");
}
