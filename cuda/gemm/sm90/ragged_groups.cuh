// Where the rows of a ragged GEMM's groups lie (GemmProblem::group_sizes), for the sm_90a kernels
// that find their work items on the device: tiles of each group's rows, cut from the group's
// first row (gemm_decode.cu: 8-row tiles; fused_staging.cu and gemm_fused_ws.cu: staged
// activation tiles). No host sync: each warp scans the sizes on its own, 32 groups a step.
#pragma once

#include <cstdint>

#include "gemm/gemm_problem.h"

namespace jax_nvfp4 {
namespace sm90 {

// The first row of group 0: *first_row clipped to [0, m].
__device__ __forceinline__ int64_t ragged_first_row(const GemmProblem& p) {
  return min(max(static_cast<int64_t>(*p.first_row), int64_t{0}), p.m);
}

// Work item `index` (counted from 0 within its group) of group `group`, whose rows are
// [begin, end); group -1 once the item lies past every group's items (see group_item).
struct GroupItem {
  int64_t group, index, begin, end;
};

// Item y of the groups' items in group order, where a group with rows [b, e) (clipped to m;
// negative sizes count as 0) holds items(b, e) items. Past the last group's items: group -1,
// index = y less all the groups' items, and begin = end = the row after the last group (clipped
// to m). Call it with every lane of the warp.
template <class Items>
__device__ GroupItem group_item(const GemmProblem& p, int64_t y, Items items) {
  const int lane = threadIdx.x % 32;
  int64_t start = ragged_first_row(p);  // the first row of the 32 groups of this step (may pass m)
  for (int64_t base = 0; base < p.stack.count; base += 32) {
    const int64_t g = base + lane;
    const int64_t size = g < p.stack.count ? max(static_cast<int64_t>(p.group_sizes[g]), int64_t{0}) : 0;
    int64_t rows = size;  // inclusive scan: rows of groups base..g
    for (int o = 1; o < 32; o *= 2) {
      const int64_t v = __shfl_up_sync(0xffffffffu, rows, o);
      if (lane >= o) rows += v;
    }
    const int64_t begin = min(start + rows - size, p.m), end = min(start + rows, p.m);
    const int64_t own = items(begin, end);
    int64_t upto = own;  // inclusive scan: items of groups base..g
    for (int o = 1; o < 32; o *= 2) {
      const int64_t v = __shfl_up_sync(0xffffffffu, upto, o);
      if (lane >= o) upto += v;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, upto > y);
    if (hit != 0) {
      const int owner = __ffs(hit) - 1;
      return {base + owner, y - __shfl_sync(0xffffffffu, upto - own, owner), __shfl_sync(0xffffffffu, begin, owner),
              __shfl_sync(0xffffffffu, end, owner)};
    }
    y -= __shfl_sync(0xffffffffu, upto, 31);
    start += __shfl_sync(0xffffffffu, rows, 31);
  }
  const int64_t after = min(start, p.m);
  return {-1, y, after, after};
}

// The items of a group with rows [b, e) cut into tiles of `rows` rows from b.
__device__ __forceinline__ auto group_tiles(int64_t rows) {
  return [rows](int64_t b, int64_t e) { return e > b ? (e - b + rows - 1) / rows : int64_t{0}; };
}

// The rows [begin, end) of tile y of the groups' tiles of `rows` rows (group_tiles), in group
// order; empty (end <= begin) past the last group's. Call it with every lane of the warp.
struct TileRows {
  int64_t group, begin, end;
};
__device__ __forceinline__ TileRows group_tile_rows(const GemmProblem& p, int64_t y, int64_t rows) {
  const GroupItem item = group_item(p, y, group_tiles(rows));
  const int64_t begin = item.begin + item.index * rows;
  return {item.group, begin, min(item.end, begin + rows)};
}

// All the groups' items (group_item's count). Call it with every lane of the warp.
template <class Items>
__device__ __forceinline__ int64_t group_item_count(const GemmProblem& p, Items items) {
  constexpr int64_t kPastAll = INT64_MAX / 2;  // more items than any grid holds
  return kPastAll - group_item(p, kPastAll, items).index;
}

}  // namespace sm90
}  // namespace jax_nvfp4
