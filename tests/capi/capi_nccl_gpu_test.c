/* The nccl backend through the C API on a real GPU (tagged "gpu"; prints why and exits 0 when
 * there is none: CUDA error 35 without a driver, 100 without a device):
 *  1. a 1-rank world from braid_nccl_unique_id's bytes, on device 0;
 *  2. an all-reduce (PREMUL_SUM by 2, so the result differs from the input) on cudaMalloc'd
 *     memory: the input is written on a producer stream and handed over with a ready event;
 *     the result is read on a consumer stream that waits on braid_work_device_event, before
 *     the host waits on the work; compared bit for bit with the host reference;
 *  3. the reducer with device = 0 end to end (all-reduce mode): gradients written into
 *     braid_reducer_grad's device views on the producer stream, marked ready with its event,
 *     the averaged gradients compared with the host reference;
 *  4. a reduce-scatter reducer on device 0 with the SGD optimizer on it (CUDA step kernels):
 *     parameters after one step equal p - lr * g exactly.
 * Linked against libbraid.so and, for the test's own buffers and streams, the CUDA runtime. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/braid.h"
#include "tests/capi/test_util.h"

#define N 4099 /* not a multiple of anything NCCL likes */

#define CUDA_OK(call)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) test_fail(__FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)

static cudaStream_t producer, consumer;

static braid_world_t* make_world(braid_group_t** g) {
  unsigned char id[128];
  size_t size = 0;
  braid_world_options_t o;
  braid_world_t* w = NULL;
  EXPECT_OK(braid_nccl_unique_id(id, sizeof id, &size));
  braid_world_options_init(&o);
  o.backend = "nccl";
  o.read_env = 0;
  o.unique_id = id;
  o.unique_id_size = size;
  o.world_size = 1;
  o.rank = 0;
  o.cuda_device = 0;
  o.timeout_ms = 60000;
  EXPECT_OK(braid_world_create(&o, &w));
  if (w != NULL) EXPECT_OK(braid_world_group(w, 0, g));
  return w;
}

static void test_allreduce_with_events(braid_group_t* g) {
  static float host[N], back[N];
  float *d_in = NULL, *d_out = NULL;
  cudaEvent_t ready;
  void* done = NULL;
  braid_collective_options_t co;
  braid_work_t* w = NULL;
  int i, mismatches = 0;
  for (i = 0; i < N; ++i) host[i] = (float)(i % 97) * 0.25f - 7.0f;
  CUDA_OK(cudaMalloc((void**)&d_in, N * sizeof(float)));
  CUDA_OK(cudaMalloc((void**)&d_out, N * sizeof(float)));
  CUDA_OK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  CUDA_OK(cudaMemcpyAsync(d_in, host, N * sizeof(float), cudaMemcpyHostToDevice, producer));
  CUDA_OK(cudaEventRecord(ready, producer));
  braid_collective_options_init(&co);
  co.ready_event = ready;
  co.premul_scalar = 2.0;
  co.label = "capi gpu all-reduce";
  EXPECT_OK(braid_allreduce(g, d_in, d_out, N, BRAID_DTYPE_F32, BRAID_OP_PREMUL_SUM, &co, &w));
  EXPECT_OK(braid_work_device_event(w, &done));
  EXPECT_TRUE(done != NULL);
  /* The consumer stream is ordered after the all-reduce by the event alone. */
  CUDA_OK(cudaStreamWaitEvent(consumer, (cudaEvent_t)done, 0));
  CUDA_OK(cudaMemcpyAsync(back, d_out, N * sizeof(float), cudaMemcpyDeviceToHost, consumer));
  CUDA_OK(cudaStreamSynchronize(consumer));
  for (i = 0; i < N; ++i) mismatches += back[i] != 2.0f * host[i];
  EXPECT_TRUE(mismatches == 0);
  EXPECT_OK(braid_work_wait(w, 60000));
  EXPECT_OK(braid_work_destroy(w));
  CUDA_OK(cudaEventDestroy(ready));
  CUDA_OK(cudaFree(d_in));
  CUDA_OK(cudaFree(d_out));
}

static void test_reducer_on_device(braid_group_t* g) {
  static float grads[2][N], back[N];
  const size_t counts[2] = {N, 37};
  braid_param_t params[2] = {{10, N, BRAID_DTYPE_F32, "w"}, {11, 37, BRAID_DTYPE_F32, "b"}};
  braid_reducer_options_t ro;
  braid_reducer_t* r = NULL;
  cudaEvent_t ready;
  int p;
  size_t i;
  braid_reducer_options_init(&ro);
  ro.device = 0;
  ro.timeout_ms = 60000;
  EXPECT_OK(braid_reducer_create(g, NULL, params, 2, &ro, &r));
  if (r == NULL) return;
  {
    void* stream = NULL; /* the comm stream mark_ready_grad reads on: a real one on a device */
    EXPECT_OK(braid_reducer_grad_stream(r, &stream));
    EXPECT_TRUE(stream != NULL);
  }
  CUDA_OK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  EXPECT_OK(braid_reducer_begin_backward(r, BRAID_SYNC));
  for (p = 0; p < 2; ++p) {
    void* d = NULL;
    size_t count = 0;
    for (i = 0; i < counts[p]; ++i) grads[p][i] = (float)((int)(i % 13) - 6) * 0.5f + (float)p;
    EXPECT_OK(braid_reducer_grad(r, params[p].id, &d, &count));
    EXPECT_TRUE(count == counts[p]);
    CUDA_OK(
        cudaMemcpyAsync(d, grads[p], counts[p] * sizeof(float), cudaMemcpyHostToDevice, producer));
    CUDA_OK(cudaEventRecord(ready, producer));
    EXPECT_OK(braid_reducer_mark_ready(r, params[p].id, ready));
  }
  EXPECT_OK(braid_reducer_finish_backward(r));
  for (p = 0; p < 2; ++p) {
    void* d = NULL;
    size_t count = 0;
    int mismatches = 0;
    EXPECT_OK(braid_reducer_grad(r, params[p].id, &d, &count));
    CUDA_OK(cudaMemcpy(back, d, counts[p] * sizeof(float), cudaMemcpyDeviceToHost));
    /* The average over 1 rank is the gradient itself. */
    for (i = 0; i < counts[p]; ++i) mismatches += back[i] != grads[p][i];
    EXPECT_TRUE(mismatches == 0);
  }
  EXPECT_OK(braid_reducer_destroy(r));
  CUDA_OK(cudaEventDestroy(ready));
}

static void test_optimizer_on_device(braid_group_t* g) {
  static float values[N], grads[N], back[N];
  braid_param_t param = {20, N, BRAID_DTYPE_F32, "w"};
  braid_reducer_options_t ro;
  braid_optimizer_options_t oo;
  braid_reducer_t* r = NULL;
  braid_optimizer_t* opt = NULL;
  cudaEvent_t ready;
  void* d = NULL;
  size_t i, count = 0;
  int mismatches = 0;
  braid_reducer_options_init(&ro);
  ro.mode = BRAID_MODE_REDUCE_SCATTER;
  ro.device = 0;
  ro.timeout_ms = 60000;
  EXPECT_OK(braid_reducer_create(g, NULL, &param, 1, &ro, &r));
  if (r == NULL) return;
  braid_optimizer_options_init(&oo);
  oo.kind = BRAID_OPTIMIZER_SGD;
  oo.lr = 0.5;
  oo.momentum = 0;
  oo.weight_decay = 0;
  oo.timeout_ms = 60000;
  EXPECT_OK(braid_optimizer_create(r, &oo, &opt));
  if (opt == NULL) {
    EXPECT_OK(braid_reducer_destroy(r));
    return;
  }
  for (i = 0; i < N; ++i) {
    values[i] = (float)(i % 31) * 0.125f;
    grads[i] = (float)((int)(i % 9) - 4) * 0.25f;
  }
  EXPECT_OK(braid_optimizer_set_param(opt, param.id, values));
  EXPECT_OK(braid_optimizer_wait_all_params(opt));
  CUDA_OK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  EXPECT_OK(braid_optimizer_begin_backward(opt, BRAID_SYNC));
  EXPECT_OK(braid_reducer_grad(r, param.id, &d, &count));
  CUDA_OK(cudaMemcpyAsync(d, grads, N * sizeof(float), cudaMemcpyHostToDevice, producer));
  CUDA_OK(cudaEventRecord(ready, producer));
  EXPECT_OK(braid_reducer_mark_ready(r, param.id, ready));
  EXPECT_OK(braid_optimizer_finish_backward(opt));
  EXPECT_OK(braid_optimizer_wait_all_params(opt));
  EXPECT_OK(braid_optimizer_param(opt, param.id, &d, &count));
  EXPECT_TRUE(count == N);
  CUDA_OK(cudaMemcpy(back, d, N * sizeof(float), cudaMemcpyDeviceToHost));
  /* SGD without momentum or decay: p - lr * g, exact for these dyadic values. */
  for (i = 0; i < N; ++i) mismatches += back[i] != values[i] - 0.5f * grads[i];
  EXPECT_TRUE(mismatches == 0);
  EXPECT_OK(braid_optimizer_destroy(opt));
  EXPECT_OK(braid_reducer_destroy(r));
  CUDA_OK(cudaEventDestroy(ready));
}

int main(void) {
  braid_group_t* g = NULL;
  braid_world_t* w;
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc == cudaErrorInsufficientDriver || rc == cudaErrorNoDevice ||
      (rc == cudaSuccess && devices == 0)) {
    printf("capi_nccl_gpu_test: skipped, no GPU: %s (CUDA error %d)\n", cudaGetErrorString(rc),
           (int)rc);
    return 0;
  }
  CUDA_OK(rc);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  w = make_world(&g);
  if (g != NULL) {
    test_allreduce_with_events(g);
    test_reducer_on_device(g);
    test_optimizer_on_device(g);
    EXPECT_OK(braid_group_destroy(g));
  }
  if (w != NULL) EXPECT_OK(braid_world_destroy(w));
  CUDA_OK(cudaStreamDestroy(producer));
  CUDA_OK(cudaStreamDestroy(consumer));
  return test_finish("capi_nccl_gpu_test");
}
