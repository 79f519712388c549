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
#pragma once

#include <cuda_runtime.h>

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

}  // namespace initialize_detail

// The initialize-stage handler of target `kExecute`. Metadata queries are answered by the execute
// handler. A key is tried once, whatever the capture gives: a failure only skips the warm-up (the
// execute stage then loads lazily, as before), and trying again every execution would cost the
// capture each time.
template <XLA_FFI_Handler* kExecute>
XLA_FFI_Error* initialize_handler(XLA_FFI_CallFrame* frame) {
  if (frame->extension_start && frame->extension_start->type == XLA_FFI_Extension_Metadata) {
    return kExecute(frame);
  }
  int device = 0;
  if (frame->stage != XLA_FFI_ExecutionStage_INITIALIZE || cudaGetDevice(&device) != cudaSuccess) {
    return nullptr;
  }
  static std::mutex mutex;
  static std::unordered_set<uint64_t> warmed;
  const uint64_t key = call_key(device, *frame);
  std::lock_guard<std::mutex> lock(mutex);
  if (warmed.count(key)) return nullptr;
  const cudaStream_t stream = initialize_detail::stream_of(*frame);
  if (!stream) return nullptr;
  initialize_detail::capture_once(kExecute, *frame, stream);
  warmed.insert(key);
  return nullptr;
}

}  // namespace jax_nvfp4
