// The FFI initialize stage of every handler: the first time a call with a given key (call_key.h)
// is initialized on a device, its execute handler runs inside a CUDA stream capture that is then
// thrown away. Nothing runs on the GPU. The capture makes CUDA load the call's kernels and
// cuBLASLt's, and set their attributes, now rather than at their first launch.
//
// Why: under lazy module loading (CUDA's default), a kernel's first launch loads its module, which
// holds the context's lock while it waits for the GPU to drain. In XLA's execute stage a
// collective of the same program may be waiting there on another GPU whose host thread is
// blocked behind that lock: a deadlock. Seen on 2 x H200: the tensor-parallel example's first
// sharded execution with bfloat16 sums (cuBLASLt's first GEMM) hung; with
// CUDA_MODULE_LOADING=EAGER it ran. XLA runs the initialize stage of a program's calls before it
// launches any of them. TransformerEngine's JAX primitives warm up the same way.
//
// XLA runs the stage before every execution, so a warm call must return fast. Each call (one
// custom call instruction of a compiled program) gets a WarmCall state from the instantiate stage,
// which remembers per device the alignment_key (call_key.h) it was last warmed with; while that
// matches, the handler returns without hashing the call's key.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "common/call_key.h"
#include "xla/ffi/api/c_api.h"

namespace jax_nvfp4 {

// True while this thread runs a handler for its warm-up capture: host-side call counters skip it,
// and cuBLASLt records every candidate algorithm (loading them all) without settling on one.
inline bool& warming_up() {
  thread_local bool flag = false;
  return flag;
}

// The per-call state. XLA owns it (deleting it with the executable) once Python has registered
// the type (jax.ffi.register_ffi_type), which assigns `id`; while `id` is 0 no state is made and
// every initialize hashes the call's key.
struct WarmCall {
  static constexpr int kDevices = 64;  // devices past this many always hash the key
  std::atomic<uint64_t> alignment[kDevices] = {};  // 0: not warmed on that device yet
};

inline XLA_FFI_TypeId& warm_call_type_id() {
  static XLA_FFI_TypeId id{0};
  return id;
}

inline const XLA_FFI_TypeInfo& warm_call_type_info() {
  static const XLA_FFI_TypeInfo info = [] {
    XLA_FFI_TypeInfo i;
    std::memset(&i, 0, sizeof(i));
    i.struct_size = XLA_FFI_TypeInfo_STRUCT_SIZE;
    i.deleter = [](void* state) { delete static_cast<WarmCall*>(state); };
    return i;
  }();
  return info;
}

// How many initializations hashed their call's key: the tests read it to see that warm calls of a
// compiled program take the per-call state instead.
inline std::atomic<uint64_t>& keyed_initializations() {
  static std::atomic<uint64_t> count{0};
  return count;
}

namespace initialize_detail {

inline void destroy(const XLA_FFI_Api* api, XLA_FFI_Error* error) {
  if (!error) return;
  XLA_FFI_Error_Destroy_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  args.error = error;
  api->XLA_FFI_Error_Destroy(&args);
}

// The call's stream, or null where XLA gives none at this stage.
inline cudaStream_t stream_of(const XLA_FFI_CallFrame& frame) {
  XLA_FFI_Stream_Get_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
  args.ctx = frame.ctx;
  if (XLA_FFI_Error* error = frame.api->XLA_FFI_Stream_Get(&args)) {
    destroy(frame.api, error);
    return nullptr;
  }
  return static_cast<cudaStream_t>(args.stream);
}

// Runs `execute` on a copy of the frame marked as the execute stage, captured on the call's
// stream and discarded. Never leaves the stream capturing, and clears any error the capture
// left, so the real launch reports its own.
inline void capture_once(XLA_FFI_Handler* execute, const XLA_FFI_CallFrame& frame, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone ||
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    cudaGetLastError();
    return;  // already being recorded (that loads the kernels too), or not capturable
  }
  XLA_FFI_CallFrame as_execute = frame;
  as_execute.stage = XLA_FFI_ExecutionStage_EXECUTE;
  warming_up() = true;
  XLA_FFI_Error* error = execute(&as_execute);
  warming_up() = false;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  // A handler that fails here fails again when it executes, and reports it there.
  destroy(frame.api, error);
}

inline bool is_metadata_query(const XLA_FFI_CallFrame& frame) {
  return frame.extension_start && frame.extension_start->type == XLA_FFI_Extension_Metadata;
}

// The call's WarmCall, or null where XLA keeps none (type not registered, or no instantiate).
inline WarmCall* warm_call_of(const XLA_FFI_CallFrame& frame) {
  if (warm_call_type_id().type_id == 0) return nullptr;
  XLA_FFI_State_Get_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_State_Get_Args_STRUCT_SIZE;
  args.ctx = frame.ctx;
  args.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  args.type_id = &warm_call_type_id();
  if (XLA_FFI_Error* error = frame.api->XLA_FFI_State_Get(&args)) {
    destroy(frame.api, error);
    return nullptr;
  }
  return static_cast<WarmCall*>(args.state);
}

}  // namespace initialize_detail

// The instantiate-stage handler of target `kExecute`: gives the call its WarmCall. Without one
// (the type is not registered, or XLA refuses it) the initialize stage still works, hashing.
template <XLA_FFI_Handler* kExecute>
XLA_FFI_Error* instantiate_handler(XLA_FFI_CallFrame* frame) {
  if (initialize_detail::is_metadata_query(*frame)) return kExecute(frame);
  if (frame->stage != XLA_FFI_ExecutionStage_INSTANTIATE || warm_call_type_id().type_id == 0) return nullptr;
  XLA_FFI_State_Set_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_State_Set_Args_STRUCT_SIZE;
  args.ctx = frame->ctx;
  args.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  args.type_id = &warm_call_type_id();
  auto* state = new WarmCall;
  args.state = state;
  if (XLA_FFI_Error* error = frame->api->XLA_FFI_State_Set(&args)) {
    initialize_detail::destroy(frame->api, error);
    delete state;
  }
  return nullptr;
}

// The initialize-stage handler of target `kExecute`. Metadata queries are answered by the execute
// handler. A key is tried once, whatever the capture gives: a failure only skips the warm-up (the
// execute stage then loads lazily, as before), and trying again every execution would cost the
// capture each time.
template <XLA_FFI_Handler* kExecute>
XLA_FFI_Error* initialize_handler(XLA_FFI_CallFrame* frame) {
  if (initialize_detail::is_metadata_query(*frame)) return kExecute(frame);
  int device = 0;
  if (frame->stage != XLA_FFI_ExecutionStage_INITIALIZE || cudaGetDevice(&device) != cudaSuccess) {
    return nullptr;
  }
  WarmCall* call = initialize_detail::warm_call_of(*frame);
  std::atomic<uint64_t>* warmed_alignment =
      call && device >= 0 && device < WarmCall::kDevices ? &call->alignment[device] : nullptr;
  const uint64_t alignment = warmed_alignment ? alignment_key(*frame) : 0;
  if (warmed_alignment && warmed_alignment->load(std::memory_order_acquire) == alignment) return nullptr;

  keyed_initializations().fetch_add(1, std::memory_order_relaxed);
  static std::mutex mutex;
  static std::unordered_set<uint64_t> warmed;
  const uint64_t key = call_key(device, *frame);
  std::lock_guard<std::mutex> lock(mutex);
  if (!warmed.count(key)) {
    const cudaStream_t stream = initialize_detail::stream_of(*frame);
    if (!stream) return nullptr;
    initialize_detail::capture_once(kExecute, *frame, stream);
    warmed.insert(key);
  }
  if (warmed_alignment) warmed_alignment->store(alignment, std::memory_order_release);
  return nullptr;
}

}  // namespace jax_nvfp4
