// sm_90a shifted-operand convolution with NVFP4 weights (DESIGN.md §4, docs/conv.md): what its
// two kernels share. A pipeline stage (filter row r, 64 input channels) holds, in shared memory:
//   * the activations of the tile's input rows for filter row r: stride_w phase arrays of
//     `slots` pixels x 64 channels, bf16, in the wgmma no-swizzle K-major layout
//     [phase][8-channel column][slot][8 channels] (16 bytes per slot, so one pixel is one
//     16-byte core-matrix row), or, loaded by TMA, as 128-byte pixel rows in the 128-byte swizzle;
//   * the packed E2M1 codes and the 512-byte E4M3 scale tile of the weights of all S taps.
// Here: the stage layout, the slot table and the cp.async activation loads, the exact
// e2m1 x e4m3 -> bf16 decode, the epilogue's per-channel scale and bias, and the launch helper.
// The kernels: conv_sm90_register_a.cuh and conv_sm90_ws_kernel.cuh.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

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

}  // namespace
}  // namespace conv90
}  // namespace jax_nvfp4
