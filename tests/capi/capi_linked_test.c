/* braid_optimizer_create_linked (0.11): one optimizer over three reducers on 2 ranks, against an
 * inline C reference, bit for bit:
 *   dense   reduce-scattered over both ranks (averaged over 2)
 *   expert  rank r holds expert r alone (its own 1-rank group: different parameters per rank)
 *   norm    a layer norm identical on both ranks of the tensor-parallel group (here the world)
 *           and reduced without it (tp_replicated = 1: its norm counts once)
 * One global norm = |dense|^2 + |expert 0|^2 + |expert 1|^2 + |norm|^2, one clip, AdamW.
 * Gradients are k/8, so every average and squared norm is exact. Also the refusals. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define M 3 /* reducers */
#define P 2 /* parameters per reducer */
#define STEPS 3
static const size_t kCounts[M][P] = {{37, 300}, {128, 5}, {64, 17}};
static const double kLr = 5e-2, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWd = 0.1;
static const double kMaxNorm = 0.5; /* the norms are ~10: clipping is active */

static braid_group_t* world_groups[2];

/* Rank `rank`'s gradient of reducer m (the layer norm's is the same on both ranks). */
static float grad(int m, int rank, int t, int i, size_t j) {
  const int src = m == 2 ? 0 : rank;
  const int k = (int)((m * 5 + src * 7 + t * 3 + i * 11 + (int)(j % 1000) * 13) % 17) - 8;
  return (float)k / 8.0f;
}

/* The copy of reducer m's parameters held by `rank` (experts differ per rank). */
static float initial(int m, int rank, int i, size_t j) {
  const int owner = m == 1 ? rank : 0;
  return (float)((int)((m * 3 + owner * 5 + i * 31 + (int)(j % 1000) * 7) % 23) - 11) / 16.0f;
}

/* The reduced gradient of reducer m, copy `rank`. */
static float reduced(int m, int rank, int t, int i, size_t j) {
  if (m == 0) return (grad(0, 0, t, i, j) + grad(0, 1, t, i, j)) / 2.0f;
  return grad(m, rank, t, i, j);
}

/* The reference: reducer m's parameters on `rank` after `steps` steps, and the last norm. */
static double reference(int steps, int rank, float* out[M][P]) {
  double norm = 0;
  int m, i, t, copy;
  size_t j;
  float *p[2][M][P], *mo[2][M][P], *v[2][M][P];
  for (copy = 0; copy < 2; ++copy) {
    for (m = 0; m < M; ++m) {
      for (i = 0; i < P; ++i) {
        p[copy][m][i] = malloc(kCounts[m][i] * sizeof(float));
        mo[copy][m][i] = calloc(kCounts[m][i], sizeof(float));
        v[copy][m][i] = calloc(kCounts[m][i], sizeof(float));
        for (j = 0; j < kCounts[m][i]; ++j) p[copy][m][i][j] = initial(m, copy, i, j);
      }
    }
  }
  for (t = 0; t < steps; ++t) {
    double sumsq = 0, scale;
    for (m = 0; m < M; ++m) {
      for (copy = 0; copy < (m == 1 ? 2 : 1); ++copy) {
        for (i = 0; i < P; ++i) {
          for (j = 0; j < kCounts[m][i]; ++j) {
            const double g = reduced(m, copy, t, i, j);
            sumsq += g * g;
          }
        }
      }
    }
    norm = sqrt(sumsq);
    scale = kMaxNorm / (norm + 1e-6);
    if (scale > 1.0) scale = 1.0;
    for (copy = 0; copy < 2; ++copy) {
      for (m = 0; m < M; ++m) {
        for (i = 0; i < P; ++i) {
          for (j = 0; j < kCounts[m][i]; ++j) {
            const float g = reduced(m, copy, t, i, j) * (float)scale;
            test_adamw_element(&p[copy][m][i][j], &mo[copy][m][i][j], &v[copy][m][i][j], g, t, kLr,
                               kBeta1, kBeta2, kEps, kWd);
          }
        }
      }
    }
  }
  for (copy = 0; copy < 2; ++copy) {
    for (m = 0; m < M; ++m) {
      for (i = 0; i < P; ++i) {
        if (copy == rank) memcpy(out[m][i], p[copy][m][i], kCounts[m][i] * sizeof(float));
        free(p[copy][m][i]);
        free(mo[copy][m][i]);
        free(v[copy][m][i]);
      }
    }
  }
  return norm;
}

static void run(int rank) {
  braid_group_t *solo_expert = NULL, *solo_norm = NULL, *world = world_groups[rank];
  braid_reducer_t* red[M];
  braid_optimizer_t* opt[M];
  braid_optimizer_options_t oo, other;
  const braid_optimizer_options_t* opts[M] = {&oo, &oo, &oo};
  const int tp_replicated[M] = {0, 0, 1};
  float* want[M][P];
  int m, i, t;
  size_t j;

  EXPECT_OK(braid_group_split(world, rank, 0, "expert", &solo_expert));
  EXPECT_OK(braid_group_split(world, rank, 0, "norm", &solo_norm));
  for (m = 0; m < M; ++m) {
    braid_param_t params[P];
    braid_reducer_options_t ro;
    for (i = 0; i < P; ++i) {
      params[i].id = i;
      params[i].count = kCounts[m][i];
      params[i].dtype = BRAID_DTYPE_F32;
      params[i].name = NULL;
      want[m][i] = malloc(kCounts[m][i] * sizeof(float));
    }
    braid_reducer_options_init(&ro);
    ro.mode = BRAID_MODE_REDUCE_SCATTER;
    ro.bucket_cap_bytes = 512;
    ro.first_bucket_cap_bytes = 256;
    ro.timeout_ms = 20000;
    EXPECT_OK(braid_reducer_create(m == 0   ? world
                                   : m == 1 ? solo_expert
                                            : solo_norm,
                                   NULL, params, P, &ro, &red[m]));
  }
  braid_optimizer_options_init(&oo);
  oo.lr = kLr;
  oo.beta1 = kBeta1;
  oo.beta2 = kBeta2;
  oo.eps = kEps;
  oo.weight_decay = kWd;
  oo.max_grad_norm = kMaxNorm;
  oo.timeout_ms = 20000;

  /* Refusals (local checks: no collective runs, nothing is created). */
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "n must be >= 1",
               braid_optimizer_create_linked(red, 0, opts, NULL, world, NULL, opt));
  other = oo;
  other.max_grad_norm = 1.0;
  opts[1] = &other;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "reducer 1 and reducer 0 differ in max_grad_norm",
               braid_optimizer_create_linked(red, M, opts, tp_replicated, world, world, opt));
  opts[1] = &oo;
  {
    braid_reducer_t* twice[2] = {red[0], red[0]};
    EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "reducer 1 is also reducer 0",
                 braid_optimizer_create_linked(twice, 2, opts, NULL, world, NULL, opt));
  }

  EXPECT_OK(braid_optimizer_create_linked(red, M, opts, tp_replicated, world, world, opt));
  for (m = 0; m < M; ++m) {
    for (i = 0; i < P; ++i) {
      for (j = 0; j < kCounts[m][i]; ++j) want[m][i][j] = initial(m, rank, i, j);
      EXPECT_OK(braid_optimizer_set_param(opt[m], i, want[m][i]));
    }
    EXPECT_OK(braid_optimizer_wait_all_params(opt[m]));
  }
  for (t = 0; t < STEPS; ++t) {
    double want_norm;
    for (m = 0; m < M; ++m) EXPECT_OK(braid_optimizer_begin_backward(opt[m], BRAID_SYNC));
    for (i = P - 1; i >= 0; --i) {
      for (m = (rank + t) % 2 ? 0 : M - 1; m >= 0 && m < M; m += (rank + t) % 2 ? 1 : -1) {
        float* g = NULL;
        size_t count = 0;
        EXPECT_OK(braid_reducer_grad(red[m], i, (void**)&g, &count));
        for (j = 0; j < count; ++j) g[j] += grad(m, rank, t, i, j);
        EXPECT_OK(braid_reducer_mark_ready(red[m], i, NULL));
      }
    }
    for (m = 0; m < M; ++m) EXPECT_OK(braid_optimizer_finish_backward(opt[m]));
    for (m = 0; m < M; ++m) EXPECT_OK(braid_optimizer_wait_all_params(opt[m]));
    want_norm = reference(t + 1, rank, want);
    for (m = 0; m < M; ++m) {
      double norm = -2;
      int64_t rounds = -1;
      EXPECT_OK(braid_optimizer_last_step(opt[m], &rounds, NULL, &norm));
      if (norm != want_norm || rounds != t + 1) {
        fprintf(stderr, "rank %d reducer %d step %d: norm %.17g rounds %lld, want %.17g\n", rank, m,
                t, norm, (long long)rounds, want_norm);
        EXPECT_TRUE(0);
      }
      for (i = 0; i < P; ++i) {
        float* p = NULL;
        size_t count = 0;
        EXPECT_OK(braid_optimizer_param(opt[m], i, (void**)&p, &count));
        if (p == NULL || count != kCounts[m][i] ||
            memcmp(p, want[m][i], count * sizeof(float)) != 0) {
          fprintf(stderr, "rank %d reducer %d parameter %d step %d differs\n", rank, m, i, t);
          EXPECT_TRUE(0);
        }
      }
    }
  }
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "already has an optimizer",
               braid_optimizer_create_linked(red, 1, opts, NULL, world, NULL, opt));
  for (m = 0; m < M; ++m) {
    EXPECT_OK(braid_optimizer_destroy(opt[m]));
    EXPECT_OK(braid_reducer_destroy(red[m]));
    for (i = 0; i < P; ++i) free(want[m][i]);
  }
  EXPECT_OK(braid_group_destroy(solo_expert));
  EXPECT_OK(braid_group_destroy(solo_norm));
}

static void* rank_main(void* arg) {
  run(*(const int*)arg);
  return NULL;
}

/* argv[1] == "mpi": one rank of `mpirun -np 2` (tests/run_mpi.sh); else 2 local threads. */
int main(int argc, char** argv) {
  test_run_2_ranks(argc, argv, world_groups, rank_main);
  return test_finish("capi_linked_test");
}
