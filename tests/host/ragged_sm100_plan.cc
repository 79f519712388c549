// Runs the sm_100a ragged path's own plan code (cuda/gemm/sm100/ragged_sm100_plan.h) for one call
// and checks what CUTLASS's grouped GEMM would read with the arguments it writes, so
// tests/test_gemm_sm100.py can compare the groups' rows with reference.ragged_segments.
//
//   ragged_sm100_plan M N K A_NVFP4(0|1) FIRST_ROW SIZE_0 SIZE_1 ...
//
// The groups' rows are placed as the setup kernel places them (group_rows over the running sum
// of the sizes). Prints key=value lines:
//   group<g>=start,end,first_tile        each group's rows [start, end) and first scale tile
//   region_<name>=offset                  the plan's workspace regions, and cutlass_ws
//   sfa_checked / sfa_mismatches          per (group row, K element): CUTLASS's layout_SFA of the
//                                         group, from its scale pointer, against the byte the
//                                         regroup kernel writes that scale to
//   sfb_checked / sfb_mismatches          per (weight row, K element) of every group: layout_SFB
//                                         from its pointer against the weights' tiled scales
//   a_mismatches / b_mismatches / d_mismatches   the groups' A, B, D pointers and strides against
//                                         the rows they must address
//   tiles_used / tiles_bound / sfa_region_fits   the regrouped row tiles, against the bound the
//                                         plan sizes its region by
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gemm/sm100/ragged_sm100_plan.h"

namespace {

using namespace jax_nvfp4;

// Fake device buffers, far apart: offsets within them are what is checked.
const uint8_t* kA = reinterpret_cast<const uint8_t*>(uintptr_t(1) << 40);
const uint8_t* kSfa = reinterpret_cast<const uint8_t*>(uintptr_t(2) << 40);
const uint8_t* kB = reinterpret_cast<const uint8_t*>(uintptr_t(3) << 40);
const uint8_t* kSfb = reinterpret_cast<const uint8_t*>(uintptr_t(4) << 40);
float* const kD = reinterpret_cast<float*>(uintptr_t(5) << 40);

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) return 2;
  const int64_t m = std::atoll(argv[1]), n = std::atoll(argv[2]), k = std::atoll(argv[3]);
  const bool a_nvfp4 = std::atoi(argv[4]) != 0;
  const int64_t first_row = std::atoll(argv[5]);
  std::vector<int64_t> sizes;
  for (int i = 6; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
  const int64_t groups = static_cast<int64_t>(sizes.size());

  GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a_is_nvfp4 = a_nvfp4;
  p.stack.count = groups;
  static const int32_t placeholder = 0;
  p.group_sizes = &placeholder;
  const char* why = sm100::ragged_unsupported_reason(p);
  std::printf("unsupported=%s\n", why == nullptr ? "none" : why);
  const sm100::RaggedPlan plan = sm100::make_ragged_plan(p, 4096);
  std::printf("region_a_codes=%lld\nregion_sfa=%lld\nregion_d=%lld\nregion_rows=%lld\n",
              plan.quantize_a ? (long long)plan.a_codes : -1LL, (long long)plan.sfa,
              (long long)plan.d, (long long)plan.rows);
  std::printf("region_layout_sfb=%lld\ncutlass_ws=%lld\n", (long long)plan.layout_sfb,
              (long long)plan.cutlass_ws);

  const int64_t first = first_row < 0 ? 0 : first_row > m ? m : first_row;
  const int64_t k_blocks = k / kBlockSize;
  const sm100::RaggedOperands ops{kA, kSfa, kB, kSfb, kD, n, k};
  int64_t before = 0, tiles = 0;
  long long sfa_checked = 0, sfa_bad = 0, sfb_checked = 0, sfb_bad = 0;
  long long a_bad = 0, b_bad = 0, d_bad = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const sm100::GroupRows r = sm100::group_rows(first, before, sizes[g], m);
    before += sizes[g] > 0 ? sizes[g] : 0;
    const int64_t count = r.end - r.start;
    const sm100::GroupArgs a = sm100::group_args(ops, g, r.start, count, tiles);
    std::printf("group%lld=%lld,%lld,%lld\n", (long long)g, (long long)r.start, (long long)r.end,
                (long long)tiles);
    // Problem shape, and the operands' first elements and row pitches (in elements; 4-bit codes).
    a_bad += cute::get<0>(a.shape) != count || cute::get<1>(a.shape) != n || cute::get<2>(a.shape) != k;
    a_bad += a.a - kA != r.start * (k / 2) || cute::get<0>(a.stride_a) != k;
    b_bad += a.b - kB != g * n * (k / 2) || cute::get<0>(a.stride_b) != k;
    d_bad += a.d - kD != r.start * n || cute::get<0>(a.stride_d) != n;
    for (int64_t row = 0; row < count; ++row) {
      for (int64_t e = 0; e < k; ++e) {
        const int64_t cutlass = (a.sfa - kSfa) + a.layout_sfa(row, e, 0);
        sfa_bad += cutlass != sm100::regrouped_scale_offset(tiles, row, e / kBlockSize, k_blocks);
        ++sfa_checked;
      }
    }
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t e = 0; e < k; ++e) {
        const int64_t cutlass = (a.sfb - kSfb) + a.layout_sfb(row, e, 0);
        const int64_t weights = g * scale_matrix_bytes(n, k_blocks) + scale_offset(row, e / kBlockSize, k_blocks);
        sfb_bad += cutlass != weights;
        ++sfb_checked;
      }
    }
    tiles += ceil_div(count, kTileRows);
  }
  std::printf("sfa_checked=%lld\nsfa_mismatches=%lld\nsfb_checked=%lld\nsfb_mismatches=%lld\n",
              sfa_checked, sfa_bad, sfb_checked, sfb_bad);
  std::printf("a_mismatches=%lld\nb_mismatches=%lld\nd_mismatches=%lld\n", a_bad, b_bad, d_bad);
  // Groups' tiles are consecutive ranges by construction; they must fit the planned region.
  const int64_t bound = sm100::regrouped_row_tiles(m, groups);
  const int64_t region = bound * scale_k_tiles(k_blocks) * kTileBytes;
  std::printf("tiles_used=%lld\ntiles_bound=%lld\nsfa_region_fits=%d\n", (long long)tiles,
              (long long)bound,
              plan.d - plan.sfa >= static_cast<size_t>(region) ? 1 : 0);
  return 0;
}
