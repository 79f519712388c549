// Large-M NVFP4 GEMM for sm_90a: dequantize once, then a TMA warp-specialized wgmma GEMM.
//
// At large M the GEMM is bound by the bf16 tensor-core rate, and dequantizing the N x K weights
// is a single memory pass (4.5 bits in, 16 bits out) whose cost shrinks like 1/M against the
// GEMM's. The pass writes bf16 values e2m1 * e4m3 * 2^-7 (exact); alpha * 2^7 goes to the
// epilogue. Activations that are not bf16 are made bf16 first: NVFP4 x is dequantized the same
// way, f16 and f32 x are split into hi + lo bf16 halves laid side by side along K (the weights
// are then written twice along K), which is exact for f16 and leaves ~2^-17 relative for f32.
//
// The GEMM is CUTLASS's TMA warp-specialized persistent wgmma kernel (wgmma_gemm.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/nvfp4_decode.cuh"
#include "common/scale_layout.h"
#include "gemm/sm90/gemm_device_utils.cuh"
#include "gemm/sm90/gemm_sm90_internal.h"
#include "gemm/sm90/nvfp4_bf16x2.h"

namespace jax_nvfp4 {
namespace sm90 {
namespace {

// --- Preparation kernels --------------------------------------------------------------------

// One E4M3 scale -> bf16x2 of scale * 2^119 in both halves.
__device__ __forceinline__ uint32_t widen_scale(uint8_t bits) {
  const __nv_bfloat16 b = __float2bfloat16_rn(e4m3_to_float(bits) * kScaleBoost);
  const __nv_bfloat162 p = __bfloat162bfloat162(b);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// 8 codes (one word) -> 8 bf16 values in element order, times block scale * 2^-7.
__device__ __forceinline__ uint4 dequant_word_ordered(uint32_t word, uint32_t scale) {
  const uint32_t p0 = mul_bf16x2(e2m1_pair_bits<0>(word), scale);  // elements 0, 4
  const uint32_t p1 = mul_bf16x2(e2m1_pair_bits<1>(word), scale);  // 1, 5
  const uint32_t p2 = mul_bf16x2(e2m1_pair_bits<2>(word), scale);  // 2, 6
  const uint32_t p3 = mul_bf16x2(e2m1_pair_bits<3>(word), scale);  // 3, 7
  return make_uint4(__byte_perm(p0, p1, 0x5410), __byte_perm(p2, p3, 0x5410),
                    __byte_perm(p0, p1, 0x7632), __byte_perm(p2, p3, 0x7632));
}

// The preparation kernels walk rows with the grid (one row per block at a time) and a row's
// elements with the block's threads: 32-bit column math, no per-element 64-bit division.

constexpr int kDequantUnroll = 4;     // words a thread loads before converting any
constexpr int kDequantThreads = 128;  // K = 4096: every thread's kDequantUnroll loads in use

// NVFP4 [rows, k] -> bf16 [out_rows, copies * k] (each row written `copies` times along K; rows
// past `rows` zero). Thread t converts words t, t + blockDim, ... of a row (8 codes in, 16 bytes
// out), so a warp's 4-byte loads and 16-byte stores are both contiguous, and it issues
// kDequantUnroll loads before it waits on one: the pass is a memory stream (4.5 bits in, 16 out).
__global__ void dequantize_rows(Nvfp4Operand src, int64_t rows, int64_t out_rows, int64_t k,
                                int copies, __nv_bfloat16* dst) {
  const int words = static_cast<int>(k / 8);
  const int step = static_cast<int>(blockDim.x);
  for (int64_t r = blockIdx.x; r < out_rows; r += gridDim.x) {
    const uint32_t* codes = reinterpret_cast<const uint32_t*>(src.codes + r * (k / 2));
    const uint8_t* scales = src.scales + scale_offset(r, 0, k / kBlockSize);
    uint4* out_row = reinterpret_cast<uint4*>(dst + r * copies * k);
    const bool valid = r < rows;
    for (int w0 = threadIdx.x; w0 < words; w0 += kDequantUnroll * step) {
      uint32_t c[kDequantUnroll];
      uint8_t s[kDequantUnroll];
#pragma unroll
      for (int u = 0; u < kDequantUnroll; ++u) {
        const int w = w0 + u * step;
        const bool load = valid && w < words;
        c[u] = load ? __ldg(codes + w) : 0u;
        s[u] = load ? __ldg(scales + row_scale_offset(w / 2)) : uint8_t{0};
      }
#pragma unroll
      for (int u = 0; u < kDequantUnroll; ++u) {
        const int w = w0 + u * step;
        if (w < words) {
          const uint4 v = dequant_word_ordered(c[u], widen_scale(s[u]));
          for (int copy = 0; copy < copies; ++copy) out_row[copy * words + w] = v;
        }
      }
    }
  }
}

// f16/f32 x [m, k] -> bf16 [m, 2k]: hi = bf16(x) in columns [0, k), lo = bf16(x - hi) in [k, 2k).
template <typename T>
__global__ void split_rows(const T* x, int64_t m, int64_t k, __nv_bfloat16* dst) {
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    const T* row = x + r * k;
    __nv_bfloat16* out = dst + r * 2 * k;
    for (int c = threadIdx.x; c < k; c += blockDim.x) {
      const float v = static_cast<float>(row[c]);
      const __nv_bfloat16 h = __float2bfloat16_rn(v);
      out[c] = h;
      out[k + c] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
  }
}

// alpha (with the dequantization factors undone) and the bias as float32 [n_pad] (zero padded).
__global__ void epilogue_operands(GemmProblem p, int64_t n_pad, float* alpha, float* bias) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (first == 0) {
    float a = *p.b.s_dec * (1.0f / kDequantFactor);
    if (p.a_is_nvfp4) a *= *p.a_q.s_dec * (1.0f / kDequantFactor);
    *alpha = a;
  }
  for (int64_t i = first; i < n_pad; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bias[i] = p.bias && i < p.n ? load_as_float(p.bias, p.bias_dtype, i) : 0.f;
  }
}

// Copies columns [0, n) of a [m, n_pad] matrix of elem_bytes elements to a dense [m, n] one.
__global__ void crop_columns(const uint8_t* src, int64_t m, int64_t n, int64_t n_pad, int elem_bytes,
                             uint8_t* dst) {
  const int row_bytes = static_cast<int>(n) * elem_bytes;
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    const uint8_t* from = src + r * n_pad * elem_bytes;
    uint8_t* to = dst + r * row_bytes;
    for (int i = threadIdx.x; i < row_bytes; i += blockDim.x) to[i] = from[i];
  }
}

// --- Planning -------------------------------------------------------------------------------

constexpr size_t kRegionAlign = 256;
size_t align_up(size_t v) { return (v + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

int elem_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// The workspace carving of one prefill problem.
struct Plan {
  int64_t n_pad = 0;   // N rounded up so the output rows are 16-byte aligned for TMA
  int64_t k_gemm = 0;  // K, or 2K when x is split into bf16 hi + lo
  int copies = 1;
  bool convert_x = false, crop = false;
  size_t off_w = 0, off_x = 0, off_alpha = 0, off_bias = 0, off_d = 0, off_cutlass = 0, total = 0;
};

size_t cutlass_workspace(DType out, int m, int n, int k) {
  switch (out) {
    case DType::kF32: return wgmma_gemm_workspace_f32(m, n, k);
    case DType::kBF16: return wgmma_gemm_workspace_bf16(m, n, k);
    default: return wgmma_gemm_workspace_f16(m, n, k);
  }
}

Plan make_plan(const GemmProblem& p) {
  Plan plan;
  const int64_t align_elems = 16 / elem_bytes(p.out_dtype);
  plan.n_pad = ceil_div(p.n, align_elems) * align_elems;
  plan.crop = plan.n_pad != p.n;
  const bool split = !p.a_is_nvfp4 && p.a_dtype != DType::kBF16;
  plan.copies = split ? 2 : 1;
  plan.k_gemm = p.k * plan.copies;
  plan.convert_x = p.a_is_nvfp4 || split;
  size_t off = 0;
  plan.off_w = off;
  off = align_up(off + static_cast<size_t>(plan.n_pad * plan.k_gemm) * 2);
  plan.off_x = off;
  if (plan.convert_x) off = align_up(off + static_cast<size_t>(p.m * plan.k_gemm) * 2);
  plan.off_alpha = off;
  off = align_up(off + sizeof(float));
  plan.off_bias = off;
  off = align_up(off + static_cast<size_t>(plan.n_pad) * sizeof(float));
  plan.off_d = off;
  if (plan.crop) off = align_up(off + static_cast<size_t>(p.m * plan.n_pad) * elem_bytes(p.out_dtype));
  plan.off_cutlass = off;
  off = align_up(off + cutlass_workspace(p.out_dtype, static_cast<int>(p.m),
                                         static_cast<int>(plan.n_pad), static_cast<int>(plan.k_gemm)));
  plan.total = off;
  return plan;
}

// Blocks for a row-walking kernel over `rows` rows.
int grid_rows(int64_t rows) {
  const int64_t cap = 32LL * sm_count();
  return static_cast<int>(rows < 1 ? 1 : (rows < cap ? rows : cap));
}

int grid_for(int64_t work, int threads) {
  const int64_t blocks = ceil_div(work, threads);
  const int64_t cap = 16LL * sm_count();  // grid-stride loops beyond a few waves
  return static_cast<int>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

// Launches dequantize_rows over out_rows rows (up to 32 blocks per SM, each walking rows).
cudaError_t dequantize_to_bf16(const Nvfp4Operand& src, int64_t rows, int64_t out_rows, int64_t k, int copies,
                               __nv_bfloat16* dst, cudaStream_t stream) {
  dequantize_rows<<<grid_rows(out_rows), kDequantThreads, 0, stream>>>(src, rows, out_rows, k, copies, dst);
  return cudaGetLastError();
}

}  // namespace

size_t prefill_workspace_bytes(const GemmProblem& p) { return make_plan(p).total; }

cudaError_t prefill_gemm(const GemmProblem& p, cudaStream_t stream) {
  const Plan plan = make_plan(p);
  if (p.workspace_bytes < plan.total || p.m > INT32_MAX || plan.n_pad > INT32_MAX ||
      plan.k_gemm > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  auto* w_bf16 = reinterpret_cast<__nv_bfloat16*>(ws + plan.off_w);
  auto* x_bf16 = reinterpret_cast<__nv_bfloat16*>(ws + plan.off_x);
  auto* alpha = reinterpret_cast<float*>(ws + plan.off_alpha);
  auto* bias = reinterpret_cast<float*>(ws + plan.off_bias);
  constexpr int kThreads = 256;

  dequantize_to_bf16(p.b, p.n, plan.n_pad, p.k, plan.copies, w_bf16, stream);
  epilogue_operands<<<grid_for(plan.n_pad, kThreads), kThreads, 0, stream>>>(p, plan.n_pad, alpha, bias);
  const void* a = p.a;
  if (p.a_is_nvfp4) {
    dequantize_to_bf16(p.a_q, p.m, p.m, p.k, 1, x_bf16, stream);
    a = x_bf16;
  } else if (p.a_dtype == DType::kF32) {
    split_rows<<<grid_rows(p.m), kThreads, 0, stream>>>(
        static_cast<const float*>(p.a), p.m, p.k, x_bf16);
    a = x_bf16;
  } else if (p.a_dtype == DType::kF16) {
    split_rows<<<grid_rows(p.m), kThreads, 0, stream>>>(
        static_cast<const __half*>(p.a), p.m, p.k, x_bf16);
    a = x_bf16;
  }
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

  void* d = plan.crop ? static_cast<void*>(ws + plan.off_d) : p.out;
  const int m = static_cast<int>(p.m), n = static_cast<int>(plan.n_pad), k = static_cast<int>(plan.k_gemm);
  const WgmmaGemmArgs g{m, n, k, a, w_bf16, d, alpha, bias, ws + plan.off_cutlass};
  cudaError_t err;
  switch (p.out_dtype) {
    case DType::kF32: err = wgmma_gemm_f32(g, stream); break;
    case DType::kBF16: err = wgmma_gemm_bf16(g, stream); break;
    default: err = wgmma_gemm_f16(g, stream); break;
  }
  if (err != cudaSuccess || !plan.crop) return err;
  crop_columns<<<grid_rows(p.m), kThreads, 0, stream>>>(
      ws + plan.off_d, p.m, p.n, plan.n_pad, elem_bytes(p.out_dtype), static_cast<uint8_t*>(p.out));
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace jax_nvfp4
