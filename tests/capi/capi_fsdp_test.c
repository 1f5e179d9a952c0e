/* Fully sharded training through the C API on 2 ranks (local threads, or mpirun -np 2): units
 * (param_units), shard_gradients with braid_reducer_mark_ready_grad (and braid_reducer_grad_slot
 * on odd steps), a fully_sharded AdamW,
 * braid_unit_enter / exit in forward and backward, braid_optimizer_end_step, summon_params,
 * and the memory figures. Parameters read inside each unit's forward are compared bit for bit
 * with an inline C AdamW reference of the averaged gradients (k/8 gradients, k/16 weights:
 * exact averages over 2 ranks). Also: a released unit's parameter cannot be read, units
 * entered out of the recorded order are refused naming both, bad phases and non-fully-sharded
 * optimizers are refused. A gather-only handle (BRAID_OPTIMIZER_NONE): the framework writes and
 * steps its pieces (braid_optimizer_param_shard, braid_reducer_grad_shard) and the units gather
 * them, checked bit for bit against the serial SGD of the averaged gradients. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define P 6
#define UNITS 3
#define STEPS 3
static const size_t kCounts[P] = {300, 17, 250, 64, 129, 40};
static const int kUnitOf[P] = {0, 0, 1, 1, 2, 2};
static const double kLr = 1e-2, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWd = 0.1;

static braid_group_t* world_groups[2];

static float grad(int rank, int t, int i, size_t j) {
  const int k = (int)((rank * 5 + t * 7 + i * 3 + (int)(j % 1000) * 11) % 17) - 8;
  return (float)k / 8.0f;
}

static float initial(int i, size_t j) {
  return (float)((int)((i * 13 + (int)(j % 1000) * 5) % 23) - 11) / 16.0f;
}

/* The serial AdamW of the averaged gradients (test_util.h): parameter i after `steps` steps. */
static float reference(int steps, int i, size_t j) {
  float p = initial(i, j), m = 0.0f, v = 0.0f;
  int t;
  for (t = 0; t < steps; ++t) {
    const float g = (grad(0, t, i, j) + grad(1, t, i, j)) / 2.0f;
    test_adamw_element(&p, &m, &v, g, t, kLr, kBeta1, kBeta2, kEps, kWd);
  }
  return p;
}

/* Parameter i as the optimizer holds it equals the reference after `steps` steps. */
static int param_ok(braid_optimizer_t* opt, int i, int steps, int rank) {
  float* p = NULL;
  size_t count = 0, j;
  EXPECT_OK(braid_optimizer_param(opt, i, (void**)&p, &count));
  if (p == NULL || count != kCounts[i]) return 0;
  for (j = 0; j < count; ++j) {
    if (p[j] != reference(steps, i, j)) {
      fprintf(stderr, "rank %d: parameter %d element %zu is %g after %d steps, want %g\n", rank, i,
              j, (double)p[j], steps, (double)reference(steps, i, j));
      return 0;
    }
  }
  return 1;
}

/* Forward: every unit entered in order, its parameters checked, exited. */
static void forward(braid_optimizer_t* opt, int steps, int rank) {
  int u, i;
  for (u = 0; u < UNITS; ++u) {
    EXPECT_OK(braid_unit_enter(opt, u, BRAID_PHASE_FORWARD));
    for (i = 0; i < P; ++i) {
      if (kUnitOf[i] == u) EXPECT_TRUE(param_ok(opt, i, steps, rank));
    }
    EXPECT_OK(braid_unit_exit(opt, u, BRAID_PHASE_FORWARD));
  }
}

static void backward(braid_reducer_t* red, braid_optimizer_t* opt, int rank, int t) {
  int u, n, i;
  float* g = malloc(300 * sizeof(float));
  EXPECT_OK(braid_optimizer_begin_backward(opt, BRAID_SYNC));
  for (u = UNITS - 1; u >= 0; --u) {
    EXPECT_OK(braid_unit_enter(opt, u, BRAID_PHASE_BACKWARD));
    for (n = P - 1; n >= 0; --n) {
      size_t j;
      i = rank == 0 ? n : (n + 1) % P; /* another readiness order on rank 1 */
      if (kUnitOf[i] != u) continue;
      if (t % 2 == 1) { /* odd steps: computed in place in the pooled bucket, no copy */
        float* slot = NULL;
        size_t count = 0;
        EXPECT_OK(braid_reducer_grad_slot(red, i, (void**)&slot, &count));
        EXPECT_TRUE(slot != NULL && count == kCounts[i]);
        if (slot == NULL || count != kCounts[i]) continue;
        for (j = 0; j < kCounts[i]; ++j) slot[j] = grad(rank, t, i, j);
        EXPECT_OK(braid_reducer_mark_ready(red, i, NULL));
        continue;
      }
      for (j = 0; j < kCounts[i]; ++j) g[j] = grad(rank, t, i, j);
      EXPECT_OK(braid_reducer_mark_ready_grad(red, i, g, NULL));
      memset(g, 0xff, kCounts[i] * sizeof(float)); /* copied in: scribbling changes nothing */
    }
    EXPECT_OK(braid_unit_exit(opt, u, BRAID_PHASE_BACKWARD));
  }
  EXPECT_OK(braid_optimizer_finish_backward(opt));
  EXPECT_OK(braid_optimizer_end_step(opt)); /* after every forward + backward pass */
  free(g);
}

/* Gather only: the framework owns the step. Initial values and an SGD step (lr 1/16: exact)
 * written through the pieces; the next forward's gathered parameters are checked. */
static void gather_only(braid_reducer_t* red, int rank) {
  braid_optimizer_options_t oo;
  braid_optimizer_t* opt = NULL;
  float *p = NULL, *g = NULL, *grads = malloc(300 * sizeof(float));
  size_t count = 0, offset = 0, j;
  int i, u, n, t;
  braid_optimizer_options_init(&oo);
  oo.kind = BRAID_OPTIMIZER_NONE;
  oo.timeout_ms = 20000;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "fully_sharded", braid_optimizer_create(red, &oo, &opt));
  oo.fully_sharded = 1;
  EXPECT_OK(braid_optimizer_create(red, &oo, &opt));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "gathers only", braid_optimizer_set_param(opt, 0, grads));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "gathers only", braid_optimizer_step(opt));
  EXPECT_ERROR(BRAID_NOT_FOUND, "",
               braid_optimizer_param_shard(opt, 99, (void**)&p, &count, &offset));
  for (i = 0; i < P; ++i) {
    EXPECT_OK(braid_optimizer_param_shard(opt, i, (void**)&p, &count, &offset));
    EXPECT_TRUE(offset + count <= kCounts[i] && (count == 0 || p != NULL));
    for (j = 0; j < count; ++j) p[j] = initial(i, (size_t)offset + j);
  }
  for (t = 0; t < 2; ++t) {
    for (u = 0; u < UNITS; ++u) { /* forward: the gathered values */
      EXPECT_OK(braid_unit_enter(opt, u, BRAID_PHASE_FORWARD));
      for (i = 0; i < P; ++i) {
        if (kUnitOf[i] != u) continue;
        EXPECT_OK(braid_optimizer_param(opt, i, (void**)&p, &count));
        for (j = 0; j < count; ++j) {
          const float want = initial(i, j) - (t ? (grad(0, 0, i, j) + grad(1, 0, i, j)) / 32 : 0);
          if (p[j] != want) {
            fprintf(stderr, "rank %d step %d: parameter %d [%zu] = %g, want %g\n", rank, t, i, j,
                    (double)p[j], (double)want);
            EXPECT_TRUE(0);
            break;
          }
        }
      }
      EXPECT_OK(braid_unit_exit(opt, u, BRAID_PHASE_FORWARD));
    }
    if (t == 1) break;
    EXPECT_OK(braid_optimizer_begin_backward(opt, BRAID_SYNC));
    for (u = UNITS - 1; u >= 0; --u) {
      EXPECT_OK(braid_unit_enter(opt, u, BRAID_PHASE_BACKWARD));
      for (n = P - 1; n >= 0; --n) {
        if (kUnitOf[n] != u) continue;
        for (j = 0; j < kCounts[n]; ++j) grads[j] = grad(rank, 0, n, j);
        EXPECT_OK(braid_reducer_mark_ready_grad(red, n, grads, NULL));
      }
      EXPECT_OK(braid_unit_exit(opt, u, BRAID_PHASE_BACKWARD));
    }
    EXPECT_OK(braid_optimizer_finish_backward(opt));
    EXPECT_OK(braid_optimizer_end_step(opt));
    for (i = 0; i < P; ++i) { /* the framework's SGD step on this rank's pieces */
      size_t gcount = 0, goffset = 0;
      EXPECT_OK(braid_reducer_grad_shard(red, i, (void**)&g, &gcount, &goffset));
      EXPECT_OK(braid_optimizer_param_shard(opt, i, (void**)&p, &count, &offset));
      EXPECT_TRUE(gcount == count && goffset == offset);
      for (j = 0; j < count; ++j) {
        EXPECT_TRUE(g[j] == (grad(0, 0, i, offset + j) + grad(1, 0, i, offset + j)) / 2);
        p[j] -= g[j] / 16;
      }
    }
  }
  EXPECT_OK(braid_optimizer_end_step(opt));
  EXPECT_OK(braid_optimizer_destroy(opt));
  free(grads);
}

static void* rank_main(void* arg) {
  const int rank = *(const int*)arg;
  braid_param_t params[P];
  int units[P];
  braid_reducer_options_t ro;
  braid_optimizer_options_t oo;
  braid_reducer_t* red = NULL;
  braid_optimizer_t *opt = NULL, *zero2 = NULL;
  braid_memory_stats_t m;
  int i, t, buckets = 0, n_units = 0, count = 0, unit_buckets[8];
  size_t j;
  void* event = (void*)1;
  float* p = NULL;
  size_t pcount = 0;
  int64_t shard_bytes = 0;

  for (i = 0; i < P; ++i) {
    params[i].id = i;
    params[i].count = kCounts[i];
    params[i].dtype = BRAID_DTYPE_F32;
    params[i].name = NULL;
    units[i] = kUnitOf[i];
  }
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.bucket_cap_bytes = 1024;
  ro.first_bucket_cap_bytes = 512;
  ro.timeout_ms = 20000;
  ro.param_units = units;
  ro.shard_gradients = 1;
  EXPECT_OK(braid_reducer_create(world_groups[rank], NULL, params, P, &ro, &red));
  EXPECT_OK(braid_reducer_num_buckets(red, &buckets));
  EXPECT_OK(braid_reducer_num_units(red, &n_units));
  EXPECT_TRUE(n_units == UNITS && buckets >= 4);
  EXPECT_OK(braid_reducer_unit_buckets(red, 1, NULL, 0, &count));
  EXPECT_TRUE(count >= 1);
  EXPECT_ERROR(BRAID_OUT_OF_RANGE, "capacity",
               braid_reducer_unit_buckets(red, 1, unit_buckets, 0, &count));
  EXPECT_OK(braid_reducer_unit_buckets(red, 1, unit_buckets, 8, &count));
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "unit",
               braid_reducer_unit_buckets(red, -1, NULL, 0, &count));
  {
    void* stream = &stream; /* a host reducer reads mark_ready_grad's gradient in the call */
    EXPECT_OK(braid_reducer_grad_stream(red, &stream));
    EXPECT_TRUE(stream == NULL);
    EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "stream", braid_reducer_grad_stream(red, NULL));
  }
  {
    float* view = NULL;
    size_t c = 0;
    EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "", braid_reducer_grad(red, 0, (void**)&view, &c));
  }

  braid_optimizer_options_init(&oo);
  EXPECT_TRUE(oo.fully_sharded == 0 && oo.reshard_after_forward == 1 && oo.prefetch == 1 &&
              oo.max_live_bytes == 0 && oo.offload == 0 && oo.gather_stream == NULL);
  oo.lr = kLr;
  oo.beta1 = kBeta1;
  oo.beta2 = kBeta2;
  oo.eps = kEps;
  oo.weight_decay = kWd;
  oo.timeout_ms = 20000;
  oo.offload = 1;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "offload", braid_optimizer_create(red, &oo, &opt));
  oo.offload = 0;
  /* 0.11: quantized gathers (qwZ) need fully_sharded; bad values named (exactness:
   * tests/gather_quant_test.cc, tests/python/qwz_test.py). */
  EXPECT_TRUE(oo.gather_dtype == BRAID_GATHER_EXACT && oo.gather_block == 4096);
  oo.gather_dtype = BRAID_GATHER_INT8;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "needs opts->fully_sharded = 1",
               braid_optimizer_create(red, &oo, &opt));
  oo.fully_sharded = 1;
  oo.gather_block = 0;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "opts->gather_block must be in [1, 2^30], got 0",
               braid_optimizer_create(red, &oo, &opt));
  oo.gather_block = 4096;
  oo.gather_dtype = (braid_gather_dtype_t)7;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "opts->gather_dtype is 7",
               braid_optimizer_create(red, &oo, &opt));
  oo.gather_dtype = BRAID_GATHER_EXACT;
  EXPECT_OK(braid_optimizer_create(red, &oo, &opt));
  for (i = 0; i < P; ++i) {
    float* init = malloc(kCounts[i] * sizeof(float));
    for (j = 0; j < kCounts[i]; ++j) init[j] = initial(i, j);
    EXPECT_OK(braid_optimizer_set_param(opt, i, init));
    free(init);
  }
  /* Released between uses: no parameter to read; bad phases named. */
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "released",
               braid_optimizer_param(opt, 0, (void**)&p, &pcount));
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "phase", braid_unit_enter(opt, 0, (braid_phase_t)7));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "", braid_unit_exit(opt, 0, BRAID_PHASE_FORWARD));

  for (t = 0; t < STEPS; ++t) {
    forward(opt, t, rank);
    backward(red, opt, rank, t);
    EXPECT_OK(braid_optimizer_wait_all_params(opt));
    m.struct_size = sizeof m;
    EXPECT_OK(braid_memory_stats(red, &m));
    /* Shards only: the kept gradient shards, the parameter shards and the optimizer state are
     * each 1/2 of the model's; no full gradient bucket beyond the pool's two. */
    EXPECT_TRUE(m.by_use[BRAID_MEMORY_GRAD_SHARDS].current > 0);
    EXPECT_TRUE(m.by_use[BRAID_MEMORY_PARAM_SHARDS].current > 0);
  }
  forward(opt, STEPS, rank);
  EXPECT_OK(braid_optimizer_gather_event(opt, 0, &event));
  EXPECT_TRUE(event == NULL); /* host backend */
  EXPECT_ERROR(BRAID_OUT_OF_RANGE, "bucket", braid_optimizer_gather_event(opt, buckets, &event));

  /* After recording: a unit out of order is refused, naming the units. */
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "unit", braid_unit_enter(opt, 2, BRAID_PHASE_FORWARD));

  /* summon: every parameter readable outside the units, then released again. */
  EXPECT_OK(braid_optimizer_summon_params(opt, 1));
  for (i = 0; i < P; ++i) EXPECT_TRUE(param_ok(opt, i, STEPS, rank));
  EXPECT_OK(braid_optimizer_summon_params(opt, 0));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "released",
               braid_optimizer_param(opt, 3, (void**)&p, &pcount));

  /* Shards only: one parameter shard and one kept gradient shard per bucket (f32 here). */
  m.struct_size = sizeof m;
  EXPECT_OK(braid_memory_stats(red, &m));
  for (i = 0; i < buckets; ++i) {
    void* shard = NULL;
    size_t shard_count = 0;
    EXPECT_OK(braid_reducer_shard(red, i, &shard, &shard_count));
    shard_bytes += (int64_t)(shard_count * sizeof(float));
  }
  EXPECT_TRUE(m.by_use[BRAID_MEMORY_GRAD_SHARDS].current == shard_bytes);
  EXPECT_TRUE(m.by_use[BRAID_MEMORY_PARAM_SHARDS].current == shard_bytes);
  EXPECT_TRUE(m.by_use[BRAID_MEMORY_OPTIMIZER_STATE].current >= 3 * shard_bytes);
  EXPECT_OK(braid_optimizer_destroy(opt));

  /* A ZeRO-2 optimizer has no units. */
  oo.fully_sharded = 0;
  EXPECT_OK(braid_optimizer_create(red, &oo, &zero2));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "fully_sharded",
               braid_unit_enter(zero2, 0, BRAID_PHASE_FORWARD));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "fully_sharded", braid_optimizer_end_step(zero2));
  EXPECT_OK(braid_optimizer_destroy(zero2));
  gather_only(red, rank);
  EXPECT_OK(braid_reducer_destroy(red));
  return NULL;
}

/* argv[1] == "mpi": one rank of `mpirun -np 2` (tests/run_mpi.sh); else 2 local threads. */
int main(int argc, char** argv) {
  test_run_2_ranks(argc, argv, world_groups, rank_main);
  return test_finish("capi_fsdp_test");
}
