// cuBLASLt behind the prefill path (cublaslt_gemm.h): the library opened once per process, one
// handle per device, and per problem the fastest of the heuristic's proposals, timed once at its
// first call (as XLA autotunes the algorithm of its own cuBLASLt GEMMs). Host code only.
#include "gemm/sm90/cublaslt_gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common/initialize_stage.h"

namespace jax_nvfp4 {
namespace sm90 {
namespace {

// The entry points used, resolved from the opened library.
struct Api {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

template <class F>
bool resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

// The API of the cuBLASLt of this header's major version, or null where it cannot be opened.
const Api* api() {
  static const Api* const loaded = []() -> const Api* {
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) return nullptr;
    static Api a;
    const bool ok = resolve(lib, "cublasLtCreate", &a.create) &&
                    resolve(lib, "cublasLtMatmulDescCreate", &a.desc_create) &&
                    resolve(lib, "cublasLtMatmulDescSetAttribute", &a.desc_set) &&
                    resolve(lib, "cublasLtMatmulDescDestroy", &a.desc_destroy) &&
                    resolve(lib, "cublasLtMatrixLayoutCreate", &a.layout_create) &&
                    resolve(lib, "cublasLtMatrixLayoutDestroy", &a.layout_destroy) &&
                    resolve(lib, "cublasLtMatmulPreferenceCreate", &a.pref_create) &&
                    resolve(lib, "cublasLtMatmulPreferenceSetAttribute", &a.pref_set) &&
                    resolve(lib, "cublasLtMatmulPreferenceDestroy", &a.pref_destroy) &&
                    resolve(lib, "cublasLtMatmulAlgoGetHeuristic", &a.heuristic) &&
                    resolve(lib, "cublasLtMatmul", &a.matmul);
    return ok ? &a : nullptr;
  }();
  return loaded;
}

cudaDataType_t cuda_type(DType t) { return t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

// The largest power of two up to 256 that divides the address (cuBLASLt's algorithms state
// the alignment they need; the heuristic is told what the buffers have).
uint32_t alignment(const void* ptr) {
  const auto v = reinterpret_cast<uintptr_t>(ptr);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// Descriptors of one problem; destroyed with it.
struct Descriptors {
  const Api& lt;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  bool ok = false;

  // cuBLASLt is column-major: D^T[n, m] = op(B)[n, k] . A^T[k, m], with B the "A" of cuBLASLt,
  // stored k x n (ld k) and transposed, and A stored k x m (ld k).
  Descriptors(const Api& api, const CublasLtGemmArgs& g) : lt(api) {
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    const int32_t pointer_mode = CUBLASLT_POINTER_MODE_DEVICE;
    const uint32_t epilogue = g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const int32_t bias_type = cuda_type(g.d_type);
    ok = lt.desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
         lt.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)) == CUBLAS_STATUS_SUCCESS &&
         lt.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)) == CUBLAS_STATUS_SUCCESS &&
         lt.desc_set(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pointer_mode, sizeof(pointer_mode)) ==
             CUBLAS_STATUS_SUCCESS &&
         lt.desc_set(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)) == CUBLAS_STATUS_SUCCESS &&
         lt.layout_create(&b, CUDA_R_16BF, g.k, g.n, g.k) == CUBLAS_STATUS_SUCCESS &&
         lt.layout_create(&a, CUDA_R_16BF, g.k, g.m, g.k) == CUBLAS_STATUS_SUCCESS &&
         lt.layout_create(&d, cuda_type(g.d_type), g.n, g.m, g.n) == CUBLAS_STATUS_SUCCESS;
    if (ok && g.bias) {
      ok = lt.desc_set(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)) == CUBLAS_STATUS_SUCCESS &&
           lt.desc_set(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)) ==
               CUBLAS_STATUS_SUCCESS;
    }
  }
  ~Descriptors() {
    if (d) lt.layout_destroy(d);
    if (a) lt.layout_destroy(a);
    if (b) lt.layout_destroy(b);
    if (op) lt.desc_destroy(op);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
};

constexpr int kCandidates = 8;  // algorithms the heuristic proposes, timed at a problem's first call
constexpr int kTimedRuns = 2;

// What the heuristic's choice depends on.
using ProblemKey = std::tuple<int, int64_t, int64_t, int64_t, int, bool, uint32_t, uint32_t, uint32_t>;

ProblemKey key_of(int device, const CublasLtGemmArgs& g) {
  return {device, g.m, g.n, g.k, static_cast<int>(g.d_type), g.bias != nullptr,
          alignment(g.a), alignment(g.b), alignment(g.d)};
}

// The heuristic's candidates for a problem, best first, and the one its calls run: fixed at the
// first call, so every later call (and a CUDA graph recorded from one) runs the same algorithm.
struct Choice {
  std::vector<cublasLtMatmulAlgo_t> candidates;
  bool settled = false;
  cublasLtMatmulAlgo_t algo{};
};

// Per-process state: one handle per device, the algorithms.
struct State {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;
  std::map<ProblemKey, Choice> choices;
  std::atomic<int64_t> calls{0};
};

State& state() {
  static State s;
  return s;
}

// The handle of `device` (created on first use), or null. Holds state().mutex.
cublasLtHandle_t handle_locked(const Api& lt, int device) {
  auto& handles = state().handles;
  const auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  if (lt.create(&h) != CUBLAS_STATUS_SUCCESS) h = nullptr;
  handles[device] = h;
  return h;
}

// The heuristic's candidates for `g` on `device` (none: cuBLASLt cannot run it), queried on first
// use. Holds state().mutex.
Choice& choice_locked(const Api& lt, cublasLtHandle_t h, int device, const CublasLtGemmArgs& g) {
  auto& choices = state().choices;
  const ProblemKey key = key_of(device, g);
  const auto it = choices.find(key);
  if (it != choices.end()) return it->second;
  Choice& c = choices[key];
  const Descriptors desc(lt, g);
  cublasLtMatmulPreference_t pref = nullptr;
  if (!desc.ok || lt.pref_create(&pref) != CUBLAS_STATUS_SUCCESS) return c;
  const uint64_t ws = kCublasLtWorkspaceBytes;
  const uint32_t align_a = std::get<7>(key), align_b = std::get<6>(key), align_d = std::get<8>(key);
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int returned = 0;
  // cuBLASLt's A is our B (the weights) and its B our A (the activations).
  const bool ok =
      lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) == CUBLAS_STATUS_SUCCESS &&
      lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)) ==
          CUBLAS_STATUS_SUCCESS &&
      lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)) ==
          CUBLAS_STATUS_SUCCESS &&
      lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)) ==
          CUBLAS_STATUS_SUCCESS &&
      lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)) ==
          CUBLAS_STATUS_SUCCESS &&
      lt.heuristic(h, desc.op, desc.b, desc.a, desc.d, desc.d, pref, kCandidates, results, &returned) ==
          CUBLAS_STATUS_SUCCESS;
  lt.pref_destroy(pref);
  for (int i = 0; ok && i < returned; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) c.candidates.push_back(results[i].algo);
  }
  return c;
}

cublasStatus_t run_algo(const Api& lt, cublasLtHandle_t h, const Descriptors& desc, const CublasLtGemmArgs& g,
                        const cublasLtMatmulAlgo_t& algo, cudaStream_t stream) {
  return lt.matmul(h, desc.op, g.scalars, g.b, desc.b, g.a, desc.a, g.scalars + 1, g.d, desc.d, g.d, desc.d, &algo,
                   g.workspace, kCublasLtWorkspaceBytes, stream);
}

// The fastest of the candidates on this call's own operands (its preparation already enqueued):
// each runs once untimed, then kTimedRuns times between a start and a stop event; the host waits
// for the last event, and the least time wins. The first candidate where anything fails.
cublasLtMatmulAlgo_t fastest(const Api& lt, cublasLtHandle_t h, const Descriptors& desc, const CublasLtGemmArgs& g,
                             const std::vector<cublasLtMatmulAlgo_t>& candidates, cudaStream_t stream) {
  const size_t n = candidates.size();
  std::vector<cudaEvent_t> start(n, nullptr), stop(n, nullptr);
  bool ok = true;
  for (size_t i = 0; i < n; ++i) {
    ok = ok && cudaEventCreate(&start[i]) == cudaSuccess && cudaEventCreate(&stop[i]) == cudaSuccess;
  }
  for (size_t i = 0; ok && i < n; ++i) {
    ok = run_algo(lt, h, desc, g, candidates[i], stream) == CUBLAS_STATUS_SUCCESS &&
         cudaEventRecord(start[i], stream) == cudaSuccess;
    for (int r = 0; ok && r < kTimedRuns; ++r) ok = run_algo(lt, h, desc, g, candidates[i], stream) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(stop[i], stream) == cudaSuccess;
  }
  ok = ok && cudaEventSynchronize(stop[n - 1]) == cudaSuccess;
  size_t best = 0;
  float best_ms = 0.f;
  for (size_t i = 0; ok && i < n; ++i) {
    float ms = 0.f;
    ok = cudaEventElapsedTime(&ms, start[i], stop[i]) == cudaSuccess;
    if (ok && (i == 0 || ms < best_ms)) best = i, best_ms = ms;
  }
  for (size_t i = 0; i < n; ++i) {
    if (start[i]) cudaEventDestroy(start[i]);
    if (stop[i]) cudaEventDestroy(stop[i]);
  }
  if (!ok) cudaGetLastError();  // clear the error: the heuristic's first choice runs instead
  return candidates[ok ? best : 0];
}

// The CUDA error reported when cublasLtMatmul refuses the GEMM once its operands are prepared:
// never cudaErrorNotSupported, which tells the caller that nothing was enqueued (it would prepare
// them again for CUTLASS). cuBLASLt keeps its own CUDA runtime: cudaGetLastError holds nothing of it.
cudaError_t cuda_error_of(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUBLAS_STATUS_ALLOC_FAILED: return cudaErrorMemoryAllocation;
    default: return cudaErrorUnknown;
  }
}

// The initialize stage's warm-up capture (common/initialize_stage.h): every candidate recorded,
// so each one's kernels are loaded before the execute stage times them; none is settled on.
cudaError_t record_candidates(const Api& lt, cublasLtHandle_t h, const Descriptors& desc, const CublasLtGemmArgs& g,
                              const std::vector<cublasLtMatmulAlgo_t>& candidates, cudaStream_t stream) {
  for (const cublasLtMatmulAlgo_t& algo : candidates) {
    if (const cublasStatus_t status = run_algo(lt, h, desc, g, algo, stream); status != CUBLAS_STATUS_SUCCESS) {
      return cuda_error_of(status);
    }
  }
  return cudaSuccess;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

}  // namespace

cudaError_t cublaslt_gemm(const CublasLtGemmArgs& g, cudaStream_t stream,
                          const std::function<cudaError_t()>& prepare) {
  const Api* lt = api();
  int device = 0;
  if (!lt || cudaGetDevice(&device) != cudaSuccess) return cudaErrorNotSupported;
  const Descriptors desc(*lt, g);
  if (!desc.ok) return cudaErrorNotSupported;
  cublasLtHandle_t h;
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    h = handle_locked(*lt, device);
    if (!h) return cudaErrorNotSupported;
    Choice& c = choice_locked(*lt, h, device, g);
    if (c.candidates.empty()) return cudaErrorNotSupported;
    if (const cudaError_t err = prepare(); err != cudaSuccess) return err;
    if (warming_up()) return record_candidates(*lt, h, desc, g, c.candidates, stream);
    if (!c.settled) {
      // Timing needs a host wait, which a stream being recorded into a CUDA graph cannot have:
      // a problem first met there keeps the heuristic's first choice.
      c.algo = c.candidates.size() > 1 && !capturing(stream) ? fastest(*lt, h, desc, g, c.candidates, stream)
                                                            : c.candidates[0];
      c.settled = true;
    }
    algo = c.algo;
  }
  if (const cublasStatus_t status = run_algo(*lt, h, desc, g, algo, stream); status != CUBLAS_STATUS_SUCCESS) {
    return cuda_error_of(status);
  }
  state().calls.fetch_add(1, std::memory_order_relaxed);
  return cudaSuccess;
}

int64_t cublaslt_gemm_calls() { return state().calls.load(std::memory_order_relaxed); }

}  // namespace sm90
}  // namespace jax_nvfp4
