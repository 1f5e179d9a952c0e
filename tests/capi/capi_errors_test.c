/* Bad input through the C API: each call returns the documented code and a message naming the
 * problem, and nothing crashes: NULL / destroyed / wrong-type / garbage handles, struct_size,
 * unknown backend, missing plugin, marking twice or outside a backward, destroy order, a
 * handle from another world, timeouts of works in flight, a job aborted by a rank. */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

static void test_handles(void) {
  braid_group_t* g[1];
  braid_world_t* w = test_local_world(1, g);
  int x = 0, local[1];
  braid_group_t* dead = NULL;
  braid_work_t* work = NULL;
  const braid_status_t inval = BRAID_INVALID_ARGUMENT;

  EXPECT_ERROR(inval, "braid_group_rank: argument 'group' is NULL", braid_group_rank(NULL, &x));
  EXPECT_ERROR(inval, "argument 'rank' is NULL", braid_group_rank(g[0], NULL));
  EXPECT_ERROR(inval, "is a braid_world_t handle, not a braid_group_t",
               braid_group_rank((braid_group_t*)w, &x));
  EXPECT_ERROR(inval, "is not a Braid handle", braid_group_rank((braid_group_t*)&x, &x));
  EXPECT_ERROR(inval, "is not a Braid handle", braid_world_destroy((braid_world_t*)local));
  EXPECT_ERROR(inval, "is a braid_group_t handle, not a braid_reducer_t",
               braid_reducer_mark_ready((braid_reducer_t*)g[0], 0, NULL));

  /* use after destroy, and a second destroy */
  EXPECT_OK(braid_group_split(g[0], 0, 0, NULL, &dead));
  EXPECT_OK(braid_group_destroy(dead));
  EXPECT_ERROR(inval, "argument 'group' is a destroyed braid_group_t handle",
               braid_group_size(dead, &x));
  EXPECT_ERROR(inval, "destroyed braid_group_t", braid_group_destroy(dead));
  EXPECT_ERROR(inval, "destroyed braid_group_t handle (used after its destroy); a braid_work_t",
               braid_work_wait((braid_work_t*)dead, 0));
  EXPECT_OK(braid_group_destroy(NULL)); /* NULL: a no-op, as free(NULL) */

  /* the last error survives successful calls, and is cleared on request */
  EXPECT_ERROR(inval, "is NULL", braid_group_rank(NULL, &x));
  EXPECT_OK(braid_group_rank(g[0], &x));
  EXPECT_TRUE(strstr(braid_last_error(), "is NULL") != NULL);
  braid_clear_error();
  EXPECT_TRUE(strcmp(braid_last_error(), "") == 0);

  /* world group taken twice; local_ranks output too small */
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "already", braid_world_group(w, 0, &dead));
  EXPECT_ERROR(inval, "outside the world", braid_world_group(w, 5, &dead));
  EXPECT_ERROR(BRAID_OUT_OF_RANGE, "room for 0", braid_world_local_ranks(w, local, 0, &x));
  EXPECT_TRUE(x == 1);

  /* bad enum values */
  EXPECT_ERROR(inval, "dtype 42 is not a braid_dtype_t",
               braid_allreduce(g[0], &x, &x, 1, (braid_dtype_t)42, BRAID_OP_SUM, NULL, &work));
  EXPECT_ERROR(
      inval, "op 9 is not a braid_reduce_op_t",
      braid_allreduce(g[0], &x, &x, 1, BRAID_DTYPE_I32, (braid_reduce_op_t)9, NULL, &work));

  /* destroy order: the world has a live group */
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "1 braid_group_t", braid_world_destroy(w));
  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_world_destroy(w));
}

static void test_options(void) {
  braid_world_options_t o;
  braid_world_t* w = NULL;
  struct {
    braid_world_options_t opts;
    char newer[16];
  } big;
  const braid_status_t inval = BRAID_INVALID_ARGUMENT;

  braid_world_options_init(&o);
  o.struct_size = 0;
  EXPECT_ERROR(inval, "braid_world_options_t.struct_size is 0: not set",
               braid_world_create(&o, &w));
  braid_world_options_init(&o);
  o.struct_size = offsetof(braid_world_options_t, timeout_ms); /* before 0.5's end */
  EXPECT_ERROR(inval, "smaller than any known version", braid_world_create(&o, &w));
  o.struct_size = sizeof(o) - 8; /* between 0.5's and 0.6's sizes */
  EXPECT_ERROR(inval, "not the size of any version", braid_world_create(&o, &w));
  o.struct_size = 1u << 20;
  EXPECT_ERROR(inval, "implausibly large", braid_world_create(&o, &w));

  memset(&big, 0, sizeof big);
  braid_world_options_init(&big.opts);
  big.opts.struct_size = sizeof big;
  big.opts.read_env = 0;
  big.newer[3] = 1;
  EXPECT_ERROR(inval, "newer Braid", braid_world_create(&big.opts, &w));
  big.newer[3] = 0; /* a newer caller that leaves the new fields at zero: accepted */
  EXPECT_OK(braid_world_create(&big.opts, &w));
  EXPECT_OK(braid_world_destroy(w));

  braid_world_options_init(&o);
  o.read_env = 0;
  o.backend = "no_such_backend";
  EXPECT_ERROR(BRAID_NOT_FOUND, "no_such_backend", braid_world_create(&o, &w));
  braid_world_options_init(&o);
  o.plugin_path = "/nonexistent/libbraid_missing_plugin.so";
  EXPECT_ERROR(BRAID_NOT_FOUND, "/nonexistent/libbraid_missing_plugin.so",
               braid_world_create(&o, &w));
  braid_world_options_init(&o);
  o.local_ranks = -2;
  EXPECT_ERROR(inval, "local_ranks must be in [0, 4096]", braid_world_create(&o, &w));
  EXPECT_ERROR(inval, "argument 'out' is NULL", braid_world_create(NULL, NULL));
}

static void test_reducer(void) {
  braid_group_t* g[1];
  braid_world_t* w = test_local_world(1, g);
  braid_param_t params[2] = {{7, 16, BRAID_DTYPE_F32, "w"}, {8, 4, BRAID_DTYPE_F32, NULL}};
  braid_reducer_t* red = NULL;
  braid_optimizer_t* opt = NULL;
  braid_reducer_options_t ro;
  void* data = NULL;
  size_t count = 0;
  const braid_status_t pre = BRAID_FAILED_PRECONDITION;

  braid_reducer_options_init(&ro);
  ro.mode = (braid_reduce_mode_t)9;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "opts->mode 9 is not a braid_reduce_mode_t",
               braid_reducer_create(g[0], NULL, params, 2, &ro, &red));
  params[0].dtype = (braid_dtype_t)-3;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "params[0] ('w' (id 7)): dtype -3 is not a braid_dtype_t",
               braid_reducer_create(g[0], NULL, params, 2, NULL, &red));
  params[0].dtype = BRAID_DTYPE_F32;
  EXPECT_OK(braid_reducer_create(g[0], NULL, params, 2, NULL, &red));
  EXPECT_ERROR(pre,
               "braid_reducer_mark_ready: parameter 'w' (id 7) marked ready outside a backward",
               braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_ERROR(pre, "previous backward is not finished",
               braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_ERROR(pre, "in progress", braid_reducer_zero_grads(red));
  EXPECT_OK(braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_ERROR(pre, "braid_reducer_mark_ready: parameter 'w' (id 7) was already marked",
               braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_ERROR(BRAID_NOT_FOUND, "unknown parameter id 99", braid_reducer_mark_ready(red, 99, NULL));
  EXPECT_ERROR(pre, "id 8", braid_reducer_finish_backward(red)); /* 8 was never marked */
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_OK(braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_OK(braid_reducer_mark_ready(red, 8, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red));
  EXPECT_ERROR(pre, "outside a backward", braid_reducer_mark_ready(red, 8, NULL));
  EXPECT_ERROR(BRAID_NOT_FOUND, "42", braid_reducer_grad(red, 42, &data, &count));
  EXPECT_ERROR(BRAID_OUT_OF_RANGE, "bucket 3", braid_reducer_shard(red, 3, &data, &count));
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "is not a braid_sync_mode_t",
               braid_reducer_begin_backward(red, (braid_sync_mode_t)7));
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "all-reduce", /* the optimizer needs reduce-scatter */
               braid_optimizer_create(red, NULL, &opt));
  EXPECT_ERROR(pre, "1 braid_reducer_t", braid_group_destroy(g[0]));
  EXPECT_OK(braid_reducer_destroy(red));

  /* an optimizer owns the backward, and its reducer cannot go first */
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  EXPECT_OK(braid_reducer_create(g[0], NULL, params, 2, &ro, &red));
  EXPECT_OK(braid_optimizer_create(red, NULL, &opt));
  EXPECT_ERROR(pre, "braid_optimizer_begin_backward",
               braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_ERROR(pre, "1 braid_optimizer_t", braid_reducer_destroy(red));
  EXPECT_ERROR(BRAID_OUT_OF_RANGE, "bucket 9", braid_optimizer_wait_params(opt, 9));
  EXPECT_ERROR(BRAID_NOT_FOUND, "/nonexistent/state",
               braid_optimizer_load(opt, "/nonexistent/state"));
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "lr must be", braid_optimizer_set_lr(opt, -1.0));
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(red));
  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_world_destroy(w));
}

/* Timeline on/off: a bad prefix fails naming the file; a good one writes a Chrome trace. */
static void test_timeline(void) {
  braid_group_t* g[1];
  braid_world_t* w = test_local_world(1, g);
  braid_param_t p = {3, 8, BRAID_DTYPE_F32, "p"};
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  char prefix[512], file[600], text[64] = {0};
  const char* tmp = getenv("TEST_TMPDIR");
  FILE* f;

  braid_reducer_options_init(&ro);
  ro.timeline_prefix = "/nonexistent/dir/trace";
  EXPECT_ERROR(BRAID_NOT_FOUND, "/nonexistent/dir/trace.rank0.json",
               braid_reducer_create(g[0], NULL, &p, 1, &ro, &red));
  snprintf(prefix, sizeof prefix, "%s/capi_trace", tmp != NULL ? tmp : "/tmp");
  snprintf(file, sizeof file, "%s.rank0.json", prefix);
  ro.timeline_prefix = prefix;
  EXPECT_OK(braid_reducer_create(g[0], NULL, &p, 1, &ro, &red));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_OK(braid_reducer_mark_ready(red, 3, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red));
  EXPECT_OK(braid_reducer_destroy(red)); /* closes the timeline */
  f = fopen(file, "r");
  EXPECT_TRUE(f != NULL);
  if (f != NULL) {
    EXPECT_TRUE(fread(text, 1, sizeof text - 1, f) > 0 && strstr(text, "traceEvents") != NULL);
    fclose(f);
    remove(file);
  }
  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_world_destroy(w));
}

/* Work in flight (rank 1 has not joined yet), a timeout, destroy order, then completion. */
static void test_in_flight(void) {
  braid_group_t* g[2];
  braid_world_t* w = test_local_world(2, g);
  braid_world_t* other = NULL;
  braid_group_t* og[1];
  braid_work_t *w0 = NULL, *w1 = NULL;
  braid_reducer_t* red = NULL;
  braid_param_t p = {1, 8, BRAID_DTYPE_F32, "p"};
  braid_reducer_options_t ro;
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4};
  int done = -1;

  EXPECT_OK(braid_allreduce(g[0], a, a, 4, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &w0));
  EXPECT_ERROR(BRAID_TIMEOUT, "timed out waiting for allreduce #0 on group 'world'",
               braid_work_wait(w0, 10));
  braid_clear_error();
  EXPECT_TRUE(braid_work_test(w0, &done) == BRAID_IN_PROGRESS && done == 0);
  EXPECT_TRUE(strcmp(braid_last_error(), "") == 0);
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "2 braid_group_t", braid_world_destroy(w));
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "1 braid_work_t", braid_group_destroy(g[0]));

  /* a handle from another world: replica of world `other` with a shard of world `w` */
  other = test_local_world(1, og);
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_HYBRID;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "different world",
               braid_reducer_create(g[0], og[0], &p, 1, &ro, &red));
  EXPECT_OK(braid_group_destroy(og[0]));
  EXPECT_OK(braid_world_destroy(other));

  EXPECT_OK(braid_allreduce(g[1], b, b, 4, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &w1));
  EXPECT_OK(braid_work_wait(w0, 20000));
  EXPECT_OK(braid_work_wait(w1, -1));
  EXPECT_TRUE(a[3] == 8.0f && b[0] == 2.0f);
  EXPECT_OK(braid_work_destroy(w0));
  EXPECT_OK(braid_work_destroy(w1));
  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_group_destroy(g[1]));
  EXPECT_OK(braid_world_destroy(w));
}

/* braid_group_abort: rank 0 waits in an all-reduce rank 1 never joins (default deadline); rank
 * 1's step fails and it aborts the job: rank 0's work fails at once with BRAID_PEER_ERROR
 * naming rank 1 and the reason, and every later call on any group is refused the same way. */
static void test_abort(void) {
  braid_group_t* g[2];
  braid_world_t* w = test_local_world(2, g);
  braid_work_t* w0 = NULL;
  braid_work_t* late = NULL;
  float a[4] = {1, 2, 3, 4};

  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "argument 'reason' is NULL", braid_group_abort(g[1], NULL));
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "reason is empty", braid_group_abort(g[1], ""));
  EXPECT_OK(braid_allreduce(g[0], a, a, 4, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &w0));
  EXPECT_OK(braid_group_abort(g[1], "step 3: loss is NaN"));
  EXPECT_ERROR(BRAID_PEER_ERROR, "job aborted: rank 1 reported INTERNAL: step 3: loss is NaN",
               braid_work_wait(w0, 2000));
  EXPECT_ERROR(BRAID_PEER_ERROR, "group 'world' refuses new calls: job aborted: rank 1",
               braid_barrier(g[1], NULL, &late));
  EXPECT_OK(braid_group_abort(g[0], "later")); /* already aborted: no effect */
  EXPECT_OK(braid_work_destroy(w0));
  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_group_destroy(g[1]));
  EXPECT_OK(braid_world_destroy(w));
}

int main(void) {
  test_abort();
  test_handles();
  test_options();
  test_reducer();
  test_timeline();
  test_in_flight();
  return test_finish("capi_errors_test");
}
