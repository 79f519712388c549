#!/usr/bin/env bash
# Quantize kernel benchmark on the device (no JAX): builds bench/quantize_kernel_bench.cu with
# each variant of the kernels' headers and times them beside a device-to-device copy, twice in
# alternating order; every variant must print the first one's output hashes.
#
#   VARIANTS="label|include dir|nvcc flags;..." bash bench/quantize_kernel_bench.sh
#
# A variant's include dir is searched before cuda/ (e.g. a folder holding a changed
# quantize/quantize_kernels.cuh); empty for the library's own. Logs go to $OUT (or ./gpu_out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT" build/quantize_bench
VARIANTS=${VARIANTS:-"ours||"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

IFS=';' read -ra specs <<< "$VARIANTS"
for spec in "${specs[@]}"; do
  IFS='|' read -r label inc flags <<< "$spec"
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 ${inc:+-I "$inc"} -I cuda $flags \
    -o "build/quantize_bench/$label" bench/quantize_kernel_bench.cu \
    cuda/quantize/sm90/quantize_sm90.cu \
    > "$OUT/build_$label.log" 2>&1 || echo "BUILD FAILED: $label" &
done
wait

status=0
for round in 1 2; do
  order=("${specs[@]}")
  [ $round = 2 ] && order=($(printf '%s\n' "${specs[@]}" | tac))
  for spec in "${order[@]}"; do
    IFS='|' read -r label _ <<< "$spec"
    bin="build/quantize_bench/$label"
    [ -x "$bin" ] || { status=1; continue; }
    "$bin" --label "$label" > "$OUT/run${round}_$label.log" 2>&1 || status=1
    grep -E "^\| ($label|memcpy|memset) " "$OUT/run${round}_$label.log"
  done
done
# Every variant's hashes must equal the first variant's (same bytes).
ref=$(grep -oE '[0-9a-f]{16} \|$' "$OUT/run1_${specs[0]%%|*}.log")
for spec in "${specs[@]:1}"; do
  label=${spec%%|*}
  if [ "$(grep -oE '[0-9a-f]{16} \|$' "$OUT/run1_$label.log")" != "$ref" ]; then
    echo "HASH MISMATCH: $label"; status=1
  fi
done
exit $status
