// Small-M NVFP4 GEMM for sm_90a: weight streaming with tensor-core mma.sync (see gemm_sm90.h).
//
// Work split: a warp owns 16 weight rows (the MMA's M) and 8*T activation rows (the MMA's N, T
// n8-tiles) over one part of K. A chunk is 128 K elements: each lane (g = lane/4, t = lane%4)
// loads 16 bytes of codes (32 elements, two scale blocks) of weight rows g and g+8.
//
// The MMA contracts over its 16 k slots in any order as long as A and B agree, so a lane feeds
// its own 32 elements in the order the cheap dequantization produces them (pair j of a word =
// elements j and j+4, nvfp4_bf16x2.h) and permutes its activations to match.
//
// Which 32 elements a lane owns: its 16 loaded code bytes (elements 32t .. 32t+31), or, with
// more than 8 bf16/f16 activation rows, the interleaved set: one 16-element block in each half
// of the chunk (interleaved_element). Then the 4 lanes of a quad load their 16-byte pieces of an
// activation row from one 128-byte line per instruction, where the contiguous order touches two;
// at 16 rows those line accesses made the L1 the bottleneck (Nsight Compute, H200). The weight
// codes are still loaded 16 bytes per lane, and lanes t and t^2 swap half their words
// (half_exchange).
//
// Split-K, deterministic and without workspace: the parts of a tile leave their partial sums in
// shared memory and rank r adds every part in rank order for its share of the fragment slots,
// then applies alpha, bias, the activation and the output cast. A gated activation pairs weight
// rows 2j, 2j+1 as MMA rows g, g+8 (weight_row), so one thread finishes both.
// Two kernel shapes (kWarpSplit):
// - warp split: a block is one 16-row tile, its warps are the K parts (no cluster);
// - cluster split: a block of 4 warps owns 64 rows and walks one K part; its warps read the same
//   activation chunk at once, from L1. The gridDim.z blocks of the K parts form a thread-block
//   cluster and add through distributed shared memory.
// M <= 8 (T == 1) always takes the warp split: the cluster version took 3-20% longer on an H200
// on 11 of the 12 Llama shape x M rows measured, and the same on the twelfth
// (bench/results/decode_kernel_h200_2026-11-22.md). Past 8 rows the launcher takes the warp split
// where its one-wave split reaches 2 K parts, else the cluster split (see launch).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/launch_config.cuh"
#include "common/nvfp4_decode.cuh"
#include "common/scale_layout.h"
#include "gemm/sm90/cluster_split.cuh"
#include "gemm/sm90/gemm_device_utils.cuh"
#include "gemm/sm90/gemm_sm90_internal.h"
#include "gemm/sm90/nvfp4_bf16x2.h"
#include "gemm/sm90/ragged_groups.cuh"

namespace jax_nvfp4 {
namespace sm90 {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerBlock = kWarps * 16;
constexpr int kMaxSplit = kMaxClusterSplit;  // K parts of a tile, over warps or cluster blocks
constexpr int kChunk = 128;  // K elements per step: 4 lanes x 32
// K chunks of weights in flight per lane (registers). Measured on an H200 (bench/
// decode_kernel_bench.sh): 4 was slower than 2 on most shapes, its registers cost occupancy.
constexpr int kDepth = 2;
static_assert(kDepth % 2 == 0, "the activation double buffer alternates with the chunk parity");

// How a lane loads its 16 code bytes of a row: one 16-byte load (K % 32 == 0: rows are 16-byte
// aligned) or two 8-byte loads, fixed per kernel. Decided by a runtime flag, ptxas issued both
// forms of every load, predicated, and the kernel took 3-11% longer at M <= 8 (H100,
// bench/results/decode_code_loads_h100_2026-11-28.md). Float32 activations keep the flag
// (kByK): with the 16-byte form fixed their M <= 8 kernel spills.
enum class CodeLoads { k16, k8, kByK };

// What the grid's y dimension runs over: the activation tiles of one GEMM, of each element of a
// stack, or the work items of a ragged GEMM (ragged_item).
enum class Grid { kOne, kStack, kRagged };

// Words of raw activation data one lane holds per chunk and n8-tile.
template <XKind XK>
constexpr int x_words() {
  return XK == XKind::kF32 ? 32 : XK == XKind::kNvfp4 ? 4 : 16;
}

struct WeightRaw {
  uint32_t codes[2][4];  // rows g and g+8: 32 elements each
  // Per row, the E4M3 scales of its two blocks (low 16 bits), or with the interleaved order
  // (two blocks a tile apart, two byte loads) the first block's here and the second's in
  // scales_next. row_scales joins those where they are used: joined right after the loads, the
  // warp stalled there until they returned (M = 16: 4-10% of the kernel's time, H100).
  uint32_t scales[2];
  uint32_t scales_next[2];
};

// Row r's two block scales (low 16 bits) of `w` in the order IL.
template <bool IL>
__device__ __forceinline__ uint32_t row_scales(const WeightRaw& w, int r) {
  return IL ? w.scales[r] | w.scales_next[r] << 8 : w.scales[r];
}

template <XKind XK>
struct ActRaw {
  uint32_t w[x_words<XK>()];
  uint32_t scales;  // NVFP4 x only
};

// Weight streams bypass L1 (no other warp reads them). A quad reads 64 bytes of a row per chunk
// and its next chunk the other half of the same 128-byte line, so the L2 fills whole lines
// (.L2::128B): with the scale loads also kept out of L1, 0-5% less time at M = 1, 4% less to 1%
// more at M = 16 (kernel level, H100, bench/results/decode_l2_hints_h100_2026-11-27.md);
// 256-byte fills were 10-15% slower at M = 1.
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v2.u32 {%0,%1}, [%2];"
               : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_stream_u16(const void* p) {
  unsigned short v;
  asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// 32 NVFP4 elements (16 bytes) starting at element e0 of a row of k; zero past k.
__device__ __forceinline__ void load_codes(const uint8_t* row, int64_t e0, int64_t k, bool vec16,
                                           uint32_t (&out)[4]) {
  out[0] = out[1] = out[2] = out[3] = 0u;
  if (e0 >= k) return;
  const uint8_t* p = row + e0 / 2;
  if (vec16 && e0 + 32 <= k) {
    const uint4 v = ld_stream16(p);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    return;
  }
  const uint2 lo = ld_stream8(p);  // k is a multiple of 16: the first half is in range
  out[0] = lo.x; out[1] = lo.y;
  if (e0 + 32 <= k) {
    const uint2 hi = ld_stream8(p + 8);
    out[2] = hi.x; out[3] = hi.y;
  }
}

// The two E4M3 scales of blocks e0/16 and e0/16+1 of `row` (adjacent bytes of one tile).
__device__ __forceinline__ uint32_t load_scales(const uint8_t* scales, int64_t row, int64_t e0,
                                                int64_t k) {
  const int64_t off = scale_offset(row, e0 / kBlockSize, k / kBlockSize);
  return *reinterpret_cast<const uint16_t*>(scales + off);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Whether a tile of 8 * T activation rows takes the interleaved order (see the top): bf16/f16
// activations (16-byte pieces of 8 elements) and more than 8 rows. Measured on an H200
// (bench/decode_kernel_bench.sh): at M = 16 it took 14-25% off, at M = 1 (where a quad's loads
// of the one row are broadcast) it added 5-13%, at M = 8 it was mixed.
template <int T, XKind XK>
constexpr bool interleaved() {
  return T >= 2 && (XK == XKind::kBF16 || XK == XKind::kF16);
}

// Interleaved order: the 16-element block of the chunk's first half that lane t owns (it also
// owns the block 4 further, in the second half), and the first element of its word i (8
// elements). In load i, the quad's lanes read elements 64 (i/2) + 16 b + 8 (i%2) for the four
// b: one 128-byte line of bf16/f16.
__device__ __forceinline__ int interleaved_block(int t) { return 2 * (t & 1) + (t >> 1); }
__device__ __forceinline__ int interleaved_element(int t, int i) {
  return 16 * interleaved_block(t) + 64 * (i >> 1) + 8 * (i & 1);
}

// The loaded code words (elements 32t + 8i) -> the interleaved words: lanes t < 2 keep words 0
// and 1 and take lane t+2's 0 and 1 as their 2 and 3; lanes t >= 2 keep 2 and 3 and take lane
// t-2's 2 and 3 as their 0 and 1.
__device__ __forceinline__ void half_exchange(uint32_t (&w)[4], int t) {
  const bool high = t & 2;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t got = __shfl_xor_sync(0xffffffffu, high ? w[i] : w[i + 2], 2);
    if (high) w[i] = got; else w[i + 2] = got;
  }
}

// Activation row `m` (or zeros), the chunk from element c0, lane t's 32 elements (contiguous, or
// IL: interleaved).
template <XKind XK, bool IL>
__device__ __forceinline__ void load_act(const GemmProblem& p, int64_t m, int64_t c0, int t, bool vec16,
                                         ActRaw<XK>& x) {
#pragma unroll
  for (int i = 0; i < x_words<XK>(); ++i) x.w[i] = 0u;
  x.scales = 0u;
  const int64_t e0 = c0 + 32 * t;
  if (m >= p.m) return;
  if constexpr (IL) {
    const uint8_t* row = static_cast<const uint8_t*>(p.a) + (m * p.k + c0) * 2;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = interleaved_element(t, i);
      if (c0 + e < p.k) {  // K is a multiple of 16: a word is all in or all out
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(row + 2 * e));
        x.w[4 * i] = u.x; x.w[4 * i + 1] = u.y; x.w[4 * i + 2] = u.z; x.w[4 * i + 3] = u.w;
      }
    }
  } else if (e0 >= p.k) {
    return;
  } else if constexpr (XK == XKind::kNvfp4) {
    uint32_t c[4];
    load_codes(p.a_q.codes + m * (p.k / 2), e0, p.k, vec16, c);
#pragma unroll
    for (int i = 0; i < 4; ++i) x.w[i] = c[i];
    x.scales = load_scales(p.a_q.scales, m, e0, p.k);
  } else {
    constexpr int kElemBytes = XK == XKind::kF32 ? 4 : 2;
    const uint8_t* row = static_cast<const uint8_t*>(p.a) + (m * p.k + e0) * kElemBytes;
    constexpr int kVecs = x_words<XK>() / 4;  // 16-byte vectors for 32 elements
    const int valid = e0 + 32 <= p.k ? kVecs : kVecs / 2;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      if (v < valid) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(row) + v);
        x.w[4 * v] = u.x; x.w[4 * v + 1] = u.y; x.w[4 * v + 2] = u.z; x.w[4 * v + 3] = u.w;
      }
    }
  }
}

// B registers of word q (the lane's elements 8q..8q+7) in pair order: b[j] holds
// elements j and j+4; `lo` gets the bf16 remainder when x is split.
template <XKind XK>
__device__ __forceinline__ void act_pairs(const ActRaw<XK>& x, int q, uint32_t (&b)[4],
                                          uint32_t (&lo)[4]) {
  if constexpr (XK == XKind::kBF16) {
    const uint32_t r0 = x.w[4 * q], r1 = x.w[4 * q + 1], r2 = x.w[4 * q + 2], r3 = x.w[4 * q + 3];
    b[0] = __byte_perm(r0, r2, 0x5410);
    b[1] = __byte_perm(r0, r2, 0x7632);
    b[2] = __byte_perm(r1, r3, 0x5410);
    b[3] = __byte_perm(r1, r3, 0x7632);
  } else if constexpr (XK == XKind::kNvfp4) {
    uint32_t s0, s1;
    widen_scales(x.scales, s0, s1);
    dequant_word(x.w[q], q < 2 ? s0 : s1, b);
  } else {
    float f[8];
    if constexpr (XK == XKind::kF16) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t h2 = x.w[4 * q + i];
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h2));
        f[2 * i] = v.x; f[2 * i + 1] = v.y;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = __uint_as_float(x.w[8 * q + i]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      b[j] = pack_bf16x2(f[j], f[j + 4]);
      const __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&b[j]);
      const float2 hf = __bfloat1622float2(h);
      lo[j] = pack_bf16x2(f[j] - hf.x, f[j + 4] - hf.y);
    }
  }
}

// The weight row of MMA row g (r = 0) or g + 8 (r = 1) of the 16-row tile at n0. With a gated
// activation the interleaved pair 2g, 2g + 1 (gate, up): the epilogue then holds both values of
// output column n0 / 2 + g in one thread. The tile reads the same 16 rows either way.
__device__ __forceinline__ int64_t weight_row(int64_t n0, int g, int r, bool gated) {
  return gated ? n0 + 2 * g + r : n0 + g + 8 * r;
}

template <int T, XKind XK>
struct Chunk {
  WeightRaw w;
  ActRaw<XK> x[T];
};

// The chunk from element c0 (checked: it may end past K) of the tile at n0, lane (g, t).
template <int T, XKind XK, bool IL>
__device__ __forceinline__ void load_chunk(const GemmProblem& p, int64_t n0, int g, int64_t m_row,
                                           int64_t c0, int t, bool vec16, Chunk<T, XK>& c) {
  const int64_t e0 = c0 + 32 * t, kb = p.k / kBlockSize;  // the lane's 16 code bytes
  const bool gated = is_gated(p.activation);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t n = weight_row(n0, g, r, gated);
    const bool ok = n < p.n;
    uint32_t codes[4];
    load_codes(p.b.codes + n * (p.k / 2), ok ? e0 : p.k, p.k, vec16, codes);
#pragma unroll
    for (int i = 0; i < 4; ++i) c.w.codes[r][i] = codes[i];
    if constexpr (IL) {  // blocks past K: zero codes, and 0 * a NaN scale would not be 0
      const int64_t b0 = c0 / kBlockSize + interleaved_block(t), b1 = b0 + kTileKBlocks;
      const uint8_t* first = p.b.scales + scale_offset(n, b0, kb);
      c.w.scales[r] = ok && b0 < kb ? first[0] : 0u;
      c.w.scales_next[r] = ok && b1 < kb ? first[kTileBytes] : 0u;
    } else {
      c.w.scales[r] = ok && e0 < p.k ? load_scales(p.b.scales, n, e0, p.k) : 0u;
    }
  }
#pragma unroll
  for (int tt = 0; tt < T; ++tt) load_act<XK, IL>(p, m_row + 8 * tt, c0, t, vec16, c.x[tt]);
}

// Per-lane pointers into the current full chunk (all 128 elements in range), advanced one
// chunk at a time: the steady-state loop does no index math and no range checks. Rows past N
// or M are clamped to the last row: they load valid memory and their results are not stored.
template <int T, XKind XK, bool IL>
struct Cursor {
  const uint8_t* codes[2];   // weight rows of MMA rows g, g+8 at the lane's first code byte
  const uint8_t* scales[2];  // their two block scales (IL: the first of them; the other is a tile on)
  const uint8_t* x[T];       // activation rows (float bytes or NVFP4 codes)
  const uint8_t* x_scales[T];

  static constexpr int kScaleStep = static_cast<int>(row_scale_step(kChunk));
  static constexpr int kXStep = XK == XKind::kNvfp4 ? kChunk / 2 : kChunk * (XK == XKind::kF32 ? 4 : 2);

  // n0: the weight tile's first row; c0: the chunk's first element; (g, t): the lane.
  __device__ __forceinline__ Cursor(const GemmProblem& p, int64_t n0, int g, int64_t m_row, int64_t c0,
                                    int t) {
    const int64_t kb = p.k / kBlockSize, e0 = c0 + 32 * t;
    const bool gated = is_gated(p.activation);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t n = min(weight_row(n0, g, r, gated), p.n - 1);
      codes[r] = p.b.codes + n * (p.k / 2) + e0 / 2;
      const int64_t block = IL ? c0 / kBlockSize + interleaved_block(t) : e0 / kBlockSize;
      scales[r] = p.b.scales + scale_offset(n, block, kb);
    }
#pragma unroll
    for (int tt = 0; tt < T; ++tt) {
      const int64_t m = min(m_row + 8 * tt, p.m - 1);
      if constexpr (IL) {
        x[tt] = static_cast<const uint8_t*>(p.a) + (m * p.k + c0 + interleaved_element(t, 0)) * 2;
        x_scales[tt] = nullptr;
      } else if constexpr (XK == XKind::kNvfp4) {
        x[tt] = p.a_q.codes + m * (p.k / 2) + e0 / 2;
        x_scales[tt] = p.a_q.scales + scale_offset(m, e0 / kBlockSize, kb);
      } else {
        x[tt] = static_cast<const uint8_t*>(p.a) + (m * p.k + e0) * (XK == XKind::kF32 ? 4 : 2);
        x_scales[tt] = nullptr;
      }
    }
  }

  __device__ __forceinline__ static void codes16(const uint8_t* ptr, bool vec16, uint32_t (&out)[4]) {
    if (vec16) {
      const uint4 v = ld_stream16(ptr);
      out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    } else {  // rows of K/2 bytes are only 8-byte aligned when K % 32 != 0
      const uint2 lo = ld_stream8(ptr), hi = ld_stream8(ptr + 8);
      out[0] = lo.x; out[1] = lo.y; out[2] = hi.x; out[3] = hi.y;
    }
  }

  // Loads the weights of the chunk under the weight cursor and moves it on to the next chunk.
  __device__ __forceinline__ void load_weights(bool vec16, WeightRaw& w) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      codes16(codes[r], vec16, w.codes[r]);
      if constexpr (IL) {
        w.scales[r] = scales[r][0];
        w.scales_next[r] = scales[r][kTileBytes];
      } else {
        w.scales[r] = ld_stream_u16(scales[r]);
      }
      codes[r] += kChunk / 2;
      scales[r] += kScaleStep;
    }
  }

  // Likewise for the activations (their own cursor: they run one chunk ahead of use, the
  // weights kDepth chunks ahead).
  __device__ __forceinline__ void load_acts(bool vec16, ActRaw<XK> (&xs)[T]) {
#pragma unroll
    for (int tt = 0; tt < T; ++tt) {
      if constexpr (XK == XKind::kNvfp4) {
        uint32_t w[4];
        codes16(x[tt], vec16, w);
#pragma unroll
        for (int i = 0; i < 4; ++i) xs[tt].w[i] = w[i];
        xs[tt].scales = *reinterpret_cast<const uint16_t*>(x_scales[tt]);
        x_scales[tt] += kScaleStep;
      } else {
#pragma unroll
        for (int v = 0; v < x_words<XK>() / 4; ++v) {  // IL: word v, as far from word 0 in every lane
          const int offset = IL ? 2 * interleaved_element(0, v) : 16 * v;
          const uint4 u = __ldg(reinterpret_cast<const uint4*>(x[tt] + offset));
          xs[tt].w[4 * v] = u.x; xs[tt].w[4 * v + 1] = u.y;
          xs[tt].w[4 * v + 2] = u.z; xs[tt].w[4 * v + 3] = u.w;
        }
      }
      x[tt] += kXStep;
    }
  }
};

// t: the lane in its quad (used when IL).
template <int T, XKind XK, bool IL>
__device__ __forceinline__ void compute_chunk(const WeightRaw& w, const ActRaw<XK> (&x)[T], int t,
                                              float (&acc)[T][4]) {
  uint32_t codes[2][4], sc[2][4];  // per row (g, g+8): the lane's words, each word's scale
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int q = 0; q < 4; ++q) codes[r][q] = w.codes[r][q];
    if constexpr (IL) half_exchange(codes[r], t);
    // both orders: words 0, 1 in the first block, 2, 3 in the second
    widen_scales(row_scales<IL>(w, r), sc[r][0], sc[r][2]);
    sc[r][1] = sc[r][0];
    sc[r][3] = sc[r][2];
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t a0[4], a1[4];  // rows g and g+8
    dequant_word(codes[0][q], sc[0][q], a0);
    dequant_word(codes[1][q], sc[1][q], a1);
#pragma unroll
    for (int tt = 0; tt < T; ++tt) {
      uint32_t b[4], lo[4];
      act_pairs<XK>(x[tt], q, b, lo);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mma_bf16(acc[tt], a0[2 * h], a1[2 * h], a0[2 * h + 1], a1[2 * h + 1], b[2 * h], b[2 * h + 1]);
        if constexpr (x_split<XK>()) {
          mma_bf16(acc[tt], a0[2 * h], a1[2 * h], a0[2 * h + 1], a1[2 * h + 1], lo[2 * h],
                   lo[2 * h + 1]);
        }
      }
    }
  }
}

// Threads of a block: the K parts' warps of one tile (warp split), or 4 warps (cluster split).
template <bool kWarpSplit>
constexpr int max_threads() {
  return kWarpSplit ? kMaxSplit * 32 : kThreads;
}

// A ragged GEMM's work item: rows [m_begin, m_end) of group `group` (at most 8, one tile), or
// with group -1 rows that no group holds (written as zeros); none where m_begin >= m_end.
struct RaggedItem {
  int64_t group = -1, m_begin = 0, m_end = 0;
};

// Work item y of a ragged GEMM (GemmProblem::group_sizes). The rows form segments: those before
// *first_row, each group's, and those after the last group; every segment is cut into tiles of
// 8 rows, numbered in row order. Call it with every lane of the warp.
__device__ RaggedItem ragged_item(const GemmProblem& p, int64_t y) {
  const int64_t first = ragged_first_row(p);
  const int64_t before = ceil_div(first, 8);
  if (y < before) return {-1, 8 * y, min(8 * y + 8, first)};
  const GroupItem item = group_item(p, y - before, group_tiles(8));
  const int64_t row = item.begin + 8 * item.index;
  return {item.group, row, min(row + 8, item.group < 0 ? p.m : item.end)};
}

// With Grid::kStack, gridDim.y runs over the stack's elements, m_tiles activation tiles each; with
// Grid::kRagged over the ragged GEMM's work items. Kernels of their own: finding the element's
// pointers took up to 30 more registers, which the one-GEMM kernels would pay for in occupancy.
template <int T, XKind XK, CodeLoads kLoads, bool kWarpSplit, Grid kGrid>
__global__ void __launch_bounds__(max_threads<kWarpSplit>())
    decode_kernel(const GemmProblem stack, int64_t chunks, int64_t m_tiles) {
  constexpr bool IL = interleaved<T, XK>();
  constexpr bool kRagged = kGrid == Grid::kRagged;
  static_assert(!kRagged || (T == 1 && kWarpSplit), "a ragged item is one 8-row tile, a block one tile");
  __shared__ float partial[4 * T][max_threads<kWarpSplit>()];
  // Programmatic dependent launch: the grid before may still be running; touch no memory until
  // it has completed (launch_config.cuh). No early allow_next_grid(): a next grid scheduled while
  // this one runs takes the SM slots that free up first, unevenly, and this kernel's one-wave
  // split then lost up to 18% back to back (14336 x 4096, M = 1-16, H200).
  wait_for_prior_grids();
  RaggedItem item;
  if constexpr (kRagged) {
    item = ragged_item(stack, blockIdx.y);
    if (item.m_begin >= item.m_end) return;  // the whole block: its warps share the item
  }
  // Rows of no group (item.group < 0): no weights are read, zeros are stored.
  const bool zero_rows = kRagged && item.group < 0;
  GemmProblem p = kGrid == Grid::kStack ? stack_element(stack, blockIdx.y / m_tiles)
                  : kRagged && !zero_rows ? stack_element(stack, item.group)
                                          : stack;
  if constexpr (kRagged) p.m = item.m_end;  // the item's rows end there; a and out stay shared

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  // The K part of this warp (rank) and the number of parts (split).
  const int split = static_cast<int>(kWarpSplit ? blockDim.x / 32 : gridDim.z);
  const int rank = kWarpSplit ? warp : static_cast<int>(blockIdx.z);
  const int64_t n0 = kWarpSplit ? static_cast<int64_t>(blockIdx.x) * 16
                                : static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp * 16;
  const int64_t m0 = kRagged ? item.m_begin
                             : static_cast<int64_t>(kGrid == Grid::kStack ? blockIdx.y % m_tiles : blockIdx.y) * 8 * T;
  const int64_t c_begin = zero_rows ? 0 : chunks * rank / split;
  const int64_t c_end = zero_rows ? 0 : chunks * (rank + 1) / split;
  const bool vec16 = kLoads == CodeLoads::kByK ? p.k % 32 == 0 : kLoads == CodeLoads::k16;

  float acc[T][4];
#pragma unroll
  for (int tt = 0; tt < T; ++tt) acc[tt][0] = acc[tt][1] = acc[tt][2] = acc[tt][3] = 0.f;

  // Full chunks through the cursor: the weights of kDepth chunks in flight (a register ring,
  // unrolled so its slots are static), the activations one chunk ahead. Only the last chunk of
  // K can be partial; it takes the checked path.
  const int64_t c_full = min(c_end, p.k / kChunk);
  int64_t c = c_begin;
  if (c < c_full) {
    Cursor<T, XK, IL> cur(p, n0, g, m0 + g, c * kChunk, t);
    const int n_full = static_cast<int>(c_full - c);
    WeightRaw w[kDepth];
    ActRaw<XK> x[2][T];
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      if (s < n_full) cur.load_weights(vec16, w[s]);
    }
    cur.load_acts(vec16, x[0]);
    // Invariant at the top of each round: w[s] holds chunk i + s, x[0] chunk i. Steady rounds
    // need no range checks: every chunk they load lies inside this block's range.
    int i = 0;
    for (; i + 2 * kDepth <= n_full; i += kDepth) {
#pragma unroll
      for (int s = 0; s < kDepth; ++s) {
        cur.load_acts(vec16, x[(s + 1) % 2]);
        compute_chunk<T, XK, IL>(w[s], x[s % 2], t, acc);
        cur.load_weights(vec16, w[s]);
      }
    }
    for (; i < n_full; i += kDepth) {
#pragma unroll
      for (int s = 0; s < kDepth; ++s) {
        if (i + s < n_full) {
          if (i + s + 1 < n_full) cur.load_acts(vec16, x[(s + 1) % 2]);
          compute_chunk<T, XK, IL>(w[s], x[s % 2], t, acc);
          if (i + s + kDepth < n_full) cur.load_weights(vec16, w[s]);
        }
      }
    }
    c = c_full;
  }
  for (; c < c_end; ++c) {  // the partial last chunk
    Chunk<T, XK> tail;
    load_chunk<T, XK, IL>(p, n0, g, m0 + g, c * kChunk, t, vec16, tail);
    compute_chunk<T, XK, IL>(tail.w, tail.x, t, acc);
  }

#pragma unroll
  for (int tt = 0; tt < T; ++tt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[4 * tt + i][threadIdx.x] = acc[tt][i];
  }
  // The part of rank r of this thread's fragment slot: in warp r of this block, or in the same
  // thread of block r of the cluster.
  const auto part = [&](int e, int r) -> float {
    if constexpr (kWarpSplit) {
      return partial[e][32 * r + lane];
    } else {
      return cg::this_cluster().map_shared_rank(&partial[e][0], r)[threadIdx.x];
    }
  };
  if constexpr (kWarpSplit) {
    __syncthreads();
  } else {
    cg::this_cluster().sync();
  }

  // Rank r finishes the outputs o = r, r+split, ... of this thread: fragment slot e = o, or with a
  // gated activation the slot pair e = 4 (o / 2) + o % 2 (gate) and e + 2 (up). Each slot is the
  // sum over ranks in rank order, then alpha and the bias of its weight row.
  float alpha = *p.b.s_dec * (1.0f / kDequantFactor);
  if constexpr (XK == XKind::kNvfp4) {
    alpha *= *p.a_q.s_dec * (1.0f / kDequantFactor);
  } else if (p.a_q.s_dec != nullptr) {  // bf16 x staged from NVFP4 codes (stage_nvfp4_x)
    alpha *= *p.a_q.s_dec;
  }
  const bool gated = is_gated(p.activation);
  const auto slot_value = [&](int e) -> float {
    float sum = 0.f;
    for (int r = 0; r < split; ++r) sum += part(e, r);
    float v = sum * alpha;
    if (p.bias) v += load_as_float(p.bias, p.bias_dtype, weight_row(n0, g, (e % 4) / 2, gated));
    return v;
  };
  const int outputs = gated ? 2 * T : 4 * T;
  for (int o = rank; o < outputs; o += split) {
    const int e = gated ? 4 * (o / 2) + o % 2 : o;
    const int tt = e / 4, i = e % 4;
    const int64_t m = m0 + 8 * tt + 2 * t + (i & 1);
    const int64_t n = weight_row(n0, g, i / 2, gated);
    if (n >= p.n || m >= p.m) continue;
    if (gated) {
      store_as(p.out, p.out_dtype, m * (p.n / 2) + n / 2,
               zero_rows ? 0.f : apply_gated(slot_value(e), slot_value(e + 2), p.activation));
    } else {
      store_as(p.out, p.out_dtype, m * p.n + n,
               zero_rows ? 0.f : apply_activation(slot_value(e), p.activation));
    }
  }
  // Keep this block's partials alive until every rank of the cluster has read them.
  if constexpr (!kWarpSplit) cg::this_cluster().sync();
}

constexpr int64_t kMaxGridY = 65535;

// The y dimension of the grid: the activation tiles of every element of the stack; for a ragged
// GEMM a bound on its work items (ragged_item), known without reading the group sizes: the
// segments of rows (before the groups, the groups that hold rows, after them) number at most
// min(G, M) + 2, and cut into 8-row tiles they give at most ceil(M / 8) more items than
// segments, less one; nor can there be more items than rows. Items past the last exit at once.
int64_t grid_rows(const GemmProblem& p, int rows_per_tile) {
  if (p.ragged()) return std::min(p.m, ceil_div(p.m, rows_per_tile) + std::min(p.stack.count, p.m) + 1);
  return ceil_div(p.m, rows_per_tile) * p.stack.count;
}

template <int T, XKind XK, CodeLoads kLoads, Grid kStack>
cudaError_t launch(const GemmProblem& p, cudaStream_t stream) {
  const int64_t chunks = ceil_div(p.k, kChunk);
  const int64_t m_tiles = ceil_div(p.m, 8 * T);
  const int64_t rows = grid_rows(p, 8 * T);
  if (rows > kMaxGridY) return cudaErrorInvalidValue;
  // Split K as far as the grid stays resident (one wave), at least 2 chunks a part. Past 8 rows
  // the warp split needs that split to reach 2: with one warp a tile it lacks the warps to hide
  // the load latency (M = 16, 14336 x 4096: 16% slower than the cluster split, whose blocks of 4
  // tiles keep it at 2 or more), and where it reaches 2 it took 10-24% less time at M = 16 and
  // 13-21% less at M = 32 on the other three Llama shapes (H200,
  // bench/results/decode_warp_split_h200_2026-11-28.md). The tiles of a stack's elements share
  // the wave: a stack splits K less than one element alone.
  const int64_t warp_tiles = ceil_div(p.n, 16) * rows;
  const int warp_parts = one_wave_split(warp_tiles, chunks, 2,
                                        resident_warp_parts<decode_kernel<T, XK, kLoads, true, kStack>>());
  if (T == 1 || warp_parts >= 2) {
    const LaunchConfig launch(dim3(static_cast<unsigned>(ceil_div(p.n, 16)), static_cast<unsigned>(rows)),
                              dim3(32 * warp_parts), 0, stream, /*cluster_z=*/0, /*pdl=*/true);
    return cudaLaunchKernelEx(&launch.cfg, decode_kernel<T, XK, kLoads, true, kStack>, p, chunks, m_tiles);
  }
  if constexpr (T > 1) {  // M <= 8 keeps the warp split: its cluster kernel is not built
    const int64_t n_tiles = ceil_div(p.n, kRowsPerBlock);
    const int split = one_wave_split(n_tiles * rows, chunks, 2,
                                     resident_blocks<decode_kernel<T, XK, kLoads, false, kStack>>(dim3(kThreads), 0));
    const LaunchConfig launch(dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(rows), split),
                              dim3(kThreads), 0, stream, static_cast<unsigned>(split), /*pdl=*/true);
    return cudaLaunchKernelEx(&launch.cfg, decode_kernel<T, XK, kLoads, false, kStack>, p, chunks, m_tiles);
  }
  return cudaErrorInvalidValue;  // unreachable: T == 1 launched above
}

template <int T, XKind XK, Grid kStack>
cudaError_t launch_loads(const GemmProblem& p, cudaStream_t stream) {
  if constexpr (XK == XKind::kF32) {
    return launch<T, XK, CodeLoads::kByK, kStack>(p, stream);
  } else {
    if (p.k % 32 == 0) return launch<T, XK, CodeLoads::k16, kStack>(p, stream);
    return launch<T, XK, CodeLoads::k8, kStack>(p, stream);
  }
}

// W4A4 at M <= 4 on large weights (one GEMM, not a stack): x's codes times their block scales,
// exact in bf16, are written once per call to the workspace, and the bf16-x kernel runs on them;
// x's s_dec stays in alpha. The NVFP4-x kernel decodes x in every warp for each of its 8 MMA
// columns, rows that do not exist included, which costs in proportion to the weights; staging
// costs a launch (about 1 us). On an H200 through JAX, staged against not: 14336 x 4096 and
// 4096 x 14336 6-9% faster at M = 1-4 and 2-3% slower at M = 8; 4096 x 4096 and 6144 x 4096
// (up to 25M weights) 7-21% slower at M = 1-8 (bench/results/decode_w4a4_staging_h200_2026-11-28.md).
constexpr int64_t kStageXMaxM = 4;
constexpr int64_t kStageXMinWeights = int64_t{1} << 25;  // 33.5M: between 25.2M and 58.7M measured
bool stages_x(const GemmProblem& p) {
  return p.a_is_nvfp4 && p.m <= kStageXMaxM && p.n * p.k >= kStageXMinWeights && p.stack.count == 1 &&
         !p.ragged();
}

// One thread a 16-element scale block of x: [m, k] codes and tiled scales -> bf16 [m, k].
__global__ void __launch_bounds__(256) stage_nvfp4_x(const GemmProblem p, __nv_bfloat16* x) {
  // The next grid, the GEMM, may be scheduled now: it waits for this one before reading x.
  allow_next_grid();
  wait_for_prior_grids();
  const int64_t blocks = p.k / kBlockSize;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.m * blocks) return;
  const int64_t row = i / blocks, block = i % blocks;
  const float scale = e4m3_to_float(p.a_q.scales[scale_offset(row, block, blocks)]);
  // 8 code bytes a block: aligned, as every row holds a multiple of 8 bytes.
  const uint2 codes = *reinterpret_cast<const uint2*>(p.a_q.codes + row * (p.k / 2) + block * 8);
  uint32_t out[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t byte = ((j < 4 ? codes.x : codes.y) >> (8 * (j % 4))) & 0xFFu;
    const __nv_bfloat162 v = __floats2bfloat162_rn(e2m1_to_float(byte & 0xFu) * scale,
                                                   e2m1_to_float(byte >> 4) * scale);
    out[j] = *reinterpret_cast<const uint32_t*>(&v);
  }
  uint4* dst = reinterpret_cast<uint4*>(x + row * p.k + block * kBlockSize);
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

template <XKind XK>
cudaError_t launch_for_m(const GemmProblem& p, cudaStream_t stream) {
  if (p.ragged()) return launch_loads<1, XK, Grid::kRagged>(p, stream);
  if (p.m <= 8) {
    if (p.stack.count > 1) return launch_loads<1, XK, Grid::kStack>(p, stream);
    return launch_loads<1, XK, Grid::kOne>(p, stream);
  }
  if (p.stack.count > 1) return cudaErrorInvalidValue;  // see decode_runs_stack
  // Split activations (two MMAs, twice the registers) stop at 16 rows a tile.
  if constexpr (x_split<XK>()) {
    return launch_loads<2, XK, Grid::kOne>(p, stream);
  } else {
    if (p.m <= 16) return launch_loads<2, XK, Grid::kOne>(p, stream);
    return launch_loads<4, XK, Grid::kOne>(p, stream);
  }
}

cudaError_t stage_then_launch(const GemmProblem& p, cudaStream_t stream) {
  auto* x = static_cast<__nv_bfloat16*>(p.workspace);
  const int64_t threads = p.m * (p.k / kBlockSize);
  const LaunchConfig stage(dim3(static_cast<unsigned>(ceil_div(threads, 256))), dim3(256), 0, stream,
                           /*cluster_z=*/0, /*pdl=*/true);
  if (const cudaError_t err = cudaLaunchKernelEx(&stage.cfg, stage_nvfp4_x, p, x); err != cudaSuccess) {
    return err;
  }
  GemmProblem staged = p;
  staged.a_is_nvfp4 = false;
  staged.a = x;
  staged.a_dtype = DType::kBF16;
  staged.a_q = {nullptr, nullptr, p.a_q.s_dec};  // s_dec only: the kernel's epilogue applies it
  return launch_for_m<XKind::kBF16>(staged, stream);
}

}  // namespace

// Only M <= 8 (T == 1: a block is a warp or a few): at M = 16 the stack's blocks of 4 warps,
// each walking the whole of K, overflowed one wave into a second, mostly idle one, and 2 experts
// of 14336 x 4096 took 10% longer in one launch than one after the other (4 took 6% less; 4 x
// H200, bench_experts.py; bench/results/experts_h200x4_2026-11-28.md).
bool decode_runs_stack(const GemmProblem& p) { return p.m <= 8 && grid_rows(p, 8) <= kMaxGridY; }

// A ragged GEMM runs on 8-row tiles at any M whose grid fits (each item reads its group's
// weights: past a few tiles a group, XLA's dequantize + ragged_dot is the better path, which the
// Python side takes; jax_nvfp4/primitives/ragged.py).
bool decode_runs_ragged(const GemmProblem& p) { return p.ragged() && grid_rows(p, 8) <= kMaxGridY; }

size_t decode_workspace_bytes(const GemmProblem& p) {
  return stages_x(p) ? static_cast<size_t>(p.m * p.k) * sizeof(__nv_bfloat16) : 0;
}

cudaError_t decode_gemm(const GemmProblem& p, cudaStream_t stream) {
  if (p.workspace_bytes < decode_workspace_bytes(p)) return cudaErrorInvalidValue;
  if (stages_x(p)) return stage_then_launch(p, stream);
  if (p.a_is_nvfp4) return launch_for_m<XKind::kNvfp4>(p, stream);
  switch (p.a_dtype) {
    case DType::kBF16: return launch_for_m<XKind::kBF16>(p, stream);
    case DType::kF16: return launch_for_m<XKind::kF16>(p, stream);
    default: return launch_for_m<XKind::kF32>(p, stream);
  }
}

}  // namespace sm90
}  // namespace jax_nvfp4
