// The sm_100a ragged GEMM launcher (ragged_sm100_plan.h says how the problem maps onto CUTLASS's
// grouped GEMM): A quantized for W4A16, a setup kernel that places the groups' rows and writes
// every group's CUTLASS arguments, a copy of A's scales into per-group tiles, the grouped GEMM
// into a float32 D, and a pass that forms the output. Everything is enqueued on the stream;
// nothing syncs (the group sizes stay on the device).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/activation.cuh"
#include "common/dtype_io.cuh"
#include "gemm/sm100/gemm_sm100.h"
#include "gemm/sm100/gemm_sm100_prep.h"
#include "gemm/sm100/ragged_sm100_cutlass.h"

namespace jax_nvfp4 {
namespace {

using sm100::RaggedPlan;

constexpr int kThreads = 256;

unsigned blocks_for(int64_t threads) {  // at most enough to fill any GPU: the loops do the rest
  return static_cast<unsigned>(std::min<int64_t>((threads + kThreads - 1) / kThreads, 8 * 148 * 8));
}

// The first index i in [0, count) with values[i] > x (count when none), values nondecreasing.
__device__ int64_t upper_bound(const int32_t* values, int64_t count, int64_t x) {
  int64_t lo = 0, hi = count;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (values[mid] > x) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// rows: start [G], end [G], first tile [G + 1] (the last: all the groups' tiles). Warp 0 places
// the groups' rows 32 groups a step (scans across the lanes); then every thread writes the
// CUTLASS arguments of its groups.
__global__ void ragged_setup_kernel(const int32_t* group_sizes, const int32_t* first_row, int64_t m,
                                    int64_t groups, sm100::RaggedOperands ops,
                                    sm100::RaggedCutlassArgs args, int32_t* rows) {
  int32_t* start = rows;
  int32_t* end = rows + groups;
  int32_t* tile = rows + 2 * groups;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int64_t first = min(max(static_cast<int64_t>(*first_row), int64_t{0}), m);
    int64_t before = 0, tiles_before = 0;
    for (int64_t base = 0; base < groups; base += 32) {
      const int64_t g = base + lane;
      const int64_t size = g < groups ? max(static_cast<int64_t>(group_sizes[g]), int64_t{0}) : 0;
      int64_t upto = size;  // inclusive scans across the lanes: rows, then tiles
      for (int o = 1; o < 32; o *= 2) {
        const int64_t v = __shfl_up_sync(0xffffffffu, upto, o);
        if (lane >= o) upto += v;
      }
      const sm100::GroupRows r = sm100::group_rows(first, before + upto - size, size, m);
      const int64_t own_tiles = ceil_div(r.end - r.start, kTileRows);
      int64_t tiles = own_tiles;
      for (int o = 1; o < 32; o *= 2) {
        const int64_t v = __shfl_up_sync(0xffffffffu, tiles, o);
        if (lane >= o) tiles += v;
      }
      if (g < groups) {
        start[g] = static_cast<int32_t>(r.start);
        end[g] = static_cast<int32_t>(r.end);
        tile[g] = static_cast<int32_t>(tiles_before + tiles - own_tiles);
      }
      before += __shfl_sync(0xffffffffu, upto, 31);
      tiles_before += __shfl_sync(0xffffffffu, tiles, 31);
    }
    if (lane == 0) tile[groups] = static_cast<int32_t>(tiles_before);
  }
  __syncthreads();  // the rows above, written to global memory, are seen by the whole block
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    const sm100::GroupArgs a = sm100::group_args(ops, g, start[g], end[g] - start[g], tile[g]);
    args.shapes[g] = a.shape;
    args.a[g] = a.a;
    args.b[g] = a.b;
    args.sfa[g] = a.sfa;
    args.sfb[g] = a.sfb;
    args.d[g] = a.d;
    args.stride_a[g] = a.stride_a;
    args.stride_b[g] = a.stride_b;
    args.stride_d[g] = a.stride_d;
    args.layout_sfa[g] = a.layout_sfa;
    args.layout_sfb[g] = a.layout_sfb;
  }
}

// The regrouped scales: each (row R of the region's row tiles, 16-element block j) takes the
// scale of row R - 128 * tile_g of its group g, i.e. row start_g + that of A, or zero past the
// group's rows or k's blocks (padding CUTLASS loads with the tile and multiplies by zero rows).
__global__ void regroup_scales_kernel(const uint8_t* a_scales, int64_t k_blocks, int64_t groups,
                                      int64_t row_tiles, const int32_t* rows, uint8_t* sfa) {
  const int32_t* start = rows;
  const int32_t* end = rows + groups;
  const int32_t* tile = rows + 2 * groups;
  const int64_t padded_blocks = scale_k_tiles(k_blocks) * kTileKBlocks;
  const int64_t count = row_tiles * kTileRows * padded_blocks;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / padded_blocks, j = i - row * padded_blocks;
    const int64_t t = row / kTileRows;
    if (t >= tile[groups]) return;  // past every group's tiles (i only grows)
    const int64_t g = upper_bound(tile, groups + 1, t) - 1;  // tile[g] <= t < tile[g + 1]
    const int64_t r = row - int64_t{tile[g]} * kTileRows;
    const bool held = r < end[g] - start[g] && j < k_blocks;
    sfa[sm100::regrouped_scale_offset(tile[g], r, j, k_blocks)] =
        held ? a_scales[scale_offset(start[g] + r, j, k_blocks)] : uint8_t{0};
  }
}

// out[r, c] = act(alpha_g * d[r, .] + bias_g) for the group g holding row r, zero on rows of no
// group; alpha_g = a_s_dec * b_s_dec[g] (b_s_dec_stride floats apart: 0 for one scalar).
__global__ void ragged_output_kernel(const float* d, int64_t m, int64_t n, int64_t groups,
                                     const int32_t* rows, const float* a_s_dec,
                                     const float* b_s_dec, int64_t b_s_dec_stride, const void* bias,
                                     DType bias_dtype, int64_t bias_stride, Activation act,
                                     void* out, DType out_dtype) {
  const int32_t* start = rows;
  const int32_t* end = rows + groups;
  const bool gated = is_gated(act);
  const int64_t cols = gated ? n / 2 : n, count = m * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const int64_t g = upper_bound(end, groups, r);  // the first group ending past the row
    float v = 0.0f;
    if (g < groups && r >= start[g]) {
      const float alpha = *a_s_dec * b_s_dec[g * b_s_dec_stride];
      const auto z = [&](int64_t col) {
        const float b = bias != nullptr ? load_as_float(bias, bias_dtype, g * bias_stride + col) : 0.0f;
        return alpha * d[r * n + col] + b;
      };
      v = gated ? apply_gated(z(2 * c), z(2 * c + 1), act) : apply_activation(z(c), act);
    }
    store_as(out, out_dtype, i, v);
  }
}

RaggedPlan ragged_plan(const GemmProblem& p) {
  const size_t quantize_ws =
      quantize_workspace_bytes(sm100::quantize_a_problem(p, nullptr, nullptr, nullptr, nullptr));
  return sm100::make_ragged_plan(p, quantize_ws);
}

int64_t element_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

}  // namespace

const char* ragged_sm100_unsupported_reason(const GemmProblem& p) {
  return sm100::ragged_unsupported_reason(p);
}

size_t ragged_sm100_workspace_bytes(const GemmProblem& p, int sm_count) {
  if (sm100::ragged_unsupported_reason(p) != nullptr || p.m == 0 || p.n == 0) return 0;
  const RaggedPlan plan = ragged_plan(p);
  const int groups = static_cast<int>(plan.groups);
  return plan.cutlass_ws + sm100::ragged_cutlass_workspace_bytes(groups, sm_count);
}

cudaError_t ragged_sm100(const GemmProblem& p, cudaStream_t stream) {
  if (sm100::ragged_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;  // nothing to write
  const int sm_count = sm100::current_sm_count();
  if (p.workspace_bytes < ragged_sm100_workspace_bytes(p, sm_count)) return cudaErrorInvalidValue;
  const RaggedPlan plan = ragged_plan(p);
  void* ws = p.workspace;
  const int64_t k_blocks = p.k / kBlockSize;

  const uint8_t* a_codes = p.a_q.codes;
  const uint8_t* a_scales = p.a_q.scales;
  const float* a_s_dec = p.a_q.s_dec;
  if (plan.quantize_a) {
    const QuantizeProblem q = sm100::quantize_a_problem(
        p, sm100::at<uint8_t>(ws, plan.a_codes), sm100::at<uint8_t>(ws, plan.a_scales),
        sm100::at<float>(ws, plan.a_s_dec), sm100::at<void>(ws, plan.quantize_ws));
    JAX_NVFP4_TRY(quantize_sm100(q, stream));
    a_codes = q.codes;
    a_scales = q.scales;
    a_s_dec = q.s_dec;
  }

  int32_t* rows = sm100::at<int32_t>(ws, plan.rows);
  uint8_t* sfa = sm100::at<uint8_t>(ws, plan.sfa);
  float* d = sm100::at<float>(ws, plan.d);
  const sm100::RaggedOperands ops{a_codes, sfa, p.b.codes, p.b.scales, d, p.n, p.k};
  const sm100::RaggedCutlassArgs args = sm100::ragged_cutlass_args(plan, ws);
  ragged_setup_kernel<<<1, kThreads, 0, stream>>>(p.group_sizes, p.first_row, p.m, plan.groups, ops,
                                                  args, rows);
  JAX_NVFP4_TRY(cudaGetLastError());
  const int64_t row_tiles = sm100::regrouped_row_tiles(p.m, plan.groups);
  regroup_scales_kernel<<<blocks_for(row_tiles * kTileRows * scale_k_tiles(k_blocks) * kTileKBlocks),
                          kThreads, 0, stream>>>(a_scales, k_blocks, plan.groups, row_tiles, rows, sfa);
  JAX_NVFP4_TRY(cudaGetLastError());
  JAX_NVFP4_TRY(sm100::run_ragged_cutlass(args, sm_count, stream));

  const int64_t out_elements = p.m * out_cols(p);
  ragged_output_kernel<<<blocks_for(out_elements), kThreads, 0, stream>>>(
      d, p.m, p.n, plan.groups, rows, a_s_dec, p.b.s_dec, p.stack.b_s_dec / int64_t{sizeof(float)},
      p.bias, p.bias_dtype, p.stack.bias / element_bytes(p.bias_dtype), p.activation, p.out,
      p.out_dtype);
  return cudaGetLastError();
}

}  // namespace jax_nvfp4
