// Prints the sm_100a launch plan and CUTLASS arguments (cuda/gemm/sm100/gemm_sm100_args.h)
// for one problem, so tests/test_gemm_sm100.py can compare them with independently computed
// expectations. Pointers are fake device addresses, printed as <buffer>+<byte offset>.
//
//   gemm_sm100_args M N K a_nvfp4(0|1) out(f32|bf16|f16|nvfp4) bias(none|f32|bf16) SMS QWS
//                   [activation(0 none|1 relu|2 gelu|3 silu|4 swiglu|5 geglu)]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gemm/sm100/gemm_sm100_args.h"

namespace {

using namespace jax_nvfp4;

struct Buffer {
  const char* name;
  uintptr_t base;
};
constexpr uintptr_t kSpan = uintptr_t(1) << 36;
const Buffer kBuffers[] = {{"a", 1 * kSpan},          {"a_codes", 2 * kSpan},
                           {"a_scales", 3 * kSpan},   {"b_codes", 4 * kSpan},
                           {"b_scales", 5 * kSpan},   {"bias", 6 * kSpan},
                           {"out", 7 * kSpan},        {"out_codes", 8 * kSpan},
                           {"out_scales", 9 * kSpan}, {"out_s_enc", 10 * kSpan},
                           {"ws", 11 * kSpan}};

void* fake(const char* name) {
  for (const Buffer& b : kBuffers) {
    if (std::strcmp(b.name, name) == 0) return reinterpret_cast<void*>(b.base);
  }
  std::abort();
}

void print_ptr(const char* key, const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr) {
    std::printf("%s=null\n", key);
    return;
  }
  for (const Buffer& b : kBuffers) {
    if (v >= b.base && v < b.base + kSpan) {
      std::printf("%s=%s+%llu\n", key, b.name, (unsigned long long)(v - b.base));
      return;
    }
  }
  std::printf("%s=?\n", key);
}

void print_stride(const char* key, const sm100::Stride& s) {
  std::printf("%s=%lld,%d,%lld\n", key, (long long)cute::get<0>(s), int(cute::get<1>(s)),
              (long long)cute::get<2>(s));
}

void print_offset(const char* key, size_t off) {
  if (off == sm100::kUnused) {
    std::printf("%s=unused\n", key);
  } else {
    std::printf("%s=%zu\n", key, off);
  }
}

// Whether a scale layout addresses (row, k) exactly where scale_offset says, for all of them.
template <class Layout>
bool layout_matches(const Layout& layout, int64_t rows, int64_t k, int64_t k_true) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t e = 0; e < k; ++e) {
      if (layout(r, e, 0) != scale_offset(r, e / kBlockSize, k_true / kBlockSize)) return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9 && argc != 10) return 2;
  GemmProblem p;
  p.m = std::atoll(argv[1]);
  p.n = std::atoll(argv[2]);
  p.k = std::atoll(argv[3]);
  p.a_is_nvfp4 = std::atoi(argv[4]) != 0;
  const char* out = argv[5];
  const char* bias = argv[6];
  const int sms = std::atoi(argv[7]);
  const size_t qws = std::strtoull(argv[8], nullptr, 10);

  if (p.a_is_nvfp4) {
    p.a_q.codes = static_cast<const uint8_t*>(fake("a_codes"));
    p.a_q.scales = static_cast<const uint8_t*>(fake("a_scales"));
  } else {
    p.a = fake("a");
  }
  p.b.codes = static_cast<const uint8_t*>(fake("b_codes"));
  p.b.scales = static_cast<const uint8_t*>(fake("b_scales"));
  if (std::strcmp(bias, "none") != 0) {
    p.bias = fake("bias");
    p.bias_dtype = std::strcmp(bias, "f32") == 0 ? DType::kF32 : DType::kBF16;
  }
  if (std::strcmp(out, "nvfp4") == 0) {
    p.out_codes = static_cast<uint8_t*>(fake("out_codes"));
    p.out_scales = static_cast<uint8_t*>(fake("out_scales"));
    p.out_s_enc = static_cast<const float*>(fake("out_s_enc"));
  } else {
    p.out = fake("out");
    p.out_dtype = std::strcmp(out, "f32") == 0    ? DType::kF32
                  : std::strcmp(out, "bf16") == 0 ? DType::kBF16
                                                  : DType::kF16;
  }
  p.workspace = fake("ws");
  if (argc == 10) p.activation = static_cast<Activation>(std::atoi(argv[9]));

  const char* reason = sm100::unsupported_reason(p);
  std::printf("unsupported=%s\n", reason ? reason : "none");
  if (reason) return 0;

  const sm100::Plan plan = sm100::make_plan(p, sms, qws);
  std::printf("kind=%d\nk_pad=%lld\nn_pad=%lld\ntwo_sm=%d\n", int(plan.kind),
              (long long)plan.k_pad, (long long)plan.n_pad, int(plan.two_sm));
  std::printf("quantize_a=%d\npad_a=%d\npad_b=%d\ncopy_bias=%d\nstage_out=%d\nactivation_pass=%d\n",
              int(plan.quantize_a), int(plan.pad_a), int(plan.pad_b), int(plan.copy_bias),
              int(plan.stage_out), int(plan.activation_pass));
  std::printf("quantize_ws_bytes=%zu\n", plan.quantize_ws_bytes);
  print_offset("off_scalars", plan.scalars);
  print_offset("off_a_codes", plan.a_codes);
  print_offset("off_a_scales", plan.a_scales);
  print_offset("off_a_s_dec", plan.a_s_dec);
  print_offset("off_quantize_ws", plan.quantize_ws);
  print_offset("off_a_padded", plan.a_padded);
  print_offset("off_b_padded", plan.b_padded);
  print_offset("off_bias", plan.bias);
  print_offset("off_out_staged", plan.out_staged);
  print_offset("off_activated", plan.activated);
  print_offset("off_cutlass", plan.cutlass_ws);

  const sm100::Args args = sm100::make_args(p, plan);
  std::printf("problem=%d,%d,%d\n", args.m, args.n, args.k);
  print_stride("stride_a", args.stride_a);
  print_stride("stride_b", args.stride_b);
  print_stride("stride_d", args.stride_d);
  print_ptr("ptr_a", args.a);
  print_ptr("ptr_b", args.b);
  print_ptr("ptr_sfa", args.sfa);
  print_ptr("ptr_sfb", args.sfb);
  print_ptr("ptr_d", args.d);
  print_ptr("ptr_alpha", args.alpha);
  print_ptr("ptr_bias", args.bias);
  print_ptr("ptr_sfd", args.sfd);
  print_ptr("ptr_norm", args.norm_constant);
  print_ptr("ptr_workspace", args.workspace);
  std::printf("sfa_ok=%d\n", int(layout_matches(args.layout_sfa, p.m, args.k, p.k)));
  std::printf("sfb_ok=%d\n", int(layout_matches(args.layout_sfb, p.n, args.k, p.k)));
  if (plan.kind == sm100::OutKind::kNvfp4) {
    std::printf("sfd_ok=%d\n", int(layout_matches(args.layout_sfd, p.m, args.n, p.n)));
  }
  return 0;
}
