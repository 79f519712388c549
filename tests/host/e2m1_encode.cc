// Reads float32 values (raw little-endian bytes) from the file argv[1] and prints the E2M1 code
// of each, as one hex digit, from the software encoder the sm_90a kernels use.
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
  std::vector<char> out;
  out.reserve(values.size() + 1);
  for (float x : values) out.push_back("0123456789abcdef"[jax_nvfp4::e2m1_encode_software(x)]);
  out.push_back('\0');
  std::puts(out.data());
  return 0;
}
