// The NVFP4 quantize / dequantize kernels, templated on the E2M1 encoder so that the sm_90a
// (software rounding) and sm_100a (cvt.rn.satfinite.e2m1x2.f32) builds share every other line.
// Each arch's .cu file includes this header once and defines its launchers with
// launch_quantize<Encoder> / launch_dequantize.
//
// Work decomposition: the unit is half of one 512-byte scale tile (128 rows x 4 blocks of 16),
// taken by one 256-thread CTA. Thread t of the tile owns entry t of the tile's row-major bytes,
// i.e. the block (row rt*128 + j*32 + i, k-block kt*4 + l) with t = i*16 + j*4 + l. So a warp
// writes 32 consecutive scale bytes, reads 8 rows x 4 consecutive blocks (whole 128-byte lines
// for bf16), and the tile's padding entries (rows past R, blocks past K/16) are written as zero
// by the threads that own them. CTAs loop over half-tiles (persistent grid).
//
// Every kernel is a programmatic dependent launch (common/launch_config.cuh) that waits for the
// grid before it on its first line: its launch overlaps that grid's tail, which matters where a
// pass takes a few microseconds (activations at decode).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "common/launch_config.cuh"
#include "common/nvfp4_decode.cuh"
#include "common/per_device.h"
#include "common/scale_layout.h"
#include "common/fast_divide.h"
#include "quantize/nvfp4_encode.h"
#include "quantize/quantize.h"

namespace jax_nvfp4 {
namespace quantize_detail {

constexpr int kThreads = 256;            // one half-tile of scale entries per CTA step
constexpr int kAmaxVectorsPerThread = 4;  // 16-byte loads in flight per thread in the amax pass
// Inputs up to this many 16-byte vectors (32 KB: 4 rows of 4096 bf16 activations) skip the amax
// pass: every quantize CTA reads x once more from L2 for the amax, cheaper than another launch.
constexpr int64_t kOwnAmaxVectors = 2048;

// Where the scale tiles of a tensor lie: matrices x row tiles x k tiles, 512 entries each.
// Tile indices are 32-bit (checked by the launchers) and divided by multiply-shift: the index
// math runs once per block of 16 elements.
struct TileGrid {
  int64_t rows_per_matrix, k_blocks, half_tiles;
  FastDivide per_matrix, per_row_tile;  // tiles per matrix, k tiles per row tile

  static TileGrid of(int64_t rows, int64_t k, int64_t rows_per_matrix) {
    TileGrid g{rows_per_matrix, k / kBlockSize, 0, FastDivide{}, FastDivide{}};
    if (rows > 0) {
      const int64_t row_tiles = ceil_div(rows_per_matrix, kTileRows);
      const int64_t k_tiles = scale_k_tiles(g.k_blocks);
      g.half_tiles = (rows / rows_per_matrix) * row_tiles * k_tiles * (kTileBytes / kThreads);
      if (g.fits_32bit()) {
        g.per_matrix = FastDivide::by(static_cast<uint32_t>(row_tiles * k_tiles));
        g.per_row_tile = FastDivide::by(static_cast<uint32_t>(k_tiles));
      }
    }
    return g;
  }

  bool fits_32bit() const { return half_tiles < (int64_t{1} << 31); }
};

// The block owned by this thread in half-tile `h`: its row (global), k-block, scale byte offset
// and whether it lies inside the tensor (false for a padding entry).
struct BlockRef {
  int64_t row, k_block, scale_offset;
  bool valid;
};

__device__ __forceinline__ BlockRef block_of(const TileGrid& g, uint32_t h) {
  const uint32_t tile = h >> 1;
  const uint32_t t = (h & 1u) * kThreads + threadIdx.x;
  const uint32_t matrix = g.per_matrix.quotient(tile);
  const uint32_t in_matrix = tile - matrix * g.per_matrix.divisor;
  const uint32_t rt = g.per_row_tile.quotient(in_matrix);
  const uint32_t kt = in_matrix - rt * g.per_row_tile.divisor;
  const uint32_t i = t >> 4, j = (t >> 2) & 3u, l = t & 3u;
  const int64_t r = static_cast<int64_t>(rt) * kTileRows + j * 32 + i;
  BlockRef b;
  b.row = static_cast<int64_t>(matrix) * g.rows_per_matrix + r;
  b.k_block = static_cast<int64_t>(kt) * kTileKBlocks + l;
  b.scale_offset = static_cast<int64_t>(tile) * kTileBytes + t;
  b.valid = r < g.rows_per_matrix && b.k_block < g.k_blocks;
  return b;
}

// ---- element types ------------------------------------------------------------------------

template <typename T>
struct Elem;

template <>
struct Elem<float> {
  static constexpr int kPerVector = 4;
  __device__ static void unpack4(const uint4& v, float* f) {
    f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
  }
  __device__ static uint4 pack4(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                      __float_as_uint(f[3]));
  }
};

template <>
struct Elem<__nv_bfloat16> {
  static constexpr int kPerVector = 8;
  __device__ static void unpack_word(uint32_t w, float* f) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xFFFF0000u);
  }
  __device__ static uint32_t pack_word(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // a -> low half
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

template <>
struct Elem<__half> {
  static constexpr int kPerVector = 8;
  __device__ static void unpack_word(uint32_t w, float* f) {
    const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&w));
    f[0] = v.x;
    f[1] = v.y;
  }
  __device__ static uint32_t pack_word(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);  // a -> low half
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

// 16-byte vector <-> floats, for every element type.
template <typename T>
__device__ __forceinline__ void unpack_vector(const uint4& v, float* f) {
  if constexpr (sizeof(T) == 4) {
    Elem<float>::unpack4(v, f);
  } else {
    Elem<T>::unpack_word(v.x, f + 0);
    Elem<T>::unpack_word(v.y, f + 2);
    Elem<T>::unpack_word(v.z, f + 4);
    Elem<T>::unpack_word(v.w, f + 6);
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack_vector(const float* f) {
  if constexpr (sizeof(T) == 4) {
    return Elem<float>::pack4(f);
  } else {
    return make_uint4(Elem<T>::pack_word(f[0], f[1]), Elem<T>::pack_word(f[2], f[3]),
                      Elem<T>::pack_word(f[4], f[5]), Elem<T>::pack_word(f[6], f[7]));
  }
}

template <typename T>
constexpr int kVectorsPerBlock = kBlockSize * static_cast<int>(sizeof(T)) / 16;

// The raw 16-byte vectors of one block of 16 elements.
template <typename T>
struct RawBlock {
  uint4 v[kVectorsPerBlock<T>];

  __device__ __forceinline__ void load(const T* __restrict__ x, int64_t k, int64_t row,
                                       int64_t k_block) {
    const uint4* src = reinterpret_cast<const uint4*>(x + row * k + k_block * kBlockSize);
#pragma unroll
    for (int q = 0; q < kVectorsPerBlock<T>; ++q) v[q] = src[q];
  }

  __device__ __forceinline__ void to_float(float* f) const {
#pragma unroll
    for (int q = 0; q < kVectorsPerBlock<T>; ++q) {
      unpack_vector<T>(v[q], f + q * Elem<T>::kPerVector);
    }
  }
};

// ---- numerics -------------------------------------------------------------------------------

// E4M3 code of a non-negative float, rn + satfinite (NaN stays NaN: 0x7F), in hardware.
__device__ __forceinline__ uint32_t e4m3_encode(float s) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(s));
  return pair & 0xFFu;
}

__device__ __forceinline__ float max_propagate_nan(float a, float b) {
  float m;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
  return m;
}

// Float value of E4M3 bits, exactly, in hardware (via f16, which holds every E4M3 value).
__device__ __forceinline__ float e4m3_decode(uint32_t bits) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(static_cast<uint16_t>(bits)));
  return __half2float(__ushort_as_half(static_cast<unsigned short>(halves & 0xFFFFu)));
}

// S_enc from the tensor's amax: 6*448/amax, or 1 where that is not a finite positive number.
__device__ __forceinline__ float encode_scale_from_amax(float amax) {
  const float s = __fdiv_rn(kE2m1Max * kE4m3Max, amax);
  const bool bad = amax == 0.0f || !(fabsf(s) <= FLT_MAX) || s == 0.0f;
  return bad ? 1.0f : s;
}

// Where each row's encode scale comes from: the given scales; else the tensor's amax, which a
// quantize CTA reduces from the amax pass's per-CTA maxima, or, for an input of at most
// kOwnAmaxVectors 16-byte vectors, computes from x itself (no amax pass).
struct EncodeScales {
  const float* given;       // [groups], or null: from the amax
  const float* block_max;   // [amax_blocks]: the amax pass's per-CTA maxima (amax_blocks > 0)
  int amax_blocks;          // 0: every quantize CTA reads all of x for the amax
  int64_t vectors;          // 16-byte vectors of x
  int64_t rows_per_group;
};

// The multiplier that takes a block with E4M3 scale bits sb onto the E2M1 grid:
// 1 / (decoded sb * s_dec), rounded, at most FLT_MAX.
__device__ __forceinline__ float block_multiplier(uint32_t sb, float s_dec) {
  return fminf(__frcp_rn(__fmul_rn(e4m3_decode(sb), s_dec)), FLT_MAX);
}

// Quantizes one block: returns its E4M3 scale bits; writes 8 bytes of packed codes.
// multiplier(sb) gives block_multiplier(sb, s_dec) of the block's row.
template <typename Encoder, typename Multiplier>
__device__ __forceinline__ uint32_t quantize_block(const float* f, float s_enc,
                                                   Multiplier multiplier, uint2* codes) {
  // max.NaN propagates NaN and Inf is the largest magnitude, so the block is finite exactly
  // when its amax is.
  float block_amax = 0.0f;
#pragma unroll
  for (int e = 0; e < kBlockSize; ++e) block_amax = max_propagate_nan(block_amax, fabsf(f[e]));
  if (!(block_amax <= FLT_MAX)) {  // a non-finite block gets the NaN scale and zero codes
    *codes = make_uint2(0u, 0u);
    return kE4m3NanBits;
  }
  const float sb_f32 = __fmul_rn(block_amax, __fmul_rn(s_enc, 1.0f / 6.0f));
  const uint32_t sb = e4m3_encode(sb_f32);
  const float mult = multiplier(sb);
  float y[kBlockSize];
#pragma unroll
  for (int e = 0; e < kBlockSize; ++e) y[e] = __fmul_rn(f[e], mult);
  *codes = make_uint2(Encoder::pack8(y), Encoder::pack8(y + 8));
  return sb;
}

// ---- kernels --------------------------------------------------------------------------------

// The maximum of every thread's m, returned to every thread of the CTA (once per kernel: its
// shared array is not reused).
__device__ __forceinline__ float cta_max(float m) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  __shared__ float warp_max[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  m = warp_max[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
  return m;
}

// max |x| over the finite elements of the 16-byte vectors first, first + stride, ... of x.
template <typename T>
__device__ __forceinline__ float strided_amax(const uint4* __restrict__ x, int64_t vectors, int64_t first,
                                              int64_t stride) {
  constexpr int kPer = Elem<T>::kPerVector;
  float m = 0.0f;
  int64_t v = first;
  for (; v + (kAmaxVectorsPerThread - 1) * stride < vectors; v += kAmaxVectorsPerThread * stride) {
    uint4 raw[kAmaxVectorsPerThread];
#pragma unroll
    for (int u = 0; u < kAmaxVectorsPerThread; ++u) raw[u] = x[v + u * stride];
#pragma unroll
    for (int u = 0; u < kAmaxVectorsPerThread; ++u) {
      float f[kPer];
      unpack_vector<T>(raw[u], f);
#pragma unroll
      for (int e = 0; e < kPer; ++e) m = fabsf(f[e]) <= FLT_MAX ? fmaxf(m, fabsf(f[e])) : m;
    }
  }
  for (; v < vectors; v += stride) {
    float f[kPer];
    unpack_vector<T>(x[v], f);
#pragma unroll
    for (int e = 0; e < kPer; ++e) m = fabsf(f[e]) <= FLT_MAX ? fmaxf(m, fabsf(f[e])) : m;
  }
  return m;
}

// Pass 1 (S_enc not given, more than kOwnAmaxVectors): max |x| over the finite elements; CTA b
// stores its maximum in block_max[b]. Nothing is accumulated in place (no atomics), so nothing
// needs zeroing first: at decode sizes that memset cost about as much as a kernel.
template <typename T>
__global__ void __launch_bounds__(kThreads) amax_kernel(const uint4* __restrict__ x,
                                                        int64_t vectors, float* block_max) {
  wait_for_prior_grids();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const float m = cta_max(strided_amax<T>(x, vectors, static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x,
                                          stride));
  if (threadIdx.x == 0) block_max[blockIdx.x] = m;
}

// kPerGroup: several encode scales (given), one per group of rows; otherwise one for the tensor.
template <typename Encoder, typename T, bool kPerGroup>
__global__ void __launch_bounds__(kThreads) quantize_kernel(
    const T* __restrict__ x, int64_t k, TileGrid grid, EncodeScales enc, int64_t groups,
    uint2* __restrict__ codes, uint8_t* __restrict__ scales, float* __restrict__ s_dec) {
  wait_for_prior_grids();
  // Without given scales the tensor's S_enc comes from its amax, which each CTA reduces from the
  // amax pass's per-CTA maxima (at most kMaxAmaxBlocks floats, from L2), or computes from x
  // itself when x is small (EncodeScales).
  float tensor_s_enc = 1.0f;
  if constexpr (!kPerGroup) {
    if (enc.given != nullptr) {
      tensor_s_enc = enc.given[0];
    } else {
      float amax = 0.0f;
      if (enc.amax_blocks > 0) {
        for (int i = threadIdx.x; i < enc.amax_blocks; i += kThreads) amax = fmaxf(amax, enc.block_max[i]);
      } else {
        amax = strided_amax<T>(reinterpret_cast<const uint4*>(x), enc.vectors, threadIdx.x, kThreads);
      }
      tensor_s_enc = encode_scale_from_amax(cta_max(amax));
    }
  }
  const float tensor_s_dec = __frcp_rn(tensor_s_enc);
  // With one S_enc a block's multiplier depends only on its 8 scale bits, so the CTA tabulates
  // it once (a thread an entry) instead of rounding a reciprocal per block.
  static_assert(kThreads == 256, "one multiplier table entry per thread");
  __shared__ float tensor_multiplier[256];
  if constexpr (!kPerGroup) {
    tensor_multiplier[threadIdx.x] = block_multiplier(threadIdx.x, tensor_s_dec);
    __syncthreads();
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t g = first; g < groups; g += static_cast<int64_t>(gridDim.x) * kThreads) {
    s_dec[g] = kPerGroup ? __frcp_rn(enc.given[g]) : tensor_s_dec;
  }
  auto quantize_one = [&](const BlockRef& b, const RawBlock<T>& raw) {
    uint32_t sb = 0;  // padding entries of the tile are zero
    if (b.valid) {
      float f[kBlockSize];
      raw.to_float(f);
      uint2* block_codes = codes + b.row * (k / kBlockSize) + b.k_block;
      if constexpr (kPerGroup) {
        const float s_enc = enc.given[b.row / enc.rows_per_group];
        const float s_dec_row = __frcp_rn(s_enc);
        sb = quantize_block<Encoder>(
            f, s_enc, [&](uint32_t bits) { return block_multiplier(bits, s_dec_row); }, block_codes);
      } else {
        sb = quantize_block<Encoder>(
            f, tensor_s_enc, [&](uint32_t bits) { return tensor_multiplier[bits]; }, block_codes);
      }
    }
    scales[b.scale_offset] = static_cast<uint8_t>(sb);
  };
  auto fetch = [&](uint32_t h, BlockRef* b, RawBlock<T>* raw) {
    *b = block_of(grid, h);
    if (b->valid) raw->load(x, k, b->row, b->k_block);
  };
  // Software pipelining over two register buffers: the next half-tile's loads are in flight
  // while this one is quantized (two named buffers, so no copies between iterations).
  const uint32_t n = static_cast<uint32_t>(grid.half_tiles), step = gridDim.x;
  BlockRef ref_a, ref_b;
  RawBlock<T> raw_a, raw_b;
  uint32_t h = blockIdx.x;
  if (h < n) fetch(h, &ref_a, &raw_a);
  for (; h < n; h += 2 * step) {
    const bool has_b = h + step < n;
    if (has_b) fetch(h + step, &ref_b, &raw_b);
    quantize_one(ref_a, raw_a);
    if (h + 2 * step < n) fetch(h + 2 * step, &ref_a, &raw_a);
    if (has_b) quantize_one(ref_b, raw_b);
  }
}

// Dequantize walks the same half-tiles as quantize (it writes no scales, so it splits them its
// own way): half-tile h holds rows [64 (h & 1), 64 (h & 1) + 64) of its tile, all 64 K
// elements. A thread converts pieces of 16 output bytes (8 bf16/f16 or 4 f32 elements) in
// consecutive pieces of a row, so each warp store covers whole 128- or 256-byte rows of the
// tile and each code load whole sectors (a thread a block, as quantize has it, left holes in
// every store instruction: 1.18x slower on an H100).
template <typename T>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(
    const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
    const float* __restrict__ s_dec, int64_t rows_per_group, bool one_group, int64_t k,
    TileGrid grid, T* __restrict__ out) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));     // elements a piece
  constexpr int kPieces = kTileKBlocks * kBlockSize / kPer;  // pieces a tile row: 8 or 16
  constexpr int kRowsPerPass = kThreads / kPieces;
  constexpr int kHalfRows = kTileRows / 2;
  using CodeWord = std::conditional_t<kPer == 8, uint32_t, uint16_t>;  // kPer 4-bit codes
  wait_for_prior_grids();
  const float tensor_s_dec = s_dec[0];  // one_group: every row's (no division per piece)
  const int piece = threadIdx.x % kPieces, l = piece * kPer / kBlockSize;
  for (uint32_t h = blockIdx.x; h < grid.half_tiles; h += gridDim.x) {
    const uint32_t tile = h >> 1;
    const uint32_t matrix = grid.per_matrix.quotient(tile);
    const uint32_t in_matrix = tile - matrix * grid.per_matrix.divisor;
    const uint32_t rt = grid.per_row_tile.quotient(in_matrix);
    const uint32_t kt = in_matrix - rt * grid.per_row_tile.divisor;
    const int64_t k_block = static_cast<int64_t>(kt) * kTileKBlocks + l;
    if (k_block >= grid.k_blocks) continue;
    const int64_t col = static_cast<int64_t>(kt) * kTileKBlocks * kBlockSize + piece * kPer;
#pragma unroll
    for (int pass = 0; pass < kHalfRows / kRowsPerPass; ++pass) {
      const uint32_t rr = (h & 1u) * kHalfRows + pass * kRowsPerPass + threadIdx.x / kPieces;
      const int64_t r = static_cast<int64_t>(rt) * kTileRows + rr;
      if (r >= grid.rows_per_matrix) break;
      const int64_t row = static_cast<int64_t>(matrix) * grid.rows_per_matrix + r;
      const uint32_t word = *reinterpret_cast<const CodeWord*>(codes + row * (k / 2) + col / 2);
      const float sb = e4m3_decode(scales[static_cast<int64_t>(tile) * kTileBytes +
                                          (rr % 32) * 16 + (rr / 32) * 4 + l]);
      const float sd = one_group ? tensor_s_dec : s_dec[row / rows_per_group];
      float f[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        f[e] = __fmul_rn(__fmul_rn(e2m1_to_float((word >> (4 * e)) & 0xFu), sb), sd);
      }
      // Indexed from a uint4 base: a T* cast at the store was split into 4-byte stores.
      reinterpret_cast<uint4*>(out)[(row * k + col) / kPer] = pack_vector<T>(f);
    }
  }
}

// ---- launchers ------------------------------------------------------------------------------

template <auto kKernel>
struct WaveBlocksOf {};

// Blocks of kThreads that kKernel keeps resident on the whole device (asked once per device).
template <auto kKernel>
int64_t wave_blocks() {
  return once_per_device<WaveBlocksOf<kKernel>>([] {
    int device = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, 0) != cudaSuccess) {
      (void)cudaGetLastError();  // leave no sticky error for the launch to report
    }
    return static_cast<int64_t>(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  });
}

// One block per work item, at most one resident wave (the kernels loop over the rest).
template <auto kKernel>
int persistent_grid(int64_t work_items) {
  const int64_t full = wave_blocks<kKernel>();
  return static_cast<int>(work_items < full ? (work_items > 0 ? work_items : 1) : full);
}

// Launches `kernel` on `blocks` CTAs of kThreads as a programmatic dependent launch.
template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), int blocks, cudaStream_t stream, Args... args) {
  LaunchConfig launch(blocks, kThreads, 0, stream, 0, /*pdl=*/true);
  return cudaLaunchKernelEx(&launch.cfg, kernel, static_cast<Params>(args)...);
}

inline bool valid_shape(int64_t rows, int64_t k, int64_t rows_per_matrix, int64_t groups) {
  if (rows < 0 || k <= 0 || k % kBlockSize != 0 || groups <= 0) return false;
  if (rows == 0) return true;
  return rows_per_matrix > 0 && rows % rows_per_matrix == 0 && rows % groups == 0;
}

template <typename Encoder, typename T>
cudaError_t launch_quantize_typed(const QuantizeProblem& p, cudaStream_t stream) {
  const TileGrid grid = TileGrid::of(p.rows, p.k, p.rows_per_matrix);
  if (!grid.fits_32bit()) return cudaErrorInvalidValue;
  float* block_max = static_cast<float*>(p.workspace);
  const int64_t vectors = p.rows * p.k * static_cast<int64_t>(sizeof(T)) / 16;
  EncodeScales enc{p.s_enc, block_max, 0, vectors, p.rows > 0 ? p.rows / p.groups : 1};
  if (p.s_enc == nullptr && vectors > kOwnAmaxVectors) {
    const int blocks = persistent_grid<amax_kernel<T>>(ceil_div(vectors, kThreads));
    enc.amax_blocks = blocks < kMaxAmaxBlocks ? blocks : kMaxAmaxBlocks;
    const cudaError_t err = launch_dependent(amax_kernel<T>, enc.amax_blocks, stream,
                                             static_cast<const uint4*>(p.x), vectors, block_max);
    if (err != cudaSuccess) return err;
  }
  constexpr auto kGrouped = quantize_kernel<Encoder, T, true>;
  constexpr auto kOneGroup = quantize_kernel<Encoder, T, false>;
  const bool grouped = p.groups > 1;
  const int blocks = grouped ? persistent_grid<kGrouped>(grid.half_tiles)
                             : persistent_grid<kOneGroup>(grid.half_tiles);
  return launch_dependent(grouped ? kGrouped : kOneGroup, blocks, stream, static_cast<const T*>(p.x), p.k,
                          grid, enc, p.groups, reinterpret_cast<uint2*>(p.codes), p.scales, p.s_dec);
}

template <typename Encoder>
cudaError_t launch_quantize(const QuantizeProblem& p, cudaStream_t stream) {
  if (!valid_shape(p.rows, p.k, p.rows_per_matrix, p.groups)) return cudaErrorInvalidValue;
  if (p.s_enc == nullptr && (p.groups != 1 || p.workspace == nullptr ||
                             p.workspace_bytes < quantize_workspace_bytes(p))) {
    return cudaErrorInvalidValue;
  }
  switch (p.x_dtype) {
    case DType::kF32: return launch_quantize_typed<Encoder, float>(p, stream);
    case DType::kBF16: return launch_quantize_typed<Encoder, __nv_bfloat16>(p, stream);
    case DType::kF16: return launch_quantize_typed<Encoder, __half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_dequantize_typed(const DequantizeProblem& p, cudaStream_t stream) {
  const TileGrid grid = TileGrid::of(p.rows, p.k, p.rows_per_matrix);
  if (!grid.fits_32bit()) return cudaErrorInvalidValue;
  if (grid.half_tiles == 0) return cudaSuccess;
  const int blocks = persistent_grid<dequantize_kernel<T>>(grid.half_tiles);
  return launch_dependent(dequantize_kernel<T>, blocks, stream, p.codes, p.scales,
                          p.s_dec, p.rows / p.groups, p.groups == 1, p.k, grid,
                          static_cast<T*>(p.out));
}

inline cudaError_t launch_dequantize(const DequantizeProblem& p, cudaStream_t stream) {
  if (!valid_shape(p.rows, p.k, p.rows_per_matrix, p.groups)) return cudaErrorInvalidValue;
  switch (p.out_dtype) {
    case DType::kF32: return launch_dequantize_typed<float>(p, stream);
    case DType::kBF16: return launch_dequantize_typed<__nv_bfloat16>(p, stream);
    case DType::kF16: return launch_dequantize_typed<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace quantize_detail
}  // namespace jax_nvfp4
