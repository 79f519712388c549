// sm_90a shifted-operand convolution with NVFP4 weights (DESIGN.md §4, docs/conv.md): the
// warp-specialized persistent kernel, launched by conv_sm90_ws_launch.cuh (compiled once per
// filter width S, conv_sm90_ws_s<S>.cu), and the shared-memory layout and TMA conditions that
// conv_sm90.cu's choice also reads.
#pragma once

#include <cstdint>

#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cuda_host_adapter.hpp"
#include "conv/sm90/conv_sm90_register_a.cuh"

namespace jax_nvfp4 {
namespace conv90 {
namespace {

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
  // Split-K over two CTAs with the stage split, where the launcher found room: the inbox into
  // which the other CTA pushes its sums (WsKernel::push_sums); 0 where the owners read them
  // through the cluster window instead.
  int inbox_offset = 0;
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

// One consumer's inbox for split-K over two CTAs with the stage split: the floats a thread owns
// in its epilogue passes (pass p is owner p % 4's; `pass` pixels a pass, 4 floats per 8 pixels).
constexpr int ws_inbox_bytes(int bn, int pass) { return (bn + 4 * pass - 1) / (4 * pass) * (pass / 2) * 128 * 4; }

// Whether split-K over two CTAs with the stage split pushes its sums into an inbox
// (WsKernel::push_sums) on tiles of `bn` pixels for filters `s` taps wide: not the 256-pixel tiles
// of 1-wide filters, whose registers spilled with it (4 local-memory instructions); they keep the
// cluster reads. The launcher asks this too, before it gives the split kernel an inbox.
constexpr bool ws_stage_split_pushes(int bn, int s) { return !(bn == 256 && s == 1); }

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

// Whether the warp-specialized kernel can load `pb` with TMA: the im2col conditions of
// conv_sm90_schedule.h, code rows a multiple of 16 bytes (C % 32 == 0), 16-byte aligned x and codes.
bool ws_tma_supported(const ConvProblem& pb) {
  return im2col_loads_fit(pb, make_geometry(pb, 128)) && pb.c % 32 == 0 &&
         reinterpret_cast<uintptr_t>(pb.x) % 16 == 0 && reinterpret_cast<uintptr_t>(pb.wgt.codes) % 16 == 0;
}

// The warp-specialized kernel (bf16 activations, S in {1, 3, 5, 7}, 2-byte outputs; docs/conv.md).
//
// The register-A kernel (conv_sm90_register_a.cuh) runs every part of a tile (slot table, loads, weight decode,
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
  // With an inbox (two CTAs, the stage split: push_sums), the owner adds the other CTA's sums
  // from its own shared memory, [float4 slot][thread], once `inbox_full` has counted their bytes.
  struct SplitSum {
    float* partial;
    int splits, owners, owner, thread, stride;
    const float4* inbox = nullptr;
    uint64_t* inbox_full = nullptr;
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
  static __device__ __forceinline__ void exchange_partials(float (&acc)[kAcc], float* partial, int ct, bool push) {
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
        if (kSplitK && !push) partial[i * 128 + ct] = acc[i];
      }
    }
  }

  // kStageSplit: consumer w finishes the passes p with p % 2 == w; with split-K as well, those
  // with p / 2 % splits == z in CTA z, over the CTAs' sums that exchange_partials left.
  template <int kPass>
  static __device__ SplitSum add_other_partials(float (&acc)[kAcc], uint8_t* smem, const WsLayout& L, int w,
                                                int ct) {
    float* partial = reinterpret_cast<float*>(smem + L.partial_offset);
    const bool push = pushes_sums(L);
    if (w == 0) exchange_partials<0, kPass>(acc, partial, ct, push);
    else exchange_partials<1, kPass>(acc, partial, ct, push);
    if constexpr (!kSplitK) {
      return {nullptr, 1, kConsumers, w, ct, 128};
    } else {
      const int splits = static_cast<int>(gridDim.z), rank = static_cast<int>(blockIdx.z);
      const int owner = w + kConsumers * rank;
      if (!push) {
        cg::this_cluster().sync();  // every CTA's sums are in place
        return {partial, splits, kConsumers * splits, owner, ct, 128};
      }
      if (w == 0) push_sums<0, kPass>(acc, smem, L, ct);
      else push_sums<1, kPass>(acc, smem, L, ct);
      uint8_t* inbox = smem + L.inbox_offset;
      auto* full = reinterpret_cast<uint64_t*>(inbox + kConsumers * ws_inbox_bytes(kBN, kPass)) + w;
      if (ct == 0) TxBarrier::arrive_and_expect_tx(full, owned_floats<kPass>(owner) * 128 * 4);
      return {nullptr, splits, kConsumers * splits, owner, ct, 128,
              reinterpret_cast<const float4*>(inbox + w * ws_inbox_bytes(kBN, kPass)), full};
    }
  }

  // Split-K over two CTAs with the stage split, where the launcher gave an inbox
  // (WsLayout::inbox_offset): after the exchange within the CTA, consumer w pushes the CTA's sums
  // of the passes the other CTA owns straight into that CTA's inbox (st.async, each store counted
  // on the owner's mbarrier), so no cluster barrier waits for the slower CTA and no owner reads
  // through the cluster window (H100, kernel alone, 7x7x512 b32 17.1 -> 15.8 us). The owner adds
  // them to its own: two terms, so the bits of the rank-order sum either way.
  static constexpr bool kPushes = kSplitK && kStageSplit && ws_stage_split_pushes(kBN, kS);
  static __device__ __forceinline__ bool pushes_sums(const WsLayout& L) { return kPushes && L.inbox_offset != 0; }
  template <int kPass>
  static __device__ __forceinline__ int owned_floats(int owner) {  // a thread's, passes p % 4 == owner
    int floats = 0;
#pragma unroll
    for (int first = 0; first < kBN; first += kPass) {
      if ((first / kPass) % 4 == owner) floats += min(kPass, kBN - first) / 8 * 4;
    }
    return floats;
  }
  template <int kW, int kPass>
  static __device__ __forceinline__ void push_sums(const float (&acc)[kAcc], uint8_t* smem, const WsLayout& L,
                                                   int ct) {
    const int rank = static_cast<int>(blockIdx.z);
    const uint32_t other = 1u - static_cast<uint32_t>(rank);
    const uint32_t inbox = smem_addr(smem + L.inbox_offset);
    uint32_t box, full;  // the other CTA's: consumer kW's inbox and its barrier
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(box) : "r"(inbox + kW * ws_inbox_bytes(kBN, kPass)), "r"(other));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(full) : "r"(inbox + kConsumers * ws_inbox_bytes(kBN, kPass) + 8 * kW), "r"(other));
    cute::cluster_wait();  // the other CTA's inbox barriers are initialized (run)
    // The owner's passes p, p + 4, ... fill its inbox in order, kPass / 8 float4 slots each.
    int slot = 0;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {  // acc[4j .. 4j + 3]: pixels 8j .. 8j + 7
      const int p = j * 8 / kPass;
      if (p % kConsumers != kW || (p / kConsumers) % 2 == rank) continue;  // the other consumer's, or ours
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                   ::"r"(box + (slot * 128 + ct) * 16), "f"(acc[4 * j]), "f"(acc[4 * j + 1]), "f"(acc[4 * j + 2]),
                   "f"(acc[4 * j + 3]), "r"(full) : "memory");
      ++slot;
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
      if (kSplitK && split.inbox != nullptr) {
        TxBarrier::wait(split.inbox_full, 0);
        const float4* box = split.inbox + (first / kPass) / 4 * (kPass / 8) * 128 + split.thread;
#pragma unroll
        for (int j = first / 8; j < (first + kPixels) / 8; ++j) {
          const float4 v = box[(j - first / 8) * 128];
          acc[4 * j] += v.x;
          acc[4 * j + 1] += v.y;
          acc[4 * j + 2] += v.z;
          acc[4 * j + 3] += v.w;
        }
      } else if constexpr (kSplitK) {
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
  static constexpr int pass_pixels(int splits) {
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
    if constexpr (kStageSplit) split = add_other_partials<kPass>(acc, smem, L, w, ct);
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
        if (!pushes_sums(L)) cg::this_cluster().sync();  // the cluster has read this CTA's partials
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
      if (pushes_sums(L)) {  // the inboxes' barriers: the owner's expected bytes, then the stores'
        auto* inbox_full = reinterpret_cast<uint64_t*>(smem + L.inbox_offset +
                                                       kConsumers * ws_inbox_bytes(kBN, pass_pixels(2)));
        for (int w = 0; w < kConsumers; ++w) TxBarrier::init(&inbox_full[w], 1);
      }
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();
    // Pushed sums: the other CTA stores into this one's inboxes once it has seen this arrival.
    if (pushes_sums(L)) cute::cluster_arrive_relaxed();
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
      if constexpr (kSplitK) {  // the consumers' cluster barriers (one tile per cluster)
        __syncwarp();
        if (pushes_sums(L)) {
          cute::cluster_wait();
        } else {
          cg::this_cluster().sync();
          cg::this_cluster().sync();
        }
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

}  // namespace
}  // namespace conv90
}  // namespace jax_nvfp4
