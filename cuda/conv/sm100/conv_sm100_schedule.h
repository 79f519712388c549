// The schedule of the sm_100a shifted-operand convolution, written once for the kernel and for
// the host model that checks it (tests/host/conv_sm100_model.cc).
//
// One CTA tile is one tcgen05.mma with M = 128: TMEM lane i holds output pixel "anchor(i)" in D
// and, in A, the activation pixel that output needs for the current filter tap. Taps along W are
// visited so that after each MMA the activations only have to move one lane down, which is what
// `.ashift` does. The shift acts inside each 32-lane sub-partition, so lane 0 of every
// sub-partition receives nothing useful: a sub-partition that runs `span` shifts yields only its
// last 32 - span lanes as outputs, and the four sub-partitions overlap by `span` anchors.
// Tiles follow one another along the stream; a CTA computes one tile for one block of output
// channels.
//
// Stride and dilation: tap s reads w = stride*q + e_s with e_s = s*dil - pad. Writing
// e_s = stride*u_s + rho (0 <= rho < stride) puts every tap of one residue rho on the "phase
// stream" x -> pixel stride*x + rho, where output q needs element x = q + u_s. Each non-empty
// residue is one *chain*: its taps are visited from u_max down to u_min, one shift per unit of u
// (a unit with no tap, from dilation, is a shift with every lane disabled).
//
// Stream positions: output rows (n, p) are laid end to end, `row_len` positions each, so a
// sub-partition's 32 lanes may cross from one row (and image) into the next: that is the halo.
// Position row*row_len + x holds pixel (n, h, stride*x + rho) when that pixel exists and nothing
// (a zero) otherwise. A lane whose tap falls in padding reads the neighbouring row's pixel or a
// zero there, so it is disabled for that MMA (disable-output-lane); so are lanes that hold no
// valid output.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CONV_SM100_HD __host__ __device__ __forceinline__
#else
#define CONV_SM100_HD inline
#endif

namespace jax_nvfp4 {
namespace ashift_conv {

constexpr int kLanes = 128;         // MMA M (cta_group::1): one output pixel per lane
constexpr int kSubLanes = 32;       // lanes of one TMEM sub-partition; .ashift stays inside one
constexpr int kSubPartitions = kLanes / kSubLanes;

CONV_SM100_HD int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// Taps of one residue class along W, visited from u_max down to u_min; empty when u_max < u_min.
struct Chain {
  int rho = 0;
  int u_max = -1;
  int u_min = 0;
  CONV_SM100_HD bool empty() const { return u_max < u_min; }
  CONV_SM100_HD int steps() const { return empty() ? 0 : u_max - u_min + 1; }
};

// A pixel of the input, or none (padding, past the last row, a gap between rows).
struct Pixel {
  bool real = false;
  int64_t n = 0, h = 0, w = 0;
};

// The output pixel a lane accumulates, or none.
struct Output {
  bool valid = false;
  int64_t n = 0, p = 0, q = 0;
};

struct Geometry {
  int64_t n = 0, h = 0, w = 0, p = 0, q = 0;
  int r = 1, s = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t row_len = 0;   // stream positions per output row: >= q and >= every phase's width
  int shift_domain = kSubLanes;  // lanes one shift moves data within (the hardware's: 32)
  int span = 0;          // most shifts one chain makes
  int valid_lanes = 0;   // outputs per shift domain: shift_domain - span
  int64_t tiles = 0;     // CTA tiles of kLanes lanes along the stream

  // Filter tap (column) of chain c at offset u, or -1 when no tap sits there.
  CONV_SM100_HD int tap_at(const Chain& c, int u) const {
    const int64_t e = static_cast<int64_t>(u) * stride_w + c.rho + pad_w;  // = s * dil_w
    if (e < 0 || e % dil_w != 0) return -1;
    const int64_t tap = e / dil_w;
    return tap < s ? static_cast<int>(tap) : -1;
  }

  // The chain of residue rho (0 <= rho < stride_w).
  CONV_SM100_HD Chain chain(int rho) const {
    Chain c;
    c.rho = rho;
    for (int t = 0; t < s; ++t) {
      const int64_t e = static_cast<int64_t>(t) * dil_w - pad_w;
      if (e - floor_div(e, stride_w) * stride_w != rho) continue;
      const int u = static_cast<int>(floor_div(e, stride_w));
      if (c.empty()) {
        c.u_max = c.u_min = u;
      } else {
        c.u_max = u > c.u_max ? u : c.u_max;
        c.u_min = u < c.u_min ? u : c.u_min;
      }
    }
    return c;
  }

  // Pixels of phase rho along W: x in [0, phase_width(rho)) are real.
  CONV_SM100_HD int64_t phase_width(int rho) const {
    return rho < w ? (w - rho + stride_w - 1) / stride_w : 0;
  }

  // Stream position (anchor) of the output in lane `lane` of tile `tile`.
  CONV_SM100_HD int64_t lane_anchor(int64_t tile, int lane) const {
    const int sub = lane / shift_domain, l = lane % shift_domain;
    return tile * (static_cast<int64_t>(kLanes / shift_domain) * valid_lanes) +
           static_cast<int64_t>(sub) * valid_lanes - span + l;
  }

  // Output pixel of a lane; lanes below `span` in their shift domain never hold one.
  CONV_SM100_HD Output lane_output(int64_t tile, int lane) const {
    Output o;
    if (lane % shift_domain < span) return o;
    const int64_t a = lane_anchor(tile, lane);
    if (a < 0) return o;
    const int64_t row = a / row_len, x = a % row_len;
    if (row >= n * p || x >= q) return o;
    o.valid = true;
    o.n = row / p;
    o.p = row % p;
    o.q = x;
    return o;
  }

  // Pixel of phase c.rho, filter row fr, at stream position pos.
  CONV_SM100_HD Pixel stream_pixel(int64_t pos, int fr, const Chain& c) const {
    Pixel px;
    if (pos < 0) return px;
    const int64_t row = pos / row_len, x = pos % row_len;
    if (row >= n * p || x >= phase_width(c.rho)) return px;
    px.n = row / p;
    px.h = (row % p) * stride_h - pad_h + static_cast<int64_t>(fr) * dil_h;
    px.w = x * stride_w + c.rho;
    px.real = px.h >= 0 && px.h < h;
    return px;
  }

  // What the loader writes into lane `lane` before the first MMA of chain c, filter row fr:
  // the element the lane's own output needs at u_max; later steps find their elements there
  // after the shifts.
  CONV_SM100_HD Pixel lane_source(int64_t tile, int lane, int fr, const Chain& c) const {
    return stream_pixel(lane_anchor(tile, lane) + c.u_max, fr, c);
  }

  // Whether lane `lane` accumulates at step `step` (offset u = u_max - step) of chain c, filter
  // row fr: its output is valid, a tap sits at u, and that tap's pixel is inside the image.
  CONV_SM100_HD bool lane_enabled(int64_t tile, int lane, int fr, const Chain& c, int step) const {
    const Output o = lane_output(tile, lane);
    if (!o.valid) return false;
    const int u = c.u_max - step;
    if (tap_at(c, u) < 0) return false;
    const int64_t x = o.q + u;
    if (x < 0 || x >= phase_width(c.rho)) return false;
    const int64_t hh = o.p * stride_h - pad_h + static_cast<int64_t>(fr) * dil_h;
    return hh >= 0 && hh < h;
  }
};

// Geometry of a problem; valid_lanes <= 0 means the filter is too wide for one sub-partition.
// shift_domain is the number of lanes a shift stays within: the hardware's 32 for the kernel;
// the host model passes 128 to show that a schedule relying on a cross-partition shift fails.
CONV_SM100_HD Geometry make_geometry(int64_t n, int64_t h, int64_t w, int64_t p, int64_t q,
                                     int r, int s, int stride_h, int stride_w, int pad_h,
                                     int pad_w, int dil_h, int dil_w,
                                     int shift_domain = kSubLanes) {
  Geometry g;
  g.shift_domain = shift_domain;
  g.n = n; g.h = h; g.w = w; g.p = p; g.q = q;
  g.r = r; g.s = s;
  g.stride_h = stride_h; g.stride_w = stride_w;
  g.pad_h = pad_h; g.pad_w = pad_w;
  g.dil_h = dil_h; g.dil_w = dil_w;
  g.row_len = q;
  g.span = 0;
  for (int rho = 0; rho < stride_w; ++rho) {
    const int64_t pw = g.phase_width(rho);
    g.row_len = pw > g.row_len ? pw : g.row_len;
    const Chain c = g.chain(rho);
    if (!c.empty() && c.u_max - c.u_min > g.span) g.span = c.u_max - c.u_min;
  }
  g.valid_lanes = shift_domain - g.span;
  if (g.valid_lanes > 0) {
    const int64_t per_tile = static_cast<int64_t>(kLanes / shift_domain) * g.valid_lanes;
    g.tiles = (n * p * g.row_len + per_tile - 1) / per_tile;
  }
  return g;
}

}  // namespace ashift_conv
}  // namespace jax_nvfp4
