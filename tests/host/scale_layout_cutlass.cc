// Checks that the tiled scale layout of common/scale_layout.h is CUTLASS's own: for every
// (row, k) of many [L, rows, K] problems, scale_offset must equal the offset CUTLASS's
// Sm1xxBlockScaledConfig<16>::tile_atom_to_shape_SFA / _SFB and
// Sm1xxBlockScaledOutputConfig<16>::tile_atom_to_shape_SFD give, and DESIGN.md §3's formula
// ([rt, kt, i, j, l] row-major). Prints one line per problem:
//   rows K L checked mismatches_sfa mismatches_sfb mismatches_sfd mismatches_design size_ok
#include <cstdint>
#include <cstdio>

#include "common/scale_layout.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"

namespace {

using jax_nvfp4::scale_matrix_bytes;
using jax_nvfp4::scale_offset;
using Config = cutlass::detail::Sm1xxBlockScaledConfig<16>;
using OutConfig = cutlass::detail::Sm1xxBlockScaledOutputConfig<16>;

// DESIGN.md §3: element [rt, kt, i, j, l] scales row rt*128 + j*32 + i and block kt*4 + l.
int64_t design_offset(int64_t row, int64_t kb, int64_t k_blocks) {
  const int64_t kt_count = (k_blocks + 3) / 4;
  const int64_t rt = row / 128, j = (row % 128) / 32, i = row % 32;
  const int64_t kt = kb / 4, l = kb % 4;
  return (((rt * kt_count + kt) * 32 + i) * 4 + j) * 4 + l;
}

void check(int rows, int k, int batch) {
  const int64_t kb = k / 16;
  // The same matrix as A (rows = M), as B (rows = N) and as an output D (rows = M, cols = K).
  const auto sfa = Config::tile_atom_to_shape_SFA(cute::make_shape(rows, 1, k, batch));
  const auto sfb = Config::tile_atom_to_shape_SFB(cute::make_shape(1, rows, k, batch));
  const auto sfd = OutConfig::tile_atom_to_shape_SFD(cute::make_shape(rows, k, 1, batch));
  const int64_t matrix = scale_matrix_bytes(rows, kb);
  int64_t checked = 0, bad_a = 0, bad_b = 0, bad_d = 0, bad_design = 0;
  for (int l = 0; l < batch; ++l) {
    for (int r = 0; r < rows; ++r) {
      for (int e = 0; e < k; ++e) {
        const int64_t ours = l * matrix + scale_offset(r, e / 16, kb);
        bad_a += sfa(r, e, l) != ours;
        bad_b += sfb(r, e, l) != ours;
        bad_d += sfd(r, e, l) != ours;
        bad_design += l * matrix + design_offset(r, e / 16, kb) != ours;
        ++checked;
      }
    }
  }
  // CUTLASS's buffer (padding included) is exactly ours.
  const bool size_ok = cute::cosize(cute::filter_zeros(sfa)) == batch * matrix &&
                       cute::cosize(cute::filter_zeros(sfd)) == batch * matrix;
  std::printf("%d %d %d %lld %lld %lld %lld %lld %d\n", rows, k, batch, (long long)checked,
              (long long)bad_a, (long long)bad_b, (long long)bad_d, (long long)bad_design,
              size_ok ? 1 : 0);
}

}  // namespace

int main() {
  const int rows[] = {1, 31, 32, 127, 128, 129, 300};
  const int ks[] = {16, 48, 64, 80, 256, 272, 1040};
  for (int r : rows) {
    for (int k : ks) check(r, k, 1);
  }
  check(129, 80, 3);
  check(256, 1024, 2);
  return 0;
}
