// Streaming-multiprocessor count of the current device, cached per device (gemm_sm90_internal.h).
// A file of its own so the kernel benchmarks in bench/ can link it without the CUTLASS kernels.
#include <cuda_runtime.h>

#include "gemm/sm90/gemm_sm90_internal.h"

namespace jax_nvfp4 {
namespace sm90 {

int sm_count() {
  constexpr int kMaxDevices = 64;
  static int counts[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (device >= kMaxDevices) return 132;
  if (counts[device] == 0) {
    int count = 0;
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    counts[device] = count > 0 ? count : 132;
  }
  return counts[device];
}

}  // namespace sm90
}  // namespace jax_nvfp4
