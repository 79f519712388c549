// call_key (cuda/common/call_key.h) on hand-built XLA FFI call frames: prints one line per case,
// "<case> same" or "<case> differs", the key of a changed frame against the base frame's.
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/call_key.h"

namespace {

struct Frame {
  int64_t x_dims[2] = {16, 4096};
  int64_t y_dims[2] = {16, 14336};
  alignas(256) char memory[1024];
  XLA_FFI_Buffer x{}, y{};
  XLA_FFI_ArgType arg_types[1] = {XLA_FFI_ArgType_BUFFER};
  XLA_FFI_RetType ret_types[1] = {XLA_FFI_RetType_BUFFER};
  void* args[1] = {&x};
  void* rets[1] = {&y};
  int64_t path = 0;
  float alpha = 1.0f;
  int32_t tile[2] = {128, 128};
  XLA_FFI_ByteSpan activation{"none", 4};
  XLA_FFI_Scalar path_attr{XLA_FFI_DataType_S64, &path};
  XLA_FFI_Scalar alpha_attr{XLA_FFI_DataType_F32, &alpha};
  XLA_FFI_Array tile_attr{XLA_FFI_DataType_S32, 2, tile};
  XLA_FFI_ByteSpan names_storage[4] = {{"activation", 10}, {"alpha", 5}, {"path", 4}, {"tile", 4}};
  XLA_FFI_ByteSpan* names[4] = {&names_storage[0], &names_storage[1], &names_storage[2], &names_storage[3]};
  XLA_FFI_AttrType attr_types[4] = {XLA_FFI_AttrType_STRING, XLA_FFI_AttrType_SCALAR, XLA_FFI_AttrType_SCALAR,
                                    XLA_FFI_AttrType_ARRAY};
  void* attrs[4] = {&activation, &alpha_attr, &path_attr, &tile_attr};
  XLA_FFI_CallFrame frame{};

  Frame() {
    x = {sizeof(XLA_FFI_Buffer), nullptr, XLA_FFI_DataType_BF16, memory, 2, x_dims};
    y = {sizeof(XLA_FFI_Buffer), nullptr, XLA_FFI_DataType_BF16, memory + 512, 2, y_dims};
    frame.struct_size = sizeof(XLA_FFI_CallFrame);
    frame.stage = XLA_FFI_ExecutionStage_INITIALIZE;
    frame.args = {sizeof(XLA_FFI_Args), nullptr, 1, arg_types, args};
    frame.rets = {sizeof(XLA_FFI_Rets), nullptr, 1, ret_types, rets};
    frame.attrs = {sizeof(XLA_FFI_Attrs), nullptr, 4, attr_types, names, attrs};
  }
  Frame(const Frame&) = delete;
};

template <typename Change>
void report(const char* name, Change change, int device = 0) {
  Frame base, changed;
  change(changed);
  const bool same = jax_nvfp4::call_key(0, base.frame) == jax_nvfp4::call_key(device, changed.frame);
  std::printf("%s %s\n", name, same ? "same" : "differs");
}

}  // namespace

int main() {
  report("unchanged", [](Frame&) {});
  report("other_addresses_same_alignment", [](Frame& f) {
    f.x.data = f.memory + 256;
    f.y.data = f.memory + 768;
  });
  report("device", [](Frame&) {}, 1);
  report("x_alignment", [](Frame& f) { f.x.data = f.memory + 16; });
  report("x_dtype", [](Frame& f) { f.x.dtype = XLA_FFI_DataType_F32; });
  report("x_rows", [](Frame& f) { f.x_dims[0] = 1; });
  report("y_rank", [](Frame& f) { f.y.rank = 1; });
  report("scalar_value", [](Frame& f) { f.path = 3; });
  report("float_value", [](Frame& f) { f.alpha = 0.5f; });
  report("array_value", [](Frame& f) { f.tile[1] = 256; });
  report("string_value", [](Frame& f) { f.activation = {"gelu", 4}; });
  report("attribute_name", [](Frame& f) { f.names_storage[2] = {"pat2", 4}; });
  report("fewer_attributes", [](Frame& f) { f.frame.attrs.size = 3; });
  return 0;
}
