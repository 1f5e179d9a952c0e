/* Uneven inputs (braid_join_*) from C99, 2 ranks (local threads, or mpirun -np 2): rank 0 has
 * STEPS0 steps of data, rank 1 has one. (a) All-reduce mode, both divide choices: each step's
 * averaged gradient on the active rank is the contributors' sum over 2 (the initial world) or
 * over the ranks with data. (b) Reduce-scatter mode with the sharded AdamW: the joined rank
 * steps its shard with the gradient it received, so every rank's parameters after each step
 * are the inline AdamW reference of the contributing gradients over 2, bit for bit. Then the
 * last joiner (rank 0) is the root, its broadcast reaches rank 1; and the errors: shadow
 * without a joined agreement, an agreement without a join, throw_on_early_termination and the
 * local abort after it. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define P 3
#define STEPS0 3
static const size_t kCounts[P] = {37, 64, 5};
static const double kLr = 1e-2, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWd = 0.1;
static braid_group_t* world_groups[2];

static int steps_of(int rank) { return rank == 0 ? STEPS0 : 1; }

/* k/8, |k| <= 8: sums and halves are exact. */
static float grad(int rank, int t, int i, size_t j) {
  const int k = (int)((rank * 7 + t * 3 + i * 11 + (int)j * 13) % 17) - 8;
  return (float)k / 8.0f;
}

static float initial(int i, size_t j) {
  return (float)((int)((i * 31 + (int)j * 7) % 23) - 11) / 16.0f;
}

/* The averaged gradient of step t: the ranks with data contribute, divided by 2 (by_world) or
 * by their number. */
static float averaged(int t, int i, size_t j, int by_world) {
  float sum = 0.0f;
  int r, n = 0;
  for (r = 0; r < 2; ++r) {
    if (t < steps_of(r)) {
      sum += grad(r, t, i, j);
      ++n;
    }
  }
  return sum / (float)(by_world ? 2 : n);
}

static void make_params(braid_param_t* params) {
  int i;
  for (i = 0; i < P; ++i) {
    params[i].id = i;
    params[i].count = kCounts[i];
    params[i].dtype = BRAID_DTYPE_F32;
    params[i].name = NULL;
  }
}

/* Shadows until every rank joined; returns is_last_joiner (`shadowed`: this rank shadowed a
 * step already). */
static int run_joined(braid_reducer_t* red, int shadowed) {
  int last = !shadowed, active = -1;
  for (;;) {
    EXPECT_OK(braid_join_agree(red, 0, BRAID_SYNC, &active, NULL));
    if (active <= 0) return last;
    EXPECT_OK(braid_join_shadow(red));
    last = 0;
  }
}

static void end_and_broadcast(braid_reducer_t* red, int rank, int shadowed) {
  int root = -1;
  float model[4];
  int k;
  EXPECT_OK(braid_join_end(red, run_joined(red, shadowed), &root));
  EXPECT_TRUE(root == 0); /* rank 0 joined last */
  for (k = 0; k < 4; ++k) model[k] = (float)(rank * 10 + k);
  EXPECT_OK(braid_join_broadcast(red, model, 4, BRAID_DTYPE_F32, root));
  for (k = 0; k < 4; ++k) EXPECT_TRUE(model[k] == (float)k);
}

static void allreduce_case(int rank, int by_world) {
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_join_options_t jo;
  braid_reducer_t* red = NULL;
  int i, t, active = -1;
  braid_sync_mode_t agreed = BRAID_NO_SYNC;
  size_t j;
  make_params(params);
  braid_reducer_options_init(&ro);
  ro.bucket_cap_bytes = ro.first_bucket_cap_bytes = 128;
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "no join is open",
               braid_join_agree(red, 1, BRAID_SYNC, &active, NULL));
  braid_join_options_init(&jo);
  EXPECT_TRUE(jo.divide_by_initial_world_size == 1 && jo.throw_on_early_termination == 0);
  jo.divide_by_initial_world_size = by_world;
  EXPECT_OK(braid_join_begin(red, &jo));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "already open", braid_join_begin(red, &jo));
  for (t = 0; t < steps_of(rank); ++t) {
    EXPECT_OK(braid_join_agree(red, 1, BRAID_SYNC, &active, &agreed));
    EXPECT_TRUE(active == (t < 1 ? 2 : 1) && agreed == BRAID_SYNC);
    EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "not a joined rank's", braid_join_shadow(red));
    EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
    for (i = P - 1; i >= 0; --i) {
      float* g = NULL;
      size_t count = 0;
      EXPECT_OK(braid_reducer_grad(red, i, (void**)&g, &count));
      for (j = 0; j < count; ++j) g[j] = grad(rank, t, i, j);
      EXPECT_OK(braid_reducer_mark_ready(red, i, NULL));
    }
    EXPECT_OK(braid_reducer_finish_backward(red));
    for (i = 0; i < P; ++i) {
      float* g = NULL;
      size_t count = 0;
      EXPECT_OK(braid_reducer_grad(red, i, (void**)&g, &count));
      for (j = 0; j < count; ++j) {
        if (g[j] != averaged(t, i, j, by_world)) {
          fprintf(stderr, "rank %d step %d by_world %d: parameter %d element %d: %g, want %g\n",
                  rank, t, by_world, i, (int)j, g[j], averaged(t, i, j, by_world));
          test_fail(__FILE__, __LINE__, "averaged gradient", "differs");
          break;
        }
      }
    }
    EXPECT_OK(braid_reducer_zero_grads(red));
  }
  end_and_broadcast(red, rank, 0);
  EXPECT_OK(braid_reducer_destroy(red));
}

static void zero2_case(int rank) {
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_optimizer_options_t oo;
  braid_reducer_t* red = NULL;
  braid_optimizer_t* opt = NULL;
  float *want[P], *m[P], *v[P];
  int i, t, active = -1;
  size_t j;
  make_params(params);
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.bucket_cap_bytes = ro.first_bucket_cap_bytes = 128;
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  braid_optimizer_options_init(&oo);
  oo.lr = kLr;
  oo.beta1 = kBeta1;
  oo.beta2 = kBeta2;
  oo.eps = kEps;
  oo.weight_decay = kWd;
  oo.timeout_ms = 20000;
  EXPECT_OK(braid_optimizer_create(red, &oo, &opt));
  for (i = 0; i < P; ++i) {
    want[i] = malloc(kCounts[i] * sizeof(float));
    m[i] = calloc(kCounts[i], sizeof(float));
    v[i] = calloc(kCounts[i], sizeof(float));
    for (j = 0; j < kCounts[i]; ++j) want[i][j] = initial(i, j);
    EXPECT_OK(braid_optimizer_set_param(opt, i, want[i]));
  }
  EXPECT_OK(braid_optimizer_wait_all_params(opt));
  EXPECT_OK(braid_join_begin(red, NULL));
  for (t = 0; t < STEPS0; ++t) {
    if (t < steps_of(rank)) {
      EXPECT_OK(braid_join_agree(red, 1, BRAID_SYNC, &active, NULL));
      EXPECT_OK(braid_optimizer_begin_backward(opt, BRAID_SYNC));
      for (i = 0; i < P; ++i) {
        float* g = NULL;
        size_t count = 0;
        EXPECT_OK(braid_reducer_grad(red, i, (void**)&g, &count));
        for (j = 0; j < count; ++j) g[j] += grad(rank, t, i, j);
        EXPECT_OK(braid_reducer_mark_ready(red, i, NULL));
      }
      EXPECT_OK(braid_optimizer_finish_backward(opt));
      EXPECT_OK(braid_optimizer_wait_all_params(opt));
    } else {
      EXPECT_OK(braid_join_agree(red, 0, BRAID_SYNC, &active, NULL));
      EXPECT_TRUE(active == 1);
      EXPECT_OK(braid_join_shadow(red));
    }
    for (i = 0; i < P; ++i) {
      float* p = NULL;
      size_t count = 0;
      for (j = 0; j < kCounts[i]; ++j) {
        test_adamw_element(&want[i][j], &m[i][j], &v[i][j], averaged(t, i, j, 1), t, kLr, kBeta1,
                           kBeta2, kEps, kWd);
      }
      EXPECT_OK(braid_optimizer_param(opt, i, (void**)&p, &count));
      if (p == NULL || memcmp(p, want[i], kCounts[i] * sizeof(float)) != 0) {
        fprintf(stderr, "rank %d step %d: parameter %d differs from the reference\n", rank, t, i);
        test_fail(__FILE__, __LINE__, "ZeRO-2 join", "parameters differ");
      }
    }
  }
  end_and_broadcast(red, rank, steps_of(rank) < STEPS0);
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(red));
  for (i = 0; i < P; ++i) {
    free(want[i]);
    free(m[i]);
    free(v[i]);
  }
}

static void throw_case(int rank) {
  braid_param_t params[P];
  braid_reducer_options_t ro;
  braid_join_options_t jo;
  braid_reducer_t* red = NULL;
  int active = -1;
  make_params(params);
  braid_reducer_options_init(&ro);
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  braid_join_options_init(&jo);
  jo.throw_on_early_termination = 1;
  EXPECT_OK(braid_join_begin(red, &jo));
  EXPECT_ERROR(BRAID_OUT_OF_RANGE,
               rank == 0 ? "Throwing across all ranks" : "Rank 1 exhausted all inputs",
               braid_join_agree(red, rank == 0, BRAID_SYNC, &active, NULL));
  /* The ranks are out of step now: each closes its join locally, and may open one again. */
  EXPECT_OK(braid_join_abort(red));
  EXPECT_OK(braid_join_abort(red)); /* none open: OK */
  EXPECT_OK(braid_join_begin(red, NULL));
  EXPECT_OK(braid_join_abort(red));
  EXPECT_OK(braid_reducer_destroy(red));
}

static void* body(void* arg) {
  const int rank = *(int*)arg;
  allreduce_case(rank, 1);
  allreduce_case(rank, 0);
  zero2_case(rank);
  throw_case(rank);
  return NULL;
}

int main(int argc, char** argv) {
  test_run_2_ranks(argc, argv, world_groups, body);
  return test_finish("capi_join_test");
}
