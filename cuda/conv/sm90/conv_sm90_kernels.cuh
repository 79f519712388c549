// sm_90a shifted-operand convolution with NVFP4 weights (DESIGN.md §4, docs/conv.md): the kernels.
// conv_sm90.cu launches the register-A kernel and picks the kernel; conv_sm90_ws_launch.cuh
// launches the warp-specialized one, compiled once per filter width S (conv_sm90_ws_s<S>.cu).
//
// One CTA computes BM output channels x BN virtual output pixels (conv_sm90_schedule.h) with
// BM/64 warpgroups. The contraction runs over pipeline stages (filter row r, 64 input channels);
// each stage brings into shared memory, with cp.async, in a ring of 2 or 3 buffers:
//   * the activations of the tile's input rows for filter row r: stride_w phase arrays of
//     `slots` pixels x 64 channels, bf16, in the wgmma no-swizzle K-major layout
//     [phase][8-channel column][slot][8 channels] (16 bytes per slot, so one pixel is one
//     16-byte core-matrix row);
//   * the packed E2M1 codes and the 512-byte E4M3 scale tile of the weights of all S taps.
// Every tap s then multiplies the same activations, its B descriptor advanced by 16 bytes per
// pixel of shift, by the tap's weights, which each thread dequantizes (e2m1 * e4m3, exact in
// bf16) straight into its wgmma A-operand registers while the previous tap's wgmmas run.
// The slot -> input pixel map of the tile is computed once per CTA into a shared-memory table.
// Small grids split the stages of each tile over a cluster of CTAs (split-K), whose partial sums
// meet in CTA 0 through distributed shared memory.
// Epilogue: alpha = s_dec_w (* s_dec_x), bias, conversion to the output dtype.
// A second, warp-specialized persistent kernel (WsKernel, below) runs the same stages with the
// loads in a producer warpgroup (TMA copies into the 128-byte swizzle where C % 32 == 0, else
// cp.async) and the decode + wgmmas in two consumer warpgroups; conv_sm90 picks between the two
// (choose_kernel).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cuda_host_adapter.hpp"
#include "common/bf16x2.cuh"
#include "common/dtype_io.cuh"
#include "common/launch_config.cuh"
#include "common/nvfp4_decode.cuh"
#include "common/scale_layout.h"
#include "common/sm90_async.cuh"
#include "common/stmatrix_tile.cuh"
#include "conv/sm90/conv_sm90.h"
#include "conv/sm90/conv_sm90_schedule.h"
#include "conv/sm90/conv_weight_decode.h"

namespace jax_nvfp4 {
namespace conv90 {
namespace {

using namespace hopper;
namespace cg = cooperative_groups;

enum class ActKind { kBF16, kF16, kF32, kNvfp4 };

constexpr int kCodeRowBytes = kChunkC / 2;  // 32 bytes of packed codes per weight row per stage

// Two E2M1 codes (one byte: element 2i low nibble) times a block scale -> bf16x2, exactly.
// The code's 3 magnitude bits placed at float bit 22 read as 2^(e-127)*(1+m/2) (subnormal for
// e = 0: m*2^-127); times 2^126 that is the E2M1 value. The product with an E4M3 scale has at
// most 5 significant bits, so the bf16 rounding is exact.
__device__ __forceinline__ uint32_t decode_pair(uint32_t byte, float scale) {
  constexpr float kTwo126 = 8.507059173023462e+37f;
  const float lo = __uint_as_float(((byte & 7u) << 22) | ((byte & 8u) << 28)) * kTwo126;
  const float hi = __uint_as_float((((byte >> 4) & 7u) << 22) | ((byte & 0x80u) << 24)) * kTwo126;
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo * scale, hi * scale);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Four E4M3 scales (bytes of `bits`) -> four bf16 pairs (each scale twice), exactly: the hardware
// converts two at a time to f16 (which holds every E4M3 value; NaN stays NaN), then to bf16.
__device__ __forceinline__ void e4m3x4_scales_bf16x2(uint32_t bits, uint32_t (&out)[4]) {
  uint32_t h[2];
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h[0]) : "h"(static_cast<uint16_t>(bits & 0xFFFFu)));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h[1]) : "h"(static_cast<uint16_t>(bits >> 16)));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float f = __half2float(__ushort_as_half(static_cast<unsigned short>(h[i / 2] >> (16 * (i % 2)))));
    const __nv_bfloat162 r = __float2bfloat162_rn(f);
    out[i] = *reinterpret_cast<const uint32_t*>(&r);
  }
}

template <typename T>
__device__ __forceinline__ float load_float(const T* p) {
  if constexpr (std::is_same_v<T, float>) return *p;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(*p);
  else return __bfloat162float(*p);
}

// Shared-memory bytes of one pipeline stage. The activations take phases x slots x 64 channels
// either way: in the no-swizzle layout (cp.async loads) or as 128-byte pixel rows in the 128-byte
// swizzle (TMA loads), whose stages are padded to whole 1024-byte swizzle atoms.
struct StageLayout {
  int act_bytes, code_bytes, scale_bytes, pad_bytes = 0;
  NVFP4_HD int total() const { return act_bytes + code_bytes + scale_bytes + pad_bytes; }
};

constexpr int kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes

NVFP4_HD StageLayout stage_layout(const ConvProblem& pb, const Geometry& g, int bm, bool swizzled = false) {
  StageLayout L{g.phases * (kChunkC / 8) * g.slots * 16, pb.s * bm * kCodeRowBytes, pb.s * kTileBytes};
  if (swizzled) L.pad_bytes = (kSwizzleAtomBytes - L.total() % kSwizzleAtomBytes) % kSwizzleAtomBytes;
  return L;
}

// Where slot (phase, slot) of the tile reads, for filter row 0 (conv_sm90_schedule.h,
// slot_origin); h0 is far out of range when the slot is zero for every filter row.
struct alignas(16) SlotEntry {
  // The 16 bytes the bf16 loader reads with one vector load:
  int64_t byte_offset0;  // byte offset of the slot's bf16 pixel, ((n * H + h0) * W + w) * C * 2
  int h0;
  int dst;               // byte offset of the slot's first 8-channel column in a stage buffer
  int n, w;              // for the converting (float, NVFP4) loaders
};
static_assert(offsetof(SlotEntry, h0) == 8 && offsetof(SlotEntry, dst) == 12, "the loader's int4 read");

constexpr int kNoRow = -(1 << 30);

NVFP4_HD int slot_table_bytes(const Geometry& g) {
  return static_cast<int>(g.phases * g.slots * sizeof(SlotEntry));
}

// The most CTAs a warp-specialized tile's stages split over (a portable cluster).
constexpr int kMaxWsSplits = 8;

// Shared memory of the warp-specialized kernel (WsKernel): nbuf stages (the register-A kernel's
// stage layout with cp.async loads, the swizzled one with TMA loads), the consumers' epilogue
// tiles, the stage split's partial sums, the slot table (cp.async loads only), and the full/empty
// barrier of every stage. The partial sums take `partial_bytes` in the stage ring where
// `partials_in_ring` (every CTA runs one tile, so the ring is idle once the consumers have
// retired its last stage) and they fit there, else after the epilogue tiles.
struct WsLayout {
  StageLayout stage;
  int nbuf = 0, epi_offset = 0, partial_offset = 0, table_offset = 0, barrier_offset = 0, total = 0;
};

inline WsLayout ws_layout(const ConvProblem& pb, const Geometry& g, int bm, int epi_bytes, int nbuf, bool tma,
                          int partial_bytes = 0, bool partials_in_ring = false) {
  WsLayout L;
  L.stage = stage_layout(pb, g, bm, /*swizzled=*/tma);
  L.nbuf = nbuf;
  L.epi_offset = nbuf * L.stage.total();
  const bool in_ring = partials_in_ring && partial_bytes <= L.epi_offset;
  L.partial_offset = in_ring ? 0 : L.epi_offset + epi_bytes;
  L.table_offset = L.epi_offset + epi_bytes + (in_ring ? 0 : partial_bytes);
  L.barrier_offset = (L.table_offset + (tma ? 0 : slot_table_bytes(g)) + 7) / 8 * 8;
  L.total = L.barrier_offset + 2 * nbuf * 8;
  return L;
}

// One consumer warpgroup's epilogue tile in the warp-specialized kernel (WsKernel::epilogue):
// kWsEpiPixels pixel rows (the widest pass) of 64 channels + 8 pad, bf16/f16.
constexpr int kWsEpiPixels = 64, kWsEpiPitch = 64 + 8, kWsEpiBytes = kWsEpiPixels * kWsEpiPitch * 2;

// The fewest stages the warp-specialized kernel's ring takes: two, or four with the stage split.
// Each of its consumers holds a stage until its next one is under way, so it needs three to run
// at all, and with three the producer starved them (H100, kernel alone: 14x14x256 b32 19.3 against
// 17.7 us with four, 7x7x512 b32 26.2 against 23.5; five or six were no faster than four).
constexpr int ws_min_stages(bool stage_split) { return stage_split ? 4 : 2; }

// Shared memory where the stage-split consumers exchange partial sums: kBN / 2 floats a thread.
constexpr int ws_partial_bytes(int bn) { return bn / 2 * 128 * 4; }

// Whether the fewest stages of the warp-specialized kernel with TMA loads, two consumers and
// `tile_n`-pixel x `bm`-channel tiles (split between the consumers by stage or not) fit in
// `max_smem` bytes. `one_tile_per_cta`: the grid runs each CTA's single tile (one wave, or
// split-K), so the stage split's partial sums may share the ring; a persistent CTA that loops over
// tiles keeps them beside it (launch_ws_kernel). base: problem_geometry(pb).
inline bool ws_tma_stages_fit(const ConvProblem& pb, const Geometry& base, int tile_n, int bm, int max_smem,
                              bool stage_split = false, bool one_tile_per_cta = true) {
  const Geometry g = with_tile(base, tile_n, /*im2col=*/true);
  return ws_layout(pb, g, bm, 2 * kWsEpiBytes, ws_min_stages(stage_split), /*tma=*/true,
                   stage_split ? ws_partial_bytes(tile_n) : 0, /*partials_in_ring=*/one_tile_per_cta)
             .total <= max_smem;
}

// The tensor maps of the warp-specialized kernel's TMA loads (encode_ws_maps).
struct WsTmaMaps {
  CUtensorMap act;       // im2col over x [N, H, W, C] bf16: kBN pixels x 64 channels, 128-byte swizzle
  CUtensorMap act_halo;  // the same, kHaloPixels pixels
  CUtensorMap codes;     // tiled over the codes [R*S][K][C/2] bytes: 32 bytes x BM rows x S taps
};

// Loads the 8 channels [c, c+8) of activation pixel (n, h, w) as bf16 into 16 bytes of shared
// memory, or zeros when `valid` is false.
template <ActKind kAct>
__device__ __forceinline__ void load_act_chunk(const ConvProblem& pb, uint8_t* dst, bool valid,
                                               int64_t n, int64_t h, int64_t w, int64_t c) {
  const int64_t pixel = (n * pb.h + h) * pb.w + w;
  if constexpr (kAct == ActKind::kBF16) {
    const auto* x = static_cast<const __nv_bfloat16*>(pb.x);
    cp_async<16>(dst, valid ? x + pixel * pb.c + c : x, valid);
  } else {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (valid) {
      if constexpr (kAct == ActKind::kNvfp4) {
        const uint32_t codes = *reinterpret_cast<const uint32_t*>(pb.x_q.codes + (pixel * pb.c + c) / 2);
        const int64_t kb = pb.c / kBlockSize;
        const int64_t scale_at = (n * pb.h + h) * scale_matrix_bytes(pb.w, kb) +
                                 scale_offset(w, c / kBlockSize, kb);
        const float sc = e4m3_to_float(pb.x_q.scales[scale_at]);
        v = make_uint4(decode_pair(codes & 0xFF, sc), decode_pair((codes >> 8) & 0xFF, sc),
                       decode_pair((codes >> 16) & 0xFF, sc), decode_pair(codes >> 24, sc));
      } else {
        using T = std::conditional_t<kAct == ActKind::kF32, float, __half>;
        const T* src = static_cast<const T*>(pb.x) + pixel * pb.c + c;
        float f[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) f[i] = load_float(src + i);
        v = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                       pack_bf16x2(f[6], f[7]));
      }
    }
    *reinterpret_cast<uint4*>(dst) = v;
  }
}

// Fills the tile's slot table (one division chain per slot, once per tile) with kLoaders threads
// (tid in [0, kLoaders)), in 32-bit index math when every virtual pixel index fits.
template <int kLoaders>
__device__ void build_slot_table(const ConvProblem& pb, const Geometry& g, int64_t g0, SlotEntry* table, int tid) {
  const bool narrow_index = g.virtual_pixels + g.slots <= INT32_MAX;
  for (int e = tid; e < g.phases * g.slots; e += kLoaders) {
    const int phase = e / g.slots, slot = e - phase * g.slots;
    int64_t n = 0, h0 = 0, w = 0;
    SlotEntry se;
    se.dst = (phase * (kChunkC / 8) * g.slots + slot) * 16;
    const bool inside = narrow_index ? slot_origin<int32_t>(pb, g, g0, phase, slot, &n, &h0, &w)
                                     : slot_origin<int64_t>(pb, g, g0, phase, slot, &n, &h0, &w);
    if (inside) {
      se.byte_offset0 = ((n * pb.h + h0) * pb.w + w) * pb.c * 2;
      se.h0 = static_cast<int>(h0);
      se.n = static_cast<int>(n);
      se.w = static_cast<int>(w);
    } else {
      se.byte_offset0 = 0;
      se.h0 = kNoRow;
      se.n = 0;
      se.w = 0;
    }
    table[e] = se;
  }
}

// Issues (cp.async for bf16) or performs the activation loads of stage (filter row r, channel
// chunk cc) into `smem` with kLoaders threads. Thread tid loads 8-channel column tid % 8 of slots
// tid / 8, tid / 8 + kLoaders / 8, ... (8 consecutive threads read a pixel's 128 contiguous bytes;
// its 8 shared-memory columns are slots*16 bytes apart, slots odd, so they hit distinct banks).
template <ActKind kAct, int kLoaders>
__device__ void load_activations(const ConvProblem& pb, const Geometry& g, const SlotEntry* table, int r, int cc,
                                 uint8_t* smem, int tid) {
  const int dh = r * pb.dil_h;
  const int c8 = tid % 8;
  const int64_t c = static_cast<int64_t>(cc) * kChunkC + c8 * 8;
  const int rows = c < pb.c ? static_cast<int>(pb.h) : 0;  // a channel tail past C loads zeros
  uint8_t* dst_col = smem + c8 * g.slots * 16;
  const int entries = g.phases * g.slots;
  if constexpr (kAct == ActKind::kBF16) {
    const auto* x = static_cast<const char*>(pb.x);
    const int64_t row_off = (static_cast<int64_t>(dh) * pb.w * pb.c + c) * 2;
    for (int e = tid / 8; e < entries; e += kLoaders / 8) {
      const int4 se = *reinterpret_cast<const int4*>(table + e);  // byte_offset0, h0, dst
      const int64_t offset0 = static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(se.y)) << 32) |
                                                   static_cast<uint32_t>(se.x));
      const int h = se.z + dh;
      const bool valid = static_cast<unsigned>(h) < static_cast<unsigned>(rows);
      cp_async<16>(dst_col + se.w, valid ? x + offset0 + row_off : x, valid);
    }
  } else {
    for (int e = tid / 8; e < entries; e += kLoaders / 8) {
      const SlotEntry& se = table[e];
      const int h = se.h0 + dh;
      const bool valid = static_cast<unsigned>(h) < static_cast<unsigned>(rows);
      load_act_chunk<kAct>(pb, dst_col + se.dst, valid, se.n, h, se.w, c);
    }
  }
}

// What the epilogue applies to a thread's two accumulator rows, output channels k and k + 8:
// alpha = s_dec_w (* s_dec_x) and their biases (0 past K or without bias).
struct RowScale {
  float alpha;
  float bias[2];
};

// Brings the words row_scale(pb, k) reads into L1 without holding registers for them (the
// warp-specialized consumers, whose accumulators leave none spare, issue it while a tile runs).
__device__ __forceinline__ void prefetch_row_scale(const ConvProblem& pb, int64_t k) {
  auto prefetch = [](const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); };
  prefetch(pb.wgt.s_dec);
  if (pb.x_is_nvfp4) prefetch(pb.x_q.s_dec);
  if (pb.bias != nullptr && k < pb.k) {
    prefetch(static_cast<const uint8_t*>(pb.bias) + k * (pb.bias_dtype == DType::kF32 ? 4 : 2));
  }
}

__device__ __forceinline__ RowScale row_scale(const ConvProblem& pb, int64_t k) {
  RowScale rs{*pb.wgt.s_dec, {0.f, 0.f}};
  if (pb.x_is_nvfp4) rs.alpha *= *pb.x_q.s_dec;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pb.bias != nullptr && k + 8 * i < pb.k) rs.bias[i] = load_as_float(pb.bias, pb.bias_dtype, k + 8 * i);
  }
  return rs;
}

template <ActKind kAct, int kBN, int kWGM, int kS, bool kSplit>
struct Kernel {
  static constexpr int kBM = 64 * kWGM;
  static constexpr int kThreads = 128 * kWGM;
  static constexpr int kAcc = kBN / 2;  // f32 accumulators per thread (64 x kBN per warpgroup)

  // Issues the loads of stage `it` (filter row r, channel chunk cc) into buffer `smem` with
  // kLoaders threads (tid in [0, kLoaders)). Each thread's share is fixed per tile, so the loops
  // only step a slot index, a row or a tap.
  template <int kLoaders>
  static __device__ void load_stage(const ConvProblem& pb, const Geometry& g, const SlotEntry* table,
                                    int64_t k0, int it, uint8_t* smem, const StageLayout& L, int tid) {
    const int r = it / g.c_chunks, cc = it % g.c_chunks;
    const int64_t c_base = static_cast<int64_t>(cc) * kChunkC;
    load_activations<kAct, kLoaders>(pb, g, table, r, cc, smem, tid);
    // Weight codes: piece p is 16 of the 32 bytes of row p / 2 of every tap (one piece per
    // thread when kLoaders = 2 * kBM); taps are K rows apart.
    uint8_t* codes = smem + L.act_bytes;
    for (int piece = tid; piece < 2 * kBM; piece += kLoaders) {
      const int64_t row_bytes = pb.c / 2;
      const int row = piece / 2, part = piece % 2;
      const int64_t k = k0 + row, byte = c_base / 2 + part * 16;
      const int64_t tap_bytes = pb.k * row_bytes;
      const uint8_t* src = pb.wgt.codes + (static_cast<int64_t>(r) * pb.s * pb.k + k) * row_bytes + byte;
      uint8_t* dst = codes + row * kCodeRowBytes + part * 16;
      const int taps = kS > 0 ? kS : pb.s;
      const bool valid = k < pb.k && byte < row_bytes;
      if (row_bytes % 16 == 0) {
#pragma unroll
        for (int s = 0; s < taps; ++s) {
          cp_async<16>(dst + s * kBM * kCodeRowBytes, valid ? src + s * tap_bytes : pb.wgt.codes, valid);
        }
      } else {
        // C % 32 == 16: rows are only 8-byte aligned, and the upper half of the last piece lies
        // past the row.
        const bool valid_hi = k < pb.k && byte + 8 < row_bytes;
#pragma unroll
        for (int s = 0; s < taps; ++s) {
          cp_async<8>(dst + s * kBM * kCodeRowBytes, valid ? src + s * tap_bytes : pb.wgt.codes, valid);
          cp_async<8>(dst + s * kBM * kCodeRowBytes + 8, valid_hi ? src + s * tap_bytes + 8 : pb.wgt.codes,
                      valid_hi);
        }
      }
    }
    // Weight scales: the one 512-byte tile of (rows k0 / 128, channel chunk cc) of every tap.
    uint8_t* scales = codes + L.code_bytes;
    const int64_t kb = pb.c / kBlockSize;
    const int64_t tile = (k0 / kTileRows) * scale_k_tiles(kb) + cc;
    for (int id = tid; id < pb.s * (kTileBytes / 16); id += kLoaders) {
      const int part = id % (kTileBytes / 16), s = id / (kTileBytes / 16);
      const uint8_t* src = pb.wgt.scales + (static_cast<int64_t>(r) * pb.s + s) * scale_matrix_bytes(pb.k, kb) +
                           tile * kTileBytes + part * 16;
      cp_async<16>(scales + s * kTileBytes + part * 16, src, true);
    }
  }

  // Dequantizes the 4 A fragments (64 channels) of tap s for this thread's rows row0 and
  // row0 + 8: k-step kk's registers are byte t of code words 2kk and 2kk+1 of each row
  // (channels 2t, 2t+1 and 2t+8, 2t+9 of the 16), times the rows' block scales.
  static __device__ __forceinline__ void decode_tap(int s, const uint8_t* codes, const uint8_t* scales,
                                                    int row0, int tr0, uint32_t sel,
                                                    uint32_t (&frag)[4][4]) {
    const int tr1 = tr0 + 8;
    const uint4* p0 = reinterpret_cast<const uint4*>(codes + (s * kBM + row0) * kCodeRowBytes);
    const uint4* p1 = reinterpret_cast<const uint4*>(codes + (s * kBM + row0 + 8) * kCodeRowBytes);
    const uint4 c0[2] = {p0[0], p0[1]}, c1[2] = {p1[0], p1[1]};
    const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&c0[0]);
    const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&c1[0]);
    uint32_t s0[4], s1[4];
    e4m3x4_scales_bf16x2(*reinterpret_cast<const uint32_t*>(scales + s * kTileBytes + (tr0 % 32) * 16 + (tr0 / 32) * 4), s0);
    e4m3x4_scales_bf16x2(*reinterpret_cast<const uint32_t*>(scales + s * kTileBytes + (tr1 % 32) * 16 + (tr1 / 32) * 4), s1);
#pragma unroll
    for (int kk = 0; kk < kChunkC / 16; ++kk) {
      uint32_t v[4];
      decode_e2m1x4(byte_perm(w0[2 * kk], w1[2 * kk], sel), v[0], v[1]);
      decode_e2m1x4(byte_perm(w0[2 * kk + 1], w1[2 * kk + 1], sel), v[2], v[3]);
      frag[kk][0] = mul_bf16x2(v[0], s0[kk]);  // exact: <= 6 significant bits, in range
      frag[kk][1] = mul_bf16x2(v[1], s1[kk]);
      frag[kk][2] = mul_bf16x2(v[2], s0[kk]);
      frag[kk][3] = mul_bf16x2(v[3], s1[kk]);
    }
  }

  // Issues tap s's 4 wgmmas (64 channels) as one commit group.
  static __device__ __forceinline__ void issue_tap(const ConvProblem& pb, const Geometry& g, int s,
                                                   uint32_t act, const uint32_t (&frag)[4][4],
                                                   float (&acc)[kAcc]) {
    const Tap tap = tap_at(pb, g, s);
    const uint32_t lead = g.slots * 16;  // next 8-channel column (K direction)
    const uint32_t b_tap = act + ((tap.phase * (kChunkC / 8)) * g.slots + tap.shift) * 16;
    const uint64_t desc = smem_descriptor(b_tap, lead, 128);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kChunkC / 16; ++kk) WgmmaRS<kBN>::run(acc, frag[kk], advance_descriptor(desc, 2 * kk * lead));
    wgmma_commit();
  }

  // All taps of one stage. With S known at compile time (kS > 0) the fragments of tap s+1 are
  // decoded into the other of two register buffers while tap s's wgmmas run; the fully unrolled
  // sequence lets ptxas see that no in-flight wgmma's registers are written (no serialization).
  // `after_first` runs once tap 0 is in flight (the next stage's loads).
  template <typename F>
  static __device__ __forceinline__ void compute_stage(const ConvProblem& pb, const Geometry& g, int64_t k0,
                                                       const uint8_t* smem, const StageLayout& L,
                                                       float (&acc)[kAcc], F&& after_first, int tid = threadIdx.x) {
    const int warp = tid / 32, lane = tid % 32;
    const int row0 = (warp / 4) * 64 + (warp % 4) * 16 + lane / 4;  // row in the tile
    const int tr0 = static_cast<int>(k0 % kTileRows) + row0;         // row in the scale tile
    const uint32_t t = lane % 4, sel = t | ((4 + t) << 4);
    const uint8_t* codes = smem + L.act_bytes;
    const uint8_t* scales = codes + L.code_bytes;
    const uint32_t act = smem_addr(smem);
    fence_accumulators(acc);
    if constexpr (kS > 0) {
      uint32_t frag[2][4][4];
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        decode_tap(s, codes, scales, row0, tr0, sel, frag[s & 1]);
        issue_tap(pb, g, s, act, frag[s & 1], acc);
        if (s == 0) after_first();
        if (s > 0) wgmma_wait<1>();  // tap s-1 retired: its fragment buffer is free
      }
    } else {
      uint32_t frag[4][4];
      for (int s = 0; s < pb.s; ++s) {
        decode_tap(s, codes, scales, row0, tr0, sel, frag);
        issue_tap(pb, g, s, act, frag, acc);
        if (s == 0) after_first();
        wgmma_wait<0>();
      }
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
  }

  static __device__ void epilogue(const ConvProblem& pb, const Geometry& g, int64_t g0, int64_t k0,
                                  const float (&acc)[kAcc]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g8 = lane / 4, t = lane % 4;
    const int64_t k_rows[2] = {k0 + (warp / 4) * 64 + (warp % 4) * 16 + g8,
                               k0 + (warp / 4) * 64 + (warp % 4) * 16 + g8 + 8};
    const RowScale rs = row_scale(pb, k_rows[0]);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      ColumnWalker col(g, g0 + 2 * t + e);  // column 8j + 2t + e of the tile
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        if (j > 0) col.advance(g, 8);
        if (!col.is_output(pb)) continue;
        const int64_t pixel = col.row * pb.q + col.vq;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if (k_rows[i] < pb.k) {
            store_as(pb.out, pb.out_dtype, pixel * pb.k + k_rows[i], acc[j * 4 + 2 * i + e] * rs.alpha + rs.bias[i]);
          }
        }
      }
    }
  }

  // Epilogue through shared memory, for 2-byte outputs with K % 8 == 0: the scaled accumulators
  // are written to a [BN pixels][BM + 8] tile over the stage buffers with stmatrix (transposed:
  // the fragment's channel rows become 16-byte pixel rows; the 8-element pad puts a matrix's 8
  // rows on distinct banks), then every 8 channels of a pixel leave with one 16-byte store
  // instead of 8 scattered 2-byte ones.
  template <typename T>
  static __device__ void epilogue_staged(const ConvProblem& pb, const Geometry& g, int64_t g0, int64_t k0,
                                         const float (&acc)[kAcc], uint8_t* smem) {
    constexpr int kPitch = kBM + 8;
    T* tile = reinterpret_cast<T*>(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rows = (warp / 4) * 64 + (warp % 4) * 16;  // the warp's 16 channels in the tile
    const int row0 = rows + lane / 4;
    const RowScale rs = row_scale(pb, k0 + row0);
    __syncthreads();  // every warp's wgmmas have retired: the stage buffers are free
    stmatrix_transposed<T, kBN / 8>(acc, rs.alpha, rs.bias, tile, kPitch, rows, lane);
    __syncthreads();
    constexpr int kChunks = kBM / 8;             // 16-byte pieces per pixel
    constexpr int kStep = kThreads / kChunks;    // pixels per pass (16)
    const int part = threadIdx.x % kChunks;
    const int64_t k = k0 + part * 8;
    if (k >= pb.k) return;
    T* out = static_cast<T*>(pb.out) + k;
    ColumnWalker col(g, g0 + threadIdx.x / kChunks);
#pragma unroll 4
    for (int j = threadIdx.x / kChunks; j < kBN; j += kStep) {
      if (col.is_output(pb)) {
        *reinterpret_cast<uint4*>(out + (col.row * pb.q + col.vq) * pb.k) =
            *reinterpret_cast<const uint4*>(tile + j * kPitch + part * 8);
      }
      col.advance(g, kStep);
    }
  }

  // Split-K across a cluster along z: CTAs 1.. leave their partial sums in their own shared
  // memory, CTA 0 adds them to its accumulators (in rank order) through distributed shared memory.
  // Returns whether this CTA holds the sums and runs the epilogue.
  static __device__ bool reduce_split_partials(float (&acc)[kAcc], uint8_t* smem) {
    float4* partial = reinterpret_cast<float4*>(smem);  // [kAcc / 4][kThreads], coalesced
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    __syncthreads();  // every warp's wgmmas have retired: the stage buffers are free
    if (rank != 0) {
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j) {
        partial[j * kThreads + threadIdx.x] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
    cluster.sync();
    if (rank == 0) {
      for (unsigned src = 1; src < cluster.num_blocks(); ++src) {
        const float4* remote = cluster.map_shared_rank(partial + threadIdx.x, src);
#pragma unroll
        for (int j = 0; j < kAcc / 4; ++j) {
          const float4 v = remote[j * kThreads];
          acc[4 * j] += v.x;
          acc[4 * j + 1] += v.y;
          acc[4 * j + 2] += v.z;
          acc[4 * j + 3] += v.w;
        }
      }
    }
    cluster.sync();  // CTA 0 has read every partial: the others may exit
    return rank == 0;
  }

  // nbuf (2 or 3) stage buffers in a ring; one barrier per stage: at the top of iteration i,
  // every thread has retired stage i-1's wgmmas, so its buffer takes stage i + nbuf - 1.
  // kSplit: the grid's z is a cluster of CTAs that each run the z-th of gridDim.z equal ranges of
  // the stages, and the partial sums meet in CTA 0 (its own instantiation: compiled into the
  // unsplit kernel, the split's code made that one up to 10 % slower).
  static __device__ void run(const ConvProblem& pb, const Geometry& g, int nbuf, bool staged) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const StageLayout L = stage_layout(pb, g, kBM);
    auto* table = reinterpret_cast<SlotEntry*>(smem + nbuf * L.total());
    const int64_t g0 = static_cast<int64_t>(blockIdx.x) * kBN;
    const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kBM;
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

    build_slot_table<kThreads>(pb, g, g0, table, threadIdx.x);
    __syncthreads();
    int first = 0, stages = pb.r * g.c_chunks;
    if constexpr (kSplit) {
      const int total = stages, splits = static_cast<int>(gridDim.z), z = static_cast<int>(blockIdx.z);
      first = total * z / splits;
      stages = total * (z + 1) / splits - first;
    }
    for (int i = 0; i < nbuf - 1; ++i) {
      if (i < stages) load_stage<kThreads>(pb, g, table, k0, first + i, smem + i * L.total(), L, threadIdx.x);
      cp_async_commit();
    }
    for (int i = 0; i < stages; ++i) {
      if (nbuf == 3) cp_async_wait<1>();
      else cp_async_wait<0>();
      fence_proxy_async();
      __syncthreads();
      const int next = i + nbuf - 1;
      compute_stage(pb, g, k0, smem + (i % nbuf) * L.total(), L, acc, [&] {
        if (next < stages) {
          load_stage<kThreads>(pb, g, table, k0, first + next, smem + (next % nbuf) * L.total(), L, threadIdx.x);
        }
        cp_async_commit();  // possibly empty: keeps one group per stage for the waits above
      });
    }
    if constexpr (kSplit) {
      cp_async_wait<0>();  // only empty groups remain; nothing may land in the buffers later
      if (!reduce_split_partials(acc, smem)) return;
    }
    if (staged) {
      cp_async_wait<0>();  // only empty groups remain; nothing may land in the tile later
      if (pb.out_dtype == DType::kF16) epilogue_staged<__half>(pb, g, g0, k0, acc, smem);
      else epilogue_staged<__nv_bfloat16>(pb, g, g0, k0, acc, smem);
    } else {
      epilogue(pb, g, g0, k0, acc);
    }
  }
};

template <ActKind kAct, int kBN, int kWGM, int kS, bool kSplit>
__global__ void __launch_bounds__(128 * kWGM, 1) conv_sm90_kernel(const ConvProblem pb, const Geometry g, int nbuf,
                                                                   bool staged) {
  Kernel<kAct, kBN, kWGM, kS, kSplit>::run(pb, g, nbuf, staged);
}

// ---------------------------------------------------------------------------------------------
// Warp-specialized persistent variant (bf16 activations, S in {1, 3, 5, 7}, 2-byte outputs;
// docs/conv.md).
//
// The register-A kernel above runs every part of a tile (slot table, loads, weight decode,
// wgmmas, epilogue) as one serial chain per warpgroup, and is bound by that chain's latency.
// Here producer warpgroups build the slot table and issue every stage's cp.async (the same
// stage layout and loads), while two consumer warpgroups only decode their weight fragments,
// issue wgmmas (the same compute_stage) and run the epilogue. Stages pass through a ring of
// mbarrier-guarded buffers; the CTA loops over tiles (one CTA per SM), so the producer loads the
// next tile while the consumers store this one. Consumer warpgroup w owns output channels
// 64w..64w+63 x all kBN pixels of the CTA tile. (Two consumers along the pixels instead, sharing
// 64 channels, decode the same weights twice: measured no faster than the register-A kernel.)
//
// kTma (C % 32 == 0, strides up to 8): one producer thread fills each stage with TMA copies
// instead, counted in bytes on the stage's full barrier: per phase array, two im2col copies (the
// tile's kBN slots and its halo; conv_sm90_schedule.h) whose walk across output rows and images,
// stepping by the conv's strides, replaces the slot table and ~2k cp.async a stage; one tiled
// copy of the codes of all S taps ([tap][row][32 bytes], rows past K and channels past C
// zero-filled); one bulk copy per tap's scale tile. The im2col copies write each pixel's 64
// channels as one 128-byte row in the 128-byte swizzle (8 rows to a 1024-byte atom): a pixel is
// one TMA request, where 8-channel columns of the no-swizzle layout took eight (56x56x64 b32 on an
// H200: 22.6 against 30.8 us). Tap s's B operand starts at its phase array, `shift` rows further,
// inside an atom (issue_tap_swizzled).
//
// kBM = 64 (TMA loads): 64 channels x kBN pixels a consumer, the two consumers splitting either
// - the pixels (K <= 64): each 64 channels x kBN pixels of a 2 * kBN pixel tile, decoding the same
//   64 weight rows (the 128-channel tile would leave half its MMAs on zero rows); or
// - the stages (kStageSplit): both on the same 64 x kBN tile, consumer w taking stages w, w + 2,
//   ..., and the two partial sums added through shared memory before the epilogue. Each
//   consumer's chain then holds half the tile's stages at the full pixel width, where the
//   128-channel tiles give both consumers every stage of a narrower tile (or split-K over a
//   cluster): the same MMAs with half the weight decodes per pixel.
//   With split-K too (kSplitK), the cluster's CTAs each take a range of the stages, and their
//   consumers alternate within it: the wider tiles' fewer decodes per pixel on one wave of CTAs.
template <int kBN, bool kTma, int kBM, bool kSplitK, int kS, bool kStageSplit>
struct WsKernel {
  static_assert(kS >= 1, "taps along W, known at compile time (the unrolled tap loop)");
  static constexpr int kConsumers = 2;
  static constexpr bool kPixelSplit = kBM == 64 && !kStageSplit;
  static_assert(kBM == 128 || kTma, "64-channel tiles with TMA loads");
  static_assert(!kStageSplit || kBM == 64, "the stage split on 64-channel tiles");
  static_assert(!kSplitK || kTma, "split-K over a cluster with TMA loads");
  static constexpr int kTileN = kPixelSplit ? 2 * kBN : kBN;  // pixels of a CTA tile
  using Mma = Kernel<ActKind::kBF16, kBN, kBM / 64, kS, false>;  // stage layout, loads, tap math
  // Producer warpgroups: two for cp.async loads where the consumers' registers allow (a
  // 512-thread CTA compiles to 128 registers a thread, too few for 256-pixel accumulators).
  static constexpr int kProducers = kTma || kBN == 256 ? 1 : 2;
  static constexpr int kLoaders = 128 * kProducers;
  static constexpr int kThreads = kLoaders + 128 * kConsumers;
  static constexpr int kAcc = Mma::kAcc;
  static_assert(kBN % 16 == 0, "stmatrix stores two 8-pixel column groups at a time");
  static constexpr int kEpiPitch = kWsEpiPitch;             // staged pixel row: 64 channels + pad
  static constexpr int kEpiBytes = kWsEpiBytes;
  // kStageSplit: where each consumer leaves the accumulators of the other's epilogue passes,
  // [kAcc][consumer thread] (WsLayout::partial_offset).
  static constexpr int kPartialBytes = kStageSplit ? ws_partial_bytes(kBN) : 0;
  // The threads whose arrival releases a stage: both consumers, or the one that used it.
  static constexpr int kReleaseThreads = kStageSplit ? 128 : 128 * kConsumers;
  // Named barriers (0 is __syncthreads): the cp.async producers' (1, in produce), then one per
  // consumer warpgroup, then both consumers' (leave_partials, add_other_partials).
  static constexpr int kConsumerBarrier0 = 2;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  // setmaxnreg moves registers from the producers, which only compute addresses, to the consumers
  // (with two producers too, where the kernel compiles to 128 a thread: 7-11 % faster on the H200).
  static constexpr int kProducerRegs = 56, kConsumerRegs = kProducers == 1 ? 224 : 160;
  static_assert(kProducerRegs * kLoaders + kConsumerRegs * 128 * kConsumers <= 65536, "the register file");

  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

  static __device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
  }

  // kSplitK: the gridDim.z CTAs of a cluster along z share one tile (the launcher gives every
  // cluster exactly one), CTA z running the z-th of gridDim.z equal ranges of its stages; their
  // partial sums meet in the epilogue (SplitSum). Its own instantiation: the split's code compiled
  // into the unsplit kernel made that one up to 20 % slower (H200).
  struct StageRange {
    int first, end;
  };
  static __device__ StageRange stage_range(int stages) {
    if constexpr (!kSplitK) return {0, stages};
    const int z = static_cast<int>(blockIdx.z), splits = static_cast<int>(gridDim.z);
    return {stages * z / splits, stages * (z + 1) / splits};
  }

  // Which epilogue passes a consumer finishes, and where it finds the partial sums of the others.
  // Pass p is this consumer's when p % owners == owner. Split-K: every CTA of the cluster leaves its
  // accumulators in its own (by then idle) shared memory, entry i of `thread` at
  // partial[i * stride + thread], and the owner of a pass adds the partials of all `splits` CTAs in
  // rank order (deterministic, and the same sum whichever CTA computes it).
  struct SplitSum {
    float* partial;
    int splits, owners, owner, thread, stride;
  };

  // Split-K over 128-channel tiles: CTA z finishes the passes p with p % splits == z.
  static __device__ SplitSum leave_partials(const float (&acc)[kAcc], uint8_t* smem, int thread) {
    constexpr int kConsumersBarrier = kConsumerBarrier0 + kConsumers;  // both consumer warpgroups
    named_sync(kConsumersBarrier, kConsumerThreads);  // both consumers' wgmmas have retired
    float* partial = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) partial[i * kConsumerThreads + thread] = acc[i];
    cg::this_cluster().sync();  // every CTA's partials are in place
    const int splits = static_cast<int>(gridDim.z), rank = static_cast<int>(blockIdx.z);
    return {partial, splits, splits, rank, thread, kConsumerThreads};
  }

  // kStageSplit: consumer w finishes the epilogue passes p with p % 2 == w. Each consumer leaves
  // its accumulators of the other's passes in the partial region, then adds those the other left
  // (two terms: the sum is the same whichever consumer adds). One instantiation per consumer, so
  // that which accumulators it keeps is known at compile time (with w at run time, each consumer
  // issued a predicated store, load and add for every accumulator: about twice the instructions
  // on the path that ends the kernel).
  template <int kW, int kPass>
  static __device__ __forceinline__ void exchange_partials(float (&acc)[kAcc], float* partial, int ct) {
    constexpr int kConsumersBarrier = kConsumerBarrier0 + kConsumers;  // both consumer warpgroups
    // acc[i] belongs to pixel 8 * (i / 4), so to epilogue pass 8 * (i / 4) / kPass.
    auto mine = [](int i) { return (i / 4) * 8 / kPass % kConsumers == kW; };
    named_sync(kConsumersBarrier, kConsumerThreads);  // the other has read the previous tile's
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      if (!mine(i)) partial[i * 128 + ct] = acc[i];
    }
    named_sync(kConsumersBarrier, kConsumerThreads);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      if (mine(i)) {
        acc[i] += partial[i * 128 + ct];
        // Split-K: the CTA's sum, for the cluster, where the other consumer no longer looks.
        if constexpr (kSplitK) partial[i * 128 + ct] = acc[i];
      }
    }
  }

  // kStageSplit: consumer w finishes the passes p with p % 2 == w; with split-K as well, those
  // with p / 2 % splits == z in CTA z, over the CTAs' sums that exchange_partials left.
  template <int kPass>
  static __device__ SplitSum add_other_partials(float (&acc)[kAcc], uint8_t* region, int w, int ct) {
    float* partial = reinterpret_cast<float*>(region);
    if (w == 0) exchange_partials<0, kPass>(acc, partial, ct);
    else exchange_partials<1, kPass>(acc, partial, ct);
    if constexpr (!kSplitK) {
      return {nullptr, 1, kConsumers, w, ct, 128};
    } else {
      cg::this_cluster().sync();  // every CTA's sums are in place
      const int splits = static_cast<int>(gridDim.z), rank = static_cast<int>(blockIdx.z);
      return {partial, splits, kConsumers * splits, w + kConsumers * rank, ct, 128};
    }
  }

  // A place in the stage ring: its buffer and the parity of its use (place / nbuf), advanced
  // without a division by the ring size (a run-time value; the divisions sat between the stages'
  // wgmma groups).
  struct RingPlace {
    int buf;
    uint32_t phase;
    static __device__ __forceinline__ RingPlace at(int place, int nbuf) {
      return {place % nbuf, static_cast<uint32_t>(place / nbuf) & 1u};
    }
    __device__ __forceinline__ void advance(int step, int nbuf) {  // step <= nbuf
      buf += step;
      if (buf >= nbuf) {
        buf -= nbuf;
        phase ^= 1u;
      }
    }
  };

  // Tile t's first virtual pixel and first output channel: tiles run pixel tile major, k_tiles
  // channel tiles to a pixel tile (indices below 2^31: the launch checks indices_fit_32).
  struct TileOrigin {
    int64_t g0, k0;
  };
  static __device__ __forceinline__ TileOrigin tile_origin(int tile, const FastDivide& k_tiles) {
    const uint32_t pixel_tile = k_tiles.quotient(tile);
    return {int64_t{pixel_tile} * kTileN, int64_t{tile - pixel_tile * k_tiles.divisor} * kBM};
  }
  static __device__ __forceinline__ int tile_count(const Geometry& g, const FastDivide& k_tiles) {
    return static_cast<int>(g.pixel_tiles) * static_cast<int>(k_tiles.divisor);
  }

  // The producers (and the consumers, below) set up before they wait for the grid before this one
  // (wait_for_prior_grids, before the first global memory access): that wait overlaps the
  // previous grid's last CTAs, which the serial index math of one thread would otherwise follow
  // (~1 us from the wait to the first copies at 7x7x512, H100).
  static __device__ void produce(const ConvProblem& pb, const Geometry& g, const WsLayout& L,
                                 const FastDivide& k_tiles, uint8_t* smem, uint64_t* full, uint64_t* empty) {
    const int tid = threadIdx.x;
    auto* table = reinterpret_cast<SlotEntry*>(smem + L.table_offset);
    const int tiles = tile_count(g, k_tiles);
    // A stage is signalled `lag` stages after its copies were issued, once they have landed and
    // this thread has fenced them (cp.async writes through the generic proxy; wgmma reads through
    // the async proxy), so up to lag + 1 stages of copies are in flight. lag <= nbuf - 2 keeps a
    // buffer for the consumers to work on while the producer waits.
    const int lag = L.nbuf >= 4 ? 2 : L.nbuf - 2;
    constexpr int kProducerBarrier = 1;
    const StageRange range = stage_range(pb.r * g.c_chunks);
    RingPlace load{0, 0}, signal{0, 0};  // the next stage to load, and the next to signal
    int loaded = 0, signalled = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const auto [g0, k0] = tile_origin(tile, k_tiles);
      named_sync(kProducerBarrier, kLoaders);  // the previous tile's loads have all read the table
      build_slot_table<kLoaders>(pb, g, g0, table, tid);
      named_sync(kProducerBarrier, kLoaders);
      if (tile == static_cast<int>(blockIdx.x)) wait_for_prior_grids();
      for (int st = range.first; st < range.end; ++st, ++loaded, load.advance(1, L.nbuf)) {
        Barrier::wait(&empty[load.buf], load.phase ^ 1u);
        Mma::template load_stage<kLoaders>(pb, g, table, k0, st, smem + load.buf * L.stage.total(), L.stage, tid);
        cp_async_commit();
        if (lag == 2) cp_async_wait<2>();
        else if (lag == 1) cp_async_wait<1>();
        else cp_async_wait<0>();
        if (loaded >= lag) {
          fence_proxy_async();  // this thread's copies, visible to the tensor cores
          Barrier::arrive(&full[signal.buf]);
          signal.advance(1, L.nbuf);
          ++signalled;
        }
      }
    }
    cp_async_wait<0>();
    fence_proxy_async();
    for (; signalled < loaded; ++signalled, signal.advance(1, L.nbuf)) Barrier::arrive(&full[signal.buf]);
  }

  // The TMA producer: thread 0 of the producer warpgroup issues every copy of every stage.
  static __device__ void produce_tma(const ConvProblem& pb, const Geometry& g, const WsLayout& L,
                                     const FastDivide& k_tiles, const WsTmaMaps& maps, uint8_t* smem, uint64_t* full,
                                     uint64_t* empty) {
    constexpr uint32_t kRowBytes = kChunkC * 2;  // one pixel's 64 channels
    constexpr uint32_t kSlotsBytes = kTileN * kRowBytes, kHaloBytes = kHaloPixels * kRowBytes;
    const uint32_t weight_bytes = L.stage.code_bytes + L.stage.scale_bytes;
    const uint64_t hint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
    const int64_t kb = pb.c / kBlockSize, scale_bytes = scale_matrix_bytes(pb.k, kb);
    const StageRange range = stage_range(pb.r * g.c_chunks);
    const int tiles = tile_count(g, k_tiles);
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const auto [g0, k0] = tile_origin(tile, k_tiles);
      const auto v0 = static_cast<uint32_t>(g0);
      const Im2colStart main = im2col_start(pb, g, v0), halo = im2col_start(pb, g, v0 + kTileN);
      const bool has_halo = loads_halo(g, g0, kTileN);
      const int64_t scale_tile = (k0 / kTileRows) * scale_k_tiles(kb);
      if (tile == static_cast<int>(blockIdx.x)) wait_for_prior_grids();
      RingPlace slot = RingPlace::at(it, L.nbuf);
      int r = range.first / g.c_chunks, cc = range.first % g.c_chunks;  // stage st's filter row, chunk
      // Not unrolled: two stages at a time spill past the producers' 56 registers (split-K).
#pragma unroll 1
      for (int st = range.first; st < range.end; ++st, ++it, slot.advance(1, L.nbuf)) {
        if (st > range.first && ++cc == g.c_chunks) {
          cc = 0;
          ++r;
        }
        const int buf = slot.buf;
        Barrier::wait(&empty[buf], slot.phase ^ 1u);
        const auto dh = static_cast<uint16_t>(r * pb.dil_h);
        uint8_t* stage = smem + buf * L.stage.total();
        uint64_t* bar = &full[buf];
        TxBarrier::arrive_and_expect_tx(bar, g.phases * (kSlotsBytes + (has_halo ? kHaloBytes : 0)) + weight_bytes);
        const int c = cc * kChunkC;
        // Phase f's array (slots a multiple of 8: it starts on an atom) walks from offset f along W.
        for (int f = 0; f < g.phases; ++f) {
          uint8_t* phase = stage + f * g.slots * kRowBytes;
          const auto fw = static_cast<uint16_t>(f);
          cute::SM90_TMA_LOAD_IM2COL_4D::copy(&maps.act, bar, phase, c, main.w, main.h, main.n, fw, dh);
          if (has_halo) {  // at slot kTileN, a multiple of 8: an atom boundary
            cute::SM90_TMA_LOAD_IM2COL_4D::copy(&maps.act_halo, bar, phase + kSlotsBytes, c, halo.w, halo.h, halo.n,
                                                fw, dh);
          }
        }
        uint8_t* codes = stage + L.stage.act_bytes;
        cute::SM90_TMA_LOAD_3D::copy(&maps.codes, bar, hint, codes, cc * kCodeRowBytes, static_cast<int32_t>(k0),
                                     r * kS);
        uint8_t* scales = codes + L.stage.code_bytes;
#pragma unroll
        for (int s = 0; s < kS; ++s) {
          const uint8_t* src = pb.wgt.scales + (static_cast<int64_t>(r) * kS + s) * scale_bytes +
                               (scale_tile + cc) * kTileBytes;
          cute::SM90_BULK_COPY_G2S::copy(src, bar, scales + s * kTileBytes, kTileBytes);
        }
      }
    }
  }

  // Stores the warpgroup's 64 channels x kBN pixels through its shared-memory tile, kPass
  // pixels per pass (the last pass takes the rest): stmatrix (transposed) into
  // [pixel][kEpiPitch], then one 16-byte store per 8 channels of a pixel.
  // Split-K or kStageSplit: only this consumer's passes (SplitSum); with split-K, over the sums of
  // the cluster's partials.
  template <int kPass, typename T>
  static __device__ void epilogue(const ConvProblem& pb, const Geometry& g, int64_t g0, int64_t k0,
                                  float (&acc)[kAcc], T* tile, int ct, int barrier, const SplitSum& split) {
    const int warp = ct / 32, lane = ct % 32;
    const int rows = warp * 16, row0 = rows + lane / 4;
    const RowScale rs = row_scale(pb, k0 + row0);  // from L1 (prefetch_row_scale)
    const int part = ct % 8;
    const int64_t k = k0 + part * 8;
    T* out = static_cast<T*>(pb.out) + k;
    auto pass = [&](int first, auto pixels) {
      constexpr int kPixels = decltype(pixels)::value;
      static_assert(kPixels % 16 == 0, "16 pixels a store round");
      if constexpr (kSplitK || kStageSplit) {
        if ((first / kPass) % split.owners != split.owner) return;
      }
      if constexpr (kSplitK) {
        cg::cluster_group cluster = cg::this_cluster();
        for (int r = 0; r < split.splits; ++r) {
          const float* part = cluster.map_shared_rank(split.partial, r) + split.thread;
#pragma unroll
          for (int i = (first / 8) * 4; i < (first + kPixels) / 8 * 4; ++i) {
            const float v = part[i * split.stride];
            acc[i] = r == 0 ? v : acc[i] + v;
          }
        }
      }
      named_sync(barrier, 128);  // the previous pass's reads of the tile are done
      stmatrix_transposed<T, kPixels / 8>(acc + (first / 8) * 4, rs.alpha, rs.bias, tile, kEpiPitch, rows, lane);
      named_sync(barrier, 128);
      if (k < pb.k) {
        ColumnWalker col = ColumnWalker::at32(g, static_cast<uint32_t>(g0 + first + ct / 8));
        // A trip count known at compile time (kPixels % 16 == 0), so the loop unrolls and the
        // rounds' shared-memory loads are issued together: a loop over j from ct / 8 did not
        // unroll, and its dependent rounds ended every tile (H100, kernel alone: the ResNet
        // stages 0-6 % faster). The 256-pixel tiles' accumulators leave registers for two rounds
        // at a time (with four, one of them spilled).
        constexpr int kRoundsInFlight = kAcc >= 128 ? 2 : kPixels / 16;
#pragma unroll(kRoundsInFlight)
        for (int jj = 0; jj < kPixels / 16; ++jj) {
          const int j = ct / 8 + 16 * jj;
          if (col.is_output(pb)) {
            *reinterpret_cast<uint4*>(out + (col.row * pb.q + col.vq) * pb.k) =
                *reinterpret_cast<const uint4*>(tile + j * kEpiPitch + part * 8);
          }
          col.advance(g, 16);
        }
      }
    };
#pragma unroll
    for (int first = 0; first + kPass <= kBN; first += kPass) {
      pass(first, std::integral_constant<int, kPass>{});
    }
    if constexpr (kBN % kPass != 0) pass(kBN - kBN % kPass, std::integral_constant<int, kBN % kPass>{});
  }

  // Split-K: the epilogue passes' width, so that the tile has a pass for every owner where it can
  // (each owner reads its passes' sums from every CTA of the cluster; with 64-pixel passes, a
  // 128-pixel tile split over four CTAs left all reads to two consumers of CTA 0). Narrower passes
  // cost their barriers, so the widest that gives every owner one. The wide tiles keep wider passes
  // (the 256-pixel stage-split kernels spilled 8 bytes with 32-pixel ones; 208-224 pixels were not
  // tried below 32).
  static constexpr int kMinPass = kBN >= 256 ? 64 : kBN >= 208 ? 32 : 16;
  static __device__ __forceinline__ int pass_pixels(int splits) {
    const int owners = kStageSplit ? kConsumers * splits : splits;
    for (int pass = kWsEpiPixels; pass > kMinPass; pass /= 2) {
      if ((kBN + pass - 1) / pass >= owners) return pass;
    }
    return kMinPass;
  }

  // The tile's epilogue after its partial sums are in place, kPass pixels a pass.
  template <int kPass>
  static __device__ __forceinline__ void finish_tile(const ConvProblem& pb, const Geometry& g, const WsLayout& L,
                                                     int64_t wg0, int64_t wk0, float (&acc)[kAcc], uint8_t* smem,
                                                     uint8_t* epi_tile, int w, int ct) {
    SplitSum split{};
    if constexpr (kStageSplit) split = add_other_partials<kPass>(acc, smem + L.partial_offset, w, ct);
    else if constexpr (kSplitK) split = leave_partials(acc, smem, 128 * w + ct);
    const int barrier = kConsumerBarrier0 + w;
    if (pb.out_dtype == DType::kF16) {
      epilogue<kPass>(pb, g, wg0, wk0, acc, reinterpret_cast<__half*>(epi_tile), ct, barrier, split);
    } else {
      epilogue<kPass>(pb, g, wg0, wk0, acc, reinterpret_cast<__nv_bfloat16*>(epi_tile), ct, barrier, split);
    }
  }

  // kTma: tap s's 4 wgmmas (64 channels) as one commit group, on the swizzled activations: pixel
  // rows 128 bytes apart, tap s in its phase array, `shift` rows further, k-step kk 32 bytes along
  // the row. The start then lies inside an atom for most shifts, and the descriptor's base offset
  // stays 0: the swizzle follows the absolute shared-memory address, as the TMA wrote it (on an
  // H200, a base offset of the start's row in its atom gave wrong sums; 0 gives the no-swizzle
  // kernel's sums bit for bit).
  static __device__ __forceinline__ void issue_tap_swizzled(const ConvProblem& pb, const Geometry& g, int s,
                                                            uint32_t act, const uint32_t (&frag)[4][4],
                                                            float (&acc)[kAcc]) {
    const Tap tap = tap_at(pb, g, s);
    const uint32_t b_tap = act + (tap.phase * g.slots + tap.shift) * (kChunkC * 2);
    const uint64_t desc = smem_descriptor_swizzle128(b_tap, kSwizzleAtomBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kChunkC / 16; ++kk) WgmmaRS<kBN>::run(acc, frag[kk], advance_descriptor(desc, kk * 32));
    wgmma_commit();
  }

  // One stage's taps, continuing the wgmma stream of the stage before (no drain between
  // stages): tap s decodes into fragment buffer (kParity + s) % 2, and the wait after each issue
  // retires the group before it. Stage st starts at parity (st * S) % 2, so the previous stage's
  // last tap runs in the other buffer while this stage's tap 0 decodes; `prev_retired` runs once
  // it has retired (that stage's buffer is then free).
  // `pixel0`: the consumer's first pixel in the CTA tile.
  template <int kParity, typename F>
  static __device__ __forceinline__ void stage_taps(const ConvProblem& pb, const Geometry& g, const uint8_t* smem,
                                                    const StageLayout& L, int row0, int tr0, int pixel0, uint32_t sel,
                                                    uint32_t (&frag)[2][4][4], float (&acc)[kAcc], F&& prev_retired) {
    const uint8_t* codes = smem + L.act_bytes;
    const uint8_t* scales = codes + L.code_bytes;
    const uint32_t act = smem_addr(smem) + pixel0 * (kTma ? kChunkC * 2 : 16);
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      Mma::decode_tap(s, codes, scales, row0, tr0, sel, frag[(kParity + s) % 2]);
      if constexpr (kTma) issue_tap_swizzled(pb, g, s, act, frag[(kParity + s) % 2], acc);
      else Mma::issue_tap(pb, g, s, act, frag[(kParity + s) % 2], acc);
      wgmma_wait<1>();
      if (s == 0) prev_retired();
    }
  }

  static __device__ void consume(const ConvProblem& pb, const Geometry& g, const WsLayout& L,
                                 const FastDivide& k_tiles, uint8_t* smem, uint64_t* full, uint64_t* empty, int w) {
    const int ct = threadIdx.x - kLoaders - 128 * w;  // thread in this warpgroup
    const int lane = ct % 32;
    // This thread's two weight rows in the CTA tile (as in Kernel::compute_stage) and the
    // consumer's pixels: rows 64w.. of all pixels, or all 64 rows of pixels kBN * w.. (pixel
    // split), or all 64 rows of all pixels (stage split).
    const int channel0 = kBM == 128 ? w * 64 : 0;  // the consumer's first channel in the tile
    const int row0 = channel0 + (ct / 32) * 16 + lane / 4;
    const int pixel0 = kPixelSplit ? w * kBN : 0;
    const uint32_t sel = (lane % 4) | ((4 + lane % 4) << 4);
    const StageRange range = stage_range(pb.r * g.c_chunks);
    const int stages = range.end - range.first;  // this CTA's, counted from 0 below
    const int tiles = tile_count(g, k_tiles);
    uint8_t* epi_tile = smem + L.epi_offset + w * kEpiBytes;
    float acc[kAcc];
    uint32_t frag[2][4][4];
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      // The ring place of the tile's first stage: every tile of the CTA runs `stages` (computed,
      // not carried across tiles: one register fewer, which the widest tilings need).
      const int it = (tile - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) * stages;
      const TileOrigin o = tile_origin(tile, k_tiles);
      const int tr0 = static_cast<int>(o.k0 % kTileRows) + row0;  // row in the scale tile
      // The epilogue's scales and bias, brought into L1 while the tile runs: once this consumer's
      // first stage has landed (the producer has waited for the grid before, so this wait returns
      // at once), or before the epilogue when it runs no stage.
      auto prefetch_scales = [&] {
        wait_for_prior_grids();
        prefetch_row_scale(pb, o.k0 + row0);
      };
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
      fence_accumulators(acc);
      // This consumer's stages of the tile: every one, or (kStageSplit) w, w + 2, ...; stage st
      // sits at place it + st of the ring. Its n-th own stage uses parity (n * S) % 2: two per
      // iteration keep the parities static, so ptxas sees that no in-flight wgmma's fragments
      // are overwritten. A stage is released once the consumer's next one has retired its wgmmas.
      const int first = kStageSplit ? w : 0, step = kStageSplit ? 2 : 1;
      RingPlace place = RingPlace::at(it + first, L.nbuf);  // of the consumer's next stage
      int prev_buf = 0;                                     // of its previous one
      auto run_stage = [&](int st, auto parity) {
        Barrier::wait(&full[place.buf], place.phase);
        if (st == first) prefetch_scales();
        const uint8_t* stage = smem + place.buf * L.stage.total();
        stage_taps<decltype(parity)::value>(pb, g, stage, L.stage, row0, tr0, pixel0, sel, frag, acc, [&] {
          if (st > first) Barrier::arrive(&empty[prev_buf]);
        });
        prev_buf = place.buf;
        place.advance(step, L.nbuf);
      };
      int st = first;
      for (; st + step < stages; st += 2 * step) {
        run_stage(st, std::integral_constant<int, 0>{});
        run_stage(st + step, std::integral_constant<int, kS % 2>{});
      }
      if (st < stages) run_stage(st, std::integral_constant<int, 0>{});
      wgmma_wait<0>();
      fence_accumulators(acc);
      if (stages > first) Barrier::arrive(&empty[prev_buf]);  // the last stage this consumer ran
      if (stages <= first) prefetch_scales();
      const int64_t wg0 = o.g0 + pixel0, wk0 = o.k0 + channel0;
      if constexpr (kSplitK) {
        const int pass = pass_pixels(static_cast<int>(gridDim.z));
        if (pass == kWsEpiPixels) {
          finish_tile<kWsEpiPixels>(pb, g, L, wg0, wk0, acc, smem, epi_tile, w, ct);
        } else if constexpr (kMinPass <= 32) {
          if (pass == 32) finish_tile<32>(pb, g, L, wg0, wk0, acc, smem, epi_tile, w, ct);
          else if constexpr (kMinPass == 16) finish_tile<16>(pb, g, L, wg0, wk0, acc, smem, epi_tile, w, ct);
        }
        cg::this_cluster().sync();  // the cluster has read this CTA's partials
      } else {
        finish_tile<kWsEpiPixels>(pb, g, L, wg0, wk0, acc, smem, epi_tile, w, ct);
      }
    }
  }

  static __device__ void run(const ConvProblem& pb, const Geometry& g, const WsLayout& L, const FastDivide& k_tiles,
                             const WsTmaMaps& maps) {
    extern __shared__ __align__(1024) uint8_t smem[];
    // The swizzle atoms of the TMA stages must start at 1024-byte boundaries (no static shared
    // memory precedes the dynamic one here).
    if (kTma && smem_addr(smem) % kSwizzleAtomBytes != 0) __trap();
    auto* full = reinterpret_cast<uint64_t*>(smem + L.barrier_offset);
    uint64_t* empty = full + L.nbuf;
    if (threadIdx.x == 0) {
      for (int i = 0; i < L.nbuf; ++i) {
        // TMA: the producer thread's arrival with the stage's byte count; cp.async: every
        // producer thread, after its fence.
        Barrier::init(&full[i], kTma ? 1 : kLoaders);
        Barrier::init(&empty[i], kReleaseThreads);  // each consumer thread that used it, its wgmmas retired
      }
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();
    // Programmatic dependent launch (launch_ex): this grid may start while the one before it in
    // the stream finishes. Each role runs wait_for_prior_grids, which returns once that grid has
    // completed and its writes are visible, after its set-up and before its first global memory
    // access (produce, produce_tma, consume). The next grid may launch at once: it waits the same
    // way for this one (its CTAs take SMs as this grid's CTAs leave them).
    allow_next_grid();
    const int wg = threadIdx.x / 128;
    if (wg < kProducers) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if constexpr (kTma) {
        if (threadIdx.x == 0) produce_tma(pb, g, L, k_tiles, maps, smem, full, empty);
      } else {
        produce(pb, g, L, k_tiles, smem, full, empty);
      }
      if constexpr (kSplitK) {  // the consumers' two cluster barriers (one tile per cluster)
        __syncwarp();
        cg::this_cluster().sync();
        cg::this_cluster().sync();
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(pb, g, L, k_tiles, smem, full, empty, wg - kProducers);
    }
  }
};

template <int kBN, bool kTma, int kBM, bool kSplitK, int kS, bool kStageSplit>
__global__ void __launch_bounds__(WsKernel<kBN, kTma, kBM, kSplitK, kS, kStageSplit>::kThreads, 1)
    conv_sm90_ws_kernel(const ConvProblem pb, const Geometry g, const WsLayout L, const FastDivide k_tiles,
                        const __grid_constant__ WsTmaMaps maps) {
  WsKernel<kBN, kTma, kBM, kSplitK, kS, kStageSplit>::run(pb, g, L, k_tiles, maps);
}

// Launches `kernel` with `smem` bytes of dynamic shared memory (raising its limit first): with
// `cluster_z`, the grid's z as one cluster; with `pdl`, as a programmatic dependent launch, for
// kernels that run griddepcontrol.wait before they touch global memory.
template <typename... Params, typename... Args>
cudaError_t launch_ex(void (*kernel)(Params...), dim3 grid, int threads, int smem, cudaStream_t stream, bool cluster_z,
                      bool pdl, Args&&... args) {
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const LaunchConfig launch(grid, dim3(threads), smem, stream, cluster_z ? grid.z : 0, pdl);
  return cudaLaunchKernelEx(&launch.cfg, kernel, std::forward<Args>(args)...);
}

// Whether the warp-specialized kernel can load `pb` with TMA: the im2col conditions of
// conv_sm90_schedule.h, code rows a multiple of 16 bytes (C % 32 == 0), 16-byte aligned x and codes.
bool ws_tma_supported(const ConvProblem& pb) {
  return im2col_loads_fit(pb, make_geometry(pb, 128)) && pb.c % 32 == 0 &&
         reinterpret_cast<uintptr_t>(pb.x) % 16 == 0 && reinterpret_cast<uintptr_t>(pb.wgt.codes) % 16 == 0;
}

}  // namespace
}  // namespace conv90
}  // namespace jax_nvfp4
