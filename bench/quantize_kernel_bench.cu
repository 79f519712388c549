// Kernel-level benchmark of the sm_90a quantize kernels (no JAX): built together with
// cuda/quantize/sm90/quantize_sm90.cu (or a variant of its headers) by
// bench/quantize_kernel_bench.sh.
//
//   quantize_kernel_bench [--label NAME]
//
// For each shape (bf16 x, 256 MB and more, the sizes of the quantize goal) it times
// quantize_sm90 with S_enc given (one pass) and from the amax (two passes), dequantize_sm90 back
// to bf16, a device-to-device cudaMemcpy of x as the copy ceiling and a cudaMemset of x's bytes
// as the write-only one: median us per call of back-to-back calls
// between CUDA events. GB/s counts the bytes an op must move (x read once, codes and scales
// written once, or the reverse; the amax variant's floor reads x twice). Each row also prints an
// FNV-1a hash of its outputs, so variants of the kernels can be checked to give the library's
// bytes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/scale_layout.h"
#include "cuda_check.h"
#include "event_timing.h"
#include "fnv_hash.h"
#include "quantize/quantize.h"

using namespace jax_nvfp4;

namespace {

// Deterministic test data: roughly normal values (sum of four uniforms) whose magnitude changes
// by up to 2^12 from one 16-element block to the next, some all-zero blocks, and a few huge
// and tiny values, so the block scales cover much of E4M3's range.
__global__ void fill(__nv_bfloat16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32);
    float sum = 0.f;
    for (int u = 0; u < 4; ++u) {
      h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12; h *= 0x297a2d39u; h ^= h >> 15;
      sum += (h & 0xFFFFu) / 65536.f - 0.5f;
    }
    const uint32_t block = static_cast<uint32_t>(i / kBlockSize) * 0x9E3779B9u;
    const float scale = exp2f(static_cast<float>((block >> 20) % 13) - 6.f);
    float v = (block >> 8) % 64 == 0 ? 0.f : sum * scale;
    if (h % 100003u == 0) v *= 1e30f;
    if (h % 100019u == 0) v *= 1e-30f;
    x[i] = __float2bfloat16(v);
  }
}

template <typename T>
std::vector<uint8_t> to_host(const T* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  CUDA_CHECK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

struct Shape {
  int64_t rows, k;
};

}  // namespace

int main(int argc, char** argv) {
  std::string label = "ours";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--label") && i + 1 < argc) label = argv[++i];
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n\n", prop.name);
  std::printf("| variant | shape | op | us | GB/s | of memcpy | output hash |\n");
  std::printf("|---|---|---|---:|---:|---:|---|\n");

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const int kReps = 7, kCalls = 50;
  for (const Shape s : {Shape{16384, 16384}, Shape{8192, 32768}}) {
    const int64_t n = s.rows * s.k;
    const size_t x_bytes = n * sizeof(__nv_bfloat16);
    const size_t code_bytes = n / 2;
    const size_t scale_bytes = static_cast<size_t>(scale_matrix_bytes(s.rows, s.k / kBlockSize));
    __nv_bfloat16* x;
    void *copy, *workspace;
    uint8_t *codes, *scales;
    float *s_dec, *s_enc;
    CUDA_CHECK(cudaMalloc(&x, x_bytes));
    CUDA_CHECK(cudaMalloc(&copy, x_bytes));
    CUDA_CHECK(cudaMalloc(&codes, code_bytes));
    CUDA_CHECK(cudaMalloc(&scales, scale_bytes));
    CUDA_CHECK(cudaMalloc(&s_dec, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&s_enc, sizeof(float)));
    fill<<<1024, 256, 0, stream>>>(x, n);
    CUDA_CHECK(cudaGetLastError());
    const float given = 1.5f;
    CUDA_CHECK(cudaMemcpy(s_enc, &given, sizeof(float), cudaMemcpyHostToDevice));

    QuantizeProblem p;
    p.rows = s.rows;
    p.k = s.k;
    p.rows_per_matrix = s.rows;
    p.x = x;
    p.x_dtype = DType::kBF16;
    p.codes = codes;
    p.scales = scales;
    p.s_dec = s_dec;
    const size_t workspace_bytes = quantize_workspace_bytes(QuantizeProblem{});
    CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));

    const double moved = static_cast<double>(x_bytes + code_bytes + scale_bytes);
    const double copy_us = median_us_per_call(stream, kReps, kCalls, [&](int) {
      CUDA_CHECK(cudaMemcpyAsync(copy, x, x_bytes, cudaMemcpyDeviceToDevice, stream));
    });
    const double copy_gbs = 2.0 * x_bytes / copy_us * 1e-3;
    char shape[64];
    std::snprintf(shape, sizeof shape, "%lldx%lld bf16", static_cast<long long>(s.rows),
                  static_cast<long long>(s.k));
    std::printf("| memcpy | %s | copy (read + write) | %.1f | %.0f | 100%% | |\n", shape, copy_us,
                copy_gbs);
    // Dequantize mostly writes: a memset of x's bytes is its other ceiling.
    const double set_us = median_us_per_call(stream, kReps, kCalls, [&](int) {
      CUDA_CHECK(cudaMemsetAsync(copy, 0, x_bytes, stream));
    });
    const double set_gbs = x_bytes / set_us * 1e-3;
    std::printf("| memset | %s | write only | %.1f | %.0f | %.1f%% | |\n", shape, set_us, set_gbs,
                100.0 * set_gbs / copy_gbs);
    for (const bool amax : {false, true}) {
      p.s_enc = amax ? nullptr : s_enc;
      p.workspace = amax ? workspace : nullptr;
      p.workspace_bytes = amax ? workspace_bytes : 0;
      CUDA_CHECK(cudaMemsetAsync(codes, 0xAB, code_bytes, stream));
      CUDA_CHECK(cudaMemsetAsync(scales, 0xAB, scale_bytes, stream));
      CUDA_CHECK(quantize_sm90(p, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      const uint64_t hash =
          fnv_hash(to_host(s_dec, sizeof(float)), fnv_hash(to_host(scales, scale_bytes),
                                                     fnv_hash(to_host(codes, code_bytes))));
      const double us = median_us_per_call(stream, kReps, kCalls,
                                           [&](int) { CUDA_CHECK(quantize_sm90(p, stream)); });
      const double gbs = moved / us * 1e-3;
      std::printf("| %s | %s | %s | %.1f | %.0f | %.1f%% | %016llx |\n", label.c_str(), shape,
                  amax ? "amax + quantize" : "quantize, S_enc given", us, gbs,
                  100.0 * gbs / copy_gbs, static_cast<unsigned long long>(hash));
    }
    // Dequantize the last quantization (from the amax) back to bf16, into the copy's buffer.
    DequantizeProblem d;
    d.rows = s.rows;
    d.k = s.k;
    d.rows_per_matrix = s.rows;
    d.codes = codes;
    d.scales = scales;
    d.s_dec = s_dec;
    d.out = copy;
    d.out_dtype = DType::kBF16;
    CUDA_CHECK(dequantize_sm90(d, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const uint64_t hash = fnv_hash(to_host(static_cast<uint8_t*>(copy), x_bytes));
    const double us = median_us_per_call(stream, kReps, kCalls,
                                         [&](int) { CUDA_CHECK(dequantize_sm90(d, stream)); });
    const double gbs = moved / us * 1e-3;
    std::printf("| %s | %s | dequantize -> bf16 | %.1f | %.0f | %.1f%% | %016llx |\n", label.c_str(),
                shape, us, gbs, 100.0 * gbs / copy_gbs, static_cast<unsigned long long>(hash));
    for (void* ptr : {static_cast<void*>(x), copy, static_cast<void*>(codes),
                      static_cast<void*>(scales), static_cast<void*>(s_dec),
                      static_cast<void*>(s_enc), workspace}) {
      CUDA_CHECK(cudaFree(ptr));
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
