// fnv_hash(values, seed): FNV-1a over a vector's elements (each XORed in whole), chainable
// through `seed`. The kernel benchmarks print it so variants or builds can be compared bit for bit.
#pragma once

#include <cstdint>
#include <vector>

template <typename T>
uint64_t fnv_hash(const std::vector<T>& values, uint64_t seed = 1469598103934665603ull) {
  uint64_t hash = seed;
  for (T v : values) hash = (hash ^ v) * 1099511628211ull;
  return hash;
}
