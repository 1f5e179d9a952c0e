/* The names in error messages: every message of a common misuse names the C entry point that
 * failed ("braid_reducer_mark_ready: ...") and, where it points at another call, that call as
 * braid.h spells it; none names a C++ method (MarkReady, BeginBackward, ...) or a C++ field.
 * Misuse driven on one local rank: marks outside a backward, unknown ids, finish without begin,
 * a second begin, a second mark, declare_unused after a mark, twice, without agree_unused, marks
 * and finishes without the declaration, copy-in and shard_gradients misuse, reduce_scatter_only
 * outside hybrid mode, and the optimizer's units (unknown unit, exit without enter, a step
 * ended with a unit held, a released unit's parameter, an unknown bucket). */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

/* A C++ name in `msg`: a CamelCase word of two humps or more (MarkReady, GradView), a `::`,
 * or a C++-only field. NULL when there is none. */
static const char* cxx_name(const char* msg) {
  static const char* const kFields[] = {"keep_shards_only", "kCountMarks", "kReduceScatterOnly"};
  size_t i, k;
  if (strstr(msg, "::") != NULL) return "::";
  for (k = 0; k < sizeof kFields / sizeof kFields[0]; ++k) {
    if (strstr(msg, kFields[k]) != NULL) return kFields[k];
  }
  for (i = 0; msg[i] != '\0'; ++i) {
    size_t j = i + 1;
    if (!isupper((unsigned char)msg[i]) || (i > 0 && isalnum((unsigned char)msg[i - 1]))) continue;
    while (islower((unsigned char)msg[j])) ++j;
    if (j > i + 1 && isupper((unsigned char)msg[j]) && islower((unsigned char)msg[j + 1]))
      return msg + i;
  }
  return NULL;
}

/* `call` returns `want`, and its message begins with "<fn>: ", contains `substr` and names no
 * C++ method. */
#define EXPECT_NAMED(want, fn, substr, call)                                       \
  do {                                                                             \
    braid_status_t s_;                                                             \
    const char *m_, *cxx_;                                                         \
    char d_[1024];                                                                 \
    braid_clear_error();                                                           \
    s_ = (call);                                                                   \
    m_ = braid_last_error();                                                       \
    cxx_ = cxx_name(m_);                                                           \
    if (s_ != (want) || strncmp(m_, fn ": ", strlen(fn) + 2) != 0 ||               \
        strstr(m_, (substr)) == NULL || cxx_ != NULL) {                            \
      snprintf(d_, sizeof d_, "got %s \"%s\"; want %s \"%s: ...%s...\"%s%.24s",    \
               braid_status_name(s_), m_, braid_status_name(want), fn, substr,     \
               cxx_ != NULL ? ", naming C++ at: " : "", cxx_ != NULL ? cxx_ : ""); \
      test_fail(__FILE__, __LINE__, #call, d_);                                    \
    }                                                                              \
  } while (0)

static const braid_status_t kPre = BRAID_FAILED_PRECONDITION;
static const braid_status_t kInval = BRAID_INVALID_ARGUMENT;

/* The checker itself: it must catch the C++ spellings the messages used to carry. */
static void test_checker(void) {
  EXPECT_TRUE(cxx_name("MarkReady('w' (id 7)) outside a backward") != NULL);
  EXPECT_TRUE(cxx_name("x: call BeginBackward first") != NULL);
  EXPECT_TRUE(cxx_name("GradView(w): no") != NULL);
  EXPECT_TRUE(cxx_name("declares its marks, or kCountMarks") != NULL);
  EXPECT_TRUE(cxx_name("see PlanOptions::shards") != NULL);
  EXPECT_TRUE(cxx_name("braid_reducer_mark_ready: parameter 'w' (id 7) marked ready") == NULL);
  EXPECT_TRUE(cxx_name("a NaN loss; INTERNAL; bucket 3 on group 'world'") == NULL);
}

static braid_reducer_t* make_reducer(braid_group_t* g, braid_reduce_mode_t mode, int as_view,
                                     int agree, int shard_gradients) {
  braid_param_t params[2] = {{7, 16, BRAID_DTYPE_F32, "w"}, {8, 4, BRAID_DTYPE_F32, "b"}};
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  braid_reducer_options_init(&ro);
  ro.mode = mode;
  ro.gradient_as_bucket_view = as_view;
  ro.agree_unused = agree;
  ro.shard_gradients = shard_gradients;
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(g, NULL, params, 2, &ro, &red));
  return red;
}

static void test_reducer(braid_group_t* g) {
  float grad[16] = {0};
  braid_reducer_t* red = make_reducer(g, BRAID_MODE_ALLREDUCE, 1, BRAID_UNUSED_NONE, 0);
  const int64_t seven = 7;
  EXPECT_NAMED(kPre, "braid_reducer_mark_ready", "braid_reducer_begin_backward",
               braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_NAMED(kPre, "braid_reducer_mark_ready_grad", "outside a backward",
               braid_reducer_mark_ready_grad(red, 7, grad, NULL));
  EXPECT_NAMED(kPre, "braid_reducer_finish_backward", "braid_reducer_begin_backward",
               braid_reducer_finish_backward(red));
  EXPECT_NAMED(kPre, "braid_reducer_set_grad_buffer", "braid_reducer_grad",
               braid_reducer_set_grad_buffer(red, 7, grad));
  EXPECT_NAMED(kInval, "braid_reducer_begin_backward", "hybrid",
               braid_reducer_begin_backward(red, BRAID_REDUCE_SCATTER_ONLY));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_NAMED(kPre, "braid_reducer_begin_backward", "braid_reducer_finish_backward",
               braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_NAMED(BRAID_NOT_FOUND, "braid_reducer_mark_ready", "unknown parameter id 99",
               braid_reducer_mark_ready(red, 99, NULL));
  EXPECT_NAMED(kPre, "braid_reducer_declare_unused", "agree_unused",
               braid_reducer_declare_unused(red, &seven, 1));
  EXPECT_OK(braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_NAMED(kPre, "braid_reducer_mark_ready", "'w' (id 7) was already marked",
               braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_NAMED(kPre, "braid_reducer_finish_backward", "'b' (id 8)",
               braid_reducer_finish_backward(red));
  EXPECT_OK(braid_reducer_destroy(red));

  /* agree_unused = declared: the declaration comes first, once, before any mark */
  red = make_reducer(g, BRAID_MODE_ALLREDUCE, 1, BRAID_UNUSED_DECLARED, 0);
  EXPECT_NAMED(kPre, "braid_reducer_declare_unused", "braid_reducer_begin_backward",
               braid_reducer_declare_unused(red, &seven, 1));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_NAMED(kPre, "braid_reducer_mark_ready", "before braid_reducer_declare_unused",
               braid_reducer_mark_ready(red, 8, NULL));
  EXPECT_NAMED(kPre, "braid_reducer_finish_backward", "without braid_reducer_declare_unused",
               braid_reducer_finish_backward(red));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_NAMED(BRAID_NOT_FOUND, "braid_reducer_declare_unused", "unknown parameter id 99",
               braid_reducer_declare_unused(red, (const int64_t[]){99}, 1));
  EXPECT_OK(braid_reducer_declare_unused(red, NULL, 0));
  EXPECT_NAMED(kPre, "braid_reducer_declare_unused", "twice",
               braid_reducer_declare_unused(red, NULL, 0));
  EXPECT_OK(braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_OK(braid_reducer_mark_ready(red, 8, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red));
  /* a no_sync backward takes marks before the declaration, then refuses it */
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_NO_SYNC));
  EXPECT_OK(braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_NAMED(kPre, "braid_reducer_declare_unused", "'w' (id 7) was marked ready",
               braid_reducer_declare_unused(red, NULL, 0));
  EXPECT_OK(braid_reducer_finish_backward(red));
  EXPECT_OK(braid_reducer_destroy(red));

  /* the copy-in path */
  red = make_reducer(g, BRAID_MODE_ALLREDUCE, 0, BRAID_UNUSED_NONE, 0);
  EXPECT_NAMED(kPre, "braid_reducer_begin_backward", "braid_reducer_set_grad_buffer",
               braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_OK(braid_reducer_set_grad_buffer(red, 7, grad));
  EXPECT_OK(braid_reducer_set_grad_buffer(red, 8, grad));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_NAMED(kPre, "braid_reducer_mark_ready_grad", "use braid_reducer_mark_ready",
               braid_reducer_mark_ready_grad(red, 7, grad, NULL));
  EXPECT_NAMED(kPre, "braid_reducer_set_grad_buffer", "during a backward",
               braid_reducer_set_grad_buffer(red, 7, grad));
  EXPECT_OK(braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_OK(braid_reducer_mark_ready(red, 8, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red));
  EXPECT_OK(braid_reducer_destroy(red));

  /* shard_gradients: gradients go in with their marks */
  red = make_reducer(g, BRAID_MODE_REDUCE_SCATTER, 1, BRAID_UNUSED_NONE, 1);
  {
    void* data = NULL;
    size_t count = 0;
    EXPECT_NAMED(kPre, "braid_reducer_grad", "braid_reducer_mark_ready_grad",
                 braid_reducer_grad(red, 7, &data, &count));
  }
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_NAMED(kPre, "braid_reducer_mark_ready", "braid_reducer_mark_ready_grad",
               braid_reducer_mark_ready(red, 7, NULL));
  EXPECT_OK(braid_reducer_mark_ready_grad(red, 7, grad, NULL));
  EXPECT_OK(braid_reducer_mark_ready_grad(red, 8, grad, NULL));
  EXPECT_OK(braid_reducer_finish_backward(red));
  EXPECT_OK(braid_reducer_destroy(red));
}

/* A fully sharded AdamW over two units: unit misuse and parameter reads. */
static void test_units(braid_group_t* g) {
  braid_param_t params[2] = {{7, 16, BRAID_DTYPE_F32, "w"}, {8, 4, BRAID_DTYPE_F32, "b"}};
  int units[2] = {0, 1};
  braid_reducer_options_t ro;
  braid_optimizer_options_t oo;
  braid_reducer_t* red = NULL;
  braid_optimizer_t* opt = NULL;
  float values[16] = {0};
  void* data = NULL;
  size_t count = 0;
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.param_units = units;
  ro.shard_gradients = 1;
  ro.bucket_cap_bytes = 16; /* a bucket per parameter */
  ro.first_bucket_cap_bytes = 16;
  ro.timeout_ms = 20000;
  EXPECT_OK(braid_reducer_create(g, NULL, params, 2, &ro, &red));
  braid_optimizer_options_init(&oo);
  oo.fully_sharded = 1;
  oo.timeout_ms = 20000;
  EXPECT_OK(braid_optimizer_create(red, &oo, &opt));
  EXPECT_OK(braid_optimizer_set_param(opt, 7, values));
  EXPECT_OK(braid_optimizer_set_param(opt, 8, values));
  EXPECT_NAMED(BRAID_OUT_OF_RANGE, "braid_optimizer_wait_params", "no bucket 99",
               braid_optimizer_wait_params(opt, 99));
  EXPECT_NAMED(kInval, "braid_unit_enter", "no such unit",
               braid_unit_enter(opt, 5, BRAID_PHASE_FORWARD));
  EXPECT_NAMED(kPre, "braid_unit_exit", "braid_unit_enter(1, BRAID_PHASE_FORWARD)",
               braid_unit_exit(opt, 1, BRAID_PHASE_FORWARD));
  EXPECT_OK(braid_unit_enter(opt, 0, BRAID_PHASE_FORWARD));
  EXPECT_OK(braid_optimizer_param(opt, 7, &data, &count));
  EXPECT_NAMED(kPre, "braid_optimizer_param", "released (fully_sharded); enter its unit first",
               braid_optimizer_param(opt, 8, &data, &count));
  EXPECT_NAMED(kPre, "braid_optimizer_end_step", "braid_unit_exit", braid_optimizer_end_step(opt));
  EXPECT_OK(braid_unit_exit(opt, 0, BRAID_PHASE_FORWARD));
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(red));
}

int main(void) {
  braid_group_t* g[1];
  braid_world_t* w = test_local_world(1, g);
  test_checker();
  test_reducer(g[0]);
  test_units(g[0]);
  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_world_destroy(w));
  return test_finish("capi_error_names_test");
}
