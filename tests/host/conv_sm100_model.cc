// Host model of the sm_100a shifted-operand convolution: runs the kernel's schedule
// (cuda/conv/sm100/conv_sm100_schedule.h) against a simulation of Tensor Memory and checks the
// result against a direct convolution.
//
// Simulated hardware: 128 TMEM lanes holding one A row (an activation pixel's channels) and one
// D row (the output pixel's accumulators) each. An MMA adds A[lane] . B[k] to D[lane][k] for
// every lane its disable-output-lane mask leaves enabled; `.ashift` then moves every A row one
// lane down *within its 32-lane sub-partition* and leaves the sub-partition's first lane holding
// garbage (NaN here). Lanes the loader leaves without a pixel also hold NaN (the kernel writes
// zeros there), so a valid output only comes out right if the masks keep it from every lane
// whose contents are not its own pixel.
//
// Usage: conv_sm100_model N H W C K R S stride_h stride_w pad_top pad_bottom pad_left pad_right
//                          dil_h dil_w [mode]
// mode: "ok" (default), or a deliberate fault the model must catch:
//   no-mask        disable lanes only for invalid outputs, never for padding taps
//   forward-taps   visit a chain's taps from u_min up instead of u_max down
//   shift-128      a schedule that assumes the shift crosses sub-partitions (one 128-lane domain)
// and "hw-shift-128" runs the real schedule on hardware whose shift does cross sub-partitions
// (the schedule must not care).
// Prints "result ok|mismatch|unsupported" and statistics "stat name value".
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "conv/sm100/conv_sm100_schedule.h"

namespace cs = jax_nvfp4::ashift_conv;

namespace {

struct Args {
  int64_t n, h, w, c, k;
  int r, s, stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, dil_h, dil_w;
  std::string mode = "ok";
};

int64_t out_extent(int64_t in, int pad_lo, int pad_hi, int taps, int dil, int stride) {
  const int64_t span = in + pad_lo + pad_hi - static_cast<int64_t>(dil) * (taps - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 16) {
    std::fprintf(stderr, "usage: %s N H W C K R S sh sw pt pb pl pr dh dw [mode]\n", argv[0]);
    return 2;
  }
  Args a;
  int64_t* i64[] = {&a.n, &a.h, &a.w, &a.c, &a.k};
  for (int i = 0; i < 5; ++i) *i64[i] = std::atoll(argv[1 + i]);
  int* i32[] = {&a.r, &a.s, &a.stride_h, &a.stride_w, &a.pad_top, &a.pad_bottom,
                &a.pad_left, &a.pad_right, &a.dil_h, &a.dil_w};
  for (int i = 0; i < 10; ++i) *i32[i] = std::atoi(argv[6 + i]);
  if (argc > 16) a.mode = argv[16];

  const int64_t P = out_extent(a.h, a.pad_top, a.pad_bottom, a.r, a.dil_h, a.stride_h);
  const int64_t Q = out_extent(a.w, a.pad_left, a.pad_right, a.s, a.dil_w, a.stride_w);
  const int domain = a.mode == "shift-128" ? cs::kLanes : cs::kSubLanes;
  const int hw_domain = a.mode == "hw-shift-128" ? cs::kLanes : cs::kSubLanes;
  const cs::Geometry g = cs::make_geometry(a.n, a.h, a.w, P, Q, a.r, a.s, a.stride_h, a.stride_w,
                                           a.pad_top, a.pad_left, a.dil_h, a.dil_w, domain);
  if (P <= 0 || Q <= 0 || g.valid_lanes <= 0) {
    std::printf("result unsupported\n");
    return 0;
  }

  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> x(a.n * a.h * a.w * a.c), wt(a.r * a.s * a.k * a.c);
  for (double& v : x) v = dist(rng);
  for (double& v : wt) v = dist(rng);
  auto X = [&](int64_t n, int64_t h, int64_t w, int64_t c) -> double {
    return x[((n * a.h + h) * a.w + w) * a.c + c];
  };
  auto Wt = [&](int fr, int fs, int64_t k, int64_t c) -> double {
    return wt[((static_cast<int64_t>(fr) * a.s + fs) * a.k + k) * a.c + c];
  };

  const double kGarbage = std::nan("");
  std::vector<double> out(a.n * P * Q * a.k, kGarbage);
  std::vector<int> writes(a.n * P * Q, 0);
  std::map<std::string, int64_t> stat;

  std::vector<double> A(cs::kLanes * a.c), D(cs::kLanes * a.k);
  for (int64_t tile = 0; tile < g.tiles; ++tile) {
    std::fill(D.begin(), D.end(), 0.0);
    for (int fr = 0; fr < a.r; ++fr) {
      for (int rho = 0; rho < a.stride_w; ++rho) {
        const cs::Chain chain = g.chain(rho);
        if (chain.empty()) continue;
        ++stat["chains"];
        // Loader: each lane gets the element its output needs at u_max.
        int64_t first_row[cs::kLanes / cs::kSubLanes];
        bool halo[cs::kLanes / cs::kSubLanes] = {};
        for (int lane = 0; lane < cs::kLanes; ++lane) {
          const cs::Pixel px = g.lane_source(tile, lane, fr, chain);
          const int64_t pos = g.lane_anchor(tile, lane) + chain.u_max;
          const int64_t row = pos < 0 ? -1 : pos / g.row_len;
          const int sub = lane / cs::kSubLanes;
          if (lane % cs::kSubLanes == 0) first_row[sub] = row;
          if (row != first_row[sub]) halo[sub] = true;
          for (int64_t c = 0; c < a.c; ++c)
            A[lane * a.c + c] = px.real ? X(px.n, px.h, px.w, c) : kGarbage;
          stat[px.real ? "lanes_loaded" : "lanes_without_pixel"]++;
        }
        for (bool b : halo) stat["halo_windows"] += b;

        const int steps = chain.steps();
        for (int step = 0; step < steps; ++step) {
          // forward-taps visits the offsets in the wrong order for a downward shift.
          const int sched_step = a.mode == "forward-taps" ? steps - 1 - step : step;
          const int u = chain.u_max - sched_step;
          const int tap = g.tap_at(chain, u);
          if (tap < 0) ++stat["shift_only_steps"];
          for (int lane = 0; lane < cs::kLanes; ++lane) {
            const cs::Output o = g.lane_output(tile, lane);
            bool enabled = g.lane_enabled(tile, lane, fr, chain, sched_step);
            if (o.valid && tap >= 0 && !enabled) {
              // Why the mask matters here: the lane holds a pixel of another row (wrapped) or
              // nothing (left/right padding or a vertical padding row).
              const bool holds_real = !std::isnan(A[lane * a.c]);
              const int64_t hh = o.p * a.stride_h - a.pad_top + static_cast<int64_t>(fr) * a.dil_h;
              if (hh < 0 || hh >= a.h) ++stat["masked_vertical_padding"];
              else if (holds_real) ++stat["masked_wrapped_pixel"];
              else ++stat["masked_empty_lane"];
            }
            if (!o.valid) ++stat["masked_invalid_output"];
            if (a.mode == "no-mask") enabled = o.valid && tap >= 0;
            if (!enabled) continue;
            for (int64_t k = 0; k < a.k; ++k) {
              double acc = 0.0;
              for (int64_t c = 0; c < a.c; ++c) acc += A[lane * a.c + c] * Wt(fr, tap, k, c);
              D[lane * a.k + k] += acc;
            }
          }
          if (step + 1 == steps) break;
          // .ashift: every A row moves one lane down inside its shift domain.
          for (int base = 0; base < cs::kLanes; base += hw_domain) {
            for (int l = hw_domain - 1; l > 0; --l)
              std::memcpy(&A[(base + l) * a.c], &A[(base + l - 1) * a.c], a.c * sizeof(double));
            for (int64_t c = 0; c < a.c; ++c) A[base * a.c + c] = kGarbage;
          }
          ++stat["shifts"];
        }
      }
    }
    // Epilogue: every valid lane stores its output.
    for (int lane = 0; lane < cs::kLanes; ++lane) {
      const cs::Output o = g.lane_output(tile, lane);
      if (!o.valid) continue;
      const int64_t pix = (o.n * P + o.p) * Q + o.q;
      ++writes[pix];
      for (int64_t k = 0; k < a.k; ++k) out[pix * a.k + k] = D[lane * a.k + k];
    }
  }

  // Direct convolution.
  double max_err = 0.0;
  int64_t bad = 0, missing = 0, repeated = 0;
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t pix = (n * P + p) * Q + q;
        if (writes[pix] == 0) ++missing;
        if (writes[pix] > 1) ++repeated;
        for (int64_t k = 0; k < a.k; ++k) {
          double ref = 0.0;
          for (int fr = 0; fr < a.r; ++fr)
            for (int fs = 0; fs < a.s; ++fs) {
              const int64_t h = p * a.stride_h - a.pad_top + static_cast<int64_t>(fr) * a.dil_h;
              const int64_t w = q * a.stride_w - a.pad_left + static_cast<int64_t>(fs) * a.dil_w;
              if (h < 0 || h >= a.h || w < 0 || w >= a.w) continue;
              for (int64_t c = 0; c < a.c; ++c) ref += X(n, h, w, c) * Wt(fr, fs, k, c);
            }
          const double got = out[pix * a.k + k];
          const double err = std::fabs(got - ref);
          if (!(err <= 1e-9 * (1.0 + std::fabs(ref)))) ++bad;
          if (err > max_err || std::isnan(err)) max_err = std::isnan(err) ? INFINITY : err;
        }
      }

  stat["tiles"] = g.tiles;
  stat["span"] = g.span;
  stat["row_len"] = g.row_len;
  stat["outputs"] = a.n * P * Q;
  stat["missing_outputs"] = missing;
  stat["repeated_outputs"] = repeated;
  stat["bad_values"] = bad;
  for (const auto& kv : stat) std::printf("stat %s %lld\n", kv.first.c_str(), (long long)kv.second);
  std::printf("max_err %g\n", max_err);
  std::printf("result %s\n", (bad == 0 && missing == 0 && repeated == 0) ? "ok" : "mismatch");
  return 0;
}
