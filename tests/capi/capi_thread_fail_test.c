/* Thread creation that fails (issue 23 item 2): no library code terminates its host. This
 * program defines pthread_create itself (the dynamic linker binds libbraid.so's calls, through
 * std::thread, to it) and makes the calls fail with EAGAIN after a chosen number of successes,
 * as RLIMIT_NPROC or a full kernel thread table would. Each C API call that starts threads is
 * run with failures from its first thread on, then its second, ... until it succeeds: every
 * attempt returns BRAID_INTERNAL naming "could not start a thread", or BRAID_OK; the objects it
 * was called on stay usable (checked by a result after each failure) and destroyable.
 * Before the fix, std::thread's std::system_error terminated the process. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

typedef int (*create_fn)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
static volatile int allowed = -1; /* < 0: every call succeeds; else successes left */
static volatile int refused = 0;

int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*), void* arg) {
  static create_fn real = NULL;
  if (real == NULL) {
    void* sym = dlsym(RTLD_NEXT, "pthread_create");
    memcpy(&real, &sym, sizeof real);
  }
  if (allowed >= 0) {
    if (__sync_fetch_and_sub(&allowed, 1) <= 0) {
      __sync_fetch_and_add(&allowed, 1);
      __sync_fetch_and_add(&refused, 1);
      return EAGAIN;
    }
  }
  return real(t, attr, fn, arg);
}

static void fail_after(int successes) {
  refused = 0;
  allowed = successes;
}
static void never_fail(void) { allowed = -1; }

/* The failed call's code and message; 1 when it failed as it should, 0 on BRAID_OK. */
static int failed_cleanly(braid_status_t s, const char* call, int k) {
  char d[1200];
  if (s == BRAID_OK) return 0;
  if (s != BRAID_INTERNAL || strstr(braid_last_error(), "could not start a thread") == NULL ||
      refused == 0) {
    snprintf(d, sizeof d, "%s with %d threads allowed: %s \"%s\" (%d refused)", call, k,
             braid_status_name(s), braid_last_error(), refused);
    test_fail(__FILE__, __LINE__, "a failed thread start is BRAID_INTERNAL naming it", d);
  }
  return 1;
}

static void test_world_group(void) {
  braid_world_options_t o;
  braid_world_t* w = NULL;
  braid_group_t* g = NULL;
  int k, failures = 0;
  braid_world_options_init(&o);
  o.backend = "local";
  o.read_env = 0;
  o.local_ranks = 1;
  EXPECT_OK(braid_world_create(&o, &w));
  for (k = 0;; ++k) {
    braid_status_t s;
    fail_after(k);
    s = braid_world_group(w, 0, &g);
    never_fail();
    if (!failed_cleanly(s, "braid_world_group", k)) break;
    if (++failures == 64) return; /* never succeeds: failed above */
  }
  EXPECT_TRUE(failures >= 1); /* the group's worker thread */
  EXPECT_OK(braid_group_destroy(g));
  EXPECT_OK(braid_world_destroy(w));
}

/* One SGD step (gradient 1, lr 0.5, no momentum or decay) from 2: every element 1.5. */
static void step_once(braid_optimizer_t* opt, braid_reducer_t* red) {
  float init[64], *grad = NULL, *p = NULL;
  size_t count = 0, i;
  for (i = 0; i < 64; ++i) init[i] = 2.0f;
  EXPECT_OK(braid_optimizer_set_param(opt, 1, init));
  EXPECT_OK(braid_optimizer_begin_backward(opt, BRAID_SYNC));
  EXPECT_OK(braid_reducer_grad(red, 1, (void**)&grad, &count));
  for (i = 0; i < count; ++i) grad[i] = 1.0f;
  EXPECT_OK(braid_reducer_mark_ready(red, 1, NULL));
  EXPECT_OK(braid_optimizer_finish_backward(opt));
  EXPECT_OK(braid_optimizer_wait_all_params(opt));
  EXPECT_OK(braid_optimizer_param(opt, 1, (void**)&p, &count));
  EXPECT_TRUE(count == 64);
  for (i = 0; i < count; ++i) EXPECT_TRUE(p[i] == 1.5f);
}

/* The reducer alone still reduces: its gradient after a 1-rank synced backward is what was
 * written (the average over one rank). */
static void reduce_once(braid_reducer_t* red) {
  float* grad = NULL;
  size_t count = 0, i;
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_OK(braid_reducer_grad(red, 1, (void**)&grad, &count));
  for (i = 0; i < count; ++i) grad[i] = (float)i;
  EXPECT_OK(braid_reducer_mark_ready(red, 1, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red));
  for (i = 0; i < count; ++i) EXPECT_TRUE(grad[i] == (float)i);
}

static void test_reducer_and_optimizer(braid_group_t* g, const char* timeline) {
  braid_param_t params[1] = {{1, 64, BRAID_DTYPE_F32, "p"}};
  braid_reducer_options_t ro;
  braid_optimizer_options_t oo;
  braid_reducer_t* red = NULL;
  braid_optimizer_t* opt = NULL;
  int k, failures = 0;
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.timeline_prefix = timeline; /* a timeline writer thread */
  ro.credit_bytes = 64;          /* a launch scheduler with its timer thread */
  for (k = 0;; ++k) {
    braid_status_t s;
    fail_after(k);
    s = braid_reducer_create(g, NULL, params, 1, &ro, &red);
    never_fail();
    if (!failed_cleanly(s, "braid_reducer_create", k)) break;
    if (++failures == 64) return;
  }
  EXPECT_TRUE(failures >= 2); /* the timeline writer, the scheduler's timer */
  reduce_once(red);

  braid_optimizer_options_init(&oo);
  oo.kind = BRAID_OPTIMIZER_SGD;
  oo.lr = 0.5;
  oo.momentum = 0;
  oo.weight_decay = 0;
  oo.threads = 3; /* two kernel workers */
  oo.overlap = 1; /* the stepper thread */
  failures = 0;
  for (k = 0;; ++k) {
    braid_status_t s;
    fail_after(k);
    s = braid_optimizer_create(red, &oo, &opt);
    never_fail();
    if (!failed_cleanly(s, "braid_optimizer_create", k)) break;
    if (++failures == 64) return;
    reduce_once(red); /* the reducer works after each failed attempt */
  }
  EXPECT_TRUE(failures >= 4); /* gather group, two kernel workers, stepper (and more) */
  step_once(opt, red);
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(red));
}

int main(void) {
  braid_group_t* g[1];
  braid_world_t* w;
  char prefix[] = "/tmp/braid_thread_fail_XXXXXX";
  const char* tmp = getenv("TEST_TMPDIR");
  char timeline[512];
  test_world_group();
  w = test_local_world(1, g);
  if (tmp != NULL) {
    snprintf(timeline, sizeof timeline, "%s/timeline", tmp);
  } else {
    if (mkdtemp(prefix) == NULL) return 1;
    snprintf(timeline, sizeof timeline, "%s/timeline", prefix);
  }
  test_reducer_and_optimizer(g[0], timeline);
  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_world_destroy(w));
  return test_finish("capi_thread_fail_test");
}
