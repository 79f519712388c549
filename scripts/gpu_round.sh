#!/usr/bin/env bash
# One GPU round on the device machine: build, GPU tests, benchmarks, in one call.
#
#   OPS="quantize;gemm" BENCH="quantize gemm" bash scripts/gpu_round.sh [pytest args]
#
# OPS     ops whose kernels are built (default: all); ARCHS (default 90a: Hopper only, fast)
# BENCH   bench/bench_<name>.py scripts to run after the tests (default: none)
# SHARDS  run the selected tests as that many pytest processes on the one GPU at once (default 1;
#         the tests are mostly compile-bound host work, so 4 shards take the conv file from ~14 to
#         a few minutes on an H100); logs pytest.<i>.log
# PREBUILT a folder holding a jax_nvfp4 wheel built elsewhere for this machine's Python (e.g. on
#         the CPU box: `pip wheel --no-build-isolation --no-deps -w .prebuilt .` under Python 3.12
#         with JAX_NVFP4_CUDA_ARCHS=90a; carry the folder): installed instead of building here
# OVERLAY with PREBUILT, =1: this checkout's jax_nvfp4/ Python files replace the wheel's (a change
#         to Python only, tested on a wheel of the same kernels built earlier)
# Logs and benchmark tables go to $OUT (the device tool's return folder) or ./gpu_out.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}

# Build requirements the device machine lacks (the nvidia-cutlass wheel for CUTLASS/CuTe headers)
# travel in .whl/ (carry it): see the README's Development section.
# A fresh folder each round: a warm machine keeps what an earlier round installed.
SITE=$(mktemp -d /tmp/gpu_round_site.XXXXXX)
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv \
  | tee "$OUT/gpu.txt"
"$PY" -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"

if [ -n "${PREBUILT:-}" ]; then
  echo "== install $(ls "$PREBUILT"/jax_nvfp4-*.whl)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$PREBUILT"/jax_nvfp4-*.whl || exit 1
  if [ "${OVERLAY:-0}" = 1 ]; then
    echo "== overlay this checkout's Python files"
    (cd jax_nvfp4 && find . -name "*.py" -exec cp --parents {} "$SITE/jax_nvfp4/" \;) || exit 1
  fi
else
  echo "== build (OPS=${OPS:-quantize;gemm;conv} ARCHS=${ARCHS:-90a})"
  if ! JAX_NVFP4_CUDA=ON JAX_NVFP4_CUDA_ARCHS="${ARCHS:-90a}" JAX_NVFP4_OPS="${OPS:-quantize;gemm;conv}" \
      "$PY" -m pip install --no-build-isolation --no-deps -v . > "$OUT/build.log" 2>&1; then
    grep -E "error|Error" "$OUT/build.log" | head -40
    echo "BUILD FAILED (see build.log)"
    exit 1
  fi
  grep -E "warning|spill" "$OUT/build.log" | grep -v "^ *$" | head -20
fi

"$PY" -P -c "import jax_nvfp4 as j; print('testing', j.__file__, j.cuda_archs())" | tee -a "$OUT/gpu.txt"

echo "== tests"
# -P and importlib mode (pyproject) keep the source tree off sys.path: the tests import the
# installed package, with its extension.
SHARDS=${SHARDS:-1}
if [ "$SHARDS" -le 1 ]; then
  "$PY" -P -m pytest -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.log"
  status=${PIPESTATUS[0]}
else
  # Round-robin over the collected test ids; each process takes GPU memory as it needs it.
  # A file that fails to collect would otherwise drop out of the shards unnoticed.
  if ! "$PY" -P -m pytest -q -p no:cacheprovider --collect-only "$@" > "$OUT/collect.log" 2>&1; then
    tail -n 20 "$OUT/collect.log"; echo "== collection failed"; exit 1
  fi
  grep "::" "$OUT/collect.log" > "$OUT/test_ids.txt"
  echo "$(wc -l < "$OUT/test_ids.txt") tests in $SHARDS shards"
  pids=()
  for ((i = 0; i < SHARDS; i++)); do
    awk -v n="$SHARDS" -v i="$i" 'NR % n == i' "$OUT/test_ids.txt" > "$OUT/test_ids.$i.txt"
    mapfile -t ids < "$OUT/test_ids.$i.txt"  # one argument a line: ids may hold spaces
    XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -P -m pytest -q -rs -p no:cacheprovider \
      "${ids[@]}" > "$OUT/pytest.$i.log" 2>&1 &
    pids+=($!)
  done
  status=0
  for ((i = 0; i < SHARDS; i++)); do
    wait "${pids[$i]}" || status=1
    echo "== shard $i: $(tail -n 1 "$OUT/pytest.$i.log")"
  done
  grep -h -E "^(FAILED|ERROR)" "$OUT"/pytest.*.log
fi

for b in ${BENCH:-}; do
  echo "== bench $b"
  "$PY" "bench/bench_$b.py" --out "$OUT" 2>&1 | tee "$OUT/bench_$b.log"
done
exit "$status"
