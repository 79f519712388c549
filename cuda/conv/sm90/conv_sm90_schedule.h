// The tile schedule of the sm_90a shifted-operand convolution, shared by the kernel and by the
// host-side emulation in tests/conv_sm90_schedule_test.cc (so the index math is checked on a CPU).
//
// Output pixels are enumerated on a "virtual" grid: each output row (n, p) gets
// Wv <= Q + halo columns, halo = floor((S-1)*dil_w / stride_w) (virtual_row_width). Columns
// vq >= Q are computed and thrown away; they let one shared-memory row serve every filter tap s
// by a uniform shift.
//
// For a tile of BN consecutive virtual pixels [g0, g0 + BN) and filter row r, shared memory holds
// phase arrays of `slots` >= BN + halo pixels each, one for each phase f < stride_w up to the last
// that a tap reads (a 1x1 filter with stride 2 reads phase 0 only). Slot j of phase f holds input pixel
//   (n, h, w) with (n, p, vq) = virtual(g0 + j), h = p*stride_h - pad_h + r*dil_h,
//                 w = vq*stride_w - pad_w + f                 (zero when outside the image)
// so output column i of tap s (t = s*dil_w) reads phase t % stride_w, slot i + t / stride_w:
//   w = (vq + t/stride_w)*stride_w - pad_w + t%stride_w = q*stride_w - pad_w + s*dil_w.
// Within a phase array consecutive slots are consecutive 16-byte rows of every 8-channel column,
// which is the wgmma no-swizzle K-major core-matrix pitch: tap s is the same descriptor advanced by
// 16 * (t / stride_w) bytes (and moved to phase t % stride_w).
#pragma once

#include <cstdint>

#include "common/fast_divide.h"
#include "common/scale_layout.h"
#include "conv/conv_problem.h"

namespace jax_nvfp4 {
namespace conv90 {

constexpr int kChunkC = 64;  // input channels per pipeline stage (one scale tile along C)
// Pixels of the second TMA box that loads a tile's halo slots (im2col loads, below).
constexpr int kHaloPixels = 8;

// Where tap s reads: phase array and slot shift.
struct Tap {
  int phase;
  int shift;
};

NVFP4_HD Tap tap_of(const ConvProblem& pb, int s) {
  const int t = s * pb.dil_w;
  return Tap{t % pb.stride_w, t / pb.stride_w};
}

// Taps whose place the geometry holds: every S the kernels unroll (1, 3, 5, 7).
constexpr int kTapTable = 8;

struct Geometry {
  int64_t wv = 0;             // virtual output row width Q + halo
  int halo = 0;               // extra slots a tap shift reaches past the tile
  int phases = 1;             // phase arrays: 1 + the largest phase a tap reads (tap_of)
  int slots = 0;              // slots per phase array (>= BN + halo, odd: bank-conflict free)
  int64_t virtual_pixels = 0; // n * p * wv
  int64_t pixel_tiles = 0;    // ceil(virtual_pixels / BN)
  int c_chunks = 0;           // ceil(C / kChunkC)
  // Divisions by wv and P in 32 bits, for indices below 2^31 (the warp-specialized kernel's, whose
  // launch checks that they are: indices_fit_32).
  FastDivide by_wv, by_p;
  // tap_of(s) for s < kTapTable: a kernel parameter, so the stage loops read a tap's place from
  // the constant bank instead of dividing by the run-time stride (a division between every two
  // taps' wgmma groups, as ptxas kept it in the loop).
  Tap taps[kTapTable] = {};
};

// Tap s's place: from the geometry's table where it holds s, else computed.
NVFP4_HD Tap tap_at(const ConvProblem& pb, const Geometry& g, int s) {
  return s < kTapTable ? g.taps[s] : tap_of(pb, s);
}

// The virtual row width: Q + halo, less the trailing halo columns that the next row's first slots
// can stand in for. That needs every slot a tap reads past the row's Q outputs to be zero both
// as this row's (past the input's right edge) and as the next row's (before its left edge): with
// 'SAME' padding at stride 1 one zero column then serves as one row's right pad and the next
// row's left pad (3x3: Q + 1 columns instead of Q + 2; at 7x7 outputs, 11% fewer computed).
// g: its halo and tap table.
NVFP4_HD int64_t virtual_row_width(const ConvProblem& pb, const Geometry& g) {
  auto outside = [&](int64_t w) { return w < 0 || w >= pb.w; };
  // Whether, in rows of wv columns, every slot a tap reads past the row is zero both ways. The
  // kernels size grids with this on every launch, so it stops at the first slot that is not.
  auto shares_zero_columns = [&](int64_t wv) {
    for (int s = 0; s < pb.s; ++s) {
      const Tap tap = tap_at(pb, g, s);
      for (int64_t u = wv; u < pb.q + tap.shift; ++u) {  // slots read by outputs vq = u - shift < Q
        if (u - wv >= wv || !outside(u * pb.stride_w - pb.pad_w + tap.phase) ||
            !outside((u - wv) * pb.stride_w - pb.pad_w + tap.phase)) {
          return false;
        }
      }
    }
    return true;
  };
  for (int64_t wv = pb.q > 0 ? pb.q : 1; wv < pb.q + g.halo; ++wv) {
    if (shares_zero_columns(wv)) return wv;
  }
  return pb.q + g.halo;
}

// The geometry without its tile width's part (slots, pixel_tiles): what a kernel choice that
// weighs several widths computes once (with_tile adds the rest).
NVFP4_HD Geometry problem_geometry(const ConvProblem& pb) {
  Geometry g;
  g.halo = static_cast<int>(((pb.s - 1) * pb.dil_w) / pb.stride_w);
  for (int s = 0; s < pb.s; ++s) {
    const Tap tap = tap_of(pb, s);
    if (tap.phase >= g.phases) g.phases = tap.phase + 1;
    if (s < kTapTable) g.taps[s] = tap;
  }
  g.wv = virtual_row_width(pb, g);
  g.virtual_pixels = pb.n * pb.p * g.wv;
  g.c_chunks = static_cast<int>(ceil_div(pb.c, kChunkC));
  if (g.virtual_pixels > 0) {  // an empty output launches nothing (and a divisor must not be 0)
    g.by_wv = FastDivide::by(static_cast<uint32_t>(g.wv));
    g.by_p = FastDivide::by(static_cast<uint32_t>(pb.p));
  }
  return g;
}

// g for tiles of bn pixels. `im2col`: the layout of the TMA loads (below): BN + kHaloPixels
// slots, a multiple of 8, so the halo's copy starts at a 1024-byte atom of the 128-byte swizzle
// the kernel loads them in.
NVFP4_HD Geometry with_tile(Geometry g, int bn, bool im2col = false) {
  g.slots = im2col ? bn + kHaloPixels : (bn + g.halo) | 1;
  g.pixel_tiles = ceil_div(g.virtual_pixels, bn);
  return g;
}

NVFP4_HD Geometry make_geometry(const ConvProblem& pb, int bn, bool im2col = false) {
  return with_tile(problem_geometry(pb), bn, im2col);
}

constexpr int64_t kMaxIndex32 = (int64_t{1} << 31) - 1;

// Whether a launch of `tiles` tiles of `tile_n` pixels keeps every tile index and every virtual
// pixel its tiles reach (halo included) below 2^31, as the 32-bit divisions (by_wv, by_p) need;
// twice the tiles, so that a CTA's next tile index (at most tiles - 1 + the grid's CTAs) does not
// overflow either.
NVFP4_HD bool indices_fit_32(const Geometry& g, int tile_n, int64_t tiles) {
  return 2 * tiles <= kMaxIndex32 && g.pixel_tiles * tile_n + kHaloPixels <= kMaxIndex32;
}

// The filter-row-independent part of a slot's source: image n, input row h0 of filter row 0 and
// input column w of slot `slot` of phase `phase` in the tile starting at virtual pixel g0. Returns
// false when the slot is zero for every filter row (past the end, or w outside the input). The
// kernel computes this once per tile; each filter row r then reads row h0 + r * dil_h. Index is
// the type of the divisions: the kernel uses int32_t when every virtual pixel index fits (its
// 64-bit division chains were ~7% of the kernel's instructions at ResNet sizes).
template <typename Index = int64_t>
NVFP4_HD bool slot_origin(const ConvProblem& pb, const Geometry& g, int64_t g0, int phase,
                          int slot, int64_t* n, int64_t* h0, int64_t* w) {
  const int64_t v = g0 + slot;
  if (v >= g.virtual_pixels) return false;
  const Index wv = static_cast<Index>(g.wv), pp = static_cast<Index>(pb.p);
  const Index row = static_cast<Index>(v) / wv, vq = static_cast<Index>(v) - row * wv;
  const Index img = row / pp, p = row - img * pp;
  const int64_t ww = static_cast<int64_t>(vq) * pb.stride_w - pb.pad_w + phase;
  if (ww < 0 || ww >= pb.w) return false;
  *n = img;
  *h0 = static_cast<int64_t>(p) * pb.stride_h - pb.pad_h;
  *w = ww;
  return true;
}

// The input pixel that slot `slot` of phase `phase` holds for filter row r in the tile starting
// at virtual pixel g0; returns false (the slot is zero) when it lies outside the input.
NVFP4_HD bool slot_source(const ConvProblem& pb, const Geometry& g, int64_t g0, int phase,
                          int slot, int r, int64_t* n, int64_t* h, int64_t* w) {
  int64_t h0 = 0;
  if (!slot_origin(pb, g, g0, phase, slot, n, &h0, w)) return false;
  *h = h0 + static_cast<int64_t>(r) * pb.dil_h;
  return *h >= 0 && *h < pb.h;
}

// TMA im2col loads. The hardware walks filter base positions along W, then H, then N, inside a
// bounding box, stepping by the traversal strides (the conv's strides), and reads each at
// base + (im2col offsets), zero outside the input. With the box spanning Wv positions along W
// from -pad_w (a virtual row) and P along H from -pad_h, the walk from virtual pixel v's base
// with offsets (f, r * dil_h) visits exactly the input pixels of phase f's slots v, v + 1, ...
// for filter row r, across output rows and images: one copy (64 channels a pixel) fills a
// phase's kBN slots, a second, kHaloPixels long, its halo. A walk of `count` positions from
// `lower` with stride t stops before dim + upper = lower + t * (count - 1) + 1.
struct Im2colBox {
  int lower_w, lower_h, upper_w, upper_h;
};

NVFP4_HD Im2colBox im2col_box(const ConvProblem& pb, const Geometry& g) {
  return Im2colBox{-pb.pad_w, -pb.pad_h,
                   static_cast<int>(pb.stride_w * (g.wv - 1) + 1 - pb.w - pb.pad_w),
                   static_cast<int>(pb.stride_h * (pb.p - 1) + 1 - pb.h - pb.pad_h)};
}

// Most a tensor map's traversal stride can be.
constexpr int kMaxTraversalStride = 8;

// Whether the im2col loads can fill the slots: strides the traversal takes, a halo the second
// box covers, and the corners and offsets the 4-D tensor map encodes (corners in [-128, 127],
// offsets in [0, 255]: the phase along W, the filter row's along H).
NVFP4_HD bool im2col_loads_fit(const ConvProblem& pb, const Geometry& g) {
  const Im2colBox b = im2col_box(pb, g);
  auto corner = [](int64_t v) { return v >= -128 && v <= 127; };
  return pb.stride_h <= kMaxTraversalStride && pb.stride_w <= kMaxTraversalStride && g.halo <= kHaloPixels &&
         corner(b.lower_w) && corner(b.lower_h) && corner(b.upper_w) && corner(b.upper_h) &&
         static_cast<int64_t>(pb.r - 1) * pb.dil_h <= 255;
}

// The filter base position (w, h, n) where the walk for virtual pixel v starts (phase 0,
// filter row 0).
struct Im2colStart {
  int32_t w, h, n;
};

// (v < 2^31: indices_fit_32.)
NVFP4_HD Im2colStart im2col_start(const ConvProblem& pb, const Geometry& g, uint32_t v) {
  const uint32_t row = g.by_wv.quotient(v), vq = v - row * g.by_wv.divisor;
  const uint32_t img = g.by_p.quotient(row), p = row - img * g.by_p.divisor;
  return Im2colStart{static_cast<int32_t>(vq) * pb.stride_w - pb.pad_w,
                     static_cast<int32_t>(p) * pb.stride_h - pb.pad_h, static_cast<int32_t>(img)};
}

// Whether the TMA producer loads the halo box of the tile starting at virtual pixel g0 (tile_n
// slots): only when a tap reads past the tile (halo > 0; not a 1x1 filter, say) and the halo
// holds virtual pixels or the zeros past the last one, which the last row's outputs read as their
// right pad where virtual rows are narrower than Q + halo (the walk fills them, out of bounds).
// Further out its slots feed only discarded columns.
NVFP4_HD bool loads_halo(const Geometry& g, int64_t g0, int tile_n) {
  return g.halo > 0 && g0 + tile_n < g.virtual_pixels + g.halo;
}

// The output pixel of virtual pixel v, or false for a discarded column (or past the end).
NVFP4_HD bool output_pixel(const ConvProblem& pb, const Geometry& g, int64_t v, int64_t* out_row,
                           int64_t* q) {
  if (v >= g.virtual_pixels) return false;
  const int64_t row = v / g.wv, vq = v - row * g.wv;
  if (vq >= pb.q) return false;
  *out_row = row;  // n * P + p
  *q = vq;
  return true;
}

// Walks the virtual columns v0, v0 + step, v0 + 2*step, ... of a tile as (output row, vq)
// without a division per column (the epilogue's thread-column loop).
struct ColumnWalker {
  int64_t row, vq;
  NVFP4_HD ColumnWalker(const Geometry& g, int64_t v0) : row(v0 / g.wv), vq(v0 - (v0 / g.wv) * g.wv) {}
  // From v0 < 2^31 (indices_fit_32), with a multiply-shift instead of a 64-bit division.
  NVFP4_HD static ColumnWalker at32(const Geometry& g, uint32_t v0) {
    const uint32_t row = g.by_wv.quotient(v0);
    return ColumnWalker(row, v0 - row * g.by_wv.divisor);
  }
  NVFP4_HD void advance(const Geometry& g, int step) {
    vq += step;
    while (vq >= g.wv) {
      vq -= g.wv;
      ++row;
    }
  }
  // Whether the current column is a real output pixel (not a discarded column, not past the end).
  NVFP4_HD bool is_output(const ConvProblem& pb) const { return vq < pb.q && row < pb.n * pb.p; }

 private:
  NVFP4_HD ColumnWalker(int64_t row_, int64_t vq_) : row(row_), vq(vq_) {}
};

}  // namespace conv90
}  // namespace jax_nvfp4
