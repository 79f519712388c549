// Hopper (sm_90a) NVFP4 GEMM: three kernel families behind one launcher.
//
//   decode   small M, memory-bound: streams the 4.5-bit weights, dequantizes them in registers
//            and multiplies on the tensor cores with mma.sync (weights as the 16-row A operand,
//            the few activation rows as B), split-K across a thread-block cluster reduced
//            through distributed shared memory (deterministic, no workspace).
//   fused    mid M: the weights are dequantized in the main loop straight into wgmma A-operand
//            registers (never written back as bf16), the activations, staged once per call in
//            the workspace in the matching K order, are the shared-memory B operand.
//   fused_ws large M: the fused kernel's math, warp-specialized (a producer warp feeds an
//            mbarrier ring with bulk and cp.async copies; two consumer warpgroups dequantize and
//            issue wgmma) and persistent over the output tiles of 128 weight rows x 128 staged
//            activation rows, or 256 (fused_ws_wide: each decoded weight fragment feeds twice the
//            MMA work); where the tiles are few, split-K over a cluster instead.
//   prefill  large M, compute-bound: one pass dequantizes the weights to bf16 in the workspace
//            (and converts x when it is not bf16), then CUTLASS's TMA warp-specialized
//            persistent wgmma GEMM runs with alpha and bias in its epilogue.
//
// Host-only declarations: the FFI handler (compiled with the host compiler) includes this.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gemm/gemm_problem.h"

namespace jax_nvfp4 {

enum class GemmSm90Path : int {
  kDecode = 0, kPrefill = 1, kFused = 2, kFusedWs = 3, kFusedWsWide = 4, kFusedWsNarrow = 5
};

// The path gemm_sm90 takes for M activation rows (docs/gemm_hopper.md has the measurements
// behind every bound): decode for M <= kGemmSm90DecodeMaxM (there the weights' bytes dominate:
// 4.5 bits of weight read per 2*M flops); fused up to kGemmSm90FusedMt64MaxM (its 64-row
// activation tile), and beyond while the 128 x 128 output tiles number at most half the SMs (its
// split-K fills the GPU); otherwise fused_ws up to kGemmSm90FusedWsMaxM, and up to
// kGemmSm90OneWaveMaxM while its tiles fit one wave; prefill beyond. Before those, from
// kGemmSm90FusedMaxM to kGemmSm90WideMaxM: fused_ws_wide where its 128 x 256 tiles number more
// than half the SMs (from kGemmSm90WideSplitMinM with K > kGemmSm90MidKMaxK, more than 30% of
// them: it splits K over a cluster where they are few), on weights of more than
// kGemmSm90Decode32Weights elements with K > kGemmSm90ShortKMaxK that are not narrow and long
// (below).
// Small weights (N * K elements) shift the bounds, since the fused kernels' fixed costs
// (activation staging, the cluster split) outweigh the dequantization pass they save: up to
// kGemmSm90PrefillWeights prefill past decode's M; up to kGemmSm90Decode64Weights decode to
// M = 64, then prefill; up to kGemmSm90Decode32Weights (kGemmSm90Decode32LongKWeights where
// K > kGemmSm90ShortKMaxK) decode to M = 32, and larger ones with K > kGemmSm90ShortKMaxK too
// where N <= kGemmSm90Decode32MaxN: few 16-row tiles, so the decode kernel's warp split takes 4 K
// parts or more (4096 x 14336 at M = 24 and 32: 27.0 and 28.7 us against fused's 32.9 and 33.4 on
// an H200; 14336 x 4096, whose 896 tiles leave the warp split one part, stays on fused: decode
// 30.3 and 33.1 against 27.0 and 27.2). Where the fused kernel
// would take its few tiles past M = 64, prefill does instead on weights up to
// kGemmSm90Decode32Weights with K <= kGemmSm90MidKMaxK (fused_ws on larger ones), and past
// M = kGemmSm90FusedMaxM on weights up to kGemmSm90FewTilesPrefillWeights.
// The shape of the weights shifts them too: with K <= kGemmSm90ShortKMaxK (8 chunks of K or
// fewer a tile) the fused kernel leads only on its 64-row activation tile: it takes M <=
// kGemmSm90FusedMt64MaxM and fused_ws the rest to M = kGemmSm90FusedWsMaxM where
// N >= kGemmSm90ShortKFusedWsMinN, prefill where N is smaller, except that decode keeps
// M <= 64 where K > kGemmSm90ShortKDecodeMinK and the weights number more than
// kGemmSm90ShortKDecodeMinWeights and up to kGemmSm90ShortKDecodeMaxWeights (there fused_ws has
// at most 32 tiles of long K); and narrow, long weights (N <= kGemmSm90NarrowMaxN,
// K >= kGemmSm90NarrowMinK) take prefill past M = kGemmSm90NarrowFusedMaxM. p.path other than
// kAuto forces one.
constexpr int64_t kGemmSm90DecodeMaxM = 16;
constexpr int64_t kGemmSm90FusedMt64MaxM = 64;
constexpr int64_t kGemmSm90FusedMaxM = 128;
constexpr int64_t kGemmSm90FusedWsMaxM = 512;
constexpr int64_t kGemmSm90OneWaveMaxM = 1024;
constexpr int64_t kGemmSm90WideMaxM = 2048;
constexpr int64_t kGemmSm90WideSplitMinM = 192;
constexpr int64_t kGemmSm90PrefillWeights = int64_t{1} << 18;          // 512 x 512
constexpr int64_t kGemmSm90Decode64Weights = int64_t{1} << 20;         // 1024 x 1024
constexpr int64_t kGemmSm90Decode32Weights = int64_t{1} << 23;         // 2048 x 4096
constexpr int64_t kGemmSm90Decode32LongKWeights = int64_t{1} << 25;    // 8192 x 4096
constexpr int64_t kGemmSm90Decode32MaxN = 4096;
constexpr int64_t kGemmSm90FewTilesPrefillWeights = int64_t{1} << 22;  // 2048 x 2048
constexpr int64_t kGemmSm90MidKMaxK = 2048;
constexpr int64_t kGemmSm90ShortKMaxK = 1024;
constexpr int64_t kGemmSm90ShortKFusedWsMinN = 4096;
constexpr int64_t kGemmSm90ShortKDecodeMinK = 512;
constexpr int64_t kGemmSm90ShortKDecodeMinWeights = int64_t{1} << 21;  // 2048 x 1024
constexpr int64_t kGemmSm90ShortKDecodeMaxWeights = int64_t{1} << 22;  // 4096 x 1024
constexpr int64_t kGemmSm90NarrowMaxN = 3072;
constexpr int64_t kGemmSm90NarrowMinK = 4096;
constexpr int64_t kGemmSm90NarrowFusedMaxM = 256;
// A ragged GEMM (p.ragged()) takes the decode kernel over its groups' 8-row tiles below
// kGemmSm90RaggedFusedWsRowsPerGroup rows a group on average (M < that * G), else fused_ws over
// each group's rows staged in tiles: of 64 rows (fused_ws_narrow) below
// kGemmSm90RaggedWideRowsPerGroup, of 128 below kGemmSm90Ragged256RowsPerGroup, of 256 from there.
// Each tile reads its group's weights once: the decode kernel's tiles number about M / 8 + G,
// fused_ws's M / rows + G (each group staged from a tile boundary), but each of those costs the
// whole tile's MMAs. The launcher sees M and G, not the sizes (they are on the device), so the
// bounds are on the average. Measured on an H200 with each kernel forced, Mixtral-8x7B's gate/up
// and down projections and DeepSeek-V2-Lite's gate/up (bench/results/ragged_h200_2026-11-29_paths.md
// and ..._tiles.md before the boundary-aligned staging; ..._bounds.md after it), in time saved:
// the 64-row tiles beat decode from 16-24 rows a group, and the 128-row tiles by 19-27% up to 48;
// the 128-row tiles beat the 64-row ones by 3-5% at 64 and 22-29% at 80-96, and the 256-row ones
// by 1-10% at 128; the 256-row tiles beat the 128-row ones by 10-21% at 160-192, 6-15% at 256,
// 5-16% at 512, and drew level at 384 (DeepSeek). Tiles of 32 rows (one or two CTAs an SM) were
// at most 7% ahead of these at 16 rows a group and behind them elsewhere: not built.
constexpr int64_t kGemmSm90RaggedFusedWsRowsPerGroup = 16;
constexpr int64_t kGemmSm90RaggedWideRowsPerGroup = 64;
constexpr int64_t kGemmSm90Ragged256RowsPerGroup = 144;
GemmSm90Path gemm_sm90_path(const GemmProblem& p);

// The p.path that forces the kernel gemm_sm90_path picks for p (a dense GEMM with p.path kAuto).
// The pick depends on the SM count, so a call is lowered with it (gemm_ffi.cc): lowered on one
// Hopper and run on another, the call runs the kernel its workspace was sized for.
GemmPath gemm_sm90_settled_path(const GemmProblem& p);

// Device scratch gemm_sm90 needs for p (dequantized operands, the float32 result before NVFP4
// output, the quantizer's and CUTLASS's scratch). p.workspace must hold this many bytes.
size_t gemm_sm90_workspace_bytes(const GemmProblem& p);

// Whether gemm_sm90 runs p's whole stack (p.stack, count > 1) in one launch: float output on the
// decode path with M <= 8 (one grid over every element: the small GEMMs of a stack of experts
// share a wave instead of each filling the GPU alone). The caller runs other stacks an element at
// a time.
bool gemm_sm90_runs_stack(const GemmProblem& p);

// Enqueues the GEMM, the stack of GEMMs where gemm_sm90_runs_stack(p), or the ragged GEMM
// (p.ragged(): the decode or the fused_ws kernel, one launch; p.path may force either), on `stream`.
// cudaErrorInvalidValue: a problem it cannot run (k not a multiple of 16, too little workspace, a
// stack it does not run).
cudaError_t gemm_sm90(const GemmProblem& p, cudaStream_t stream);

}  // namespace jax_nvfp4
