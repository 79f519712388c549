// Streaming-multiprocessor count of the current device, cached per device (gemm_sm90_internal.h).
// A file of its own so the kernel benchmarks in bench/ can link it without the CUTLASS kernels.
#include <cuda_runtime.h>

#include "common/per_device.h"
#include "gemm/sm90/gemm_sm90_internal.h"

namespace jax_nvfp4 {
namespace sm90 {

int sm_count() {
  struct SmCount {};
  return once_per_device<SmCount>([] {
    int device = 0, count = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    return count > 0 ? count : 132;
  });
}

}  // namespace sm90
}  // namespace jax_nvfp4
