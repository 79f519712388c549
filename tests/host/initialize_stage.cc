// instantiate_handler and initialize_handler (cuda/common/initialize_stage.h) around a stub
// execute handler that records how it was called, with a fake XLA API that keeps per-call state
// by the frame's context (one context a call). Prints one line per case: the case, then the
// stub's calls and, for each, the stage it saw, whether it ran as a warm-up and whether its
// stream was capturing, then "keyed" where the initialize hashed the call's key. Without a GPU
// the initialize cases print "no_device" and must not call the stub.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <map>
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

// The fake's per-call states; its errors are never read, so any non-null pointer serves.
std::map<XLA_FFI_ExecutionContext*, void*> states;
XLA_FFI_Error* const kFakeError = reinterpret_cast<XLA_FFI_Error*>(&states);
void error_destroy(XLA_FFI_Error_Destroy_Args*) {}

XLA_FFI_Error* state_set(XLA_FFI_State_Set_Args* args) {
  if (args->stage != XLA_FFI_ExecutionStage_INSTANTIATE || states.count(args->ctx)) return kFakeError;
  states[args->ctx] = args->state;
  return nullptr;
}

XLA_FFI_Error* state_get(XLA_FFI_State_Get_Args* args) {
  const auto it = states.find(args->ctx);
  if (args->stage != XLA_FFI_ExecutionStage_INSTANTIATE || it == states.end()) return kFakeError;
  args->state = it->second;
  return nullptr;
}

template <XLA_FFI_Handler* kHandler>
void report(const char* name, XLA_FFI_CallFrame& frame) {
  calls.clear();
  const uint64_t keyed = jax_nvfp4::keyed_initializations().load();
  XLA_FFI_Error* error = kHandler(&frame);
  std::printf("%s %s %s%s\n", name, error ? "error" : "ok", calls.empty() ? "-" : calls.c_str(),
              jax_nvfp4::keyed_initializations().load() != keyed ? " keyed" : "");
}

constexpr XLA_FFI_Handler* initialize = jax_nvfp4::initialize_handler<stub_execute>;
constexpr XLA_FFI_Handler* instantiate = jax_nvfp4::instantiate_handler<stub_execute>;

}  // namespace

int main() {
  XLA_FFI_Api api;
  std::memset(&api, 0, sizeof(api));
  api.XLA_FFI_Stream_Get = stream_get;
  api.XLA_FFI_State_Set = state_set;
  api.XLA_FFI_State_Get = state_get;
  api.XLA_FFI_Error_Destroy = error_destroy;

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
  report<initialize>("metadata", frame);
  report<instantiate>("instantiate_metadata", frame);
  frame.extension_start = nullptr;

  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  report<initialize>("execute_stage", frame);

  // Two calls, told apart by their contexts. The first is instantiated before the state's type is
  // registered (it gets no state), the second after.
  alignas(8) static char contexts[2];
  auto* stateless = reinterpret_cast<XLA_FFI_ExecutionContext*>(&contexts[0]);
  auto* stateful = reinterpret_cast<XLA_FFI_ExecutionContext*>(&contexts[1]);
  frame.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  frame.ctx = stateless;
  report<instantiate>("instantiate_unregistered", frame);
  jax_nvfp4::warm_call_type_id().type_id = 7;  // what registering the type would assign
  frame.ctx = stateful;
  report<instantiate>("instantiate_registered", frame);
  std::printf("states %zu %s\n", states.size(), states.count(stateful) ? "stateful" : "-");

  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess) {
    frame.stage = XLA_FFI_ExecutionStage_INITIALIZE;
    report<initialize>("no_device", frame);
    return 0;
  }
  frame.stage = XLA_FFI_ExecutionStage_INITIALIZE;
  frame.ctx = stateless;
  report<initialize>("first_initialize", frame);
  report<initialize>("same_call_again", frame);
  dims[0] = 128;
  report<initialize>("other_shape", frame);
  x.data = memory + 16;
  report<initialize>("other_alignment", frame);

  // The call with state: its first initialize hashes (the key is known: no warm-up), later ones of
  // the same alignment do not; another alignment hashes again, and so does the way back.
  frame.ctx = stateful;
  report<initialize>("stateful_first", frame);
  report<initialize>("stateful_again", frame);
  x.data = memory + 32;
  report<initialize>("stateful_other_alignment", frame);
  report<initialize>("stateful_other_alignment_again", frame);
  x.data = memory + 16;
  report<initialize>("stateful_alignment_back", frame);

  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  std::printf("stream_left_capturing %s\n",
              cudaStreamIsCapturing(stream, &status) == cudaSuccess && status == cudaStreamCaptureStatusNone ? "no"
                                                                                                            : "yes");
  return 0;
}
