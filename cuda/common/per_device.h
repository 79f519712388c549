// A host-side query answered once per CUDA device and cached: occupancy and attribute queries
// cost more host time than a decode-size kernel takes on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

namespace jax_nvfp4 {

// query() for the current device, computed on the first call per device (thread-safe) and
// returned from the cache after. Tag names the cached value: each Tag type has its own cache.
template <typename Tag, typename Query>
auto once_per_device(Query&& query) -> decltype(query()) {
  using Value = decltype(query());
  constexpr int kMaxDevices = 64;
  static Value cache[kMaxDevices];
  static std::once_flag done[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return query();
  std::call_once(done[device], [&] { cache[device] = query(); });
  return cache[device];
}

}  // namespace jax_nvfp4
