// Launcher of the sm_90a (Hopper) NVFP4-weight convolution: implicit GEMM on wgmma with the
// activations of one input row segment loaded once into shared memory and reused for all S
// filter taps along W by shifting the wgmma B-operand descriptor (conv_sm90_schedule.h).
#pragma once

#include <cuda_runtime.h>

#include "conv/conv_problem.h"

namespace jax_nvfp4 {

// Which sm_90a kernel runs a problem: the library's choice (kAuto), the register-A kernel (every
// activation dtype and filter, split-K for small grids), or the warp-specialized kernel with CTA
// tiles of 128 output channels x 64 to 256 pixels (bf16 activations, S in {1, 3, 5, 7}, bf16/f16
// output, K % 8 == 0), optionally split-K over a cluster, or of 64 output channels. It loads with
// TMA where it can (C % 32 == 0, strides up to 8); the 128-channel tiles of 128 and 256 pixels fall
// back to cp.async loads elsewhere (and the *CpAsync values force those), the others need TMA.
// Tests and benchmarks force one; the values are the FFI attribute `kernel`.
enum class ConvSm90Kernel {
  kAuto = 0,
  kRegisterA = 1,
  kWs128x128 = 2,
  kWs128x256 = 3,
  kWs128x128CpAsync = 4,
  kWs128x256CpAsync = 5,
  kWs128x64 = 6,
  kWs128x112 = 7,
  kWs128x208 = 8,
  kWs64x256 = 9,  // 64 output channels x 256 pixels, two consumers along the pixels (TMA loads)
  kWs64x416 = 10,  // the same, 416 pixels
  kWs64x128Ks = 11,  // 64 output channels x 128 pixels, the consumers alternating stages (TMA loads)
  kWs64x224Ks = 12,  // the same, 224 pixels
  kWs64x256Ks = 13,  // the same, 256 pixels
  kWs64x64Ks = 14,  // the same, 64 pixels (small grids: small_grid_choice)
};

// A tiling and, for the warp-specialized ones, the CTAs each tile's stages split over.
struct ConvSm90Choice {
  ConvSm90Kernel kernel;
  int splits;
};

// The kernel conv_sm90 runs `p` with under kAuto, on a GPU of `sms` SMs whose blocks may take
// `max_smem` bytes of shared memory (host only: nothing is launched). Where a warp-specialized
// choice then finds its stages do not fit after all (what this does not check), the launcher runs
// the register-A kernel instead.
ConvSm90Choice conv_sm90_choice(const ConvProblem& p, int sms, int max_smem);

// A CTA's tile: output channels x (virtual) pixels.
struct ConvSm90Tile {
  int channels, pixels;
};

// The tile `kernel` (not kAuto) runs `p` with on a GPU of `sms` SMs: the register-A kernel's as
// its launcher sizes it for bf16 activations whose stages fit in shared memory.
ConvSm90Tile conv_sm90_tile(const ConvProblem& p, ConvSm90Kernel kernel, int sms);

// What a warp-specialized launch of `kernel` (not kAuto or kRegisterA) over clusters of `splits`
// CTAs would run with on the current GPU: its dynamic shared memory, its ring of stages, and
// whether split-K's CTAs push their sums into the owner's inbox (conv_sm90_ws_kernel.cuh,
// push_sums) instead of reading them through the cluster window. Nothing is launched. The outputs
// are the same bits either way, so the tests ask this to tell the two paths apart.
struct ConvSm90WsPlan {
  int smem_bytes = 0, stages = 0;
  bool pushes_sums = false;
};

// Fills `plan` for `kernel` on `p` (whose pointers need only be 16-byte aligned: none is read);
// cudaErrorInvalidValue where that launch would not take the problem.
cudaError_t conv_sm90_ws_plan(const ConvProblem& p, ConvSm90Kernel kernel, int splits, ConvSm90WsPlan* plan);

// Runs `p` on `stream`. Activations bf16/f16/f32 or NVFP4 (x_q: codes [N*H*W, C/2], scales one
// tiled [W, C/16] matrix per (n, h) image row, as an NVFP4Array [N, H, W, C] stores them).
// Returns cudaErrorInvalidValue for a problem it cannot take (shared memory over the limit, or a
// forced kernel that does not take the problem's dtypes).
// `splits` (a forced 128-channel warp-specialized kernel with TMA loads): the stages of every tile
// split over a cluster of that many CTAs (split-K, at most 8); 1 or less runs unsplit. With kAuto
// the launcher chooses the split too.
cudaError_t conv_sm90(const ConvProblem& p, cudaStream_t stream, ConvSm90Kernel kernel = ConvSm90Kernel::kAuto,
                      int splits = 1);

}  // namespace jax_nvfp4
