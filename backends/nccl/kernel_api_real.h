// The real KernelApi: the sm_90 kernels of kernels/bucket_kernels.h. Stateless.
#ifndef BRAID_BACKENDS_NCCL_KERNEL_API_REAL_H_
#define BRAID_BACKENDS_NCCL_KERNEL_API_REAL_H_

#include <memory>

#include "backends/nccl/kernel_api.h"

namespace braid::nccl {

std::shared_ptr<KernelApi> RealKernelApi();

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_KERNEL_API_REAL_H_
