// initialize_handler (cuda/common/initialize_stage.h) around a stub execute handler that records
// how it was called. Prints one line per case: the case, then the stub's calls and, for each, the
// stage it saw, whether it ran as a warm-up and whether its stream was capturing. Without a GPU
// the initialize cases print "no_device" and must not call the stub.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "common/initialize_stage.h"

namespace {

std::string calls;  // what the stub saw, one "[stage warm capturing]" per call
cudaStream_t stream = nullptr;

extern "C" XLA_FFI_Error* stub_execute(XLA_FFI_CallFrame* frame) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const bool capturing = stream && cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
                         status == cudaStreamCaptureStatusActive;
  const bool metadata = frame->extension_start && frame->extension_start->type == XLA_FFI_Extension_Metadata;
  calls += metadata ? "[metadata]"
                    : "[" + std::to_string(frame->stage) + (jax_nvfp4::warming_up() ? " warm" : " cold") +
                          (capturing ? " capturing]" : " plain]");
  return nullptr;
}

XLA_FFI_Error* stream_get(XLA_FFI_Stream_Get_Args* args) {
  args->stream = stream;
  return nullptr;
}

void report(const char* name, XLA_FFI_CallFrame& frame) {
  calls.clear();
  XLA_FFI_Error* error = jax_nvfp4::initialize_handler<stub_execute>(&frame);
  std::printf("%s %s %s\n", name, error ? "error" : "ok", calls.empty() ? "-" : calls.c_str());
}

}  // namespace

int main() {
  XLA_FFI_Api api;
  std::memset(&api, 0, sizeof(api));
  api.XLA_FFI_Stream_Get = stream_get;

  alignas(256) static char memory[256];
  int64_t dims[1] = {64};
  XLA_FFI_Buffer x{sizeof(XLA_FFI_Buffer), nullptr, XLA_FFI_DataType_BF16, memory, 1, dims};
  XLA_FFI_ArgType arg_types[1] = {XLA_FFI_ArgType_BUFFER};
  void* args[1] = {&x};
  XLA_FFI_CallFrame frame;
  std::memset(&frame, 0, sizeof(frame));
  frame.struct_size = sizeof(frame);
  frame.api = &api;
  frame.args = {sizeof(XLA_FFI_Args), nullptr, 1, arg_types, args};
  frame.rets = {sizeof(XLA_FFI_Rets), nullptr, 0, nullptr, nullptr};
  frame.attrs = {sizeof(XLA_FFI_Attrs), nullptr, 0, nullptr, nullptr, nullptr};

  // XLA_FFI_InternalExtension, or XLA_FFI_Extension_Base in older jaxlibs.
  std::remove_pointer_t<decltype(frame.extension_start)> metadata;
  std::memset(&metadata, 0, sizeof(metadata));
  metadata.struct_size = sizeof(metadata);
  metadata.type = XLA_FFI_Extension_Metadata;
  frame.extension_start = &metadata;
  report("metadata", frame);
  frame.extension_start = nullptr;

  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  report("execute_stage", frame);

  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess) {
    frame.stage = XLA_FFI_ExecutionStage_INITIALIZE;
    report("no_device", frame);
    return 0;
  }
  frame.stage = XLA_FFI_ExecutionStage_INITIALIZE;
  report("first_initialize", frame);
  report("same_call_again", frame);
  dims[0] = 128;
  report("other_shape", frame);
  x.data = memory + 16;
  report("other_alignment", frame);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  std::printf("stream_left_capturing %s\n",
              cudaStreamIsCapturing(stream, &status) == cudaSuccess && status == cudaStreamCaptureStatusNone ? "no"
                                                                                                            : "yes");
  return 0;
}
