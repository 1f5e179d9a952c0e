/* The nccl backend through the C API, on a machine without a GPU (what runs everywhere):
 * braid_nccl_unique_id (ncclGetUniqueId needs NCCL, not a GPU), worlds from a unique id failing
 * with FAILED_PRECONDITION naming the CUDA error, bad nccl fields (INVALID_ARGUMENT naming the
 * field), a bad BRAID_NCCL_LIBRARY (naming the path), option structs of 0.5 still accepted,
 * braid_work_device_event on a host backend, and the reducer's device option checks. On a
 * machine with a GPU the no-GPU expectations are replaced by a successful 1-rank world (the
 * device itself is exercised by capi_nccl_gpu_test). */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define MISSING_LIB "/nonexistent/braid-capi-test/libnccl.so.2"

static unsigned char id_a[128], id_b[128];

static void test_unique_id(void) {
  unsigned char small[16];
  size_t size = 0;
  int i, nonzero = 0;
  EXPECT_OK(braid_nccl_unique_id(NULL, 0, &size)); /* size query */
  EXPECT_TRUE(size == 128);
  size = 0;
  EXPECT_ERROR(BRAID_OUT_OF_RANGE, "room for 16", braid_nccl_unique_id(small, sizeof small, &size));
  EXPECT_TRUE(size == 128); /* written even on OUT_OF_RANGE */
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "'size' is NULL", braid_nccl_unique_id(id_a, 128, NULL));
  size = 0;
  EXPECT_OK(braid_nccl_unique_id(id_a, sizeof id_a, &size));
  EXPECT_TRUE(size == 128);
  EXPECT_OK(braid_nccl_unique_id(id_b, sizeof id_b, &size));
  for (i = 0; i < 128; ++i) nonzero += id_a[i] != 0;
  EXPECT_TRUE(nonzero > 0);
  EXPECT_TRUE(memcmp(id_a, id_b, sizeof id_a) != 0); /* a fresh id each time */
}

static void nccl_options(braid_world_options_t* o) {
  braid_world_options_init(o);
  o->backend = "nccl";
  o->read_env = 0;
  o->unique_id = id_a;
  o->unique_id_size = sizeof id_a;
  o->world_size = 1;
  o->rank = 0;
  o->timeout_ms = 20000;
}

static void test_world_without_gpu(void) {
  braid_world_options_t o;
  braid_world_t* w = NULL;
  braid_status_t s;
  nccl_options(&o);
  EXPECT_TRUE(o.cuda_device == -1 && o.nccl_blocking == -1); /* the documented defaults */
  braid_clear_error();
  s = braid_world_create(&o, &w);
  if (s == BRAID_OK) {
    /* A GPU machine: the 1-rank world exists; its group is collective over 1 rank only. */
    braid_group_t* g = NULL;
    int size = 0;
    printf("a GPU is present: the 1-rank nccl world was created\n");
    EXPECT_OK(braid_world_size(w, &size));
    EXPECT_TRUE(size == 1);
    EXPECT_OK(braid_world_group(w, 0, &g));
    EXPECT_OK(braid_group_destroy(g));
    EXPECT_OK(braid_world_destroy(w));
    return;
  }
  EXPECT_TRUE(s == BRAID_FAILED_PRECONDITION);
  EXPECT_TRUE(strstr(braid_last_error(), "braid_world_create") != NULL);
  EXPECT_TRUE(strstr(braid_last_error(), "no usable CUDA device") != NULL);
  EXPECT_TRUE(strstr(braid_last_error(), "(CUDA error 35)") != NULL ||
              strstr(braid_last_error(), "(CUDA error 100)") != NULL);
  if (s != BRAID_FAILED_PRECONDITION) fprintf(stderr, "got: %s\n", braid_last_error());
}

static void test_bad_nccl_fields(void) {
  braid_world_options_t o;
  braid_world_t* w = NULL;
  const braid_status_t inval = BRAID_INVALID_ARGUMENT;

  nccl_options(&o);
  o.unique_id_size = 127;
  EXPECT_ERROR(inval, "unique_id_size is 127: an NCCL unique id has 128 bytes",
               braid_world_create(&o, &w));
  nccl_options(&o);
  o.rank = 1;
  EXPECT_ERROR(inval, "rank 1 is outside [0, 1) (world_size)", braid_world_create(&o, &w));
  nccl_options(&o);
  o.rank = -1;
  EXPECT_ERROR(inval, "rank -1 is outside", braid_world_create(&o, &w));
  nccl_options(&o);
  o.world_size = 0;
  EXPECT_ERROR(inval, "world_size must be >= 1", braid_world_create(&o, &w));
  nccl_options(&o);
  o.backend = "local";
  EXPECT_ERROR(inval, "unique_id is set but the backend is 'local'", braid_world_create(&o, &w));
  nccl_options(&o);
  o.unique_id = NULL;
  EXPECT_ERROR(inval, "unique_id_size is 128 but unique_id is NULL", braid_world_create(&o, &w));
  nccl_options(&o);
  o.unique_id = NULL;
  o.unique_id_size = 0;
  o.world_size = 0;
  o.rank = 1;
  EXPECT_ERROR(inval, "rank (1) goes with a unique_id or an explicit rendezvous (world_size)",
               braid_world_create(&o, &w));
  nccl_options(&o);
  o.cuda_device = -2;
  EXPECT_ERROR(inval, "cuda_device must be >= -1", braid_world_create(&o, &w));
  nccl_options(&o);
  o.nccl_blocking = 2;
  EXPECT_ERROR(inval, "nccl_blocking must be -1 (default), 0 or 1, got 2",
               braid_world_create(&o, &w));
  /* A device that does not exist is named by the backend, after the GPU check. */
}

/* BRAID_NCCL_LIBRARY (read_env = 1) points at a missing library: both entry points that open
 * NCCL say which library they could not load. */
static void test_bad_library(void) {
  braid_world_options_t o;
  braid_world_t* w = NULL;
  unsigned char id[128];
  size_t size = 0;
  EXPECT_TRUE(setenv("BRAID_NCCL_LIBRARY", MISSING_LIB, 1) == 0);
  nccl_options(&o);
  o.read_env = 1;
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, MISSING_LIB, braid_world_create(&o, &w));
  EXPECT_TRUE(strstr(braid_last_error(), "dlopen failed") != NULL);
  EXPECT_ERROR(BRAID_FAILED_PRECONDITION, MISSING_LIB, braid_nccl_unique_id(id, sizeof id, &size));
  EXPECT_TRUE(size == 128);
  EXPECT_TRUE(unsetenv("BRAID_NCCL_LIBRARY") == 0);
  EXPECT_OK(braid_nccl_unique_id(id, sizeof id, &size)); /* the default library again */
}

/* A caller compiled against 0.5's header passes the shorter struct: accepted, with the nccl
 * fields at their defaults (whatever lies beyond its end is not read). Sizes inside a field are
 * no version. */
static void test_old_struct_sizes(void) {
  braid_world_options_t o;
  braid_reducer_options_t ro;
  braid_world_t* w = NULL;
  braid_group_t* g = NULL;
  braid_reducer_t* r = NULL;
  braid_param_t p = {1, 4, BRAID_DTYPE_F32, "p"};

  braid_world_options_init(&o);
  o.struct_size = offsetof(braid_world_options_t, unique_id);
  o.backend = "local";
  o.read_env = 0;
  o.unique_id = id_a; /* beyond the 0.5 struct: ignored */
  o.world_size = 7;
  o.cuda_device = -9;
  EXPECT_OK(braid_world_create(&o, &w));
  EXPECT_OK(braid_world_group(w, 0, &g));
  o.struct_size = offsetof(braid_world_options_t, unique_id) + 4;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "not the size of any version", braid_world_create(&o, &w));
  o.struct_size = offsetof(braid_world_options_t, unique_id) - 8;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "smaller than any known version",
               braid_world_create(&o, &w));

  braid_reducer_options_init(&ro);
  EXPECT_TRUE(ro.device == BRAID_DEVICE_HOST);
  ro.struct_size = offsetof(braid_reducer_options_t, device);
  ro.device = 5; /* beyond the 0.5 struct: ignored, host memory */
  EXPECT_OK(braid_reducer_create(g, NULL, &p, 1, &ro, &r));
  EXPECT_OK(braid_reducer_destroy(r));
  EXPECT_OK(braid_group_destroy(g));
  EXPECT_OK(braid_world_destroy(w));
}

/* Host backends have no device event; the reducer's device option is checked. */
static void test_host_device_event_and_reducer_device(void) {
  braid_group_t* g[1];
  braid_world_t* w = test_local_world(1, g);
  braid_work_t* work = NULL;
  braid_reducer_options_t ro;
  braid_reducer_t* r = NULL;
  braid_param_t p = {1, 4, BRAID_DTYPE_F32, "weight"};
  float buf[4] = {1, 2, 3, 4};
  void* event = &event;

  EXPECT_OK(braid_allreduce(g[0], buf, buf, 4, BRAID_DTYPE_F32, BRAID_OP_SUM, NULL, &work));
  EXPECT_OK(braid_work_wait(work, 20000));
  EXPECT_OK(braid_work_device_event(work, &event));
  EXPECT_TRUE(event == NULL);
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "'event' is NULL", braid_work_device_event(work, NULL));
  EXPECT_OK(braid_work_destroy(work));
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "work", braid_work_device_event(work, &event));

  braid_reducer_options_init(&ro);
  ro.device = -2;
  EXPECT_ERROR(BRAID_INVALID_ARGUMENT, "opts->device must be BRAID_DEVICE_HOST (-1)",
               braid_reducer_create(g[0], NULL, &p, 1, &ro, &r));
  ro.device = 0; /* CUDA parameters on a host backend's group */
  EXPECT_ERROR(BRAID_UNIMPLEMENTED, "does not reduce device buffers",
               braid_reducer_create(g[0], NULL, &p, 1, &ro, &r));
  EXPECT_TRUE(strstr(braid_last_error(), "weight") != NULL);
  EXPECT_TRUE(strstr(braid_last_error(), "cuda:0") != NULL);
  EXPECT_OK(braid_group_destroy(g[0]));
  EXPECT_OK(braid_world_destroy(w));
}

int main(void) {
  test_unique_id();
  test_world_without_gpu();
  test_bad_nccl_fields();
  test_bad_library();
  test_old_struct_sizes();
  test_host_device_event_and_reducer_device();
  return test_finish("capi_nccl_test");
}
