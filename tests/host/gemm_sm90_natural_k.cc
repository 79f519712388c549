// Checks the fused_ws kernels' weight-code order (gemm/sm90/natural_k.h) against CuTe's register
// layout of wgmma's A operand: a consumer thread decodes nibble n of stored word 4t + q as pair
// j = n % 4 of word q, half n / 4, into register 2 (j % 2) of k-step 2q + j / 2 (fused_weights.cuh,
// dequant_words); CuTe's ALayout of SM90_64x128x16_F32BF16BF16_RS says which k slot that register
// half holds, so the element it decodes must be 16 (k-step) + slot: natural_k_element must say
// so, and natural_k_codes must put that element's code there, for random rows of codes.
// Prints "checked <count>" and "natural ok", or the first problem.
#include <cstdio>
#include <random>

#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "gemm/sm90/natural_k.h"

using namespace jax_nvfp4::sm90;

int main() {
  using Traits = cute::MMA_Traits<cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>>;
  const auto a_layout = typename Traits::ALayout{};  // (thread, value) -> m + 64 k of the 64 x 16 A tile
  long checked = 0;
  int bad = 0, seen[128] = {};
  for (int t = 0; t < 4; ++t) {
    for (int q = 0; q < 4; ++q) {
      for (int n = 0; n < 8; ++n) {
        const int j = n % 4, half = n / 4;
        const int value = 2 * (2 * (j % 2)) + half;  // register 2 (j % 2), row r0, this half
        const int slot = static_cast<int>(a_layout(t, value)) / 64;
        const int e = natural_k_element(4 * t + q, n);
        bad += e != 16 * (2 * q + j / 2) + slot;
        ++seen[e];
        ++checked;
      }
    }
  }
  for (int e = 0; e < 128; ++e) bad += seen[e] != 1;
  std::mt19937 rng(5);
  for (int row = 0; row < 1000; ++row) {
    uint32_t natural[16], stored[16];
    for (auto& w : natural) w = rng();
    natural_k_codes(natural, stored);
    for (int w = 0; w < 16; ++w) {
      for (int n = 0; n < 8; ++n) {
        const int e = natural_k_element(w, n);
        bad += ((stored[w] >> (4 * n)) & 15u) != ((natural[e / 8] >> (4 * (e % 8))) & 15u);
        ++checked;
      }
    }
  }
  std::printf("checked %ld\n", checked);
  if (bad == 0) std::printf("natural ok\n");
  return bad == 0 ? 0 : 1;
}
