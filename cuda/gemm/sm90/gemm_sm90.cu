// The sm_90a GEMM launcher: picks decode, fused or prefill, and adds NVFP4 output by quantizing the
// float32 result (kept in the workspace) with quantize_sm90. The decode and fused kernels apply
// the activation in their epilogue; the prefill path's GEMM library cannot, so there one
// elementwise pass applies it to the GEMM's output in place (after the output cast: a 2-byte
// output is rounded twice) or to the float32 result an NVFP4 output is quantized from. A gated
// activation is fused in the decode, fused and fused_ws kernels (each thread's MMA rows are a
// gate/up pair); on the prefill path the GEMM writes its [m, n] result to the workspace in the
// output dtype and the pass pairs the columns into the output.
#include "gemm/sm90/gemm_sm90.h"

#include "common/scale_layout.h"
#include "gemm/activation_pass.cuh"
#include "gemm/sm90/gemm_sm90_internal.h"
#include "quantize/quantize.h"

namespace jax_nvfp4 {

namespace {

constexpr size_t kRegionAlign = 256;
size_t align_up(size_t v) { return (v + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

bool separate_activation(const GemmProblem& p) {
  return p.activation != Activation::kNone && gemm_sm90_path(p) == GemmSm90Path::kPrefill;
}

// Bytes of the staged [m, n] GEMM result a separate gated activation reads.
size_t gated_stage_bytes(const GemmProblem& p) {
  if (!is_gated(p.activation) || !separate_activation(p)) return 0;
  return align_up(static_cast<size_t>(p.m * p.n) * dtype_bytes(p.out_dtype));
}

// The float32 result [m, out_cols] at `out_f32` that the quantizer reads, as a problem of its own.
GemmProblem float_stage(const GemmProblem& p, void* out_f32) {
  GemmProblem f = p;
  f.out = out_f32;
  f.out_dtype = DType::kF32;
  f.out_codes = nullptr;
  f.out_scales = nullptr;
  f.out_s_enc = nullptr;
  f.out_s_dec = nullptr;
  return f;
}

QuantizeProblem quantize_stage(const GemmProblem& p, const float* y, void* ws, size_t ws_bytes) {
  QuantizeProblem q;
  q.rows = p.m;
  q.k = out_cols(p);
  q.rows_per_matrix = p.m;
  q.groups = 1;
  q.x = y;
  q.x_dtype = DType::kF32;
  q.s_enc = p.out_s_enc;
  q.codes = p.out_codes;
  q.scales = p.out_scales;
  q.s_dec = p.out_s_dec;
  q.workspace = ws;
  q.workspace_bytes = ws_bytes;
  return q;
}

// The staged rows of a fused_ws path's tiles; 0 on the other paths.
int fused_ws_rows(GemmSm90Path path) {
  switch (path) {
    case GemmSm90Path::kFusedWsNarrow: return 64;
    case GemmSm90Path::kFusedWs: return 128;
    case GemmSm90Path::kFusedWsWide: return 256;
    default: return 0;
  }
}

size_t path_workspace(const GemmProblem& p) {
  const GemmSm90Path path = gemm_sm90_path(p);
  if (const int mt = fused_ws_rows(path)) return sm90::fused_ws_workspace_bytes(p, mt);
  switch (path) {
    case GemmSm90Path::kDecode: return sm90::decode_workspace_bytes(p);
    case GemmSm90Path::kFused: return sm90::fused_workspace_bytes(p);
    default: return sm90::prefill_workspace_bytes(p);
  }
}

// The workspace of one float-output problem: its kernel's, after the staged result of a separate
// gated activation.
size_t float_workspace(const GemmProblem& p) { return gated_stage_bytes(p) + path_workspace(p); }

cudaError_t run_path(const GemmProblem& p, cudaStream_t stream) {
  const GemmSm90Path path = gemm_sm90_path(p);
  if (const int mt = fused_ws_rows(path)) return sm90::fused_ws_gemm(p, mt, stream);
  switch (path) {
    case GemmSm90Path::kDecode: return sm90::decode_gemm(p, stream);
    case GemmSm90Path::kFused: return sm90::fused_gemm(p, stream);
    default: return sm90::prefill_gemm(p, stream);
  }
}

// The kernels of one float-output problem: with a separate activation, the GEMM without it, then
// the pass over its output in place, or, gated, from the staged result at the workspace's start.
cudaError_t run_float(const GemmProblem& p, cudaStream_t stream) {
  const bool separate = separate_activation(p);
  GemmProblem g = p;
  if (separate) g.activation = Activation::kNone;
  const size_t stage = gated_stage_bytes(p);
  if (stage > 0) {
    g.out = p.workspace;
    g.workspace = static_cast<uint8_t*>(p.workspace) + stage;
    g.workspace_bytes = p.workspace_bytes - stage;
  }
  cudaError_t err = run_path(g, stream);
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess || !separate) return err;
  return activation_pass(g.out, p.out_dtype, p.m, p.n, p.n, p.out, p.out_dtype, p.activation, stream);
}

// A ragged GEMM's kernel: the one p.path forces, else by the rows a group on average (gemm_sm90.h).
GemmSm90Path ragged_path(const GemmProblem& p) {
  switch (p.path) {
    case GemmPath::kDecode: return GemmSm90Path::kDecode;
    case GemmPath::kFusedWs: return GemmSm90Path::kFusedWs;
    case GemmPath::kFusedWsNarrow: return GemmSm90Path::kFusedWsNarrow;
    case GemmPath::kFusedWsWide: return GemmSm90Path::kFusedWsWide;
    default: break;
  }
  const int64_t groups = p.stack.count;
  if (p.m < kGemmSm90RaggedFusedWsRowsPerGroup * groups) return GemmSm90Path::kDecode;
  if (p.m < kGemmSm90RaggedWideRowsPerGroup * groups) return GemmSm90Path::kFusedWsNarrow;
  return p.m < kGemmSm90Ragged256RowsPerGroup * groups ? GemmSm90Path::kFusedWs : GemmSm90Path::kFusedWsWide;
}

}  // namespace

GemmSm90Path gemm_sm90_path(const GemmProblem& p) {
  if (p.ragged()) return ragged_path(p);
  if (p.path == GemmPath::kDecode) return GemmSm90Path::kDecode;
  if (p.path == GemmPath::kPrefill || p.path == GemmPath::kPrefillCutlass) return GemmSm90Path::kPrefill;
  if (p.path == GemmPath::kFused) return GemmSm90Path::kFused;
  if (p.path == GemmPath::kFusedWs) return GemmSm90Path::kFusedWs;
  if (p.path == GemmPath::kFusedWsWide) return GemmSm90Path::kFusedWsWide;
  if (p.m <= kGemmSm90DecodeMaxM) return GemmSm90Path::kDecode;
  const int64_t weights = p.n * p.k;
  if (weights <= kGemmSm90PrefillWeights) return GemmSm90Path::kPrefill;
  if (weights <= kGemmSm90Decode64Weights) return p.m <= 64 ? GemmSm90Path::kDecode : GemmSm90Path::kPrefill;
  const bool short_k = p.k <= kGemmSm90ShortKMaxK;
  if (p.m <= 32 && weights <= (short_k ? kGemmSm90Decode32Weights : kGemmSm90Decode32LongKWeights)) {
    return GemmSm90Path::kDecode;
  }
  if (p.m <= 32 && !short_k && p.n <= kGemmSm90Decode32MaxN) {
    return GemmSm90Path::kDecode;
  }
  const int64_t sms = sm90::sm_count();
  const bool narrow = p.n <= kGemmSm90NarrowMaxN && p.k >= kGemmSm90NarrowMinK;
  if (!short_k && !narrow && weights > kGemmSm90Decode32Weights && p.m > kGemmSm90FusedMaxM &&
      p.m <= kGemmSm90WideMaxM) {
    // From kGemmSm90WideSplitMinM with K > kGemmSm90MidKMaxK, fewer tiles will do: the kernel
    // splits K over a cluster where they are few.
    const int64_t wide_tiles = sm90::fused_ws_output_tiles(p, 256);
    const bool split_k = p.m >= kGemmSm90WideSplitMinM && p.k > kGemmSm90MidKMaxK && 10 * wide_tiles > 3 * sms;
    if (2 * wide_tiles > sms || split_k) {
      return GemmSm90Path::kFusedWsWide;
    }
  }
  if (p.m > kGemmSm90OneWaveMaxM) return GemmSm90Path::kPrefill;
  if (short_k && p.m <= kGemmSm90FusedWsMaxM) {
    if (p.m <= kGemmSm90FusedMt64MaxM && p.k > kGemmSm90ShortKDecodeMinK && weights > kGemmSm90ShortKDecodeMinWeights &&
        weights <= kGemmSm90ShortKDecodeMaxWeights) {
      return GemmSm90Path::kDecode;
    }
    if (p.n < kGemmSm90ShortKFusedWsMinN) return GemmSm90Path::kPrefill;
    return p.m <= kGemmSm90FusedMt64MaxM ? GemmSm90Path::kFused : GemmSm90Path::kFusedWs;
  }
  if (narrow && p.m > kGemmSm90NarrowFusedMaxM) return GemmSm90Path::kPrefill;
  if (p.m <= kGemmSm90FusedMt64MaxM) return GemmSm90Path::kFused;
  const int64_t tiles = sm90::fused_ws_output_tiles(p, 128);
  if (2 * tiles > sms) {
    return p.m <= kGemmSm90FusedWsMaxM || tiles <= sms ? GemmSm90Path::kFusedWs : GemmSm90Path::kPrefill;
  }
  // Few tiles: the fused kernel's split-K fills the GPU where K is long, unless the weights are
  // small enough that the prefill path's dequantization pass costs less than the split. With
  // K <= kGemmSm90MidKMaxK the split has too few chunks to pay off: prefill, or fused_ws on
  // larger weights.
  if (p.k <= kGemmSm90MidKMaxK) {
    return weights <= kGemmSm90Decode32Weights ? GemmSm90Path::kPrefill : GemmSm90Path::kFusedWs;
  }
  const bool prefill = p.m > kGemmSm90FusedMaxM && weights <= kGemmSm90FewTilesPrefillWeights;
  return prefill ? GemmSm90Path::kPrefill : GemmSm90Path::kFused;
}

GemmPath gemm_sm90_settled_path(const GemmProblem& p) {
  switch (gemm_sm90_path(p)) {
    case GemmSm90Path::kDecode: return GemmPath::kDecode;
    case GemmSm90Path::kFused: return GemmPath::kFused;
    case GemmSm90Path::kFusedWs: return GemmPath::kFusedWs;
    case GemmSm90Path::kFusedWsWide: return GemmPath::kFusedWsWide;
    default: return GemmPath::kPrefill;  // (kFusedWsNarrow runs ragged GEMMs only)
  }
}

size_t gemm_sm90_workspace_bytes(const GemmProblem& p) {
  if (!p.nvfp4_out()) return float_workspace(p);
  const size_t y_bytes = align_up(static_cast<size_t>(p.m * out_cols(p)) * sizeof(float));
  const GemmProblem f = float_stage(p, nullptr);
  const QuantizeProblem q = quantize_stage(p, nullptr, nullptr, 0);
  return y_bytes + align_up(float_workspace(f)) + align_up(quantize_workspace_bytes(q));
}

bool gemm_sm90_runs_stack(const GemmProblem& p) {
  return !p.nvfp4_out() && gemm_sm90_path(p) == GemmSm90Path::kDecode && sm90::decode_runs_stack(p);
}

cudaError_t gemm_sm90(const GemmProblem& p, cudaStream_t stream) {
  if (p.k <= 0 || p.k % kBlockSize != 0 || p.m < 0 || p.n < 0) return cudaErrorInvalidValue;
  if (p.ragged()) {
    if (p.nvfp4_out() || p.stack.count < 1) return cudaErrorInvalidValue;
    if (gemm_sm90_path(p) == GemmSm90Path::kDecode && !sm90::decode_runs_ragged(p)) return cudaErrorInvalidValue;
  } else if (p.stack.count != 1 && (p.stack.count < 1 || !gemm_sm90_runs_stack(p))) {
    return cudaErrorInvalidValue;
  }
  if (p.workspace_bytes < gemm_sm90_workspace_bytes(p)) return cudaErrorInvalidValue;
  if (is_gated(p.activation) && p.n % 2 != 0) return cudaErrorInvalidValue;
  if (p.m == 0 && p.n > 0 && p.nvfp4_out()) {  // nothing to multiply, but out_s_dec is still set
    const QuantizeProblem probe = quantize_stage(p, nullptr, nullptr, 0);
    return quantize_sm90(quantize_stage(p, nullptr, p.workspace, quantize_workspace_bytes(probe)), stream);
  }
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  if (!p.nvfp4_out()) return run_float(p, stream);
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  float* y = reinterpret_cast<float*>(ws);
  const size_t y_bytes = align_up(static_cast<size_t>(p.m * out_cols(p)) * sizeof(float));
  GemmProblem f = float_stage(p, y);
  const size_t f_bytes = align_up(float_workspace(f));
  f.workspace = ws + y_bytes;
  f.workspace_bytes = f_bytes;
  const cudaError_t err = run_float(f, stream);
  if (err != cudaSuccess) return err;
  const QuantizeProblem probe = quantize_stage(p, y, nullptr, 0);
  const QuantizeProblem q =
      quantize_stage(p, y, ws + y_bytes + f_bytes, quantize_workspace_bytes(probe));
  return quantize_sm90(q, stream);
}

}  // namespace jax_nvfp4
