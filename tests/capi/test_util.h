/* Minimal C99 test helpers for the C API tests: checks that count failures (thread-safe) and
 * print the call, the code and braid_last_error(). */
#ifndef BRAID_TESTS_CAPI_TEST_UTIL_H_
#define BRAID_TESTS_CAPI_TEST_UTIL_H_

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "capi/braid.h"

static pthread_mutex_t test_mu = PTHREAD_MUTEX_INITIALIZER;
static int test_failures = 0;

static inline void test_fail(const char* file, int line, const char* what, const char* detail) {
  pthread_mutex_lock(&test_mu);
  ++test_failures;
  fprintf(stderr, "%s:%d: FAILED: %s\n    %s\n", file, line, what, detail);
  pthread_mutex_unlock(&test_mu);
}

/* The call must return BRAID_OK. */
#define EXPECT_OK(call)                                                             \
  do {                                                                              \
    braid_status_t s_ = (call);                                                     \
    if (s_ != BRAID_OK) {                                                           \
      char d_[1024];                                                                \
      snprintf(d_, sizeof d_, "%s: %s", braid_status_name(s_), braid_last_error()); \
      test_fail(__FILE__, __LINE__, #call, d_);                                     \
    }                                                                               \
  } while (0)

/* The call must return `want` and braid_last_error() must contain `substr`. */
#define EXPECT_ERROR(want, substr, call)                                                         \
  do {                                                                                           \
    braid_status_t s_;                                                                           \
    braid_clear_error();                                                                         \
    s_ = (call);                                                                                 \
    if (s_ != (want) || strstr(braid_last_error(), (substr)) == NULL) {                          \
      char d_[1024];                                                                             \
      snprintf(d_, sizeof d_, "got %s \"%s\", want %s containing \"%s\"", braid_status_name(s_), \
               braid_last_error(), braid_status_name(want), (substr));                           \
      test_fail(__FILE__, __LINE__, #call, d_);                                                  \
    }                                                                                            \
  } while (0)

#define EXPECT_TRUE(cond)                                          \
  do {                                                             \
    if (!(cond)) test_fail(__FILE__, __LINE__, #cond, "is false"); \
  } while (0)

/* A local world of `ranks` ranks (environment ignored) and the world group of each rank. */
static inline braid_world_t* test_local_world(int ranks, braid_group_t** groups) {
  braid_world_options_t o;
  braid_world_t* w = NULL;
  int r;
  braid_world_options_init(&o);
  o.backend = "local";
  o.local_ranks = ranks;
  o.read_env = 0;
  o.timeout_ms = 20000;
  EXPECT_OK(braid_world_create(&o, &w));
  for (r = 0; groups != NULL && r < ranks; ++r) EXPECT_OK(braid_world_group(w, r, &groups[r]));
  return w;
}

/* Runs body(&rank) for each of the 2 ranks of the world: "local" (argv[1] absent): a local
 * world of 2 ranks, one thread each; "mpi": this process's rank of a 2-process mpirun world.
 * groups[rank] is set to the world group of each rank run here. */
static inline void test_run_2_ranks(int argc, char** argv, braid_group_t** groups,
                                    void* (*body)(void*)) {
  static int ranks[2] = {0, 1};
  braid_world_t* w = NULL;
  int r, size = 0, count = 0, local = -1;
  if (argc > 1 && strcmp(argv[1], "mpi") == 0) {
    braid_world_options_t o;
    braid_world_options_init(&o);
    o.backend = "mpi";
    o.timeout_ms = 60000;
    EXPECT_OK(braid_world_create(&o, &w));
    EXPECT_OK(braid_world_size(w, &size));
    EXPECT_OK(braid_world_local_ranks(w, &local, 1, &count));
    if (size != 2 || count != 1 || local < 0 || local > 1) {
      test_fail(__FILE__, __LINE__, "mpi world", "needs mpirun -np 2");
      return;
    }
    EXPECT_OK(braid_world_group(w, local, &groups[local]));
    body(&ranks[local]);
    EXPECT_OK(braid_group_destroy(groups[local]));
  } else {
    pthread_t threads[2];
    w = test_local_world(2, groups);
    for (r = 0; r < 2; ++r) pthread_create(&threads[r], NULL, body, &ranks[r]);
    for (r = 0; r < 2; ++r) pthread_join(threads[r], NULL);
    for (r = 0; r < 2; ++r) EXPECT_OK(braid_group_destroy(groups[r]));
  }
  EXPECT_OK(braid_world_destroy(w));
}

/* optim/adamw_math.h's AdamW update of one element at step t (0-based) with gradient g, in C:
 * StepScalars (double, rounded to float once) and AdamWElement (float operations in the same
 * order; the tests build with -ffp-contract=off), so the C tests compare bit for bit. */
static inline void test_adamw_element(float* p, float* m, float* v, float g, int t, double lr,
                                      double beta1_d, double beta2_d, double eps_d, double wd) {
  const double bc1 = 1.0 - pow(beta1_d, (double)(t + 1));
  const double bc2 = 1.0 - pow(beta2_d, (double)(t + 1));
  const float beta1 = (float)beta1_d, omb1 = (float)(1.0 - beta1_d);
  const float beta2 = (float)beta2_d, omb2 = (float)(1.0 - beta2_d);
  const float decay = (float)(1.0 - lr * wd), step_size = (float)(lr / bc1);
  const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2)), eps = (float)eps_d;
  const float mm = beta1 * *m + omb1 * g;
  const float vv = beta2 * *v + omb2 * (g * g);
  const float denom = sqrtf(vv) * inv_sqrt_bc2 + eps;
  const float pp = *p * decay;
  *p = pp - step_size * (mm / denom);
  *m = mm;
  *v = vv;
}

static inline int test_finish(const char* name) {
  if (test_failures == 0) {
    printf("%s: all checks passed\n", name);
    return 0;
  }
  fprintf(stderr, "%s: %d check(s) failed\n", name, test_failures);
  return 1;
}

#endif /* BRAID_TESTS_CAPI_TEST_UTIL_H_ */
