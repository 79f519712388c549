// Mid-M NVFP4 GEMM for sm_90a: the weights are dequantized inside the main loop, straight into
// the A-operand registers of wgmma, and multiply activations held in shared memory (B).
//
// Between decode (a few activation rows: a weight stream) and prefill (thousands: MMA-bound,
// where a separate pass dequantizing the weights to bf16 costs little) lies a range where that
// pass's 16-bit write and re-read of every weight costs more than the GEMM itself. Here each
// weight byte is read once per CTA from HBM/L2 and never written back.
//
// Work split: a CTA of two warpgroups owns 128 weight rows (64 per warpgroup, the wgmma's M; one
// scale tile) and MT rows of activations (the wgmma's N, 64 or 128), over a range of K chunks of
// 128 elements. Shared memory holds two cp.async rings:
//   weights      the chunk's codes (128 rows x 64 bytes) and its two 512-byte scale tiles,
//                kLw chunks ahead (from HBM); a buffer is free again once every thread has read
//                it;
//   activations  the chunk's [MT x 128] bf16 tile, kLx chunks ahead (from L2); the asynchronous
//                wgmma reads it, so a buffer is refilled only after the wgmmas of the chunk
//                before have retired everywhere (two chunks later).
// A thread's cp.async groups complete in order, so one thread loading both would wait for its
// young weight copies whenever it waits for an activation tile: the first warpgroup copies the
// activations, the second the weights, and each waits on its own ring's depth.
// Each thread dequantizes 32 elements of two weight rows per chunk (the decode kernel's lane
// layout: 16 bytes per row, pair j of a word = elements j and j + 4, nvfp4_bf16x2.h) into the
// registers of 8 wgmma k-steps while the previous chunk's wgmmas run.
//
// The MMA contracts its 16 k slots in any order shared by A and B, so the activations are laid
// out in the order the weights come out of the dequantization: a staging kernel writes x once
// per call as bf16 tiles in that K order and in wgmma's swizzled K-major layout, which makes a
// stage one contiguous copy. It also makes every activation kind bf16: NVFP4 is dequantized
// exactly, f16 and f32 become a bf16 hi row and lo row side by side (the two results are added
// in the epilogue: exact for f16, ~2^-17 relative for f32).
//
// Split-K over a thread-block cluster when the output tiles alone do not fill the GPU; the
// partial sums meet through distributed shared memory in rank order (cluster_split.cuh).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "common/scale_layout.h"
#include "common/sm90_async.cuh"
#include "gemm/sm90/cluster_split.cuh"
#include "gemm/sm90/fused_staging.h"
#include "gemm/sm90/gemm_device_utils.cuh"
#include "gemm/sm90/gemm_sm90_internal.h"
#include "gemm/sm90/nvfp4_bf16x2.h"

namespace jax_nvfp4 {
namespace sm90 {
namespace {

using namespace hopper;
namespace cg = cooperative_groups;

constexpr int kThreads = 256;  // two warpgroups
constexpr int kLoaderThreads = 128;  // per ring: warpgroup 0 activations, 1 weights
constexpr int kRows = 128;     // weight rows per CTA: one scale tile
constexpr int kChunk = 128;    // K elements per stage: 4 lanes x 32
constexpr int kSteps = kChunk / 16;
constexpr int kCodeBytes = kRows * kChunk / 2;
constexpr int kScaleBytes = 2 * kTileBytes;  // scale tiles 2c and 2c + 1 of the row tile
constexpr int kWeightStageBytes = kCodeBytes + kScaleBytes;
constexpr int kMinChunksPerSplit = 4;  // the weight ring needs a few chunks to fill
static_assert(kChunk == 2 * kTileKBlocks * kBlockSize, "a chunk spans two scale tiles");
static_assert(kRows == kTileRows, "a CTA's rows are one scale tile");

// Ring depths per activation tile width (shared memory stays under the 227 KB limit).
template <int MT>
struct Tile {
  static constexpr int kXStageBytes = MT * kChunk * 2;
  static constexpr int kLx = 2;  // activation chunks in flight (they come from L2)
  static constexpr int kSx = kLx + 2;
  static constexpr int kLw = MT == 64 ? 10 : 8;  // weight chunks in flight (from HBM)
  static constexpr int kSw = kLw + 1;
  static constexpr int kSmemBytes = kSx * kXStageBytes + kSw * kWeightStageBytes;
  static constexpr int kAcc = MT / 2;  // accumulators per thread of an m64 x MT wgmma
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kThreads * kAcc * 4 <= kSx * kXStageBytes, "split-K partials fit the activation ring");
};

// Rows of staged activations per row of x: two (bf16 hi, lo) for f16 and f32.
template <XKind XK>
constexpr int staged_rows_per_row() {
  return x_split<XK>() ? 2 : 1;
}

// --- Staging of the activations (order and layout: fused_staging.h) ------------------------

// Pair j (elements j, j + 4) of 8 consecutive activations e0 .. e0+7 of effective row r, as
// bf16x2 (zero past M or K).
template <XKind XK>
__device__ __forceinline__ void activation_pairs(const GemmProblem& p, int64_t r, int64_t e0,
                                                 uint32_t (&pair)[4]) {
  pair[0] = pair[1] = pair[2] = pair[3] = 0u;
  const int64_t m = r / staged_rows_per_row<XK>();
  if (m >= p.m || e0 >= p.k) return;  // k is a multiple of 16, so e0 + 8 <= k
  if constexpr (XK == XKind::kBF16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.a) + m * p.k + e0));
    pair[0] = __byte_perm(u.x, u.z, 0x5410);
    pair[1] = __byte_perm(u.x, u.z, 0x7632);
    pair[2] = __byte_perm(u.y, u.w, 0x5410);
    pair[3] = __byte_perm(u.y, u.w, 0x7632);
  } else if constexpr (XK == XKind::kNvfp4) {
    const uint32_t word = __ldg(reinterpret_cast<const uint32_t*>(p.a_q.codes + (m * p.k + e0) / 2));
    const uint32_t scale = p.a_q.scales[scale_offset(m, e0 / kBlockSize, p.k / kBlockSize)];
    uint32_t s0, s1;
    widen_scales(scale, s0, s1);
    dequant_word(word, s0, pair);
  } else {
    float f[8];
    if constexpr (XK == XKind::kF16) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(static_cast<const __half*>(p.a) + m * p.k + e0));
      const uint32_t h[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h[i]));
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
      }
    } else {
      const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.a) + m * p.k + e0);
      const float4 a = __ldg(src), b = __ldg(src + 1);
      f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
      f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    }
    const bool lo = r % 2 == 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t hi = pack_bf16x2(f[j], f[j + 4]);
      const float2 hf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&hi));
      pair[j] = lo ? pack_bf16x2(f[j] - hf.x, f[j + 4] - hf.y) : hi;
    }
  }
}

// One thread per (staged row, chunk, t, q): 8 activations in, 4 words out.
template <XKind XK, int MT>
__global__ void stage_activations(const GemmProblem p, int64_t staged_rows, int64_t chunks, uint32_t* xs) {
  constexpr int kTileWords = MT * kChunk / 2;
  const int64_t total = staged_rows * chunks * 16;
  for (int64_t id = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; id < total;
       id += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int tq = static_cast<int>(id % 16);  // consecutive threads read consecutive 8-element words
    const int t = tq / 4, q = tq % 4;
    const int64_t c = (id / 16) % chunks, r = id / 16 / chunks;
    uint32_t pair[4];
    activation_pairs<XK>(p, r, c * kChunk + 32 * t + 8 * q, pair);
    uint32_t* tile = xs + ((r / MT) * chunks + c) * kTileWords;
    const int64_t row = r % MT;
#pragma unroll
    for (int j = 0; j < 4; ++j) tile[staged_word<MT>(staged_k_group(32 * t + 8 * q + j), row, t)] = pair[j];
  }
}

// --- The GEMM kernel ------------------------------------------------------------------------

// A weight loader thread's share of every chunk: `kPiece` bytes (16; 8 when rows of K/2 bytes
// are only 8-byte aligned) of the codes of rows r_first + u * kRowsPerPass, and (loaders < 64) 16
// bytes of the chunk's two scale tiles. Addresses are set up once; a chunk only adds its offset.
// Rows past N, K past k and scale tiles past the last are zero filled.
struct WeightCopier {
  const uint8_t* codes;   // this thread's piece of row r_first in chunk 0
  int64_t pass_stride;    // bytes between the rows of consecutive passes
  uint32_t rows_ok;       // bit u: the row of pass u is < N
  int first_elem;         // K offset of the piece within a chunk
  int dst;                // shared-memory offset of the piece of pass 0 within a stage
  const uint8_t* scales;  // this thread's 16 bytes of the chunk-0 scale tiles, or null
  int scale_tile;         // which of a chunk's two scale tiles they are in
  int scale_dst;          // their shared-memory offset within the scales of a stage

  template <int kPiece>
  static constexpr int rows_per_pass() { return kLoaderThreads / (kChunk / 2 / kPiece); }

  template <int kPiece>
  __device__ __forceinline__ void setup(const GemmProblem& p, int64_t n0, int lid) {
    constexpr int kPerRow = kChunk / 2 / kPiece;
    const int r_first = lid / kPerRow, part = lid % kPerRow;
    codes = p.b.codes + (n0 + r_first) * (p.k / 2) + part * kPiece;
    pass_stride = rows_per_pass<kPiece>() * (p.k / 2);
    rows_ok = 0;
    for (int u = 0; u < kRows / rows_per_pass<kPiece>(); ++u) {
      if (n0 + r_first + u * rows_per_pass<kPiece>() < p.n) rows_ok |= 1u << u;
    }
    first_elem = part * kPiece * 2;
    dst = r_first * (kChunk / 2) + part * kPiece;
    const int64_t k_tiles = scale_k_tiles(p.k / kBlockSize);
    scales = lid < kScaleBytes / 16 ? p.b.scales + (n0 / kTileRows) * k_tiles * kTileBytes + lid * 16 : nullptr;
    scale_tile = lid / (kTileBytes / 16);
    scale_dst = lid * 16;
  }

  template <int kPiece>
  __device__ __forceinline__ void copy(const GemmProblem& p, int64_t c, int64_t k_tiles, uint8_t* stage) const {
    const uint8_t* src = codes + c * (kChunk / 2);
    const bool k_ok = c * kChunk + first_elem < p.k;
#pragma unroll
    for (int u = 0; u < kRows / rows_per_pass<kPiece>(); ++u) {
      const bool ok = k_ok && (rows_ok >> u & 1u);
      cp_async<kPiece>(stage + dst + u * rows_per_pass<kPiece>() * (kChunk / 2),
                       ok ? src + u * pass_stride : p.b.codes, ok);
    }
    if (scales != nullptr) {
      const bool ok = 2 * c + scale_tile < k_tiles;
      cp_async<16>(stage + kCodeBytes + scale_dst, ok ? scales + c * kScaleBytes : p.b.scales, ok);
    }
  }
};

// This thread's A registers of the chunk in `w`: rows r0 and r0 + 8 of the tile, elements
// 32t .. 32t+31; k-step 2q + h takes pairs 2h, 2h + 1 of word q. Scales of blocks past K are
// zeroed (their padding bytes may hold anything; the codes there are zero).
__device__ __forceinline__ void dequant_chunk(const uint8_t* w, int r0, int t, int64_t first_block,
                                              int64_t k_blocks, uint32_t (&frag)[kSteps][4]) {
  const uint4 c0 = *reinterpret_cast<const uint4*>(w + r0 * 64 + t * 16);
  const uint4 c1 = *reinterpret_cast<const uint4*>(w + (r0 + 8) * 64 + t * 16);
  const uint32_t keep = (first_block < k_blocks ? 0x00FFu : 0u) | (first_block + 1 < k_blocks ? 0xFF00u : 0u);
  const uint32_t two0 = *reinterpret_cast<const uint16_t*>(w + kCodeBytes + scale_offset(r0, 2 * t, 2 * kTileKBlocks));
  const uint32_t two1 = *reinterpret_cast<const uint16_t*>(w + kCodeBytes + scale_offset(r0 + 8, 2 * t, 2 * kTileKBlocks));
  uint32_t sc[2][2];
  widen_scales(two0 & keep, sc[0][0], sc[0][1]);
  widen_scales(two1 & keep, sc[1][0], sc[1][1]);
  const uint32_t w0[4] = {c0.x, c0.y, c0.z, c0.w}, w1[4] = {c1.x, c1.y, c1.z, c1.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t a0[4], a1[4];
    dequant_word(w0[q], sc[0][q / 2], a0);
    dequant_word(w1[q], sc[1][q / 2], a1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      frag[2 * q + h][0] = a0[2 * h];
      frag[2 * q + h][1] = a1[2 * h];
      frag[2 * q + h][2] = a0[2 * h + 1];
      frag[2 * q + h][3] = a1[2 * h + 1];
    }
  }
}

template <int MT, bool kVec16>
__global__ void __launch_bounds__(kThreads, 1)
    fused_kernel(const GemmProblem p, const uint8_t* xs, int64_t chunks, int rows_per_x_row) {
  using Cfg = Tile<MT>;
  extern __shared__ __align__(1024) uint8_t smem[];  // swizzle atoms are 1024-byte aligned
  uint8_t* x_ring = smem;
  uint8_t* w_ring = smem + Cfg::kSx * Cfg::kXStageBytes;

  const int split = static_cast<int>(gridDim.z), rank = static_cast<int>(blockIdx.z);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t c_begin = chunks * rank / split;
  const int n_local = static_cast<int>(chunks * (rank + 1) / split - c_begin);
  const uint8_t* x_tiles = xs + static_cast<int64_t>(blockIdx.y) * chunks * Cfg::kXStageBytes;
  const int64_t k_blocks = p.k / kBlockSize, k_tiles = scale_k_tiles(k_blocks);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16 + g;  // warpgroup warp / 4 owns rows 64 (warp / 4) .. + 63
  const bool x_loader = threadIdx.x < kLoaderThreads;
  const int lid = threadIdx.x % kLoaderThreads;

  auto w_stage = [&](int j) { return w_ring + (j % Cfg::kSw) * kWeightStageBytes; };
  auto x_stage = [&](int j) { return x_ring + (j % Cfg::kSx) * Cfg::kXStageBytes; };
  const uint8_t* x_src = x_tiles + lid * 16;  // this thread's 16-byte pieces, kLoaderThreads apart
  auto load_x = [&](int j) {
    const uint8_t* src = x_src + (c_begin + j) * Cfg::kXStageBytes;
    uint8_t* dst = x_stage(j) + lid * 16;
#pragma unroll
    for (int u = 0; u < Cfg::kXStageBytes / 16 / kLoaderThreads; ++u) {
      cp_async<16>(dst + u * kLoaderThreads * 16, src + u * kLoaderThreads * 16, true);
    }
  };
  constexpr int kPiece = kVec16 ? 16 : 8;
  WeightCopier wc;
  wc.setup<kPiece>(p, n0, lid);
  auto load_w = [&](int j) { wc.copy<kPiece>(p, c_begin + j, k_tiles, w_stage(j)); };

  float acc[Cfg::kAcc];
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.f;

  // Every thread commits one group per prologue round and per iteration. A weight loader's
  // group j holds weight chunk j (prologue round j, or iteration j - kLw); an activation
  // loader's holds chunk j in prologue round j < kLx, chunk j + kLx in iteration j. So before
  // iteration j commits, kLw - 1 (weights) or kLx - 1 (activations) younger groups may pend.
#pragma unroll 1
  for (int j = 0; j < Cfg::kLw; ++j) {
    if (!x_loader && j < n_local) load_w(j);
    if (x_loader && j < Cfg::kLx && j < n_local) load_x(j);
    cp_async_commit();
  }

  auto step = [&](int j, uint32_t(&frag)[kSteps][4]) {
    if (x_loader) {
      cp_async_wait<Cfg::kLx - 1>();
      fence_proxy_async();  // this thread's copies, visible to the wgmma (async proxy)
    } else {
      cp_async_wait<Cfg::kLw - 1>();
    }
    __syncthreads();  // everyone's copies landed; chunk j - 2's wgmmas retired everywhere
    if (!x_loader && j + Cfg::kLw < n_local) load_w(j + Cfg::kLw);
    if (x_loader && j + Cfg::kLx < n_local) load_x(j + Cfg::kLx);
    cp_async_commit();
    dequant_chunk(w_stage(j), r0, t, (c_begin + j) * (kChunk / kBlockSize) + 2 * t, k_blocks, frag);
    const uint32_t x_addr = smem_addr(x_stage(j));
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      WgmmaRS<MT>::run(acc, frag[s], smem_descriptor_swizzle128(x_addr + staged_k_step_offset<MT>(s), 1024));
    }
    wgmma_commit();
    wgmma_wait<1>();  // chunk j - 1 retired: its registers are free for chunk j + 1
  };

  // Two register buffers, alternating (static indices: ptxas sees no in-flight operand written).
  uint32_t frag[2][kSteps][4];
  fence_accumulators(acc);
  int j = 0;
#pragma unroll 1
  for (; j + 2 <= n_local; j += 2) {
    step(j, frag[0]);
    step(j + 1, frag[1]);
  }
  if (j < n_local) step(j, frag[0]);
  wgmma_wait<0>();
  fence_accumulators(acc);

  float alpha = *p.b.s_dec * (1.0f / kDequantFactor);
  if (p.a_is_nvfp4) alpha *= *p.a_q.s_dec * (1.0f / kDequantFactor);
  // Accumulators 2i and 2i + 1: weight row n, staged rows col and col + 1, which are two rows
  // of x, or the hi and lo halves of one.
  const int64_t staged0 = static_cast<int64_t>(blockIdx.y) * MT;
  auto store_pair = [&](int i, float v0, float v1) {
    const int64_t n = n0 + r0 + 8 * (i % 2);
    const int64_t col = staged0 + 8 * (i / 2) + 2 * t;
    if (n >= p.n) return;
    const float b = p.bias ? load_as_float(p.bias, p.bias_dtype, n) : 0.f;
    if (rows_per_x_row == 2) {
      const int64_t m = col / 2;
      if (m < p.m) store_as(p.out, p.out_dtype, m * p.n + n, (v0 + v1) * alpha + b);
    } else {
      if (col < p.m) store_as(p.out, p.out_dtype, col * p.n + n, v0 * alpha + b);
      if (col + 1 < p.m) store_as(p.out, p.out_dtype, (col + 1) * p.n + n, v1 * alpha + b);
    }
  };

  if (split == 1) {
#pragma unroll
    for (int i = 0; i < Cfg::kAcc / 2; ++i) store_pair(i, acc[2 * i], acc[2 * i + 1]);
    return;
  }
  // Split-K: partials through the (now idle) activation ring; rank r finishes the pairs
  // i = r, r + split, ..., summing over ranks in rank order (deterministic).
  cp_async_wait<0>();
  __syncthreads();
  float* partial = reinterpret_cast<float*>(x_ring);
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; ++i) partial[i * kThreads + threadIdx.x] = acc[i];
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  for (int i = rank; i < Cfg::kAcc / 2; i += split) {
    float v0 = 0.f, v1 = 0.f;
    for (int r = 0; r < split; ++r) {
      const float* remote = cluster.map_shared_rank(partial, r);
      v0 += remote[2 * i * kThreads + threadIdx.x];
      v1 += remote[(2 * i + 1) * kThreads + threadIdx.x];
    }
    store_pair(i, v0, v1);
  }
  cluster.sync();  // keep this CTA's partials alive until every rank has read them
}

// --- Host side ------------------------------------------------------------------------------

struct Plan {
  int mt = 64;            // staged rows per tile
  int rows_per_x_row = 1;
  int64_t staged_rows = 0, m_tiles = 0, chunks = 0, n_tiles = 0;
  size_t staged_bytes = 0;
};

Plan make_plan(const GemmProblem& p) {
  Plan pl;
  pl.rows_per_x_row = !p.a_is_nvfp4 && (p.a_dtype == DType::kF16 || p.a_dtype == DType::kF32) ? 2 : 1;
  const int64_t rows = p.m * pl.rows_per_x_row;
  pl.mt = rows <= 64 ? 64 : 128;
  pl.m_tiles = ceil_div(rows, pl.mt);
  pl.staged_rows = pl.m_tiles * pl.mt;
  pl.chunks = ceil_div(p.k, kChunk);
  pl.n_tiles = ceil_div(p.n, kRows);
  pl.staged_bytes = static_cast<size_t>(pl.staged_rows * pl.chunks * kChunk) * 2;
  return pl;
}

template <XKind XK, int MT>
cudaError_t stage(const GemmProblem& p, const Plan& pl, cudaStream_t stream) {
  const int64_t threads = pl.staged_rows * pl.chunks * 16;
  const int64_t blocks = std::min<int64_t>(ceil_div(threads, 256), 8LL * sm_count());
  stage_activations<XK, MT><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      p, pl.staged_rows, pl.chunks, static_cast<uint32_t*>(p.workspace));
  return cudaGetLastError();
}

template <int MT>
cudaError_t stage_x(const GemmProblem& p, const Plan& pl, cudaStream_t stream) {
  if (p.a_is_nvfp4) return stage<XKind::kNvfp4, MT>(p, pl, stream);
  switch (p.a_dtype) {
    case DType::kBF16: return stage<XKind::kBF16, MT>(p, pl, stream);
    case DType::kF16: return stage<XKind::kF16, MT>(p, pl, stream);
    default: return stage<XKind::kF32, MT>(p, pl, stream);
  }
}

template <int MT, bool kVec16>
cudaError_t launch_gemm(const GemmProblem& p, const Plan& pl, cudaStream_t stream) {
  const ResidentBlocks capacity = resident_blocks<fused_kernel<MT, kVec16>>(dim3(kThreads), Tile<MT>::kSmemBytes);
  if (capacity[1] == 0) return cudaErrorInvalidConfiguration;  // the kernel cannot run here
  const int split = one_wave_split(pl.n_tiles * pl.m_tiles, pl.chunks, kMinChunksPerSplit, capacity);
  const ClusterLaunch launch(
      dim3(static_cast<unsigned>(pl.n_tiles), static_cast<unsigned>(pl.m_tiles), static_cast<unsigned>(split)),
      dim3(kThreads), Tile<MT>::kSmemBytes, split, stream);
  return cudaLaunchKernelEx(&launch.cfg, fused_kernel<MT, kVec16>, p, static_cast<const uint8_t*>(p.workspace),
                            pl.chunks, pl.rows_per_x_row);
}

// Rows of K/2 bytes are 16-byte aligned when K % 32 == 0; otherwise the weights come in 8-byte
// pieces.
template <int MT>
cudaError_t run(const GemmProblem& p, const Plan& pl, cudaStream_t stream) {
  if (cudaError_t err = stage_x<MT>(p, pl, stream); err != cudaSuccess) return err;
  return p.k % 32 == 0 ? launch_gemm<MT, true>(p, pl, stream) : launch_gemm<MT, false>(p, pl, stream);
}

}  // namespace

size_t fused_workspace_bytes(const GemmProblem& p) { return make_plan(p).staged_bytes; }

int64_t fused_output_tiles(const GemmProblem& p) {
  const Plan pl = make_plan(p);
  return pl.n_tiles * pl.m_tiles;
}

cudaError_t fused_gemm(const GemmProblem& p, cudaStream_t stream) {
  const Plan pl = make_plan(p);
  if (pl.m_tiles > 65535 || pl.n_tiles > INT32_MAX || p.workspace_bytes < pl.staged_bytes) {
    return cudaErrorInvalidValue;
  }
  return pl.mt == 64 ? run<64>(p, pl, stream) : run<128>(p, pl, stream);
}

}  // namespace sm90
}  // namespace jax_nvfp4
