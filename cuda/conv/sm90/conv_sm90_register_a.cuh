// sm_90a shifted-operand convolution with NVFP4 weights (DESIGN.md §4, docs/conv.md): the
// register-A kernel, launched by conv_sm90.cu.
//
// One CTA computes BM output channels x BN virtual output pixels (conv_sm90_schedule.h) with
// BM/64 warpgroups. The contraction runs over pipeline stages (filter row r, 64 input channels;
// conv_sm90_stage.cuh), which cp.async brings into shared memory in a ring of 2 or 3 buffers.
// Every tap s then multiplies the same activations, its B descriptor advanced by 16 bytes per
// pixel of shift, by the tap's weights, which each thread dequantizes (e2m1 * e4m3, exact in
// bf16) straight into its wgmma A-operand registers while the previous tap's wgmmas run.
// The slot -> input pixel map of the tile is computed once per CTA into a shared-memory table.
// Small grids split the stages of each tile over a cluster of CTAs (split-K), whose partial sums
// meet in CTA 0 through distributed shared memory.
// Epilogue: alpha = s_dec_w (* s_dec_x), bias, conversion to the output dtype.
// The warp-specialized kernel (conv_sm90_ws_kernel.cuh) reuses its stage layout, loads and tap
// math; conv_sm90 picks between the two (choose_kernel).
#pragma once

#include "conv/sm90/conv_sm90_stage.cuh"

namespace jax_nvfp4 {
namespace conv90 {
namespace {

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

}  // namespace
}  // namespace conv90
}  // namespace jax_nvfp4
