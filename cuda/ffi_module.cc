// The nanobind extension: exposes every registered FFI handler as a PyCapsule, which GPU
// targets were compiled, the workspace sizes of the targets that take a workspace result and the
// attributes they settle at lowering, so the Python package can register the handlers with XLA
// and lower calls to them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/ffi_registry.h"
#include "common/workspace_registry.h"
#ifdef JAX_NVFP4_HAS_CUBLASLT
#include "gemm/sm90/cublaslt_gemm.h"
#endif
#ifdef JAX_NVFP4_HAS_GEMM_SM90
#include "gemm/sm90/gemm_sm90.h"
#endif
#ifdef JAX_NVFP4_HAS_CONV_SM90
#include "conv/sm90/conv_sm90.h"
#include "conv/sm90/conv_sm90_schedule.h"
#endif

namespace nb = nanobind;

namespace {

using Shape = std::pair<std::vector<int64_t>, std::string>;  // (dims, numpy dtype name)

xla::ffi::DataType data_type(const std::string& name) {
  using T = xla::ffi::DataType;
  if (name == "float32") return T::F32;
  if (name == "bfloat16") return T::BF16;
  if (name == "float16") return T::F16;
  if (name == "float4_e2m1fn") return T::F4E2M1FN;
  if (name == "float8_e4m3fn") return T::F8E4M3FN;
  if (name == "uint8") return T::U8;
  if (name == "int32") return T::S32;
  throw std::invalid_argument("jax_nvfp4: no FFI data type for dtype " + name);
}

std::vector<jax_nvfp4::ArgShape> arg_shapes(const std::vector<Shape>& shapes) {
  std::vector<jax_nvfp4::ArgShape> out;
  for (const auto& [dims, dtype] : shapes) out.push_back({dims, data_type(dtype)});
  return out;
}

// What the lowering-time functions of a target see (common/workspace_registry.h).
jax_nvfp4::WorkspaceQuery query(int compute_capability, const std::vector<Shape>& args,
                                const std::vector<Shape>& rets, const std::map<std::string, int64_t>& attrs) {
  return {compute_capability, arg_shapes(args), arg_shapes(rets), attrs};
}

// The targets a registry holds a function for.
template <class Fn>
std::vector<std::string> targets_of(const std::map<std::string, Fn>& fns) {
  std::vector<std::string> names;
  for (const auto& [name, fn] : fns) names.push_back(name);
  return names;
}

// The function a registry holds for `target`; ValueError "<target><missing>" where it holds none.
template <class Fn>
Fn registered(const std::map<std::string, Fn>& fns, const std::string& target, const char* missing) {
  const auto it = fns.find(target);
  if (it == fns.end()) throw std::invalid_argument("jax_nvfp4: " + target + missing);
  return it->second;
}

#ifdef JAX_NVFP4_HAS_CONV_SM90
// A conv problem with bf16 activations and output and unit dilation, for the host-side queries
// of the sm_90a launcher (no operand is set).
jax_nvfp4::ConvProblem bf16_conv_problem(int64_t n, int64_t h, int64_t w, int64_t c, int64_t k, int r, int s,
                                         int stride, int64_t p, int64_t q, int pad_h, int pad_w) {
  jax_nvfp4::ConvProblem pb;
  pb.n = n;
  pb.h = h;
  pb.w = w;
  pb.c = c;
  pb.k = k;
  pb.r = r;
  pb.s = s;
  pb.stride_h = pb.stride_w = stride;
  pb.p = p;
  pb.q = q;
  pb.pad_h = pad_h;
  pb.pad_w = pad_w;
  return pb;
}
#endif

}  // namespace

NB_MODULE(_nvfp4_cuda, m) {
  m.def("targets", []() {
    nb::dict out;
    for (const auto& [name, stages] : jax_nvfp4::ffi_targets()) {
      nb::dict bundle;
      bundle["execute"] = nb::capsule(reinterpret_cast<void*>(stages.execute));
      bundle["instantiate"] = nb::capsule(reinterpret_cast<void*>(stages.instantiate));
      bundle["initialize"] = nb::capsule(reinterpret_cast<void*>(stages.initialize));
      out[name.c_str()] = bundle;
    }
    return out;
  });
  m.def(
      "warm_call_type",
      []() {
        nb::dict registration;
        registration["type_id"] = nb::capsule(&jax_nvfp4::warm_call_type_id());
        registration["type_info"] = nb::capsule(const_cast<XLA_FFI_TypeInfo*>(&jax_nvfp4::warm_call_type_info()));
        return registration;
      },
      "The registration (jax.ffi.register_ffi_type) of the per-call state of the initialize "
      "stage (cuda/common/initialize_stage.h).");
  m.def(
      "warm_call_type_id", []() { return jax_nvfp4::warm_call_type_id().type_id; },
      "The id XLA assigned that type; 0 while it is not registered.");
  m.def(
      "keyed_initializations", []() { return jax_nvfp4::keyed_initializations().load(); },
      "How many initialize stages hashed their call's key, having no per-call state that "
      "matched: warm calls of a program with per-call state do not.");
  m.def("cuda_archs", []() {
    std::vector<std::string> archs;
#ifdef JAX_NVFP4_HAS_SM90
    archs.push_back("sm_90a");
#endif
#ifdef JAX_NVFP4_HAS_SM100
    archs.push_back("sm_100a");
#endif
    return archs;
  });
  m.def(
      "cublaslt_gemm_calls",
      []() -> nb::object {
#ifdef JAX_NVFP4_HAS_CUBLASLT
        return nb::int_(jax_nvfp4::sm90::cublaslt_gemm_calls());
#else
        return nb::none();
#endif
      },
      "How many sm_90a prefill GEMMs have been enqueued through cuBLASLt in this process, or None "
      "where the build had no cuBLASLt header (the prefill GEMM is then always CUTLASS's).");
#ifdef JAX_NVFP4_HAS_GEMM_SM90
  m.def(
      "gemm_sm90_path",
      [](int64_t rows, int64_t n, int64_t k) {
        jax_nvfp4::GemmProblem p;
        p.m = rows;
        p.n = n;
        p.k = k;
        switch (jax_nvfp4::gemm_sm90_path(p)) {
          case jax_nvfp4::GemmSm90Path::kDecode: return "decode";
          case jax_nvfp4::GemmSm90Path::kFused: return "fused";
          case jax_nvfp4::GemmSm90Path::kFusedWs: return "fused_ws";
          case jax_nvfp4::GemmSm90Path::kFusedWsWide: return "fused_ws_wide";
          default: return "prefill";
        }
      },
      nb::arg("m"), nb::arg("n"), nb::arg("k"),
      "The sm_90a kernel family (decode, fused, fused_ws, fused_ws_wide or prefill) that `matmul` "
      "runs for m rows of bf16 activations times NVFP4 weights [n, k] on the current GPU (sized for "
      "132 SMs where none is visible); JAX_NVFP4_GEMM_SM90_PATH is not consulted.");
#endif
#ifdef JAX_NVFP4_HAS_CONV_SM90
  m.def(
      "conv_sm90_kernel_choice",
      [](int64_t n, int64_t h, int64_t w, int64_t c, int64_t k, int r, int s, int stride, int64_t p, int64_t q,
         int pad_h, int pad_w, int sms, int max_smem) {
        const jax_nvfp4::ConvProblem pb = bf16_conv_problem(n, h, w, c, k, r, s, stride, p, q, pad_h, pad_w);
        const jax_nvfp4::ConvSm90Choice choice = jax_nvfp4::conv_sm90_choice(pb, sms, max_smem);
        const jax_nvfp4::ConvSm90Tile tile = jax_nvfp4::conv_sm90_tile(pb, choice.kernel, sms);
        return std::make_tuple(static_cast<int>(choice.kernel), choice.splits, tile.channels, tile.pixels);
      },
      nb::arg("n"), nb::arg("h"), nb::arg("w"), nb::arg("c"), nb::arg("k"), nb::arg("r"), nb::arg("s"),
      nb::arg("stride"), nb::arg("p"), nb::arg("q"), nb::arg("pad_h"), nb::arg("pad_w"), nb::arg("sms") = 132,
      nb::arg("max_smem") = 232448,
      "The sm_90a conv kernel (ConvSm90Kernel, as the FFI attribute `kernel` numbers it), split, "
      "and CTA tile (output channels, pixels) that `conv` runs a bf16 problem with on a GPU of "
      "`sms` SMs and `max_smem` bytes of shared memory a block (an H100's by default); "
      "JAX_NVFP4_CONV_SM90_KERNEL is not consulted.");
  m.def(
      "conv_sm90_ws_plan",
      [](int64_t n, int64_t h, int64_t w, int64_t c, int64_t k, int r, int s, int stride, int64_t p, int64_t q,
         int pad_h, int pad_w, int kernel, int splits) {
        jax_nvfp4::ConvProblem pb = bf16_conv_problem(n, h, w, c, k, r, s, stride, p, q, pad_h, pad_w);
        // Nothing is read: the TMA maps need only 16-byte-aligned operand addresses.
        alignas(16) static unsigned char nothing[16];
        pb.x = pb.out = nothing;
        pb.wgt.codes = pb.wgt.scales = nothing;
        jax_nvfp4::ConvSm90WsPlan plan;
        if (jax_nvfp4::conv_sm90_ws_plan(pb, static_cast<jax_nvfp4::ConvSm90Kernel>(kernel), splits, &plan) !=
            cudaSuccess) {
          throw std::invalid_argument("jax_nvfp4: the forced sm_90a conv kernel does not take this problem");
        }
        return std::make_tuple(plan.smem_bytes, plan.stages, plan.pushes_sums);
      },
      nb::arg("n"), nb::arg("h"), nb::arg("w"), nb::arg("c"), nb::arg("k"), nb::arg("r"), nb::arg("s"),
      nb::arg("stride"), nb::arg("p"), nb::arg("q"), nb::arg("pad_h"), nb::arg("pad_w"), nb::arg("kernel"),
      nb::arg("splits"),
      "What the warp-specialized sm_90a conv kernel `kernel` (ConvSm90Kernel) over clusters of "
      "`splits` CTAs would run a bf16 problem with on the current GPU, without launching it: "
      "(dynamic shared memory bytes, stages in its ring, whether split-K's CTAs push their sums into "
      "the owner's shared memory). ValueError where it does not take the problem. Needs a GPU (the "
      "TMA maps are encoded by the driver).");
  m.def(
      "conv_sm90_virtual_row_width",
      [](int64_t q, int64_t w, int s, int stride_w, int pad_w, int dil_w) {
        jax_nvfp4::ConvProblem pb;
        pb.q = q;
        pb.w = w;
        pb.s = s;
        pb.stride_w = stride_w;
        pb.pad_w = pad_w;
        pb.dil_w = dil_w;
        return jax_nvfp4::conv90::problem_geometry(pb).wv;
      },
      nb::arg("q"), nb::arg("w"), nb::arg("s"), nb::arg("stride_w"), nb::arg("pad_w"), nb::arg("dil_w"),
      "The sm_90a conv kernels' virtual output row width (conv_sm90_schedule.h) for Q output "
      "columns of an input W wide, S filter taps along W, that stride, leading padding and "
      "dilation: the tests and the benchmark size the kernels' grids with it.");
#endif
  m.def(
      "host_calls", [](const std::string& target) { return jax_nvfp4::host_calls(target).load(); },
      nb::arg("target"),
      "How many times the handler of FFI target `target` has run on the host (a call replayed "
      "from a CUDA graph does not run it).");
  m.def("workspace_targets", []() { return targets_of(jax_nvfp4::workspace_functions()); });
  m.def(
      "workspace_bytes",
      [](const std::string& target, int compute_capability, const std::vector<Shape>& args,
         const std::vector<Shape>& rets, const std::map<std::string, int64_t>& attrs) -> size_t {
        return registered(jax_nvfp4::workspace_functions(), target, " takes no workspace")(
            query(compute_capability, args, rets, attrs));
      },
      nb::arg("target"), nb::arg("compute_capability"), nb::arg("args"), nb::arg("rets"),
      nb::arg("attrs") = std::map<std::string, int64_t>{},
      "Bytes of the workspace result of a call to FFI target `target` on a GPU of compute "
      "capability `compute_capability` (major*10+minor), given the (dims, dtype name) of its "
      "operands and other results and its integer attributes.");
  m.def("settled_targets", []() { return targets_of(jax_nvfp4::settle_functions()); });
  m.def(
      "settled_attrs",
      [](const std::string& target, int compute_capability, const std::vector<Shape>& args,
         const std::vector<Shape>& rets, const std::map<std::string, int64_t>& attrs) {
        return registered(jax_nvfp4::settle_functions(), target, " settles no attributes")(
            query(compute_capability, args, rets, attrs));
      },
      nb::arg("target"), nb::arg("compute_capability"), nb::arg("args"), nb::arg("rets"),
      nb::arg("attrs") = std::map<std::string, int64_t>{},
      "The integer attributes a call to FFI target `target` is lowered with in place of `attrs` "
      "on the current GPU of compute capability `compute_capability` (the kernel choices that "
      "depend on the device beyond it, settled), given what workspace_bytes takes.");
}
