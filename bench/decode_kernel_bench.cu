// Kernel-level benchmark and check of the sm_90a decode GEMM (no JAX): built together with
// cuda/gemm/sm90/gemm_decode.cu by bench/decode_kernel_bench.sh.
//
//   decode_kernel_bench [--check] [--time] [--peers] [--label NAME] [--only M N]
//
// --check  random codes/scales/activations (every x dtype, bias, out dtypes, tails in M, N, K)
//          against a float64 host reference: relative Frobenius error of the checked outputs.
// --tails  with --check: only the small tail-heavy cases (for compute-sanitizer).
// --time   CUDA-graph replay of back-to-back calls, rotating among enough weight copies that
//          they exceed the L2 several times (HBM, not L2, is measured); median of repeats.
// --only   with --time: only that M and N (e.g. under a profiler).
// --peers  the same for cuBLAS bf16 GEMM (bf16 in, f32 compute, bf16 out, rotating weights),
//          a device-to-device copy (bytes read + written) as the bandwidth ceiling, and per
//          shape the read floor: one launch that only reads the same weight bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/scale_layout.h"
#include "cublas_dlopen.h"
#include "cuda_check.h"
#include "event_timing.h"
#include "gemm/sm90/gemm_sm90_internal.h"
#include "w4a16_problem.h"


using namespace jax_nvfp4;


namespace {

const double kE2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

double e2m1(uint8_t c) { return (c & 8 ? -1 : 1) * kE2m1[c & 7]; }
double e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7);
  return b & 0x80 ? -v : v;
}

struct HostNvfp4 {
  int64_t rows = 0, k = 0;
  std::vector<uint8_t> codes, scales;
  float s_dec = 1.f;
  double at(int64_t r, int64_t c) const {
    const uint8_t byte = codes[r * (k / 2) + c / 2];
    const uint8_t code = c % 2 ? byte >> 4 : byte & 15;
    return e2m1(code) * e4m3(scales[scale_offset(r, c / kBlockSize, k / kBlockSize)]);
  }
};

// Random codes (all 16, negative zero included) and scales over the whole E4M3 range below
// NaN, subnormals included.
HostNvfp4 random_nvfp4(int64_t rows, int64_t k, std::mt19937& rng) {
  HostNvfp4 h;
  h.rows = rows;
  h.k = k;
  h.codes.resize(rows * k / 2);
  h.scales.assign(scale_matrix_bytes(rows, k / kBlockSize), 0);
  std::uniform_int_distribution<int> byte(0, 255), sc(0, 0x7E);
  for (auto& c : h.codes) c = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < k / kBlockSize; ++b)
      h.scales[scale_offset(r, b, k / kBlockSize)] = static_cast<uint8_t>(sc(rng));
  h.s_dec = 0.37f;
  return h;
}

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(v.size() * sizeof(T), 16)));
  CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

float* device_scalar(float v) { return to_device(std::vector<float>{v}); }

const char* dtype_name(DType t) { return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : "f16"; }

// ---------------------------------------------------------------------------------------------
// Correctness

struct CheckCase {
  int64_t m, n, k;
  int x_kind;  // 0 bf16, 1 f16, 2 f32, 3 nvfp4
  DType out;
  bool bias;
};

bool run_check(const CheckCase& c, std::mt19937& rng, double* err_out) {
  const HostNvfp4 w = random_nvfp4(c.n, c.k, rng);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<double> xd(c.m * c.k);
  GemmProblem p;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  std::vector<void*> frees;
  HostNvfp4 xq;
  if (c.x_kind == 3) {
    xq = random_nvfp4(c.m, c.k, rng);
    xq.s_dec = 1.7f;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.k; ++j) xd[i * c.k + j] = xq.at(i, j) * xq.s_dec;
    p.a_is_nvfp4 = true;
    p.a_q.codes = to_device(xq.codes);
    p.a_q.scales = to_device(xq.scales);
    p.a_q.s_dec = device_scalar(xq.s_dec);
    frees.insert(frees.end(), {(void*)p.a_q.codes, (void*)p.a_q.scales, (void*)p.a_q.s_dec});
  } else if (c.x_kind == 0) {
    std::vector<__nv_bfloat16> x(c.m * c.k);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = __float2bfloat16(nd(rng));
      xd[i] = __bfloat162float(x[i]);
    }
    p.a = to_device(x);
    p.a_dtype = DType::kBF16;
    frees.push_back((void*)p.a);
  } else if (c.x_kind == 1) {
    std::vector<__half> x(c.m * c.k);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = __float2half(nd(rng));
      xd[i] = __half2float(x[i]);
    }
    p.a = to_device(x);
    p.a_dtype = DType::kF16;
    frees.push_back((void*)p.a);
  } else {
    std::vector<float> x(c.m * c.k);
    for (size_t i = 0; i < x.size(); ++i) xd[i] = x[i] = nd(rng);
    p.a = to_device(x);
    p.a_dtype = DType::kF32;
    frees.push_back((void*)p.a);
  }
  // f16 output: a smaller tensor scale keeps the random products inside the f16 range.
  const float w_s_dec = c.out == DType::kF16 ? w.s_dec * 1e-4f : w.s_dec;
  p.b.codes = to_device(w.codes);
  p.b.scales = to_device(w.scales);
  p.b.s_dec = device_scalar(w_s_dec);
  frees.insert(frees.end(), {(void*)p.b.codes, (void*)p.b.scales, (void*)p.b.s_dec});
  std::vector<float> bias(c.n);
  for (auto& b : bias) b = nd(rng);
  if (c.bias) {
    p.bias = to_device(bias);
    p.bias_dtype = DType::kF32;
    frees.push_back((void*)p.bias);
  }
  const size_t esize = c.out == DType::kF32 ? 4 : 2;
  void* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, c.m * c.n * esize));
  CUDA_CHECK(cudaMemset(out, 0xFF, c.m * c.n * esize));
  frees.push_back(out);
  p.out = out;
  p.out_dtype = c.out;
  p.workspace_bytes = sm90::decode_workspace_bytes(p);  // NVFP4 x staged as bf16 (large weights, M <= 4)
  if (p.workspace_bytes > 0) {
    CUDA_CHECK(cudaMalloc(&p.workspace, p.workspace_bytes));
    frees.push_back(p.workspace);
  }
  CUDA_CHECK(sm90::decode_gemm(p, 0));
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> o16(c.m * c.n);
  std::vector<float> o32(c.m * c.n);
  if (esize == 4) CUDA_CHECK(cudaMemcpy(o32.data(), out, c.m * c.n * 4, cudaMemcpyDeviceToHost));
  else CUDA_CHECK(cudaMemcpy(o16.data(), out, c.m * c.n * 2, cudaMemcpyDeviceToHost));
  // Checked rows of w: all of them for small N, a strided subset (plus the last) for large N.
  const int64_t stride = c.n * c.k > (int64_t{1} << 24) ? 37 : 1;
  double num = 0, den = 0;
  std::vector<double> wrow(c.k);
  for (int64_t n = 0; n < c.n; n = (n + stride < c.n || n == c.n - 1) ? n + stride : c.n - 1) {
    for (int64_t j = 0; j < c.k; ++j) wrow[j] = w.at(n, j);
    for (int64_t m = 0; m < c.m; ++m) {
      double ref = 0;
      for (int64_t j = 0; j < c.k; ++j) ref += xd[m * c.k + j] * wrow[j];
      ref *= w_s_dec;
      if (c.bias) ref += bias[n];
      double got;
      const uint16_t h = o16[m * c.n + n];
      if (c.out == DType::kF32) got = o32[m * c.n + n];
      else if (c.out == DType::kBF16) got = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(&h));
      else got = __half2float(*reinterpret_cast<const __half*>(&h));
      num += (got - ref) * (got - ref);
      den += ref * ref;
    }
    if (n == c.n - 1) break;
  }
  for (void* f : frees) CUDA_CHECK(cudaFree(f));
  const double err = std::sqrt(num / std::max(den, 1e-300));
  *err_out = err;
  const double tol = c.out == DType::kF32 ? 1e-5 : c.out == DType::kBF16 ? 8e-3 : 1e-3;
  return err <= tol;  // NaN fails
}

int check_all(bool tails_only) {
  std::mt19937 rng(1234);
  const int64_t big[][2] = {{14336, 4096}, {4096, 14336}, {4096, 4096}, {6144, 4096}};
  std::vector<CheckCase> cases;
  if (!tails_only)
    for (auto& s : big)
      for (int64_t m : {1, 16, 32}) cases.push_back({m, s[0], s[1], 0, DType::kF32, false});
  // Tails: M not a multiple of 8, N of 64 or 16, K of 128 or 32 (8-byte aligned rows: the
  // kernels fixed to 8-byte code loads, also at M = 9-16 and on whole 128-row scale tiles).
  const int64_t tails[][3] = {{1, 100, 272},  {3, 77, 4112}, {13, 200, 48},  {32, 64, 16},
                              {7, 1, 144},    {9, 130, 400}, {17, 61, 1296}, {25, 33, 2064},
                              {2, 4096, 4112}, {31, 300, 8208}, {12, 384, 1040}, {16, 256, 2064},
                              {5, 128, 80}};
  for (auto& t : tails)
    for (int xk = 0; xk < 4; ++xk) cases.push_back({t[0], t[1], t[2], xk, DType::kF32, xk % 2 == 0});
  for (int xk = 0; xk < 4; ++xk) {
    cases.push_back({16, 1000, 3072, xk, DType::kF32, true});
    cases.push_back({32, 520, 1040, xk, DType::kBF16, true});
    cases.push_back({5, 520, 1040, xk, DType::kF16, false});
  }
  int fails = 0;
  for (const auto& c : cases) {
    double err = 0;
    const bool ok = run_check(c, rng, &err);
    if (!ok) ++fails;
    std::printf("check m=%-3lld n=%-6lld k=%-6lld x=%-5s out=%-4s bias=%d  rel_err=%.3e %s\n",
                (long long)c.m, (long long)c.n, (long long)c.k,
                c.x_kind == 3 ? "nvfp4" : dtype_name(c.x_kind == 0 ? DType::kBF16 : c.x_kind == 1 ? DType::kF16 : DType::kF32),
                dtype_name(c.out), c.bias, err, ok ? "ok" : "FAIL");
  }
  std::printf("check: %d of %zu failed\n", fails, cases.size());
  return fails;
}

// ---------------------------------------------------------------------------------------------
// Timing

constexpr int kCallsPerGraph = 100;
constexpr int kRepeats = 7;

// Median microseconds per call of `enqueue(i)` (i = call index), replayed from a CUDA graph.
template <typename F>
double time_graph(F enqueue, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) enqueue(i);
  CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCallsPerGraph; ++i) enqueue(i);
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  CUDA_CHECK(cudaGraphLaunch(ge, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  const double us = median_us_per_call(s, kRepeats, 1, [&](int) { CUDA_CHECK(cudaGraphLaunch(ge, s)); });
  CUDA_CHECK(cudaGraphExecDestroy(ge));
  CUDA_CHECK(cudaGraphDestroy(g));
  return us / kCallsPerGraph;
}

// The bandwidth ceiling: a plain 16-byte-per-thread copy kernel (a graph's memcpy node may run
// on a copy engine, which is slower than the SMs).
__global__ void copy_kernel(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    b[i] = a[i];
}

// The floor for one shape: a launch that only reads its weight bytes (codes, then scales),
// contiguously, 16 bytes per thread with 4 loads in flight, as one call of ours must at best.
__global__ void read_kernel(const uint4* __restrict__ a, size_t na, const uint4* __restrict__ b, size_t nb,
                            uint32_t* sink) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < na; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = i + u * stride < na ? __ldcs(a + i + u * stride) : uint4{};
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < nb; i += stride) {
    const uint4 v = __ldcs(b + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // never true in practice; keeps the loads
}

// `only_m`/`only_n` > 0 restrict the timing to that M and N (e.g. for a profiler run).
int time_all(bool peers, const char* label, int64_t only_m, int64_t only_n) {
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  double copy_gbs = 0;
  Cublas cublas;
  if (peers) {
    const size_t bytes = size_t{512} << 20;
    void *a, *b;
    CUDA_CHECK(cudaMalloc(&a, bytes));
    CUDA_CHECK(cudaMalloc(&b, bytes));
    CUDA_CHECK(cudaMemset(a, 1, bytes));
    const int grid = prop.multiProcessorCount * 8;
    const double us = time_graph(
        [&](int) { copy_kernel<<<grid, 512, 0, s>>>(static_cast<const uint4*>(a), static_cast<uint4*>(b), bytes / 16); }, s);
    copy_gbs = 2.0 * bytes / (us * 1e3);
    std::printf("device %s, %d SMs, L2 %d MB; copy kernel %zu MB: %.1f us, %.0f GB/s (read+write)\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, bytes >> 20, us, copy_gbs);
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    cublas.init(s);
  }
  std::printf("\n| variant | M | N | K | ours us | GB/s (weights) | %% of copy | cuBLAS bf16 us | speedup | read floor us | floor / ours |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(7);
  for (auto& sh : kLlamaShapes) {
    const int64_t n = sh[0], k = sh[1];
    if (only_n > 0 && n != only_n) continue;
    const size_t code_bytes = n * k / 2, scale_bytes = scale_matrix_bytes(n, k / kBlockSize);
    const size_t w_bytes = code_bytes + scale_bytes;
    const int copies = rotation_copies(w_bytes);
    uint8_t *codes, *scales;
    CUDA_CHECK(cudaMalloc(&codes, code_bytes * copies));
    CUDA_CHECK(cudaMalloc(&scales, scale_bytes * copies));
    {
      const HostNvfp4 h = random_nvfp4(n, k, rng);
      for (int c = 0; c < copies; ++c) {
        CUDA_CHECK(cudaMemcpy(codes + c * code_bytes, h.codes.data(), code_bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(scales + c * scale_bytes, h.scales.data(), scale_bytes, cudaMemcpyHostToDevice));
      }
    }
    float* s_dec = device_scalar(0.37f);
    void *x, *y;
    CUDA_CHECK(cudaMalloc(&x, 32 * k * 2));
    CUDA_CHECK(cudaMalloc(&y, 32 * n * 4));
    {
      std::vector<__nv_bfloat16> hx(32 * k);
      std::normal_distribution<float> nd;
      for (auto& v : hx) v = __float2bfloat16(nd(rng));
      CUDA_CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    }
    // bf16 weights for cuBLAS, rotated the same way.
    const size_t wb_bytes = n * k * 2;
    const int wb_copies = rotation_copies(wb_bytes);
    void* wb = nullptr;
    if (cublas.ok) {
      CUDA_CHECK(cudaMalloc(&wb, wb_bytes * wb_copies));
      CUDA_CHECK(cudaMemset(wb, 0x3C, wb_bytes * wb_copies));
    }
    double floor_us = NAN;
    if (peers) {
      floor_us = time_graph(
          [&](int i) {
            read_kernel<<<prop.multiProcessorCount * 4, 512, 0, s>>>(
                reinterpret_cast<const uint4*>(codes + (i % copies) * code_bytes), code_bytes / 16,
                reinterpret_cast<const uint4*>(scales + (i % copies) * scale_bytes), scale_bytes / 16,
                static_cast<uint32_t*>(y));
          },
          s);
    }
    for (int64_t m : {1, 4, 8, 16, 32}) {
      if (only_m > 0 && m != only_m) continue;
      const GemmProblem p = w4a16_problem(m, n, k, x, codes, scales, s_dec, y);  // weights rotated per call
      const double us = time_graph(
          [&](int i) {
            GemmProblem q = p;
            q.b.codes = codes + (i % copies) * code_bytes;
            q.b.scales = scales + (i % copies) * scale_bytes;
            CUDA_CHECK(sm90::decode_gemm(q, s));
          },
          s);
      const double gbs = w_bytes / (us * 1e3);
      double cb = NAN;
      if (cublas.ok) {
        cb = time_graph(
            [&](int i) {
              if (cublas.run(static_cast<uint8_t*>(wb) + (i % wb_copies) * wb_bytes, x, y, m, n, k) != 0) {
                std::fprintf(stderr, "cublasGemmEx failed\n");
                std::exit(1);
              }
            },
            s);
      }
      std::printf("| %s | %lld | %lld | %lld | %.2f | %.0f | %.0f%% | %.2f | %.2fx | %.2f | %.0f%% |\n", label,
                  (long long)m, (long long)n, (long long)k, us, gbs,
                  copy_gbs > 0 ? 100.0 * gbs / copy_gbs : NAN, cb, cb / us, floor_us, 100.0 * floor_us / us);
      std::fflush(stdout);
    }
    CUDA_CHECK(cudaFree(codes));
    CUDA_CHECK(cudaFree(scales));
    CUDA_CHECK(cudaFree(s_dec));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y));
    if (wb) CUDA_CHECK(cudaFree(wb));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool check = false, tails = false, time = false, peers = false;
  const char* label = "ours";
  int64_t only_m = 0, only_n = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--check")) check = true;
    else if (!std::strcmp(argv[i], "--tails")) tails = true;
    else if (!std::strcmp(argv[i], "--time")) time = true;
    else if (!std::strcmp(argv[i], "--peers")) peers = true;
    else if (!std::strcmp(argv[i], "--label") && i + 1 < argc) label = argv[++i];
    else if (!std::strcmp(argv[i], "--only") && i + 2 < argc) {  // --only M N
      only_m = std::atoll(argv[++i]);
      only_n = std::atoll(argv[++i]);
    }
  }
  int rc = 0;
  if (check) rc |= check_all(tails) != 0;
  if (time) rc |= time_all(peers, label, only_m, only_n);
  return rc;
}
