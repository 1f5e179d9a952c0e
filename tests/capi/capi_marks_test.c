/* braid_reducer_options_t.param_marks (0.11): tied and reused parameters marked once per
 * contribution. Declared marks add up and launch after the last; a mark beyond the count is
 * refused naming the parameter (nothing added); BRAID_MARKS_COUNTED learns the count in the
 * first synced backward and refuses fewer marks later; negative counts are refused; a 0.10
 * options struct (ending at priorities) still creates a reducer of single marks. */
#include <stddef.h>

#include "tests/capi/test_util.h"

/* One synced backward on a one-rank reducer: `n` marks of parameter 3 (each adding 1 to its
 * gradient view), one of parameter 4. Returns finish_backward's status; *late: the last mark's. */
static braid_status_t backward(braid_reducer_t* red, int n, braid_status_t* late) {
  void* data = NULL;
  size_t count = 0, i;
  int k;
  EXPECT_OK(braid_reducer_zero_grads(red));
  EXPECT_OK(braid_reducer_begin_backward(red, BRAID_SYNC));
  EXPECT_OK(braid_reducer_grad(red, 3, &data, &count));
  *late = BRAID_OK;
  for (k = 0; k < n; ++k) {
    for (i = 0; i < count; ++i) ((float*)data)[i] += 1.0f;
    *late = braid_reducer_mark_ready(red, 3, NULL);
  }
  EXPECT_OK(braid_reducer_mark_ready(red, 4, NULL));
  return braid_reducer_finish_backward(red);
}

static float first_grad(braid_reducer_t* red) {
  void* data = NULL;
  size_t count = 0;
  EXPECT_OK(braid_reducer_grad(red, 3, &data, &count));
  return data != NULL ? ((float*)data)[0] : -1.0f;
}

int main(void) {
  braid_group_t* g[1];
  braid_world_t* w = test_local_world(1, g);
  braid_param_t p[2] = {{3, 4, BRAID_DTYPE_F32, "wte.weight"}, {4, 2, BRAID_DTYPE_F32, "b"}};
  int declared[2] = {2, 1}, counted[2] = {BRAID_MARKS_COUNTED, 1}, bad[2] = {1, -2};
  braid_reducer_options_t ro;
  braid_reducer_t* red = NULL;
  braid_status_t late;

  braid_reducer_options_init(&ro);
  EXPECT_TRUE(ro.param_marks == NULL);
  ro.param_marks = declared;
  EXPECT_OK(braid_reducer_create(g[0], NULL, p, 2, &ro, &red));
  EXPECT_OK(backward(red, 2, &late));
  EXPECT_TRUE(late == BRAID_OK && first_grad(red) == 2.0f);
  EXPECT_OK(backward(red, 3, &late));
  EXPECT_TRUE(late == BRAID_FAILED_PRECONDITION);
  EXPECT_TRUE(strstr(braid_last_error(), "'wte.weight' (id 3)") != NULL);
  EXPECT_OK(braid_reducer_destroy(red));

  ro.param_marks = counted;
  EXPECT_OK(braid_reducer_create(g[0], NULL, p, 2, &ro, &red));
  EXPECT_OK(backward(red, 3, &late)); /* counts 3 */
  EXPECT_OK(backward(red, 3, &late));
  EXPECT_TRUE(first_grad(red) == 3.0f);
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, "marked ready 2 time(s)", backward(red, 2, &late));
  EXPECT_OK(braid_reducer_destroy(red));

  ro.param_marks = bad;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "'b' (id 4)",
               braid_reducer_create(g[0], NULL, p, 2, &ro, &red));

  ro.param_marks = declared; /* ignored: a 0.10 caller's struct ends before it */
  ro.struct_size = offsetof(braid_reducer_options_t, agree_unused);
  EXPECT_OK(braid_reducer_create(g[0], NULL, p, 2, &ro, &red));
  EXPECT_OK(backward(red, 1, &late));
  EXPECT_TRUE(first_grad(red) == 1.0f);
  EXPECT_OK(braid_reducer_destroy(red));

  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_world_destroy(w));
  if (test_failures > 0) fprintf(stderr, "%d failure(s)\n", test_failures);
  return test_failures > 0 ? 1 : 0;
}
