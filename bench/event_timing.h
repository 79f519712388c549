// median_us_per_call: the kernel benchmarks' timer. Runs `calls` back-to-back enqueue(i) on
// `stream` between two CUDA events, `reps` times, and returns the median in microseconds per call.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"

template <typename Enqueue>
double median_us_per_call(cudaStream_t stream, int reps, int calls, Enqueue&& enqueue) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int rep = 0; rep < reps; ++rep) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < calls; ++i) enqueue(i);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(ms * 1e3 / calls);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}
