// The real DeviceStepKernels (step_kernels.h): AdamWCudaLaunch / SgdCudaLaunch of adamw_cuda.h
// on the given stream (a cudaStream_t). Stateless; links the CUDA runtime.
//
//   OptimizerConfig cfg;
//   cfg.device_kernels = CudaStepKernels();   // required for CUDA parameters
#ifndef BRAID_OPTIM_CUDA_STEP_KERNELS_H_
#define BRAID_OPTIM_CUDA_STEP_KERNELS_H_

#include <memory>

#include "optim/step_kernels.h"

namespace braid::optim {

std::shared_ptr<DeviceStepKernels> CudaStepKernels();

}  // namespace braid::optim

#endif  // BRAID_OPTIM_CUDA_STEP_KERNELS_H_
