// Host emulation of the sm_90a convolution's tile loop (cuda/conv/sm90/conv_sm90_schedule.h):
// fills the shared-memory phase arrays exactly as the kernel's loader does (slot_source), reads
// every tap at its shifted slot (tap_at), walks the output columns as the epilogue does
// (ColumnWalker) and compares with a direct convolution on small integers (exact in double).
// Mode "im2col" fills them instead as the warp-specialized kernel's TMA loads do: the PTX ISA's
// im2col walk (filter base positions along W, then H, then N inside the bounding box, stepping by
// the traversal strides, each read at the base plus the im2col offsets (phase, filter row), zero
// outside the input) from im2col_start, BN pixels and a kHaloPixels halo box per phase; a halo
// the kernel skips is filled with a value that would corrupt any output that read it.
//
// usage: conv_sm90_schedule_test N H W C K R S sh sw pad_h pad_w dil_h dil_w P Q BN [slots|im2col]
// prints "OK <outputs> <tiles> <max_slot_read> <slots>" or "FAIL <reason>".
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "conv/sm90/conv_sm90_schedule.h"

using jax_nvfp4::ConvProblem;
namespace c90 = jax_nvfp4::conv90;

int main(int argc, char** argv) {
  if (argc != 17 && argc != 18) {
    std::printf("FAIL usage\n");
    return 2;
  }
  long a[16];
  for (int i = 0; i < 16; ++i) a[i] = std::atol(argv[i + 1]);
  ConvProblem pb;
  pb.n = a[0]; pb.h = a[1]; pb.w = a[2]; pb.c = a[3]; pb.k = a[4];
  pb.r = static_cast<int>(a[5]); pb.s = static_cast<int>(a[6]);
  pb.stride_h = static_cast<int>(a[7]); pb.stride_w = static_cast<int>(a[8]);
  pb.pad_h = static_cast<int>(a[9]); pb.pad_w = static_cast<int>(a[10]);
  pb.dil_h = static_cast<int>(a[11]); pb.dil_w = static_cast<int>(a[12]);
  pb.p = a[13]; pb.q = a[14];
  const int bn = static_cast<int>(a[15]);
  const bool im2col = argc == 18 && std::string(argv[17]) == "im2col";

  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> dist(-3, 3);
  std::vector<double> x(pb.n * pb.h * pb.w * pb.c), w(pb.r * pb.s * pb.k * pb.c);
  for (auto& v : x) v = dist(rng);
  for (auto& v : w) v = dist(rng);
  auto X = [&](int64_t n, int64_t h, int64_t ww, int64_t c) { return x[((n * pb.h + h) * pb.w + ww) * pb.c + c]; };
  auto Wt = [&](int r, int s, int64_t k, int64_t c) { return w[((r * pb.s + s) * pb.k + k) * pb.c + c]; };

  // Direct convolution.
  std::vector<double> ref(pb.n * pb.p * pb.q * pb.k, 0.0);
  for (int64_t n = 0; n < pb.n; ++n)
    for (int64_t p = 0; p < pb.p; ++p)
      for (int64_t q = 0; q < pb.q; ++q)
        for (int64_t k = 0; k < pb.k; ++k) {
          double sum = 0;
          for (int r = 0; r < pb.r; ++r)
            for (int s = 0; s < pb.s; ++s) {
              const int64_t h = p * pb.stride_h - pb.pad_h + r * pb.dil_h;
              const int64_t ww = q * pb.stride_w - pb.pad_w + s * pb.dil_w;
              if (h < 0 || h >= pb.h || ww < 0 || ww >= pb.w) continue;
              for (int64_t c = 0; c < pb.c; ++c) sum += X(n, h, ww, c) * Wt(r, s, k, c);
            }
          ref[((n * pb.p + p) * pb.q + q) * pb.k + k] = sum;
        }

  const c90::Geometry g = c90::make_geometry(pb, bn, im2col);
  if (im2col && !c90::im2col_loads_fit(pb, g)) {
    std::printf("FAIL im2col loads do not fit this problem\n");
    return 1;
  }
  if (im2col && !c90::indices_fit_32(g, bn, g.pixel_tiles)) {
    std::printf("FAIL indices past 2^31\n");
    return 1;
  }
  // The TMA im2col walk: `pixels` pixels from filter base `start` with im2col offsets (phase,
  // r * dil_h), into slots [first, first + pixels) of phase array `phase`.
  const c90::Im2colBox box = c90::im2col_box(pb, g);
  auto walk = [&](c90::Im2colStart start, int pixels, int phase, int r, int first, std::vector<double>& smem) {
    int64_t w = start.w, h = start.h, n = start.n;
    for (int i = 0; i < pixels; ++i) {
      const int64_t hh = h + static_cast<int64_t>(r) * pb.dil_h, ww = w + phase;
      const bool inside = n < pb.n && hh >= 0 && hh < pb.h && ww >= 0 && ww < pb.w;
      const size_t at = (static_cast<size_t>(phase) * g.slots + first + i) * pb.c;
      for (int64_t c = 0; c < pb.c; ++c) smem[at + c] = inside ? X(n, hh, ww, c) : 0.0;
      if ((w += pb.stride_w) >= pb.w + box.upper_w) {
        w = box.lower_w;
        if ((h += pb.stride_h) >= pb.h + box.upper_h) {
          h = box.lower_h;
          ++n;
        }
      }
    }
  };
  std::vector<double> out(ref.size(), 0.0);
  std::vector<int> writes(ref.size(), 0);
  int max_read = 0;
  for (int64_t tile = 0; tile < g.pixel_tiles; ++tile) {
    const int64_t g0 = tile * bn;
    std::vector<double> acc(static_cast<size_t>(bn) * pb.k, 0.0);
    for (int r = 0; r < pb.r; ++r) {
      // The loader: phase arrays [phase][slot][c].
      std::vector<double> smem(static_cast<size_t>(g.phases) * g.slots * pb.c, 0.0);
      for (int f = 0; f < g.phases && im2col; ++f) {
        // The warp-specialized kernel's start coordinates, with its 32-bit divisions.
        const auto v0 = static_cast<uint32_t>(g0);
        walk(c90::im2col_start(pb, g, v0), bn, f, r, 0, smem);
        if (c90::loads_halo(g, g0, bn)) {
          walk(c90::im2col_start(pb, g, v0 + bn), c90::kHaloPixels, f, r, bn, smem);
        } else {
          const auto halo = smem.begin() + (static_cast<size_t>(f) * g.slots + bn) * pb.c;
          std::fill(halo, halo + static_cast<size_t>(c90::kHaloPixels) * pb.c, 1e9);
        }
      }
      for (int f = 0; f < g.phases && !im2col; ++f)
        for (int slot = 0; slot < g.slots; ++slot) {
          // The kernel's 32-bit index math must place every slot where the 64-bit one does.
          int64_t n64 = 0, h64 = 0, w64 = 0, n32 = 0, h32 = 0, w32 = 0;
          const bool in64 = c90::slot_origin<int64_t>(pb, g, g0, f, slot, &n64, &h64, &w64);
          const bool in32 = c90::slot_origin<int32_t>(pb, g, g0, f, slot, &n32, &h32, &w32);
          if (in64 != in32 || (in64 && (n64 != n32 || h64 != h32 || w64 != w32))) {
            std::printf("FAIL slot %d of tile %lld: 32-bit origin differs\n", slot, static_cast<long long>(tile));
            return 1;
          }
          int64_t n, h, ww;
          if (!c90::slot_source(pb, g, g0, f, slot, r, &n, &h, &ww)) continue;
          for (int64_t c = 0; c < pb.c; ++c) smem[(static_cast<size_t>(f) * g.slots + slot) * pb.c + c] = X(n, h, ww, c);
        }
      // The MMA loop: every tap reads the same arrays at a shifted slot.
      for (int s = 0; s < pb.s; ++s) {
        const c90::Tap tap = c90::tap_at(pb, g, s);
        if (tap.phase >= g.phases) {
          std::printf("FAIL phase %d out of %d\n", tap.phase, g.phases);
          return 1;
        }
        for (int i = 0; i < bn; ++i) {
          const int slot = i + tap.shift;
          if (slot >= g.slots) {
            std::printf("FAIL slot %d read past %d\n", slot, g.slots);
            return 1;
          }
          if (slot > max_read) max_read = slot;
          for (int64_t k = 0; k < pb.k; ++k) {
            double sum = 0;
            for (int64_t c = 0; c < pb.c; ++c) sum += smem[(static_cast<size_t>(tap.phase) * g.slots + slot) * pb.c + c] * Wt(r, s, k, c);
            acc[static_cast<size_t>(i) * pb.k + k] += sum;
          }
        }
      }
    }
    // The epilogue: thread t, element e of the 8-column groups j.
    for (int t = 0; t < 4; ++t)
      for (int e = 0; e < 2; ++e) {
        c90::ColumnWalker col(g, g0 + 2 * t + e);
        if (im2col) {  // the warp-specialized kernel's walker (32-bit division) starts at the same column
          const c90::ColumnWalker col32 = c90::ColumnWalker::at32(g, static_cast<uint32_t>(g0 + 2 * t + e));
          if (col32.row != col.row || col32.vq != col.vq) {
            std::printf("FAIL column %lld: 32-bit walker differs\n", static_cast<long long>(g0 + 2 * t + e));
            return 1;
          }
        }
        for (int j = 0; j < bn / 8; ++j) {
          if (j > 0) col.advance(g, 8);
          if (!col.is_output(pb)) continue;
          const int i = 8 * j + 2 * t + e;
          const int64_t pixel = col.row * pb.q + col.vq;
          for (int64_t k = 0; k < pb.k; ++k) {
            out[pixel * pb.k + k] = acc[static_cast<size_t>(i) * pb.k + k];
            ++writes[pixel * pb.k + k];
          }
        }
      }
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    if (writes[i] != 1) {
      std::printf("FAIL output %zu written %d times\n", i, writes[i]);
      return 1;
    }
    if (out[i] != ref[i]) {
      std::printf("FAIL output %zu: %g != %g\n", i, out[i], ref[i]);
      return 1;
    }
  }
  std::printf("OK %zu %lld %d %d\n", ref.size(), static_cast<long long>(g.pixel_tiles), max_read, g.slots);
  return 0;
}
