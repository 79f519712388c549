// Split-K for the sm_90a GEMM kernels that add their partial sums through shared memory, over a
// thread-block cluster (distributed shared memory) or over the warps of one block: the largest
// split whose whole grid the GPU keeps resident at once (one wave: a second, partial wave would
// double the time of its blocks; more resident warps hide more load and MMA latency).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "common/launch_config.cuh"
#include "common/per_device.h"
#include "gemm/sm90/gemm_sm90_internal.h"  // sm_count

namespace jax_nvfp4 {
namespace sm90 {

constexpr int kMaxClusterSplit = 8;  // the portable cluster size

// Entry s (1..kMaxClusterSplit): blocks the device runs at once in clusters of s; 0 where the
// launch is impossible.
using ResidentBlocks = std::array<int64_t, kMaxClusterSplit + 1>;

template <typename Kernel>
ResidentBlocks query_resident_blocks(Kernel kernel, dim3 block, size_t smem_bytes) {
  ResidentBlocks blocks{};
  if (smem_bytes > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem_bytes)) != cudaSuccess) {
    (void)cudaGetLastError();
    return blocks;
  }
  for (int s = 1; s <= kMaxClusterSplit; ++s) {
    const LaunchConfig probe(dim3(1, 1, s), block, smem_bytes, nullptr, s, /*pdl=*/false);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe.cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // leave no sticky error for the launch to report
      clusters = 0;
    }
    blocks[s] = static_cast<int64_t>(clusters) * s;
  }
  return blocks;
}

// Entry s: K parts the device runs at once when each part is one warp of a block of s warps
// (a tile per block, no shared memory beyond the kernel's static one); the same one-wave test
// as for clusters then applies (tiles * s <= entry s).
template <typename Kernel>
ResidentBlocks query_resident_warp_parts(Kernel kernel) {
  ResidentBlocks parts{};
  for (int s = 1; s <= kMaxClusterSplit; ++s) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * s, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      per_sm = 0;
    }
    parts[s] = static_cast<int64_t>(per_sm) * sm_count() * s;
  }
  return parts;
}

// The queries cost more than a decode-size kernel: each (kernel, kind of split) is asked once per
// device.
enum class SplitOver { kCluster, kWarps };
template <auto kKernel, SplitOver kOver>
struct ResidentOf {};

// query_resident_blocks for kernel kKernel, cached per device. Also sets the kernel's dynamic
// shared memory limit on the device (once).
template <auto kKernel>
ResidentBlocks resident_blocks(dim3 block, size_t smem_bytes) {
  return once_per_device<ResidentOf<kKernel, SplitOver::kCluster>>(
      [&] { return query_resident_blocks(kKernel, block, smem_bytes); });
}

// query_resident_warp_parts for kernel kKernel, cached per device.
template <auto kKernel>
ResidentBlocks resident_warp_parts() {
  return once_per_device<ResidentOf<kKernel, SplitOver::kWarps>>(
      [] { return query_resident_warp_parts(kKernel); });
}

// The largest split (<= kMaxClusterSplit, >= min_chunks K chunks a part) that keeps `tiles`
// output tiles resident in one wave; 1 if none does.
inline int one_wave_split(int64_t tiles, int64_t chunks, int64_t min_chunks, const ResidentBlocks& capacity) {
  int split = 1;
  while (split < kMaxClusterSplit && tiles * (split + 1) <= capacity[split + 1] &&
         chunks >= min_chunks * (split + 1)) {
    ++split;
  }
  return split;
}

}  // namespace sm90
}  // namespace jax_nvfp4
