#!/usr/bin/env bash
# Kernel-alone conv benchmark (no JAX): builds bench/conv_kernel_bench.cu with the library's
# sm_90a conv sources (one nvcc per translation unit, in parallel), then runs it on the GPU.
#
#   bash bench/conv_kernel_bench.sh [conv_kernel_bench arguments, e.g. --shape b32 --splits 2]
#
# CUTLASS   the nvidia-cutlass wheel's cutlass_library/source (default: found through Python)
# BUILD     build folder (default build/conv_bench); the binary is $BUILD/conv_kernel_bench
# NO_RUN=1  build only (e.g. on the CPU box, to carry the binary to the GPU machine)
# BIN       run this binary instead of building one
# The table goes to stdout; the build log to $BUILD/build.log.
set -euo pipefail
BUILD=${BUILD:-build/conv_bench}
if [ -z "${BIN:-}" ]; then
  CUTLASS=${CUTLASS:-$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')}
  mkdir -p "$BUILD/obj"
  NVCC="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -I cuda -isystem $CUTLASS/include"
  srcs=(bench/conv_kernel_bench.cu cuda/conv/sm90/conv_sm90.cu cuda/conv/sm90/conv_sm90_ws_s{1,3,5,7}.cu)
  jobs=${JOBS:-$(nproc)}
  : > "$BUILD/build.log"
  printf '%s\n' "${srcs[@]}" | xargs -P "$jobs" -I{} sh -c \
    "$NVCC -c -o '$BUILD/obj/\$(basename {}).o' {} >> '$BUILD/build.log' 2>&1 || { echo 'BUILD FAILED: {}'; exit 255; }"
  nvcc -gencode=arch=compute_90a,code=sm_90a -o "$BUILD/conv_kernel_bench" "$BUILD"/obj/*.o -ldl
  BIN=$BUILD/conv_kernel_bench
fi
[ -n "${NO_RUN:-}" ] && exit 0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
"$BIN" "$@"
