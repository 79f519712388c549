// Large-M NVFP4 GEMM for sm_90a: dequantize once, then a bf16 GEMM (cuBLASLt or CUTLASS wgmma).
//
// At large M the GEMM is bound by the bf16 tensor-core rate, and dequantizing the N x K weights
// is a single memory pass (4.5 bits in, 16 bits out) whose cost shrinks like 1/M against the
// GEMM's. The pass writes bf16 values e2m1 * e4m3 * 2^-7 (exact); alpha * 2^7 goes to the
// epilogue. Activations that are not bf16 are made bf16 first: NVFP4 x is dequantized the same
// way, f16 and f32 x are split into hi + lo bf16 halves laid side by side along K (the weights
// are then written twice along K), which is exact for f16 and leaves ~2^-17 relative for f32.
// One kernel launch prepares all of that (and alpha and the bias).
//
// The GEMM is cuBLASLt's bf16 GEMM where the build has cuBLASLt's header and cuBLASLt runs the
// problem (cublaslt_gemm.h), else CUTLASS's TMA warp-specialized persistent wgmma kernel
// (wgmma_gemm.cuh) as a programmatic dependent launch of the preparation kernel. Both take alpha
// from device memory and add the bias in float32 before the output cast. CUTLASS's takes the
// problems cuBLASLt does not (use_cublaslt below); JAX_NVFP4_GEMM_SM90_PATH=prefill_cutlass forces it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/launch_config.cuh"
#include "common/nvfp4_decode.cuh"
#include "common/scale_layout.h"
#ifdef JAX_NVFP4_HAS_CUBLASLT
#include "gemm/sm90/cublaslt_gemm.h"
#endif
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

// The preparation kernel walks rows with the grid (one row per block at a time) and a row's
// elements with the block's threads: 32-bit column math, no per-element 64-bit division.

constexpr int kPrepThreads = 128;     // K = 4096: every thread's kDequantUnroll loads in use
constexpr int kDequantUnroll = 4;     // words a thread loads before converting any

// One NVFP4 row of k codes -> bf16, written `copies` times along K (zeros when !valid: padding
// rows). Thread t converts words t, t + blockDim, ... (8 codes in, 16 bytes out), so a warp's
// 4-byte loads and 16-byte stores are both contiguous, and it issues kDequantUnroll loads before
// it waits on one: the pass is a memory stream (4.5 bits in, 16 out).
__device__ void dequantize_row(const Nvfp4Operand& src, int64_t r, bool valid, int64_t k, int copies,
                               __nv_bfloat16* dst) {
  const int words = static_cast<int>(k / 8);
  const int step = static_cast<int>(blockDim.x);
  const uint32_t* codes = reinterpret_cast<const uint32_t*>(src.codes + r * (k / 2));
  const uint8_t* scales = src.scales + scale_offset(r, 0, k / kBlockSize);
  uint4* out_row = reinterpret_cast<uint4*>(dst);
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

// One f16/f32 row of k values -> bf16 [2k]: hi = bf16(x) in columns [0, k), lo = bf16(x - hi)
// in [k, 2k).
template <typename T>
__device__ void split_row(const T* row, int64_t k, __nv_bfloat16* out) {
  for (int c = threadIdx.x; c < k; c += blockDim.x) {
    const float v = static_cast<float>(row[c]);
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    out[c] = h;
    out[k + c] = __float2bfloat16_rn(v - __bfloat162float(h));
  }
}

// How the preparation kernel makes x bf16.
enum class XPrep { kNone, kDequantize, kSplitF16, kSplitF32 };

// Everything the GEMM reads besides a bf16 x, in one launch (launch gaps between several small
// kernels cost more than their work at M ~ 1024): rows [0, n_pad) of the grid's row space are the
// weight rows, dequantized (rows past n zero) together with bias[row] (float32, zero padded);
// rows [n_pad, n_pad + m) are x's rows, converted as kX says; block 0 also writes the GEMM's
// scalars: alpha with the dequantization factors undone, and beta = 0. A programmatic dependent
// launch: it waits for the grid before it.
template <XPrep kX>
__global__ void __launch_bounds__(kPrepThreads) prepare_operands(GemmProblem p, int64_t n_pad, int copies,
                                                                 __nv_bfloat16* w_out, __nv_bfloat16* x_out,
                                                                 float* scalars, float* bias) {
  wait_for_prior_grids();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    float a = *p.b.s_dec * (1.0f / kDequantFactor);
    if (p.a_is_nvfp4) a *= *p.a_q.s_dec * (1.0f / kDequantFactor);
    scalars[0] = a;
    scalars[1] = 0.f;
  }
  const int64_t k = p.k;
  const int64_t rows = n_pad + (kX == XPrep::kNone ? 0 : p.m);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (r < n_pad) {
      if (threadIdx.x == 0) bias[r] = p.bias && r < p.n ? load_as_float(p.bias, p.bias_dtype, r) : 0.f;
      dequantize_row(p.b, r, r < p.n, k, copies, w_out + r * copies * k);
      continue;
    }
    const int64_t xr = r - n_pad;
    if constexpr (kX == XPrep::kDequantize) {
      dequantize_row(p.a_q, xr, true, k, 1, x_out + xr * k);
    } else if constexpr (kX == XPrep::kSplitF16) {
      split_row(static_cast<const __half*>(p.a) + xr * k, k, x_out + xr * 2 * k);
    } else if constexpr (kX == XPrep::kSplitF32) {
      split_row(static_cast<const float*>(p.a) + xr * k, k, x_out + xr * 2 * k);
    }
  }
}

// Copies columns [0, n) of a [m, n_pad] matrix of elem_bytes elements to a dense [m, n] one.
// A programmatic dependent launch: its launch overlaps the end of the GEMM.
__global__ void crop_columns(const uint8_t* src, int64_t m, int64_t n, int64_t n_pad, int elem_bytes,
                             uint8_t* dst) {
  wait_for_prior_grids();
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


// The workspace carving of one prefill problem.
struct Plan {
  int64_t n_pad = 0;   // N rounded up so the output rows are 16-byte aligned for TMA
  int64_t k_gemm = 0;  // K, or 2K when x is split into bf16 hi + lo
  int copies = 1;
  bool convert_x = false, crop = false;
  // off_gemm: the GEMM library's own workspace, sized for CUTLASS and for cuBLASLt where it may run.
  size_t off_w = 0, off_x = 0, off_scalars = 0, off_bias = 0, off_d = 0, off_gemm = 0, total = 0;
};

// Whether cuBLASLt may take p's GEMM (where it is built): not when forced to CUTLASS, nor for an
// f16 output (cuBLASLt has no bf16 x bf16 -> f16 GEMM), nor for output rows that are not 16-byte
// aligned (`crop`: its heuristic offers no bf16 algorithm for an odd N; CUTLASS writes padded rows
// and crops them), nor for a bf16 output with a bias of another type (cuBLASLt reads the bias in
// the output's type; a float32 output takes the workspace's float32 bias). cublaslt_gemm itself
// declines a problem it has no algorithm for.
bool cublaslt_may_run(const GemmProblem& p, bool crop) {
  if (p.path == GemmPath::kPrefillCutlass || p.out_dtype == DType::kF16 || crop) return false;
  return p.bias == nullptr || p.out_dtype == DType::kF32 || p.bias_dtype == p.out_dtype;
}

size_t gemm_workspace(DType out, int m, int n, int k, bool cublaslt) {
  size_t bytes;
  switch (out) {
    case DType::kF32: bytes = wgmma_gemm_workspace_f32(m, n, k); break;
    case DType::kBF16: bytes = wgmma_gemm_workspace_bf16(m, n, k); break;
    default: bytes = wgmma_gemm_workspace_f16(m, n, k); break;
  }
#ifdef JAX_NVFP4_HAS_CUBLASLT
  if (cublaslt && bytes < kCublasLtWorkspaceBytes) bytes = kCublasLtWorkspaceBytes;
#else
  (void)cublaslt;
#endif
  return bytes;
}

Plan make_plan(const GemmProblem& p) {
  Plan plan;
  const int64_t align_elems = 16 / dtype_bytes(p.out_dtype);
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
  plan.off_scalars = off;
  off = align_up(off + 2 * sizeof(float));
  plan.off_bias = off;
  off = align_up(off + static_cast<size_t>(plan.n_pad) * sizeof(float));
  plan.off_d = off;
  if (plan.crop) off = align_up(off + static_cast<size_t>(p.m * plan.n_pad) * dtype_bytes(p.out_dtype));
  plan.off_gemm = off;
  off = align_up(off + gemm_workspace(p.out_dtype, static_cast<int>(p.m), static_cast<int>(plan.n_pad),
                                      static_cast<int>(plan.k_gemm), cublaslt_may_run(p, plan.crop)));
  plan.total = off;
  return plan;
}

// Blocks for a row-walking kernel over `rows` rows (up to 32 per SM, each walking rows).
unsigned grid_rows(int64_t rows) {
  const int64_t cap = 32LL * sm_count();
  return static_cast<unsigned>(rows < 1 ? 1 : (rows < cap ? rows : cap));
}

template <XPrep kX>
cudaError_t launch_prepare(const GemmProblem& p, const Plan& plan, uint8_t* ws, cudaStream_t stream) {
  const int64_t rows = plan.n_pad + (kX == XPrep::kNone ? 0 : p.m);
  LaunchConfig launch(grid_rows(rows), kPrepThreads, 0, stream, 0, /*pdl=*/true);
  return cudaLaunchKernelEx(&launch.cfg, prepare_operands<kX>, p, plan.n_pad, plan.copies,
                            reinterpret_cast<__nv_bfloat16*>(ws + plan.off_w),
                            reinterpret_cast<__nv_bfloat16*>(ws + plan.off_x),
                            reinterpret_cast<float*>(ws + plan.off_scalars), reinterpret_cast<float*>(ws + plan.off_bias));
}

// Enqueues the preparation kernel of `p`: the bf16 weights, x made bf16 where it is not, the
// scalars and the bias, in the workspace regions of `plan`.
cudaError_t prepare(const GemmProblem& p, const Plan& plan, uint8_t* ws, cudaStream_t stream) {
  if (p.a_is_nvfp4) return launch_prepare<XPrep::kDequantize>(p, plan, ws, stream);
  switch (p.a_dtype) {
    case DType::kF32: return launch_prepare<XPrep::kSplitF32>(p, plan, ws, stream);
    case DType::kF16: return launch_prepare<XPrep::kSplitF16>(p, plan, ws, stream);
    default: return launch_prepare<XPrep::kNone>(p, plan, ws, stream);
  }
}

#ifdef JAX_NVFP4_HAS_CUBLASLT
// Fills `g` with cuBLASLt's GEMM of `p` and says whether cuBLASLt may take it (cublaslt_may_run).
bool use_cublaslt(const GemmProblem& p, const Plan& plan, uint8_t* ws, CublasLtGemmArgs* g) {
  if (!cublaslt_may_run(p, plan.crop)) return false;
  const void* bias = p.bias != nullptr && p.out_dtype == DType::kF32 ? ws + plan.off_bias : p.bias;
  *g = CublasLtGemmArgs{p.m, p.n, plan.k_gemm, plan.convert_x ? ws + plan.off_x : p.a, ws + plan.off_w,
                        p.out, p.out_dtype, reinterpret_cast<const float*>(ws + plan.off_scalars), bias,
                        ws + plan.off_gemm};
  return true;
}
#endif

}  // namespace

size_t prefill_workspace_bytes(const GemmProblem& p) { return make_plan(p).total; }

cudaError_t prefill_gemm(const GemmProblem& p, cudaStream_t stream) {
  const Plan plan = make_plan(p);
  if (p.workspace_bytes < plan.total || p.m > INT32_MAX || plan.n_pad > INT32_MAX ||
      plan.k_gemm > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  const auto enqueue_prepare = [&] { return prepare(p, plan, ws, stream); };
#ifdef JAX_NVFP4_HAS_CUBLASLT
  if (CublasLtGemmArgs lt; use_cublaslt(p, plan, ws, &lt)) {
    const cudaError_t err = cublaslt_gemm(lt, stream, enqueue_prepare);
    if (err != cudaErrorNotSupported) return err;  // else nothing was enqueued: CUTLASS's GEMM
  }
#endif
  void* d = plan.crop ? static_cast<void*>(ws + plan.off_d) : p.out;
  const WgmmaGemmArgs g{static_cast<int>(p.m), static_cast<int>(plan.n_pad), static_cast<int>(plan.k_gemm),
                        plan.convert_x ? ws + plan.off_x : p.a,
                        ws + plan.off_w, d,
                        reinterpret_cast<float*>(ws + plan.off_scalars), reinterpret_cast<float*>(ws + plan.off_bias),
                        ws + plan.off_gemm};
  cudaError_t err;
  switch (p.out_dtype) {
    case DType::kF32: err = wgmma_gemm_f32(g, stream, enqueue_prepare); break;
    case DType::kBF16: err = wgmma_gemm_bf16(g, stream, enqueue_prepare); break;
    default: err = wgmma_gemm_f16(g, stream, enqueue_prepare); break;
  }
  if (err != cudaSuccess || !plan.crop) return err;
  LaunchConfig launch(grid_rows(p.m), 256, 0, stream, 0, /*pdl=*/true);
  return cudaLaunchKernelEx(&launch.cfg, crop_columns, static_cast<const uint8_t*>(ws + plan.off_d), p.m, p.n,
                            plan.n_pad, dtype_bytes(p.out_dtype), static_cast<uint8_t*>(p.out));
}

}  // namespace sm90
}  // namespace jax_nvfp4
