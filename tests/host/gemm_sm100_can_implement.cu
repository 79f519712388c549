// Asks CUTLASS itself whether it accepts the arguments the sm_100a launcher builds: for each
// problem on the command line, runs the planner and argument builder (gemm_sm100_args.h) and
// calls Gemm::can_implement of the 1-SM and 2-SM kernels of that output kind. Host code only
// (can_implement needs no GPU), so the test builds it as PTX, without ptxas.
//
//   gemm_sm100_can_implement MODE M,N,K,OUT ...   MODE: planned | unpadded_k | unpadded_n
//   prints "M N K OUT can_1sm can_2sm" per problem
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gemm/sm100/gemm_sm100_cutlass.cuh"

namespace {

using namespace jax_nvfp4;
using namespace jax_nvfp4::sm100;

template <OutKind kKind, bool kTwoSm>
int accepts(const GemmProblem& p, const Plan& plan) {
  using G = CutlassGemm<kKind, kTwoSm>;
  const auto args = G::arguments(make_args(p, plan), 148);
  return G::Gemm::can_implement(args) == cutlass::Status::kSuccess;
}

template <OutKind kKind>
void report(const GemmProblem& p, const Plan& plan, const char* out) {
  std::printf("%lld %lld %lld %s %d %d\n", (long long)p.m, (long long)p.n, (long long)p.k, out,
              accepts<kKind, false>(p, plan), accepts<kKind, true>(p, plan));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* mode = argv[1];
  alignas(256) static uint8_t fake[256];  // pointers are never dereferenced on the host
  for (int i = 2; i < argc; ++i) {
    long long m, n, k;
    char out[8] = {};
    if (std::sscanf(argv[i], "%lld,%lld,%lld,%7s", &m, &n, &k, out) != 4) return 2;
    GemmProblem p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.a_is_nvfp4 = true;
    p.a_q.codes = p.a_q.scales = p.b.codes = p.b.scales = fake;
    p.workspace = fake;
    if (std::strcmp(out, "nvfp4") == 0) {
      p.out_codes = p.out_scales = fake;
      p.out_s_enc = reinterpret_cast<const float*>(fake);
    } else {
      p.out = fake;
      p.out_dtype = std::strcmp(out, "f32") == 0 ? DType::kF32 : DType::kBF16;
    }
    Plan plan = make_plan(p, 148, 0);
    if (std::strcmp(mode, "unpadded_k") == 0) plan.k_pad = p.k;
    if (std::strcmp(mode, "unpadded_n") == 0) plan.n_pad = p.n;
    switch (plan.kind) {
      case OutKind::kF32: report<OutKind::kF32>(p, plan, out); break;
      case OutKind::kBF16: report<OutKind::kBF16>(p, plan, out); break;
      case OutKind::kNvfp4: report<OutKind::kNvfp4>(p, plan, out); break;
    }
  }
  return 0;
}
