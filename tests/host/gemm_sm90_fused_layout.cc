// Checks the fused sm_90a GEMM's staged activation tile (gemm/sm90/fused_staging.h) against
// CuTe's own wgmma layout: for MT = 64, 128 and 256 rows, every element's offset must be the one
// cute::GMMA::Layout_K_SW128_Atom<bf16> tiled to [MT x 128] gives, each k-step's descriptor
// offset the atom's unswizzled offset of that k column, and the K order must put each of a
// chunk's 128 elements in its own (k-group, word, half) slot.
// Prints "MT checked mismatches" per tile width and "order ok", or the first problem.
#include <cstdio>

#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/tensor.hpp"
#include "gemm/sm90/fused_staging.h"

namespace {

// CuTe applies the swizzle of a GMMA layout to the shared-memory address, so offsets are taken
// through a tensor on a 1024-byte-aligned buffer.
alignas(1024) cute::bfloat16_t tile_buffer[256 * 128];

template <int MT>
int check_tile() {
  using namespace cute;
  const auto layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, make_shape(Int<MT>{}, Int<128>{}));
  const auto tile = make_tensor(make_smem_ptr(tile_buffer), layout);
  int checked = 0, bad = 0;
  for (int row = 0; row < MT; ++row) {
    for (int kg = 0; kg < 16; ++kg) {
      for (int t = 0; t < 4; ++t) {
        for (int half = 0; half < 2; ++half) {
          const int ours = 2 * jax_nvfp4::sm90::staged_word<MT>(kg, row, t) + half;  // bf16 elements
          bad += ours != static_cast<int>(&tile(row, 8 * kg + 2 * t + half) - tile_buffer);
          ++checked;
        }
      }
    }
  }
  for (int s = 0; s < 8; ++s) {  // wgmma reads k-step s from the atom's unswizzled origin of column 16s
    bad += jax_nvfp4::sm90::staged_k_step_offset<MT>(s) / 2 != static_cast<int>(layout.layout_b()(0, 16 * s));
    ++checked;
  }
  std::printf("%d %d %d\n", MT, checked, bad);
  return bad;
}

}  // namespace

int main() {
  int bad = check_tile<64>() + check_tile<128>() + check_tile<256>();
  int hits[16][4][2] = {};
  for (int e = 0; e < 128; ++e) ++hits[jax_nvfp4::sm90::staged_k_group(e)][e / 32][(e % 8) / 4];
  for (auto& kg : hits) {
    for (auto& t : kg) {
      for (int h : t) bad += h != 1;
    }
  }
  if (bad == 0) std::printf("order ok\n");
  return bad == 0 ? 0 : 1;
}
