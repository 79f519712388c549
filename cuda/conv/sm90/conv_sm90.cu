// sm_90a shifted-operand convolution with NVFP4 weights (DESIGN.md §4, docs/conv.md).
//
// One CTA computes BM output channels x BN virtual output pixels (conv_sm90_schedule.h) with
// BM/64 warpgroups. The contraction runs over pipeline stages (filter row r, 64 input channels);
// each stage brings into shared memory, with cp.async, double-buffered:
//   * the activations of the tile's input rows for filter row r: stride_w phase arrays of
//     `slots` pixels x 64 channels, bf16, in the wgmma no-swizzle K-major layout
//     [phase][8-channel column][slot][8 channels] (16 bytes per slot, so one pixel is one
//     16-byte core-matrix row);
//   * the packed E2M1 codes and the 512-byte E4M3 scale tile of the weights of all S taps.
// Every tap s then multiplies the same activations, its B descriptor advanced by 16 bytes per
// pixel of shift, by the tap's weights, which each thread dequantizes (e2m1 * e4m3, exact in
// bf16) straight into its wgmma A-operand registers. Epilogue: alpha = s_dec_w (* s_dec_x),
// bias, conversion to the output dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/nvfp4_decode.cuh"
#include "common/scale_layout.h"
#include "conv/sm90/conv_sm90.h"
#include "conv/sm90/conv_sm90_schedule.h"
#include "conv/sm90/wgmma_rs.cuh"

namespace jax_nvfp4 {
namespace conv90 {
namespace {

enum class ActKind { kBF16, kF16, kF32, kNvfp4 };

constexpr int kStages = 2;
constexpr int kCodeRowBytes = kChunkC / 2;  // 32 bytes of packed codes per weight row per stage

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

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <typename T>
__device__ __forceinline__ float load_float(const T* p) {
  if constexpr (std::is_same_v<T, float>) return *p;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(*p);
  else return __bfloat162float(*p);
}

__device__ __forceinline__ float read_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  }
}

__device__ __forceinline__ void store_out(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = v; break;
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
    default: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
  }
}

// Shared-memory bytes of one pipeline stage.
struct StageLayout {
  int act_bytes, code_bytes, scale_bytes;
  NVFP4_HD int total() const { return act_bytes + code_bytes + scale_bytes; }
};

NVFP4_HD StageLayout stage_layout(const ConvProblem& pb, const Geometry& g, int bm) {
  return StageLayout{g.phases * (kChunkC / 8) * g.slots * 16, pb.s * bm * kCodeRowBytes,
                     pb.s * kTileBytes};
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
        v = make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]),
                       pack_bf16(f[6], f[7]));
      }
    }
    *reinterpret_cast<uint4*>(dst) = v;
  }
}

template <ActKind kAct, int kBN, int kWGM>
struct Kernel {
  static constexpr int kBM = 64 * kWGM;
  static constexpr int kThreads = 128 * kWGM;
  static constexpr int kAcc = kBN / 2;  // f32 accumulators per thread (64 x kBN per warpgroup)

  // Issues the loads of stage `it` (filter row r, channel chunk cc) into buffer `smem`.
  static __device__ void load_stage(const ConvProblem& pb, const Geometry& g, int64_t g0,
                                    int64_t k0, int it, uint8_t* smem, const StageLayout& L) {
    const int r = it / g.c_chunks, cc = it % g.c_chunks;
    const int64_t c_base = static_cast<int64_t>(cc) * kChunkC;
    // Activations: thread-consecutive 8-channel columns of one slot, so global reads of a pixel
    // are contiguous and the 8 shared-memory columns (slots*16 bytes apart, slots odd) hit
    // distinct banks.
    const int act_chunks = g.phases * g.slots * (kChunkC / 8);
    for (int id = threadIdx.x; id < act_chunks; id += kThreads) {
      const int c8 = id % (kChunkC / 8), rest = id / (kChunkC / 8);
      const int slot = rest % g.slots, phase = rest / g.slots;
      int64_t n = 0, h = 0, w = 0;
      const int64_t c = c_base + c8 * 8;
      const bool valid = c < pb.c && slot_source(pb, g, g0, phase, slot, r, &n, &h, &w);
      uint8_t* dst = smem + ((phase * (kChunkC / 8) + c8) * g.slots + slot) * 16;
      load_act_chunk<kAct>(pb, dst, valid, n, h, w, c);
    }
    // Weight codes: kBM rows x 32 bytes per tap, in 8-byte pieces (C/2 is a multiple of 8).
    uint8_t* codes = smem + L.act_bytes;
    const int64_t row_bytes = pb.c / 2;
    const int code_chunks = pb.s * kBM * (kCodeRowBytes / 8);
    for (int id = threadIdx.x; id < code_chunks; id += kThreads) {
      const int part = id % (kCodeRowBytes / 8), rest = id / (kCodeRowBytes / 8);
      const int row = rest % kBM, s = rest / kBM;
      const int64_t k = k0 + row, byte = c_base / 2 + part * 8;
      const bool valid = k < pb.k && byte < row_bytes;
      const uint8_t* src = pb.wgt.codes + ((static_cast<int64_t>(r) * pb.s + s) * pb.k + k) * row_bytes + byte;
      cp_async<8>(codes + (s * kBM + row) * kCodeRowBytes + part * 8, valid ? src : pb.wgt.codes, valid);
    }
    // Weight scales: the one 512-byte tile of (rows k0 / 128, channel chunk cc) of every tap.
    uint8_t* scales = codes + L.code_bytes;
    const int64_t kb = pb.c / kBlockSize;
    const int64_t tile = (k0 / kTileRows) * scale_k_tiles(kb) + cc;
    for (int id = threadIdx.x; id < pb.s * (kTileBytes / 16); id += kThreads) {
      const int part = id % (kTileBytes / 16), s = id / (kTileBytes / 16);
      const uint8_t* src = pb.wgt.scales + (static_cast<int64_t>(r) * pb.s + s) * scale_matrix_bytes(pb.k, kb) +
                           tile * kTileBytes + part * 16;
      cp_async<16>(scales + s * kTileBytes + part * 16, src, true);
    }
  }

  // The A fragment of k-step kk (16 channels) for this thread's rows: bytes kk*8 + t and
  // kk*8 + 4 + t of each row's 32 code bytes hold channels (2t, 2t+1) and (2t+8, 2t+9).
  static __device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const uint4 (&c0)[2],
                                                    const uint4 (&c1)[2], float s0, float s1,
                                                    int kk, int t) {
    const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&c0[0]);
    const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&c1[0]);
    const int shift = 8 * t;
    a[0] = decode_pair((w0[2 * kk] >> shift) & 0xFF, s0);
    a[1] = decode_pair((w1[2 * kk] >> shift) & 0xFF, s1);
    a[2] = decode_pair((w0[2 * kk + 1] >> shift) & 0xFF, s0);
    a[3] = decode_pair((w1[2 * kk + 1] >> shift) & 0xFF, s1);
  }

  // Dequantizes the 4 A fragments (64 channels) of tap s into `frag`, then issues the tap's 4
  // wgmmas back to back as one commit group.
  static __device__ __forceinline__ void issue_tap(const ConvProblem& pb, const Geometry& g, int s,
                                                   const uint8_t* codes, const uint8_t* scales,
                                                   uint32_t act, int row0, int tr0, int t,
                                                   uint32_t (&frag)[4][4], float (&acc)[kAcc]) {
    const int row1 = row0 + 8, tr1 = tr0 + 8;
    const uint4* p0 = reinterpret_cast<const uint4*>(codes + (s * kBM + row0) * kCodeRowBytes);
    const uint4* p1 = reinterpret_cast<const uint4*>(codes + (s * kBM + row1) * kCodeRowBytes);
    const uint4 c0[2] = {p0[0], p0[1]}, c1[2] = {p1[0], p1[1]};
    const uint32_t sc0 = *reinterpret_cast<const uint32_t*>(scales + s * kTileBytes + (tr0 % 32) * 16 + (tr0 / 32) * 4);
    const uint32_t sc1 = *reinterpret_cast<const uint32_t*>(scales + s * kTileBytes + (tr1 % 32) * 16 + (tr1 / 32) * 4);
#pragma unroll
    for (int kk = 0; kk < kChunkC / 16; ++kk) {
      a_fragment(frag[kk], c0, c1, e4m3_to_float((sc0 >> (8 * kk)) & 0xFF),
                 e4m3_to_float((sc1 >> (8 * kk)) & 0xFF), kk, t);
    }
    const Tap tap = tap_of(pb, s);
    const uint32_t lead = g.slots * 16;  // next 8-channel column (K direction)
    const uint32_t b_tap = act + ((tap.phase * (kChunkC / 8)) * g.slots + tap.shift) * 16;
    wgmma_fence();
    fence_accumulators(acc);
#pragma unroll
    for (int kk = 0; kk < kChunkC / 16; ++kk) {
      WgmmaRS<kBN>::run(acc, frag[kk], smem_descriptor(b_tap + 2 * kk * lead, lead, 128));
    }
    wgmma_commit();
    wgmma_wait<1>();  // the previous tap's group is done: its fragment buffer may be rewritten
    fence_accumulators(acc);
  }

  static __device__ void compute_stage(const ConvProblem& pb, const Geometry& g, int64_t k0,
                                       const uint8_t* smem, const StageLayout& L,
                                       float (&acc)[kAcc]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = (warp / 4) * 64 + (warp % 4) * 16 + lane / 4;  // row in the tile
    const int tr0 = static_cast<int>(k0 % kTileRows) + row0;         // row in the scale tile
    const uint8_t* codes = smem + L.act_bytes;
    const uint8_t* scales = codes + L.code_bytes;
    const uint32_t act = smem_addr(smem);
    // Two fragment buffers, alternating between taps, so decoding tap s+1 overlaps tap s's MMAs.
    uint32_t frag_a[4][4], frag_b[4][4];
    for (int s = 0; s < pb.s; s += 2) {
      issue_tap(pb, g, s, codes, scales, act, row0, tr0, lane % 4, frag_a, acc);
      if (s + 1 < pb.s) issue_tap(pb, g, s + 1, codes, scales, act, row0, tr0, lane % 4, frag_b, acc);
    }
  }

  static __device__ void epilogue(const ConvProblem& pb, const Geometry& g, int64_t g0, int64_t k0,
                                  const float (&acc)[kAcc]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g8 = lane / 4, t = lane % 4;
    const int64_t k_rows[2] = {k0 + (warp / 4) * 64 + (warp % 4) * 16 + g8,
                               k0 + (warp / 4) * 64 + (warp % 4) * 16 + g8 + 8};
    float alpha = *pb.wgt.s_dec;
    if (pb.x_is_nvfp4) alpha *= *pb.x_q.s_dec;
    float bias[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (pb.bias != nullptr && k_rows[i] < pb.k) bias[i] = read_as_float(pb.bias, pb.bias_dtype, k_rows[i]);
    }
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
            store_out(pb.out, pb.out_dtype, pixel * pb.k + k_rows[i], acc[j * 4 + 2 * i + e] * alpha + bias[i]);
          }
        }
      }
    }
  }

  static __device__ void run(const ConvProblem& pb, const Geometry& g) {
    extern __shared__ __align__(128) uint8_t smem[];
    const StageLayout L = stage_layout(pb, g, kBM);
    const int64_t g0 = static_cast<int64_t>(blockIdx.x) * kBN;
    const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kBM;
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

    const int stages = pb.r * g.c_chunks;
    load_stage(pb, g, g0, k0, 0, smem, L);
    cp_async_commit();
    for (int it = 0; it < stages; ++it) {
      uint8_t* buf = smem + (it % kStages) * L.total();
      if (it + 1 < stages) {
        load_stage(pb, g, g0, k0, it + 1, smem + ((it + 1) % kStages) * L.total(), L);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      fence_proxy_async();
      __syncthreads();
      compute_stage(pb, g, k0, buf, L, acc);
      wgmma_wait<0>();
      fence_accumulators(acc);
      __syncthreads();  // buffer `it` may be refilled by the next iteration's loads
    }
    epilogue(pb, g, g0, k0, acc);
  }
};

template <ActKind kAct, int kBN, int kWGM>
__global__ void __launch_bounds__(128 * kWGM, 1) conv_sm90_kernel(const ConvProblem pb, const Geometry g) {
  Kernel<kAct, kBN, kWGM>::run(pb, g);
}

template <ActKind kAct, int kBN, int kWGM>
cudaError_t launch(const ConvProblem& pb, cudaStream_t stream, int max_smem) {
  const Geometry g = make_geometry(pb, kBN);
  const int smem = kStages * stage_layout(pb, g, 64 * kWGM).total();
  if (smem > max_smem) return cudaErrorInvalidValue;
  auto* kernel = conv_sm90_kernel<kAct, kBN, kWGM>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(g.pixel_tiles), static_cast<unsigned>(ceil_div(pb.k, 64 * kWGM)));
  kernel<<<grid, 128 * kWGM, smem, stream>>>(pb, g);
  return cudaGetLastError();
}

int device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&value, attr, device);
  return value;
}

}  // namespace
}  // namespace conv90

cudaError_t conv_sm90(const ConvProblem& p, cudaStream_t stream) {
  using namespace conv90;
  if (p.n * p.p * p.q == 0 || p.k == 0) return cudaSuccess;
  const int max_smem = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  // One warpgroup per CTA when K fits in 64 channels, or when 128-channel tiles would give fewer
  // CTAs than two per SM (more, smaller CTAs keep every SM busy).
  const bool narrow = p.k <= 64 || make_geometry(p, 128).pixel_tiles * ceil_div(p.k, 128) < 2 * sms;
  if (p.x_is_nvfp4) {
    return narrow ? launch<ActKind::kNvfp4, 128, 1>(p, stream, max_smem)
                  : launch<ActKind::kNvfp4, 128, 2>(p, stream, max_smem);
  }
  if (p.x_dtype == DType::kF32) {
    return narrow ? launch<ActKind::kF32, 128, 1>(p, stream, max_smem)
                  : launch<ActKind::kF32, 128, 2>(p, stream, max_smem);
  }
  if (p.x_dtype == DType::kF16) {
    return narrow ? launch<ActKind::kF16, 128, 1>(p, stream, max_smem)
                  : launch<ActKind::kF16, 128, 2>(p, stream, max_smem);
  }
  // bf16: 256-pixel tiles when they still give every SM two CTAs (more reuse per weight decode).
  const int64_t k_tiles = ceil_div(p.k, narrow ? 64 : 128);
  const bool wide = make_geometry(p, 256).pixel_tiles * k_tiles >= 2 * sms;
  if (wide) {
    const cudaError_t err = narrow ? launch<ActKind::kBF16, 256, 1>(p, stream, max_smem)
                                   : launch<ActKind::kBF16, 256, 2>(p, stream, max_smem);
    if (err != cudaErrorInvalidValue) return err;
  }
  return narrow ? launch<ActKind::kBF16, 128, 1>(p, stream, max_smem)
                : launch<ActKind::kBF16, 128, 2>(p, stream, max_smem);
}

}  // namespace jax_nvfp4
