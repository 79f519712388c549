// What decides which kernels an FFI call launches, hashed to 64 bits: the device, each
// operand's and result's dtype, shape and address modulo 256 (paths and vector widths depend on
// alignment), and every attribute's name and value. Calls with equal keys launch the same kernels,
// so the initialize stage (initialize_stage.h) loads them once per key. XLA runs that stage before
// every execution, so the key is hashed without allocating: 0.3 us a call with its lookup (a
// CPU of the CI machine), against 1.1 us as a byte string; 0.6-1 us on an H200's host
// (bench/bench_dispatch.py, command buffers off). So a call XLA keeps per-call state for
// (initialize_stage.h) hashes its key only when its alignment_key changes. Two calls whose keys
// collide would only share one warm-up. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "xla/ffi/api/c_api.h"

namespace jax_nvfp4 {
namespace call_key_detail {

// Bytes of one element of an attribute's dtype; 0 for a dtype no attribute of ours has (its value
// then stays out of the key, its dtype in).
inline size_t attr_element_bytes(XLA_FFI_DataType dtype) {
  switch (dtype) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8: return 1;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16:
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16: return 2;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
    case XLA_FFI_DataType_F32: return 4;
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
    case XLA_FFI_DataType_F64: return 8;
    default: return 0;
  }
}

// FNV-1a's step over 8-byte words (then the tail's bytes) of what is put into it (a byte at a
// time took 1.2 us a call).
struct Hasher {
  uint64_t hash = 0xcbf29ce484222325ull;

  void mix(uint64_t word) { hash = (hash ^ word) * 0x100000001b3ull; }

  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (; n >= 8; n -= 8, p += 8) {
      uint64_t word;
      std::memcpy(&word, p, 8);
      mix(word);
    }
    for (; n; --n, ++p) mix(*p);
  }
};

template <typename T>
void put(Hasher& key, const T& value) {
  key.bytes(&value, sizeof(value));
}

inline void put_bytes(Hasher& key, const void* data, size_t n) {
  put(key, n);
  if (n) key.bytes(data, n);
}

// The part of a buffer's address that kernel choices read.
inline uintptr_t alignment_of(const void* buffer) {
  return reinterpret_cast<uintptr_t>(static_cast<const XLA_FFI_Buffer*>(buffer)->data) % 256;
}

inline void put_buffer(Hasher& key, const XLA_FFI_Buffer& b) {
  put(key, b.dtype);
  put(key, b.rank);
  put_bytes(key, b.dims, static_cast<size_t>(b.rank) * sizeof(int64_t));
  put(key, alignment_of(&b));
}

inline void put_attrs(Hasher& key, const XLA_FFI_Attrs& attrs) {
  put(key, attrs.size);
  for (int64_t i = 0; i < attrs.size; ++i) {
    put_bytes(key, attrs.names[i]->ptr, attrs.names[i]->len);
    put(key, attrs.types[i]);
    switch (attrs.types[i]) {
      case XLA_FFI_AttrType_SCALAR: {
        const auto* s = static_cast<const XLA_FFI_Scalar*>(attrs.attrs[i]);
        put(key, s->dtype);
        put_bytes(key, s->value, attr_element_bytes(s->dtype));
        break;
      }
      case XLA_FFI_AttrType_ARRAY: {
        const auto* a = static_cast<const XLA_FFI_Array*>(attrs.attrs[i]);
        put(key, a->dtype);
        put(key, a->size);
        put_bytes(key, a->data, a->size * attr_element_bytes(a->dtype));
        break;
      }
      case XLA_FFI_AttrType_STRING: {
        const auto* s = static_cast<const XLA_FFI_ByteSpan*>(attrs.attrs[i]);
        put_bytes(key, s->ptr, s->len);
        break;
      }
      case XLA_FFI_AttrType_DICTIONARY:
        put_attrs(key, *static_cast<const XLA_FFI_Attrs*>(attrs.attrs[i]));
        break;
    }
  }
}

}  // namespace call_key_detail

// What may change between two executions of one call (one XLA custom call instruction, whose
// dtypes, shapes and attributes are fixed): its buffers' addresses modulo 256. Never 0.
inline uint64_t alignment_key(const XLA_FFI_CallFrame& frame) {
  using namespace call_key_detail;
  Hasher key;
  for (int64_t i = 0; i < frame.args.size; ++i) {
    if (frame.args.types[i] == XLA_FFI_ArgType_BUFFER) put(key, alignment_of(frame.args.args[i]));
  }
  for (int64_t i = 0; i < frame.rets.size; ++i) {
    if (frame.rets.types[i] == XLA_FFI_RetType_BUFFER) put(key, alignment_of(frame.rets.rets[i]));
  }
  return key.hash | 1;
}

inline uint64_t call_key(int device, const XLA_FFI_CallFrame& frame) {
  using namespace call_key_detail;
  Hasher key;
  put(key, device);
  put(key, frame.args.size);
  for (int64_t i = 0; i < frame.args.size; ++i) {
    put(key, frame.args.types[i]);
    if (frame.args.types[i] == XLA_FFI_ArgType_BUFFER) {
      put_buffer(key, *static_cast<const XLA_FFI_Buffer*>(frame.args.args[i]));
    }
  }
  put(key, frame.rets.size);
  for (int64_t i = 0; i < frame.rets.size; ++i) {
    put(key, frame.rets.types[i]);
    if (frame.rets.types[i] == XLA_FFI_RetType_BUFFER) {
      put_buffer(key, *static_cast<const XLA_FFI_Buffer*>(frame.rets.rets[i]));
    }
  }
  put_attrs(key, frame.attrs);
  return key.hash;
}

}  // namespace jax_nvfp4
