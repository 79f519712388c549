// Checks FastDivide against '/' for many divisors and numerators in [0, 2^31); prints the
// number of mismatches and the number of checks.
#include <cstdio>
#include <initializer_list>

#include "common/fast_divide.h"

int main() {
  const uint32_t big[] = {1u << 20, 65535u, 65537u, 1000003u, (1u << 30) + 1u, (1u << 31) - 1u};
  uint64_t checks = 0, mismatches = 0;
  auto check = [&](uint32_t d) {
    const jax_nvfp4::FastDivide f = jax_nvfp4::FastDivide::by(d);
    uint32_t n = 0;
    for (uint64_t step = 1; n < (1u << 31); step = step * 3 / 2 + 1) {
      for (uint32_t m : {n, n + 1, n + d - 1, n + d, n * d}) {
        if (m >= (1u << 31)) continue;
        ++checks;
        mismatches += f.quotient(m) != m / d;
      }
      n += static_cast<uint32_t>(step);
    }
    for (uint32_t m : {(1u << 31) - 1u, (1u << 31) - d}) {
      ++checks;
      mismatches += f.quotient(m) != m / d;
    }
  };
  for (uint32_t d = 1; d <= 5000; ++d) check(d);
  for (uint32_t d : big) check(d);
  std::printf("%llu %llu\n", static_cast<unsigned long long>(mismatches),
              static_cast<unsigned long long>(checks));
  return 0;
}
