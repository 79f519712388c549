// The staging kernel of the fused sm_90a GEMM kernels: writes x once per call into the workspace
// as bf16 tiles in the K order the weight dequantization produces and in wgmma's 128-byte-swizzle
// K-major layout (fused_staging.h), so that a stage of either kernel is one contiguous copy.
// Every activation kind becomes bf16: NVFP4 is dequantized exactly, f16 and f32 become a bf16
// hi row and lo row side by side (the kernels add the two results in their epilogue). A ragged
// GEMM's groups are staged each from a tile boundary (tile y holds the rows of group_tile_rows's
// tile y), so that no tile holds two groups' rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "common/launch_config.cuh"
#include "common/scale_layout.h"
#include "gemm/sm90/fused_staging.h"
#include "gemm/sm90/fused_weights.cuh"
#include "gemm/sm90/gemm_device_utils.cuh"
#include "gemm/sm90/gemm_sm90_internal.h"
#include "gemm/sm90/ragged_groups.cuh"

namespace jax_nvfp4 {
namespace sm90 {
namespace {

using fused::kChunk;

// Rows of staged activations per row of x: two (bf16 hi, lo) for f16 and f32.
template <XKind XK>
constexpr int staged_rows_per_row() {
  return x_split<XK>() ? 2 : 1;
}

constexpr int kSegmentsPerChunk = kChunk / 32;  // a thread stages one 32-element segment of a chunk row
static_assert(kSegmentsPerChunk == 4, "transpose_4x4 exchanges the four segments of a chunk row");

// Words 0-3 (elements e0 + 8q .. e0 + 8q + 7) of NVFP4 row m as their bf16x2 pairs (elements
// 8q + j and 8q + j + 4 in pair[q][j]), dequantized exactly; zero past M or K.
__device__ __forceinline__ void nvfp4_segment_pairs(const GemmProblem& p, int64_t m, int64_t e0,
                                                    uint32_t (&pair)[4][4]) {
  uint32_t words[4] = {0u, 0u, 0u, 0u}, scales = 0u;
  if (m < p.m && e0 < p.k) {  // k is a multiple of 16: block 0 is whole, block 1 whole or past K
    const uint8_t* codes = p.a_q.codes + (m * p.k + e0) / 2;
    const int64_t block = e0 / kBlockSize, k_blocks = p.k / kBlockSize;
    scales = p.a_q.scales[scale_offset(m, block, k_blocks)];
    if (e0 + kBlockSize < p.k) {
      scales |= static_cast<uint32_t>(p.a_q.scales[scale_offset(m, block + 1, k_blocks)]) << 8;
      if (p.k % 32 == 0) {  // rows of K/2 bytes, 16-byte aligned
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(codes));
        words[0] = u.x; words[1] = u.y; words[2] = u.z; words[3] = u.w;
      } else {
        const uint2 lo = __ldg(reinterpret_cast<const uint2*>(codes));
        const uint2 hi = __ldg(reinterpret_cast<const uint2*>(codes) + 1);
        words[0] = lo.x; words[1] = lo.y; words[2] = hi.x; words[3] = hi.y;
      }
    } else {
      const uint2 lo = __ldg(reinterpret_cast<const uint2*>(codes));
      words[0] = lo.x; words[1] = lo.y;
    }
  }
  uint32_t s0, s1;
  widen_scales(scales, s0, s1);
#pragma unroll
  for (int q = 0; q < 4; ++q) dequant_word(words[q], q < 2 ? s0 : s1, pair[q]);
}

// Four adjacent lanes t = 0..3 hold a[j] = A[t][j]; afterwards lane t holds a[r] = A[r][t]. Two
// exchanges: with lane t ^ 1, then with lane t ^ 2.
__device__ __forceinline__ void transpose_4x4(uint32_t (&a)[4], int t) {
  const bool odd = t & 1, high = t & 2;
#pragma unroll
  for (int c = 0; c < 4; c += 2) {
    const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? a[c] : a[c + 1], 1);
    if (odd) a[c] = got; else a[c + 1] = got;
  }
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const uint32_t got = __shfl_xor_sync(0xffffffffu, high ? a[c] : a[c + 2], 2);
    if (high) a[c] = got; else a[c + 2] = got;
  }
}

// Pair j (elements j, j + 4) of 8 consecutive activations e0 .. e0+7 of effective row r, as
// bf16x2 (zero past M or K). Not NVFP4 (nvfp4_segment_pairs).
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

// Words 0-3 of effective row r's 32-element segment e0 .. e0 + 31 as activation_pairs gives them.
// Their 16-byte loads (four; eight for f32) are issued before any is used: a thread's loads are
// all its bytes in flight, and one a thread left the pass well short of HBM bandwidth where x
// outgrows the L2.
template <XKind XK>
__device__ __forceinline__ void activation_segment_pairs(const GemmProblem& p, int64_t r, int64_t e0,
                                                         uint32_t (&pair)[4][4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) activation_pairs<XK>(p, r, e0 + 8 * q, pair[q]);
}

// One thread per (staged row, chunk, t): the 32-element segment t of the chunk row, words q = 0-3.
// Pair j of word q is word t of the row's 16-byte k-group 4q + j: the four lanes of segments
// t = 0..3 exchange their pairs (transpose_4x4), and each stores a k-group whole, the four
// together 64 contiguous bytes.
// Whole warps step together: a ragged GEMM's warp finds the rows of its (at most two) tiles
// with warp-wide scans, and the lanes past the end run along (the exchanges need every lane).
template <XKind XK, int MT>
__global__ void stage_kernel(const GemmProblem p, int64_t staged_rows, int64_t chunks, uint32_t* xs) {
  constexpr int kTileWords = MT * kChunk / 2;
  constexpr int kRowsPerRow = staged_rows_per_row<XK>();
  const int64_t total = staged_rows * chunks * kSegmentsPerChunk;
  const int lane = threadIdx.x % 32;
  wait_for_prior_grids();  // programmatic dependent launch: the grid before may be writing x
  for (int64_t warp0 = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x - lane; warp0 < total;
       warp0 += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t id = min(warp0 + lane, total - 1);
    const int t = static_cast<int>(id % kSegmentsPerChunk);  // consecutive threads, consecutive segments
    const int64_t c = (id / kSegmentsPerChunk) % chunks, r = id / kSegmentsPerChunk / chunks;
    GemmProblem src = p;
    int64_t src_row = r;  // in staged rows (kRowsPerRow a row of x)
    if (p.ragged()) {
      const int64_t y = r / MT, first = __shfl_sync(0xffffffffu, y, 0), last = __shfl_sync(0xffffffffu, y, 31);
      const TileRows a = group_tile_rows(p, first, MT / kRowsPerRow);
      const TileRows b = last != first ? group_tile_rows(p, last, MT / kRowsPerRow) : a;  // warp-uniform
      const TileRows rows = y == first ? a : b;
      if (rows.end <= rows.begin) continue;  // past the groups' tiles: the GEMM reads none of it
      src.m = rows.end;
      src_row = rows.begin * kRowsPerRow + r % MT;
    }
    const int64_t e0 = c * kChunk + 32 * t;
    uint32_t pair[4][4];
    if constexpr (XK == XKind::kNvfp4) {
      nvfp4_segment_pairs(src, src_row, e0, pair);
    } else {
      activation_segment_pairs<XK>(src, src_row, e0, pair);
    }
    uint32_t* tile = xs + ((r / MT) * chunks + c) * kTileWords;
    const int row = static_cast<int>(r % MT);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      transpose_4x4(pair[q], t);
      // A group of 4 lanes lies wholly before or past the end: total is a multiple of 4.
      if (warp0 + lane < total) {
        *reinterpret_cast<uint4*>(tile + staged_word<MT>(staged_k_group(8 * q + t), row, 0)) =
            make_uint4(pair[q][0], pair[q][1], pair[q][2], pair[q][3]);
      }
    }
  }
}

template <XKind XK, int MT>
cudaError_t launch(const GemmProblem& p, const StagedActivations& s, cudaStream_t stream) {
  const int64_t staged_rows = s.m_tiles * MT;
  const int64_t threads = staged_rows * s.chunks * kSegmentsPerChunk;
  const int64_t blocks = std::min<int64_t>(ceil_div(threads, 256), 8LL * sm_count());
  const LaunchConfig config(dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, /*cluster_z=*/0, /*pdl=*/true);
  return cudaLaunchKernelEx(&config.cfg, stage_kernel<XK, MT>, p, staged_rows, s.chunks,
                            static_cast<uint32_t*>(p.workspace));
}

template <int MT>
cudaError_t launch(const GemmProblem& p, const StagedActivations& s, cudaStream_t stream) {
  if (p.a_is_nvfp4) return launch<XKind::kNvfp4, MT>(p, s, stream);
  switch (p.a_dtype) {
    case DType::kBF16: return launch<XKind::kBF16, MT>(p, s, stream);
    case DType::kF16: return launch<XKind::kF16, MT>(p, s, stream);
    default: return launch<XKind::kF32, MT>(p, s, stream);
  }
}

}  // namespace

StagedActivations staged_activations(const GemmProblem& p, int mt) {
  StagedActivations s;
  s.mt = mt;
  s.rows_per_x_row = !p.a_is_nvfp4 && (p.a_dtype == DType::kF16 || p.a_dtype == DType::kF32) ? 2 : 1;
  s.m_tiles = ceil_div(p.m * s.rows_per_x_row, static_cast<int64_t>(mt));
  // Ragged: each group's rows from a tile boundary, so up to one more tile for each group with rows.
  if (p.ragged()) s.m_tiles += std::min(p.stack.count, p.m);
  s.chunks = ceil_div(p.k, static_cast<int64_t>(kChunk));
  s.bytes = static_cast<size_t>(s.m_tiles * mt * s.chunks * kChunk) * 2;
  return s;
}

cudaError_t stage_activations(const GemmProblem& p, const StagedActivations& s, cudaStream_t stream) {
  if (p.workspace_bytes < s.bytes) return cudaErrorInvalidValue;
  switch (s.mt) {
    case 64: return launch<64>(p, s, stream);
    case 128: return launch<128>(p, s, stream);
    default: return launch<256>(p, s, stream);
  }
}

}  // namespace sm90
}  // namespace jax_nvfp4
