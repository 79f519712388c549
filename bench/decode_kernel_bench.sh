#!/usr/bin/env bash
# Decode GEMM kernel benchmark on the device (no JAX): builds bench/decode_kernel_bench.cu with
# each kernel variant, checks it against the host reference, times it beside cuBLAS bf16 and a
# device copy, and runs compute-sanitizer on the tail cases of the first variant.
#
#   VARIANTS="label|kernel.cu|nvcc flags;..." bash bench/decode_kernel_bench.sh
#
# Default: the library's kernel. Logs and the table go to $OUT (or ./gpu_out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT" build/decode_bench
VARIANTS=${VARIANTS:-"ours|cuda/gemm/sm90/gemm_decode.cu|"}
NVCC="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -I cuda"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
export CUBLAS_LIB=${CUBLAS_LIB:-$(find $(python3 -c 'import site; print(" ".join(site.getsitepackages()))') \
  -name 'libcublas.so.*' 2>/dev/null | grep -v Lt | head -1)}
echo "cuBLAS: $CUBLAS_LIB"

IFS=';' read -ra specs <<< "$VARIANTS"
for spec in "${specs[@]}"; do
  IFS='|' read -r label src flags <<< "$spec"
  $NVCC $flags -o "build/decode_bench/$label" bench/decode_kernel_bench.cu "$src" \
    cuda/gemm/sm90/sm_count.cu -ldl \
    > "$OUT/build_$label.log" 2>&1 || echo "BUILD FAILED: $label" &
done
wait

status=0
first=1
for spec in "${specs[@]}"; do
  IFS='|' read -r label src flags <<< "$spec"
  bin="build/decode_bench/$label"
  [ -x "$bin" ] || { status=1; continue; }
  peers=""
  [ $first = 1 ] && peers="--peers"
  "$bin" --check --time $peers --label "$label" > "$OUT/run_$label.log" 2>&1 || status=1
  grep -E "FAIL|failed|device|^\| $label" "$OUT/run_$label.log"
  if [ $first = 1 ] && [ "${SANITIZE:-1}" = 1 ]; then
    compute-sanitizer --tool memcheck "$bin" --check --tails > "$OUT/memcheck_$label.log" 2>&1 || status=1
    tail -n 3 "$OUT/memcheck_$label.log"
  fi
  first=0
done
exit $status
