#!/usr/bin/env bash
# Builds bench/fused_gemm_bench.cu with the sm_90a GEMM kernels it times (fused, fused_ws,
# prefill) and, on a GPU machine, runs it (arguments are passed on). CUTLASS's headers come from
# the nvidia-cutlass wheel (CUTLASS_DIR overrides); BIN names the binary (default
# build/fused_gemm_bench); NO_RUN=1 only builds.
set -euo pipefail
CUTLASS_DIR=${CUTLASS_DIR:-$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')}
BIN=${BIN:-build/fused_gemm_bench}
OBJ=$(dirname "$BIN")/fused_gemm_bench_obj
mkdir -p "$OBJ"
NVCC="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -DNDEBUG -I cuda -isystem $CUTLASS_DIR/include -isystem $CUTLASS_DIR/tools/util/include"
srcs="gemm_fused gemm_fused_ws fused_staging gemm_prefill wgmma_gemm_bf16 wgmma_gemm_f16 wgmma_gemm_f32 sm_count"
for f in $srcs; do
  $NVCC -c -o "$OBJ/$f.o" "cuda/gemm/sm90/$f.cu" &
done
$NVCC -I bench -c -o "$OBJ/bench.o" bench/fused_gemm_bench.cu &
wait
$NVCC -o "$BIN" "$OBJ"/*.o -ldl
export CUBLAS_LIB=${CUBLAS_LIB:-$(find $(python3 -c 'import site; print(" ".join(site.getsitepackages()))') \
  -name 'libcublas.so.*' 2>/dev/null | grep -v Lt | head -1)}
[ "${NO_RUN:-0}" = 1 ] || "$BIN" "$@"
