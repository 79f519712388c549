// Hopper (sm_90a) asynchronous-copy and warpgroup-MMA primitives shared by the sm_90a kernels
// (GEMM and convolution): cp.async with zero fill, the proxy fence that makes its writes visible
// to the tensor cores, shared-memory matrix descriptors, and wgmma.mma_async (bf16 x bf16 -> f32,
// CuTe's) with A in registers and B from shared memory, plus the fence / commit / wait that order
// it. Accumulators are always added to (scale-d = 1): callers zero them first.
#pragma once

#include <cstdint>
#include <utility>

// CuTe declares the wgmma shapes whose N is not one of 8, 16, 32, 64, 96, 128, 192, 256 only
// with this defined (the convolution's tile widths use them). WgmmaRS checks what it got.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif
#include "cute/arch/mma_sm90.hpp"

namespace jax_nvfp4 {
namespace hopper {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async of `bytes` (4, 8 or 16); src_bytes = 0 fills the destination with zeros.
template <int kBytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? kBytes : 0;
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Makes this thread's shared-memory writes visible to the tensor cores (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of an accumulator across wgmma fences/waits.
template <int kN>
__device__ __forceinline__ void fence_accumulators(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor of a no-swizzle K-major operand: start address, the byte
// distance between core matrices along K (leading) and along M/N (stride), all in 16-byte units.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t smem_addr, uint32_t lead_bytes,
                                                    uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_addr >> 4) & 0x3FFF) |
         (static_cast<uint64_t>((lead_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32);
}

// Descriptor of a K-major operand in the 128-byte swizzle layout: rows of 64 bf16 (128 bytes),
// the 16-byte chunk c of row r stored at chunk c ^ (r % 8) within 1024-byte-aligned atoms of 8
// rows, atoms `stride_bytes` apart along M/N. A k-step starts 32 bytes further along the row.
__device__ __forceinline__ uint64_t smem_descriptor_swizzle128(uint32_t smem_addr, uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_addr >> 4) & 0x3FFF) | (uint64_t{1} << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

// `desc` with its start address `bytes` (a multiple of 16) further: the start field is the low
// word's 14 low bits in 16-byte units and shared memory ends below 256 KB, so the sum never carries
// into the other fields. One add instead of rebuilding the descriptor for every k-step.
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t desc, uint32_t bytes) {
  return (desc & ~uint64_t{0xFFFFFFFFu}) | (static_cast<uint32_t>(desc) + (bytes >> 4));
}

// D[64 x N] += A[64 x 16] (registers, bf16) * B[16 x N] (shared memory, bf16, K-major, described
// by desc_b), float32 accumulators: CuTe's wgmma register-A operation for N (any multiple of 8 up
// to 256, picked by CuTe's selector), its 64 x N / 128 accumulators of each thread passed one by one.
template <int kN>
struct WgmmaRS {
  static_assert(kN % 8 == 0 && kN >= 8 && kN <= 256, "wgmma N");
  using Op = decltype(cute::SM90::GMMA::rs_op_selector<cute::bfloat16_t, cute::bfloat16_t, float,
                                                       cute::Shape<cute::_64, cute::Int<kN>, cute::_16>>());
  static_assert(sizeof(typename Op::CRegisters) == kN / 2 * sizeof(float),
                "CuTe's selector picked another N (its extended shapes were included without the define)");

  static __device__ __forceinline__ void run(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b) {
    run(d, a, desc_b, std::make_index_sequence<kN / 2>{});
  }

 private:
  template <size_t... I>
  static __device__ __forceinline__ void run(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                             std::index_sequence<I...>) {
    Op::fma(a[0], a[1], a[2], a[3], desc_b, d[I]...);
  }
};

}  // namespace hopper
}  // namespace jax_nvfp4
