// Reads float32 values (raw little-endian bytes, a multiple of 8) from the file argv[1] and
// prints the E2M1 code of each, one hex digit per value, twice: from the scalar software encoder
// and from the 8-wide packer the sm_90a kernels use (unpacked again), on separate lines.
#include <cstdio>
#include <vector>

#include "quantize/nvfp4_encode.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::FILE* f = std::fopen(argv[1], "rb");
  if (f == nullptr) return 2;
  std::vector<float> values;
  float v;
  while (std::fread(&v, sizeof v, 1, f) == 1) values.push_back(v);
  std::fclose(f);
  if (values.size() % 8 != 0) return 2;
  const char* hex = "0123456789abcdef";
  std::vector<char> scalar, packed;
  for (float x : values) scalar.push_back(hex[jax_nvfp4::e2m1_encode_software(x)]);
  for (size_t i = 0; i < values.size(); i += 8) {
    const uint32_t word = jax_nvfp4::e2m1_pack8_software(&values[i]);
    for (int e = 0; e < 8; ++e) packed.push_back(hex[(word >> (4 * e)) & 0xFu]);
  }
  scalar.push_back('\0');
  packed.push_back('\0');
  std::puts(scalar.data());
  std::puts(packed.data());
  return 0;
}
