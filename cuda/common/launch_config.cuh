// Kernel launches through cudaLaunchKernelEx: a thread-block cluster along z and programmatic
// dependent launch (PDL), and the two device-side instructions a PDL kernel runs.
//
// A PDL grid may be scheduled while the grid before it in the stream is still finishing, so its
// launch latency and set-up overlap that grid's tail. In exchange, its kernel must call
// wait_for_prior_grids() before it reads or writes global memory (L2 prefetches excepted: they
// change no value it reads); that returns once every earlier grid has completed and its writes are
// visible. Kernels launched without PDL may call it too: it then returns at once.
#pragma once

#include <cuda_runtime.h>

namespace jax_nvfp4 {

struct LaunchConfig {
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t cfg;
  // cluster_z > 0: clusters of 1 x 1 x cluster_z blocks (0: no cluster attribute).
  LaunchConfig(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, unsigned cluster_z, bool pdl)
      : attrs{}, cfg{} {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem_bytes;
    cfg.stream = stream;
    unsigned n = 0;
    if (cluster_z > 0) {
      attrs[n].id = cudaLaunchAttributeClusterDimension;
      attrs[n].val.clusterDim.x = 1;
      attrs[n].val.clusterDim.y = 1;
      attrs[n++].val.clusterDim.z = cluster_z;
    }
    if (pdl) {
      attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    cfg.attrs = attrs;
    cfg.numAttrs = n;
  }
  LaunchConfig(const LaunchConfig&) = delete;  // cfg.attrs points into this object
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

// (sm_90 and later.) Blocks until every grid before this one in the stream has completed and its
// writes are visible.
__device__ __forceinline__ void wait_for_prior_grids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// Lets the next PDL grid in the stream be scheduled now (it still waits for this one to complete
// before it touches memory); without it, that happens as this grid's blocks exit.
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;"); }

}  // namespace jax_nvfp4
