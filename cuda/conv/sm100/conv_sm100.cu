// sm_100a shifted-operand convolution: tcgen05.mma kind::f16 with A (activations) in Tensor
// Memory and `.ashift` between the filter taps of a row; NVFP4 weights dequantized to bf16 in
// shared memory as B; fp32 accumulator in Tensor Memory. The schedule (lanes, chains, masks,
// halo) is conv_sm100_schedule.h, checked on the host by tests/host/conv_sm100_model.cc.
//
// One CTA = one tile of 128 lanes x 128 output channels, 4 warps; warp w owns TMEM sub-partition
// w (lanes 32w..32w+31). Per stage (filter row, chain, 32-channel block):
//   1. every lane's thread loads its activation pixel (schedule: lane_source), converts it to
//      bf16 and writes it into A's TMEM columns (tcgen05.st); the warps ballot the per-step
//      disable-output-lane masks; all threads dequantize the chain's weight taps into shared
//      memory in the no-swizzle K-major canonical layout;
//   2. thread 0 issues, per step of the chain, one MMA per 16 channels, with .ashift on all but
//      the last step, and commits to an mbarrier the next stage waits on.
// The accumulator is zeroed by tcgen05.st first, so every MMA accumulates and a disabled lane
// simply keeps its sum. The epilogue reads D with tcgen05.ld, applies alpha and bias and stores
// the lanes that hold an output.
//
// Activations reach TMEM through registers rather than TMA: TMEM is written only by tcgen05.st
// or tcgen05.cp, the operand must be converted to bf16 (f32/f16 inputs, NVFP4 dequantization),
// and a 32-lane window crosses row and image boundaries at positions TMA boxes cannot express.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cute/arch/mma_sm100_desc.hpp>

#include "common/bf16x2.cuh"
#include "common/dtype_io.cuh"
#include "common/nvfp4_decode.cuh"
#include "common/scale_layout.h"
#include "conv/sm100/conv_sm100.h"
#include "conv/sm100/conv_sm100_schedule.h"
#include "conv/sm100/tcgen05_ops.cuh"

namespace jax_nvfp4 {
namespace {

using ashift_conv::Chain;
using ashift_conv::Geometry;
using ashift_conv::Output;
using ashift_conv::Pixel;

constexpr int kThreads = 128;            // 4 warps, one per TMEM sub-partition
constexpr int kBlockN = 128;             // output channels per CTA: the MMA's N
constexpr int kBlockC = 32;              // input channels per stage
constexpr int kMmaK = 16;                // K of one kind::f16 MMA
constexpr uint32_t kTmemCols = 256;      // allocation: power of two >= D + A columns
constexpr uint32_t kColD = 0;            // D: kBlockN fp32 columns
constexpr uint32_t kColA = kBlockN;      // A: kBlockC bf16 = kBlockC/2 columns per lane
constexpr int kCoreBytes = 128;          // one core matrix: 8 rows x 16 bytes
constexpr int kTapBytes = kBlockN * kBlockC * 2;  // one tap's B tile (bf16)
constexpr int kMaxTaps = 24;             // B tiles kept in shared memory: one per filter column
constexpr int kMaxSteps = ashift_conv::kSubLanes;  // span < 32

struct SharedState {
  uint32_t disable[kMaxSteps][4];  // per step: disable-output-lane words (bit = lane disabled)
  uint64_t mma_done;               // mbarrier: the stage's MMAs have completed
  uint32_t tmem_base;
};

// Canonical K-major, no-swizzle layout of one tap's B tile: core matrices of 8 rows x 8 channels;
// the 4 channel-core-matrices of a row group are adjacent (LBO), row groups follow (SBO).
constexpr uint32_t kLbo = kCoreBytes;
constexpr uint32_t kSbo = kCoreBytes * (kBlockC / 8);

__device__ __forceinline__ uint32_t b_tile_offset(int row, int chunk) {
  return (row / 8) * kSbo + chunk * kLbo + (row % 8) * 16;
}

__device__ __forceinline__ uint64_t b_descriptor(uint32_t smem_byte_addr) {
  cute::UMMA::SmemDescriptor d;
  d.start_address_ = static_cast<uint16_t>(smem_byte_addr >> 4);
  d.leading_byte_offset_ = static_cast<uint16_t>(kLbo >> 4);
  d.stride_byte_offset_ = static_cast<uint16_t>(kSbo >> 4);
  d.version_ = 1;  // tcgen05 descriptor
  d.base_offset_ = 0;
  d.lbo_mode_ = 0;
  d.layout_type_ = static_cast<uint8_t>(cute::UMMA::LayoutType::SWIZZLE_NONE);
  return d.desc_;
}

// kind::f16, bf16 x bf16 -> f32, A and B K-major, M = 128, N = n.
__device__ __forceinline__ uint32_t instr_descriptor(int n) {
  cute::UMMA::InstrDescriptor d;
  d.desc_ = 0;
  d.c_format_ = 1;  // F32
  d.a_format_ = static_cast<uint8_t>(cute::UMMA::F16F32Format::BF16);
  d.b_format_ = static_cast<uint8_t>(cute::UMMA::F16F32Format::BF16);
  d.a_major_ = 0;
  d.b_major_ = 0;
  d.n_dim_ = static_cast<uint16_t>(n >> 3);
  d.m_dim_ = ashift_conv::kLanes >> 4;
  return d.desc_;
}

__device__ __forceinline__ uint32_t bf16_pair_from_f16(uint32_t bits) {
  const __half2 h = *reinterpret_cast<const __half2*>(&bits);
  const float2 f = __half22float2(h);
  return pack_bf16x2(f.x, f.y);
}

// 8 NVFP4 codes (one 32-bit word, element 2i in the low nibble) times their E4M3 scale, as four
// bf16 pairs: the products are exact in bf16.
__device__ __forceinline__ void dequant8(uint32_t codes, float scale, uint32_t* out) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t byte = (codes >> (8 * i)) & 0xFFu;
    out[i] = pack_bf16x2(e2m1_to_float(byte & 0xFu) * scale, e2m1_to_float(byte >> 4) * scale);
  }
}

// Channels [c0, c0 + count) (count 16 or 32) of one activation pixel as 16 bf16 pairs; zeros for
// a lane without a pixel and past `count`.
__device__ __forceinline__ void load_pixel(const ConvProblem& p, const Pixel& px, int64_t c0,
                                           int count, uint32_t (&v)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = 0u;
  if (!px.real) return;
  const int64_t pixel = (px.n * p.h + px.h) * p.w + px.w;
  const int vecs = count / 8;  // groups of 8 channels
  if (p.x_is_nvfp4) {
    const uint8_t* codes = p.x_q.codes + pixel * (p.c / 2) + c0 / 2;
    const int64_t kb = p.c / kBlockSize;
    const uint8_t* scales = p.x_q.scales + (px.n * p.h + px.h) * scale_matrix_bytes(p.w, kb);
#pragma unroll
    for (int g = 0; g < kBlockC / 8; ++g) {
      if (g >= vecs) break;
      const uint32_t word = *reinterpret_cast<const uint32_t*>(codes + 4 * g);
      const float s = e4m3_to_float(scales[scale_offset(px.w, (c0 + 8 * g) / kBlockSize, kb)]);
      dequant8(word, s, &v[4 * g]);
    }
    return;
  }
  switch (p.x_dtype) {
    case DType::kBF16: {
      const uint4* src = reinterpret_cast<const uint4*>(
          static_cast<const __nv_bfloat16*>(p.x) + pixel * p.c + c0);
#pragma unroll
      for (int g = 0; g < kBlockC / 8; ++g) {
        if (g >= vecs) break;
        const uint4 q = src[g];
        v[4 * g] = q.x; v[4 * g + 1] = q.y; v[4 * g + 2] = q.z; v[4 * g + 3] = q.w;
      }
      break;
    }
    case DType::kF16: {
      const uint4* src =
          reinterpret_cast<const uint4*>(static_cast<const __half*>(p.x) + pixel * p.c + c0);
#pragma unroll
      for (int g = 0; g < kBlockC / 8; ++g) {
        if (g >= vecs) break;
        const uint4 q = src[g];
        v[4 * g] = bf16_pair_from_f16(q.x); v[4 * g + 1] = bf16_pair_from_f16(q.y);
        v[4 * g + 2] = bf16_pair_from_f16(q.z); v[4 * g + 3] = bf16_pair_from_f16(q.w);
      }
      break;
    }
    case DType::kF32: {
      const float4* src =
          reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + pixel * p.c + c0);
#pragma unroll
      for (int i = 0; i < kBlockC / 4; ++i) {
        if (i >= 2 * vecs) break;
        const float4 f = src[i];
        v[2 * i] = pack_bf16x2(f.x, f.y);
        v[2 * i + 1] = pack_bf16x2(f.z, f.w);
      }
      break;
    }
  }
}

// Dequantizes weight tap (fr, fs), output channels [n0, n0 + kBlockN), input channels
// [c0, c0 + kBlockC) into a B tile; rows past k and channels past c are zero.
__device__ void load_weight_tap(const ConvProblem& p, int fr, int fs, int64_t n0, int64_t c0,
                                uint8_t* tile) {
  const int64_t kb = p.c / kBlockSize;
  const int64_t rs = static_cast<int64_t>(fr) * p.s + fs;
  const uint8_t* codes = p.wgt.codes + rs * p.k * (p.c / 2);
  const uint8_t* scales = p.wgt.scales + rs * scale_matrix_bytes(p.k, kb);
  constexpr int kChunks = kBlockN * (kBlockC / 8);
  for (int id = threadIdx.x; id < kChunks; id += kThreads) {
    const int row = id / (kBlockC / 8), chunk = id % (kBlockC / 8);
    const int64_t k = n0 + row, c = c0 + 8 * chunk;
    uint32_t v[4] = {0u, 0u, 0u, 0u};
    if (k < p.k && c < p.c) {
      const uint32_t word = *reinterpret_cast<const uint32_t*>(codes + k * (p.c / 2) + c / 2);
      dequant8(word, e4m3_to_float(scales[scale_offset(k, c / kBlockSize, kb)]), v);
    }
    *reinterpret_cast<uint4*>(tile + b_tile_offset(row, chunk)) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    conv_sm100_ashift_kernel(const ConvProblem p, const Geometry g) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* b_tiles = smem;  // p.s tiles of kTapBytes, one per filter column
  SharedState& st = *reinterpret_cast<SharedState*>(smem + static_cast<size_t>(p.s) * kTapBytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x;  // thread i owns TMEM lane i
  const int64_t tile = blockIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBlockN;
  const int n_mma = static_cast<int>(p.k - n0 >= kBlockN ? kBlockN : (p.k - n0 + 15) / 16 * 16);
  const uint32_t idesc = instr_descriptor(n_mma);

  if (warp == 0) tcgen05::alloc(&st.tmem_base, kTmemCols);
  if (threadIdx.x == 0) tcgen05::mbarrier_init(&st.mma_done, 1);
  tcgen05::fence_before_sync();
  __syncthreads();
  tcgen05::fence_after_sync();
  const uint32_t tmem = st.tmem_base;
  const uint32_t warp_lanes = static_cast<uint32_t>(warp * 32) << 16;  // lane field of taddr

  // D = 0, so every MMA accumulates and a lane disabled in some MMA keeps a correct sum.
  {
    const uint32_t zero[16] = {};
    for (int col = 0; col < kBlockN; col += 16)
      tcgen05::st_32x32b_x16(tmem + warp_lanes + kColD + col, zero);
  }

  const Output out_px = g.lane_output(tile, lane);
  uint32_t phase = 0;
  bool first_stage = true;
  for (int fr = 0; fr < p.r; ++fr) {
    for (int rho = 0; rho < p.stride_w; ++rho) {
      const Chain chain = g.chain(rho);
      if (chain.empty()) continue;
      const int steps = chain.steps();
      for (int64_t c0 = 0; c0 < p.c; c0 += kBlockC) {
        const int count = static_cast<int>(p.c - c0 >= kBlockC ? kBlockC : p.c - c0);
        if (!first_stage) {  // the previous stage's MMAs still read A, B and the masks
          tcgen05::mbarrier_wait(&st.mma_done, phase);
          phase ^= 1u;
          tcgen05::fence_after_sync();
        }
        first_stage = false;

        uint32_t a_vals[16];
        load_pixel(p, g.lane_source(tile, lane, fr, chain), c0, count, a_vals);
        tcgen05::st_32x32b_x16(tmem + warp_lanes + kColA, a_vals);
        for (int step = 0; step < steps; ++step) {
          const unsigned enabled =
              __ballot_sync(0xFFFFFFFFu, g.lane_enabled(tile, lane, fr, chain, step));
          if (lane % 32 == 0) st.disable[step][warp] = ~enabled;
        }
        for (int step = 0; step < steps; ++step) {
          const int fs = g.tap_at(chain, chain.u_max - step);
          if (fs >= 0) load_weight_tap(p, fr, fs, n0, c0, b_tiles + fs * kTapBytes);
        }
        tcgen05::wait_st();
        tcgen05::fence_proxy_async_smem();
        tcgen05::fence_before_sync();
        __syncthreads();

        if (threadIdx.x == 0) {
          tcgen05::fence_after_sync();
          const int any_tap = g.tap_at(chain, chain.u_max);  // u_max always holds a tap
          for (int step = 0; step < steps; ++step) {
            const int fs = g.tap_at(chain, chain.u_max - step);
            // A step without a tap (dilation) only shifts: every lane is disabled.
            const uint32_t b_base = tcgen05::smem_addr(b_tiles + (fs >= 0 ? fs : any_tap) * kTapBytes);
            const uint32_t(&mask)[4] = st.disable[step];
            for (int kk = 0; kk < count / kMmaK; ++kk) {
              const uint32_t a_tmem = tmem + kColA + kk * (kMmaK / 2);
              const uint64_t b_desc = b_descriptor(b_base + kk * 2 * kCoreBytes);
              if (step + 1 < steps)
                tcgen05::mma_f16_tmem_a<true>(tmem + kColD, a_tmem, b_desc, idesc, mask);
              else
                tcgen05::mma_f16_tmem_a<false>(tmem + kColD, a_tmem, b_desc, idesc, mask);
            }
          }
          tcgen05::commit(&st.mma_done);
        }
      }
    }
  }
  tcgen05::mbarrier_wait(&st.mma_done, phase);
  tcgen05::fence_after_sync();

  // Epilogue: alpha * D + bias for the lanes that hold an output.
  const float alpha = *p.wgt.s_dec * (p.x_is_nvfp4 ? *p.x_q.s_dec : 1.f);
  const int64_t out_row = ((out_px.n * p.p + out_px.p) * p.q + out_px.q) * p.k;
  for (int col = 0; col < n_mma; col += 16) {
    uint32_t acc[16];
    tcgen05::ld_32x32b_x16(tmem + warp_lanes + kColD + col, acc);
    tcgen05::wait_ld();
    if (!out_px.valid) continue;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int64_t k = n0 + col + i;
      if (k < p.k) {
        const float bias = p.bias ? load_as_float(p.bias, p.bias_dtype, k) : 0.f;
        store_as(p.out, p.out_dtype, out_row + k, alpha * __uint_as_float(acc[i]) + bias);
      }
    }
  }
  tcgen05::fence_before_sync();
  __syncthreads();
  if (warp == 0) tcgen05::dealloc(tmem, kTmemCols);
}

Geometry geometry_of(const ConvProblem& p) {
  return ashift_conv::make_geometry(p.n, p.h, p.w, p.p, p.q, p.r, p.s, p.stride_h, p.stride_w,
                                   p.pad_h, p.pad_w, p.dil_h, p.dil_w);
}

size_t shared_bytes(const ConvProblem& p) {
  return static_cast<size_t>(p.s) * kTapBytes + sizeof(SharedState);
}

}  // namespace

cudaError_t conv_sm100(const ConvProblem& p, cudaStream_t stream) {
  if (p.n <= 0 || p.p <= 0 || p.q <= 0 || p.k <= 0) return cudaSuccess;  // empty output
  if (p.c <= 0 || p.c % kBlockSize != 0 || p.s > kMaxTaps || p.r < 1 || p.s < 1 ||
      p.stride_h < 1 || p.stride_w < 1 || p.dil_h < 1 || p.dil_w < 1)
    return cudaErrorInvalidValue;
  const Geometry g = geometry_of(p);
  if (g.valid_lanes <= 0 || g.span >= kMaxSteps || g.tiles > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const size_t smem = shared_bytes(p);
  cudaError_t err = cudaFuncSetAttribute(conv_sm100_ashift_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(g.tiles), static_cast<unsigned>(ceil_div(p.k, kBlockN)));
  conv_sm100_ashift_kernel<<<grid, kThreads, smem, stream>>>(p, g);
  return cudaGetLastError();
}

}  // namespace jax_nvfp4
