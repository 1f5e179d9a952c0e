// Launches x[i] *= s on the current device (default stream); returns a cudaError_t value.
#ifndef BRAID_TESTS_GPU_SCALE_KERNEL_H_
#define BRAID_TESTS_GPU_SCALE_KERNEL_H_
#ifdef __cplusplus
extern "C" {
#endif
int BraidTestScale(float* device_x, int n, float s);
#ifdef __cplusplus
}
#endif
#endif  // BRAID_TESTS_GPU_SCALE_KERNEL_H_
