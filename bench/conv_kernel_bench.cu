// Times the sm_90a convolution kernel alone (no JAX) on the ResNet-50 3x3 stages, to compare
// kernel variants and to separate the kernel's time from what a JAX call adds around it.
//
//   bash bench/conv_kernel_bench.sh [--label NAME] [--shape SUBSTRING] [--kernel PREFIX]
//                                   [--splits 2,3,4] [--custom N,H,W,C,K[,R,S,stride]]
//   (builds it with cuda/conv/sm90/conv_sm90.cu and the conv_sm90_ws_s<S>.cu units, then runs it)
//
// Every sm_90a kernel that takes a shape runs (ConvSm90Kernel: register_a, the warp-specialized
// ws128xBN tilings with their loads, and auto, the library's choice); --kernel keeps those whose
// name starts with PREFIX (and auto); --splits adds the TMA ws128xBN and stage-split (ws64xBNks)
// tilings split-K over a cluster of that many CTAs. --custom times that one problem ('SAME'
// padding; 3x3, stride 1 by default) instead of the list below (e.g. a sweep over C).
// Random bf16 activations and NVFP4 weights (random codes, E4M3 scales in [2^-4, 2]), bf16
// output. Each shape: 68 sampled outputs (64 random, 4 at the ends of the last output row)
// checked against a float64 host convolution of the same operands; time per launch from CUDA
// events over 200 back-to-back launches, the kernels round-robin, median of 7 rounds (operands
// warm in L2, as PyTorch's cuDNN timing loop has them);
// an FNV hash of the output so two kernels or builds can be compared bit for bit.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/nvfp4_decode.cuh"
#include "common/scale_layout.h"
#include "conv/sm90/conv_sm90.h"
#include "cuda_check.h"
#include "event_timing.h"
#include "fnv_hash.h"

using namespace jax_nvfp4;

namespace {

struct Shape {
  const char* name;
  int n, h, w, c, k;
  int r = 3, s = 3, stride = 1;  // 'SAME' padding
};

const Shape kShapes[] = {
    {"resnet56x56x64 b32", 32, 56, 56, 64, 64},   {"resnet28x28x128 b32", 32, 28, 28, 128, 128},
    {"resnet14x14x256 b32", 32, 14, 14, 256, 256}, {"resnet7x7x512 b32", 32, 7, 7, 512, 512},
    {"resnet56x56x64 b1", 1, 56, 56, 64, 64},     {"resnet28x28x128 b1", 1, 28, 28, 128, 128},
    {"resnet14x14x256 b1", 1, 14, 14, 256, 256},   {"resnet7x7x512 b1", 1, 7, 7, 512, 512},
    {"wide 1x7 17x17x192 b32", 32, 17, 17, 192, 192, 1, 7}, {"wide 7x7 28x28x128 b32", 32, 28, 28, 128, 128, 7, 7},
    {"stride2 3x3 56x56x64 b32", 32, 56, 56, 64, 128, 3, 3, 2},
    {"stride2 3x3 28x28x256 b32", 32, 28, 28, 256, 256, 3, 3, 2},
    {"stride2 3x3 14x14x512 b32", 32, 14, 14, 512, 512, 3, 3, 2},
};

// 'SAME' padding along one axis: (low pad, output size).
std::pair<int, int> same_padding(int in, int window, int stride) {
  const int out = (in + stride - 1) / stride;
  const int total = std::max((out - 1) * stride + window - in, 0);
  return {total / 2, out};
}

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// The host copy of one problem's operands, for the sampled float64 check.
struct HostOperands {
  std::vector<__nv_bfloat16> x;
  std::vector<uint8_t> codes, scales;
};

double weight_value(const ConvProblem& p, const HostOperands& h, int r, int s, int64_t k, int64_t c) {
  const int64_t row = (static_cast<int64_t>(r) * p.s + s) * p.k + k;
  const uint8_t byte = h.codes[(row * p.c + c) / 2];
  const int64_t kb = p.c / kBlockSize;
  const int64_t scale_at = (static_cast<int64_t>(r) * p.s + s) * scale_matrix_bytes(p.k, kb) +
                           scale_offset(k, c / kBlockSize, kb);
  return e2m1_to_float(c % 2 ? byte >> 4 : byte & 15) * e4m3_to_float(h.scales[scale_at]);
}

double reference_output(const ConvProblem& p, const HostOperands& h, int64_t n, int64_t pp, int64_t q,
                        int64_t k) {
  double sum = 0;
  for (int r = 0; r < p.r; ++r) {
    for (int s = 0; s < p.s; ++s) {
      const int64_t hh = pp * p.stride_h - p.pad_h + r * p.dil_h, ww = q * p.stride_w - p.pad_w + s * p.dil_w;
      if (hh < 0 || hh >= p.h || ww < 0 || ww >= p.w) continue;
      for (int64_t c = 0; c < p.c; ++c) {
        sum += static_cast<double>(__bfloat162float(h.x[((n * p.h + hh) * p.w + ww) * p.c + c])) *
               weight_value(p, h, r, s, k, c);
      }
    }
  }
  return sum;
}

struct KernelChoice {
  std::string name;
  ConvSm90Kernel kernel;
  int splits = 1;
};

const KernelChoice kKernels[] = {
    {"register_a", ConvSm90Kernel::kRegisterA},
    {"ws128x64", ConvSm90Kernel::kWs128x64},
    {"ws128x112", ConvSm90Kernel::kWs128x112},
    {"ws128x128", ConvSm90Kernel::kWs128x128},
    {"ws128x208", ConvSm90Kernel::kWs128x208},
    {"ws128x256", ConvSm90Kernel::kWs128x256},
    {"ws64x256", ConvSm90Kernel::kWs64x256},
    {"ws64x416", ConvSm90Kernel::kWs64x416},
    {"ws64x64ks", ConvSm90Kernel::kWs64x64Ks},
    {"ws64x128ks", ConvSm90Kernel::kWs64x128Ks},
    {"ws64x224ks", ConvSm90Kernel::kWs64x224Ks},
    {"ws64x256ks", ConvSm90Kernel::kWs64x256Ks},
    {"ws128x128_cpasync", ConvSm90Kernel::kWs128x128CpAsync},
    {"ws128x256_cpasync", ConvSm90Kernel::kWs128x256CpAsync},
    {"auto", ConvSm90Kernel::kAuto},
};

// "2,3,4" -> {2, 3, 4}.
std::vector<int> parse_ints(const char* list) {
  std::vector<int> out;
  for (const char* c = list; *c != '\0';) {
    char* end = nullptr;
    out.push_back(static_cast<int>(std::strtol(c, &end, 10)));
    if (end == c) break;
    c = *end == ',' ? end + 1 : end;
  }
  return out;
}

// kKernels, plus every warp-specialized TMA tiling with 128 channels or the stage split, split
// over each of `splits` CTAs (named like ws128x256/s4, ws64x256ks/s2).
std::vector<KernelChoice> kernel_choices(const std::vector<int>& splits) {
  std::vector<KernelChoice> out(std::begin(kKernels), std::end(kKernels));
  for (const KernelChoice& kc : kKernels) {
    const bool splittable = kc.name.rfind("ws128x", 0) == 0 || kc.name.find("ks") != std::string::npos;
    if (!splittable || kc.name.find("cpasync") != std::string::npos) continue;
    for (int s : splits) {
      if (s > 1) out.push_back({kc.name + "/s" + std::to_string(s), kc.kernel, s});
    }
  }
  return out;
}

void run_shape(const Shape& sh, const char* label, const char* only_kernel, const std::vector<KernelChoice>& choices) {
  ConvProblem p;
  p.n = sh.n; p.h = sh.h; p.w = sh.w; p.c = sh.c; p.k = sh.k;
  p.r = sh.r; p.s = sh.s; p.stride_h = sh.stride; p.stride_w = sh.stride;
  std::tie(p.pad_h, p.p) = same_padding(sh.h, sh.r, sh.stride);
  std::tie(p.pad_w, p.q) = same_padding(sh.w, sh.s, sh.stride);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  HostOperands h;
  h.x.resize(p.n * p.h * p.w * p.c);
  for (auto& v : h.x) v = __float2bfloat16(normal(rng));
  const int64_t kb = p.c / kBlockSize;
  h.codes.resize(p.r * p.s * p.k * p.c / 2);
  h.scales.resize(p.r * p.s * scale_matrix_bytes(p.k, kb));
  for (auto& v : h.codes) v = static_cast<uint8_t>(rng());
  for (auto& v : h.scales) v = static_cast<uint8_t>(0x20 + rng() % 0x21);  // 2^-4 .. 2
  const float one = 1.f;

  p.x = to_device(h.x);
  p.x_dtype = DType::kBF16;
  p.wgt.codes = to_device(h.codes);
  p.wgt.scales = to_device(h.scales);
  p.wgt.s_dec = to_device(std::vector<float>{one});
  const int64_t out_elems = p.n * p.p * p.q * p.k;
  CUDA_CHECK(cudaMalloc(&p.out, out_elems * 2));
  p.out_dtype = DType::kBF16;

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  // Every kernel that takes the problem: checked on 68 sampled outputs, then timed round-robin
  // (7 rounds of 200 launches each, so clock drift as the GPU warms hits all alike).
  std::vector<KernelChoice> ran;
  std::vector<std::vector<double>> times;
  std::vector<double> worst_err;
  std::vector<uint64_t> hashes;
  for (const KernelChoice& kc : choices) {
    if (only_kernel != nullptr && kc.name.rfind(only_kernel, 0) != 0 && kc.name != "auto") continue;
    const cudaError_t err = conv_sm90(p, stream, kc.kernel, kc.splits);
    if (err == cudaErrorInvalidValue) {
      cudaGetLastError();
      continue;
    }
    CUDA_CHECK(err);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> out(out_elems);
    CUDA_CHECK(cudaMemcpy(out.data(), p.out, out_elems * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemset(p.out, 0xFF, out_elems * 2));  // the next kernel must write every output
    std::mt19937 pick(99);
    // 64 random outputs, then the first and last channel of the last output row's two ends,
    // where a tile that ends with the virtual rows reads its halo past the final pixel.
    std::vector<int64_t> samples;
    for (int i = 0; i < 64; ++i) samples.push_back(static_cast<int64_t>(pick() % static_cast<uint64_t>(out_elems)));
    const int64_t last_row = (p.n * p.p - 1) * p.q * p.k;
    for (int64_t q : {int64_t{0}, p.q - 1}) {
      for (int64_t k : {int64_t{0}, p.k - 1}) samples.push_back(last_row + q * p.k + k);
    }
    double worst = 0;
    for (const int64_t e : samples) {
      const int64_t k = e % p.k, q = (e / p.k) % p.q, pp = (e / (p.k * p.q)) % p.p, n = e / (p.k * p.q * p.p);
      const double want = reference_output(p, h, n, pp, q, k);
      uint32_t bits = static_cast<uint32_t>(out[e]) << 16;
      float got;
      std::memcpy(&got, &bits, 4);
      worst = std::max(worst, std::fabs(got - want) / (std::fabs(want) + 1.0));
    }
    ran.push_back(kc);
    worst_err.push_back(worst);
    hashes.push_back(fnv_hash(out));
    times.emplace_back();
  }
  for (int round = 0; round < 7; ++round) {
    for (size_t i = 0; i < ran.size(); ++i) {
      const KernelChoice& kc = ran[i];
      times[i].push_back(
          median_us_per_call(stream, 1, 200, [&](int) { CUDA_CHECK(conv_sm90(p, stream, kc.kernel, kc.splits)); }));
    }
  }
  const double flops = 2.0 * out_elems * p.r * p.s * p.c;
  for (size_t i = 0; i < ran.size(); ++i) {
    std::sort(times[i].begin(), times[i].end());
    const double us = times[i][times[i].size() / 2];
    std::printf("| %s | %s | %s | %.1f | %.0f | %.1e | %016llx |\n", label, ran[i].name.c_str(), sh.name, us, flops / us / 1e6,
                worst_err[i], static_cast<unsigned long long>(hashes[i]));
  }
  std::fflush(stdout);
  CUDA_CHECK(cudaFree(const_cast<void*>(p.x)));
  CUDA_CHECK(cudaFree(const_cast<uint8_t*>(p.wgt.codes)));
  CUDA_CHECK(cudaFree(const_cast<uint8_t*>(p.wgt.scales)));
  CUDA_CHECK(cudaFree(const_cast<float*>(p.wgt.s_dec)));
  CUDA_CHECK(cudaFree(p.out));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  const char* label = "ours";
  const char* only = nullptr;
  const char* only_kernel = nullptr;
  std::vector<int> splits, custom;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--splits")) splits = parse_ints(argv[i + 1]);
    if (!std::strcmp(argv[i], "--label")) label = argv[i + 1];
    if (!std::strcmp(argv[i], "--shape")) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--kernel")) only_kernel = argv[i + 1];
    if (!std::strcmp(argv[i], "--custom")) custom = parse_ints(argv[i + 1]);
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n| variant | shape | us | TFLOP/s | max rel err (68 samples) | output hash |\n"
              "|---|---|---|---|---|---|\n", prop.name, prop.multiProcessorCount);
  if (!custom.empty()) {
    if (custom.size() != 5 && custom.size() != 8) {
      std::fprintf(stderr, "--custom takes N,H,W,C,K or N,H,W,C,K,R,S,stride\n");
      return 2;
    }
    if (custom.size() == 5) custom.insert(custom.end(), {3, 3, 1});  // 3x3, stride 1
    char name[96];
    std::snprintf(name, sizeof name, "custom %dx%d %dx%dx%d->%d /%d b%d", custom[5], custom[6], custom[1], custom[2],
                  custom[3], custom[4], custom[7], custom[0]);
    const Shape sh{name, custom[0], custom[1], custom[2], custom[3], custom[4], custom[5], custom[6], custom[7]};
    run_shape(sh, label, only_kernel, kernel_choices(splits));
    return 0;
  }
  for (const Shape& sh : kShapes) {
    if (only == nullptr || std::strstr(sh.name, only)) run_shape(sh, label, only_kernel, kernel_choices(splits));
  }
  return 0;
}
