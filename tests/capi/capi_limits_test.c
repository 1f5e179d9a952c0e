/* Limits at the C API's entry points (issue 23 item 1): sizes whose bytes wrap size_t,
 * non-finite hyper-parameters (the same rule at creation, in set_hyper and in set_lr) and
 * unbounded resource counts are refused, naming the argument as the caller wrote it, before
 * anything starts; the refused call changes nothing (a later step uses the old values). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

static const braid_status_t inval = BRAID_INVALID_ARGUMENT;

static void test_world_limits(void) {
  braid_world_options_t o;
  braid_world_t* w = NULL;
  braid_world_options_init(&o);
  o.backend = "local";
  o.read_env = 0;
  o.local_ranks = 4097;
  EXPECT_ERROR(inval, "local_ranks must be in [0, 4096] (0: the default), got 4097",
               braid_world_create(&o, &w));
  o.local_ranks = 1 << 30;
  EXPECT_ERROR(inval, "local_ranks must be in [0, 4096]", braid_world_create(&o, &w));
  EXPECT_TRUE(w == NULL);
}

static void test_param_bytes(braid_group_t* g) {
  braid_param_t params[2] = {{7, 16, BRAID_DTYPE_F32, "w"}, {8, 4, BRAID_DTYPE_F32, "b"}};
  braid_reducer_t* red = NULL;
  /* count x 4 wraps size_t to 0: it used to register, handing out a huge view */
  params[1].count = SIZE_MAX / 4 + 1;
  EXPECT_ERROR(inval,
               "braid_reducer_create: params[1].count ('b' (id 8)) is 4611686018427387904: "
               "4611686018427387904 x 4 bytes (f32) take the parameters past 2^60 bytes",
               braid_reducer_create(g, NULL, params, 2, NULL, &red));
  params[1].count = SIZE_MAX;
  params[1].dtype = BRAID_DTYPE_F16;
  EXPECT_ERROR(inval, "params[1].count ('b' (id 8)) is 18446744073709551615",
               braid_reducer_create(g, NULL, params, 2, NULL, &red));
  /* each fits, together they pass the limit: the second is named */
  params[0].count = (size_t)1 << 58;
  params[1].count = (size_t)1 << 58;
  params[1].dtype = BRAID_DTYPE_F64;
  EXPECT_ERROR(inval, "params[1].count ('b' (id 8)) is 288230376151711744: 288230376151711744 x 8",
               braid_reducer_create(g, NULL, params, 2, NULL, &red));
  EXPECT_TRUE(red == NULL);
}

static braid_reducer_t* sgd_reducer(braid_group_t* g) {
  braid_param_t params[1] = {{1, 4, BRAID_DTYPE_F32, "p"}};
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  EXPECT_OK(braid_reducer_create(g, NULL, params, 1, &ro, &red));
  return red;
}

static void test_create_limits(braid_group_t* g) {
  braid_reducer_t* red = sgd_reducer(g);
  braid_optimizer_t* opt = NULL;
  braid_optimizer_options_t o;
  const double inf = INFINITY;

#define REFUSED(field, value, kind_, want)                            \
  do {                                                                \
    braid_optimizer_options_init(&o);                                 \
    o.kind = (kind_);                                                 \
    o.field = (value);                                                \
    EXPECT_ERROR(inval, want, braid_optimizer_create(red, &o, &opt)); \
    EXPECT_TRUE(opt == NULL);                                         \
  } while (0)
  REFUSED(lr, inf, BRAID_OPTIMIZER_ADAMW,
          "braid_optimizer_create: opts->lr must be finite, got inf");
  REFUSED(weight_decay, inf, BRAID_OPTIMIZER_ADAMW, "opts->weight_decay must be finite, got inf");
  REFUSED(eps, inf, BRAID_OPTIMIZER_ADAMW, "opts->eps must be finite, got inf");
  REFUSED(beta2, NAN, BRAID_OPTIMIZER_ADAMW, "opts->beta2 must be finite, got nan");
  REFUSED(momentum, inf, BRAID_OPTIMIZER_SGD, "opts->momentum must be finite, got inf");
  REFUSED(lr, -inf, BRAID_OPTIMIZER_SGD, "opts->lr must be finite, got -inf");
  REFUSED(max_grad_norm, NAN, BRAID_OPTIMIZER_SGD, "opts->max_grad_norm is NaN");
  REFUSED(threads, 257, BRAID_OPTIMIZER_ADAMW, "opts->threads must be in [1, 256], got 257");
  REFUSED(threads, 100000, BRAID_OPTIMIZER_ADAMW, "opts->threads must be in [1, 256]");
  REFUSED(threads, 0, BRAID_OPTIMIZER_ADAMW, "opts->threads must be in [1, 256], got 0");
  REFUSED(num_groups, 1 << 20, BRAID_OPTIMIZER_ADAMW,
          "opts->num_groups must be in [1, 65536], got 1048576");
#undef REFUSED
  /* a field the kind does not use is not checked (AdamW has no momentum) */
  braid_optimizer_options_init(&o);
  o.momentum = inf;
  o.threads = 256;
  EXPECT_OK(braid_optimizer_create(red, &o, &opt));
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(red));
}

/* An f64 parameter: the reducer reduces it, the sharded optimizer (f32 / bf16 / f16 kernels)
 * refuses it at creation, naming it. Found by the capi fuzz target (session 13): the optimizer
 * was created and its stepper thread hit a BRAID_CHECK at the first step, ending the host.
 * The reducer stays usable: its f64 gradient is reduced after the refusal. */
static void test_optimizer_dtypes(braid_group_t* g) {
  braid_param_t params[2] = {{1, 4, BRAID_DTYPE_F32, "w"}, {2, 3, BRAID_DTYPE_F64, "d"}};
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  braid_optimizer_t* opt = NULL;
  double* grad = NULL;
  size_t count = 0, i;
  int bucket = -1;
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  EXPECT_OK(braid_reducer_create(g, NULL, params, 2, &ro, &red));
  EXPECT_ERROR(inval,
               "braid_optimizer_create: optimizer: parameter 'd' (id 2) is f64; the sharded "
               "optimizer steps f32, bf16 and f16 parameters",
               braid_optimizer_create(red, NULL, &opt));
  EXPECT_TRUE(opt == NULL);
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_OK(braid_reducer_grad(red, 2, (void**)&grad, &count));
  EXPECT_TRUE(count == 3);
  for (i = 0; i < count; ++i) grad[i] = 0.25 + (double)i;
  EXPECT_OK(braid_reducer_mark_ready(red, 2, NULL));
  EXPECT_OK(braid_reducer_mark_ready(red, 1, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red));
  EXPECT_OK(braid_reducer_param_bucket(red, 2, &bucket));
  EXPECT_OK(braid_reducer_shard(red, bucket, (void**)&grad, &count));
  EXPECT_TRUE(count >= 3); /* one rank: its shard is the whole bucket, averaged over 1 */
  for (i = 0; i < 3 && i < count; ++i) EXPECT_TRUE(grad[i] == 0.25 + (double)i);
  EXPECT_OK(braid_reducer_destroy(red));
}

/* One SGD step with gradient 1 from parameter 2: p = 2 - lr exactly (momentum 0, decay 0). */
static void step_and_check(braid_optimizer_t* opt, braid_reducer_t* red, float want) {
  float* grad = NULL;
  float* p = NULL;
  size_t count = 0, i;
  EXPECT_OK(braid_optimizer_begin_backward(opt, BRAID_SYNC));
  EXPECT_OK(braid_reducer_grad(red, 1, (void**)&grad, &count));
  for (i = 0; i < count; ++i) grad[i] = 1.0f;
  EXPECT_OK(braid_reducer_mark_ready(red, 1, NULL));
  EXPECT_OK(braid_optimizer_finish_backward(opt));
  EXPECT_OK(braid_optimizer_wait_all_params(opt));
  EXPECT_OK(braid_optimizer_param(opt, 1, (void**)&p, &count));
  EXPECT_TRUE(count == 4);
  for (i = 0; i < count; ++i) {
    if (p[i] != want) {
      char d[128];
      snprintf(d, sizeof d, "p[%zu] = %.9g, want %.9g", i, (double)p[i], (double)want);
      test_fail(__FILE__, __LINE__, "sgd step", d);
    }
  }
}

static void test_setter_limits(braid_group_t* g) {
  braid_reducer_t* red = sgd_reducer(g);
  braid_optimizer_t* opt = NULL;
  braid_optimizer_options_t o;
  braid_optimizer_hyper_t h;
  const float init[4] = {2, 2, 2, 2};
  braid_optimizer_options_init(&o);
  o.kind = BRAID_OPTIMIZER_SGD;
  o.lr = 0.5;
  o.momentum = 0;
  o.weight_decay = 0;
  EXPECT_OK(braid_optimizer_create(red, &o, &opt));
  EXPECT_OK(braid_optimizer_set_param(opt, 1, init));

  EXPECT_ERROR(inval, "braid_optimizer_set_lr: lr must be finite, got inf",
               braid_optimizer_set_lr(opt, INFINITY));
  EXPECT_ERROR(inval, "lr must be finite, got nan", braid_optimizer_set_lr(opt, NAN));
  EXPECT_ERROR(inval, "lr must be >= 0", braid_optimizer_set_lr(opt, -1.0));
  memset(&h, 0, sizeof h);
  h.struct_size = sizeof h;
  h.lr = INFINITY;
  EXPECT_ERROR(inval, "braid_optimizer_set_hyper: hyper->lr must be finite, got inf",
               braid_optimizer_set_hyper(opt, 0, &h));
  h.lr = 0.25;
  h.weight_decay = INFINITY;
  EXPECT_ERROR(inval, "hyper->weight_decay must be finite, got inf",
               braid_optimizer_set_hyper(opt, 0, &h));
  h.weight_decay = 0;
  h.momentum = -INFINITY;
  EXPECT_ERROR(inval, "hyper->momentum must be finite, got -inf",
               braid_optimizer_set_hyper(opt, 0, &h));
  /* nothing changed: lr is still 0.5 */
  step_and_check(opt, red, 1.5f);
  /* a good value is taken */
  h.momentum = 0;
  h.beta1 = NAN; /* AdamW's half: ignored by SGD */
  EXPECT_OK(braid_optimizer_set_hyper(opt, 0, &h));
  step_and_check(opt, red, 1.25f);
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(red));
}

/* Ranks passing different reducer options: the error names the option and each rank's value
 * (it used to describe a parameter-count mismatch: "rank 0 registered 1 parameters, rank 1
 * registered 0"). */
static braid_group_t* two[2];
static void* create_differing(void* arg) {
  const int rank = *(const int*)arg;
  braid_param_t params[1] = {{1, 1024, BRAID_DTYPE_F32, "p"}};
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.credit_bytes = rank == 0 ? 1024 : 0;
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION,
               "reducer options differ across the ranks of group 'world': credit_bytes is 1024 "
               "on rank 0, 0 on rank 1",
               braid_reducer_create(two[rank], NULL, params, 1, &ro, &red));
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.priorities = rank;
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "priorities is 0 on rank 0, 1 on rank 1",
               braid_reducer_create(two[rank], NULL, params, 1, &ro, &red));
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.shard_gradients = rank;
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "shard_gradients is 0 on rank 0, 1 on rank 1",
               braid_reducer_create(two[rank], NULL, params, 1, &ro, &red));
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.bucket_cap_bytes = rank == 0 ? 4096 : 8192;
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "bucket_cap_bytes is 4096 on rank 0, 8192 on rank 1",
               braid_reducer_create(two[rank], NULL, params, 1, &ro, &red));
  /* agreeing options still make a reducer */
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.credit_bytes = 1024;
  EXPECT_OK(braid_reducer_create(two[rank], NULL, params, 1, &ro, &red));
  EXPECT_OK(braid_reducer_destroy(red));
  return NULL;
}

static void test_differing_options(void) {
  static int ranks[2] = {0, 1};
  pthread_t t[2];
  int r;
  braid_world_t* w = test_local_world(2, two);
  for (r = 0; r < 2; ++r) pthread_create(&t[r], NULL, create_differing, &ranks[r]);
  for (r = 0; r < 2; ++r) pthread_join(t[r], NULL);
  for (r = 0; r < 2; ++r) EXPECT_OK(braid_group_destroy(two[r]));
  EXPECT_OK(braid_world_destroy(w));
}

int main(void) {
  braid_group_t* g[1];
  braid_world_t* w;
  test_world_limits();
  w = test_local_world(1, g);
  test_param_bytes(g[0]);
  test_create_limits(g[0]);
  test_optimizer_dtypes(g[0]);
  test_setter_limits(g[0]);
  test_differing_options();
  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_world_destroy(w));
  return test_finish("capi_limits_test");
}
