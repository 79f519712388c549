// Asks CUTLASS itself whether its grouped GEMM (ragged_sm100_cutlass.cuh) accepts the groups the
// sm_100a ragged path plans: for each call on the command line the groups' shapes (count_g, N, K)
// are placed as the setup kernel places them (ragged_sm100_plan.h) and handed to
// Gemm::can_implement as host shapes, which it checks for TMA alignment (the launcher passes none,
// so this is where the plan's K % 32 and N % 4 are held against CUTLASS's rules). Host code only;
// the test builds it as PTX, without ptxas.
//
//   ragged_sm100_can_implement N,K,SIZE_0,SIZE_1,... ...   prints "N K accepted(0|1)" per call
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gemm/sm100/ragged_sm100_cutlass.cuh"

int main(int argc, char** argv) {
  using namespace jax_nvfp4;
  using namespace jax_nvfp4::sm100;
  for (int i = 1; i < argc; ++i) {
    std::vector<long long> v;
    for (char* tok = std::strtok(argv[i], ","); tok != nullptr; tok = std::strtok(nullptr, ",")) {
      v.push_back(std::atoll(tok));
    }
    if (v.size() < 3) return 2;
    const int64_t n = v[0], k = v[1], m = 1 << 20;
    std::vector<GroupShape> shapes;
    int64_t before = 0;
    for (size_t g = 2; g < v.size(); ++g) {
      const GroupRows r = group_rows(0, before, v[g], m);
      before += v[g] > 0 ? v[g] : 0;
      shapes.push_back(GroupShape{static_cast<int>(r.end - r.start), static_cast<int>(n),
                                  static_cast<int>(k)});
    }
    RaggedCutlassArgs args;  // device arrays: never dereferenced on the host
    args.groups = static_cast<int>(shapes.size());
    const auto arguments = GroupedGemm::arguments(args, 148, shapes.data());
    const bool ok = GroupedGemm::Gemm::can_implement(arguments) == cutlass::Status::kSuccess;
    std::printf("%lld %lld %d\n", (long long)n, (long long)k, ok ? 1 : 0);
  }
  return 0;
}
