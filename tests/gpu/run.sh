#!/bin/bash
# Runs on the GPU machine, from the folder tests/gpu/pack.sh filled (see there).
#   run.sh tests   the CUDA test suite twice: fat binary, then compute_52 PTX only
#   run.sh bench [PRESET:TYPE ...]
#                  m40-bench on synthetic models (default llama-7b:q4_0 llama-7b:q8_0),
#                  with $BENCH_ARGS (default -p 512 -n 128 -r 3 -b 1,8) and the
#                  library in $BENCH_LIB (default: the fat build; ptx for compute_52 PTX)
#   run.sh gemma   the Gemma 3 270M reference on CUDA device 0 ($M40_GEMMA_GGUF)
#   run.sh gemv [7b|1b] [TYPE ...]
#                  gemv_bench: each decode product of the model's shapes against a
#                  plain read of its bytes, for GGUF type ids (default 2 12 8: Q4_0 Q4_K Q8_0);
#                  BENCH_LIB=ptx: the compute_52 build (the M40's scaled path)
#   run.sh profile [PRESET:TYPE ...]
#                  per-operation times of a 512-token prompt and decode steps of
#                  1 and 8 sessions (default llama-7b:q4_0)
# Logs go to $OUT (or /tmp) and a summary to stdout.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}
export M40_SOURCE_DIR=$here M40_TEST_TMPDIR=${M40_TEST_TMPDIR:-/tmp/m40-gpu-tests}
mkdir -p "$M40_TEST_TMPDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
status=0
synthetic() { # the path of a random-weight model of preset $1 and type $2, written on first use
  local model=$M40_TEST_TMPDIR/$1-$2.gguf
  [ -f "$model" ] || python3 "$here/tools/synth_gguf.py" --preset "$1" --type "$2" --out "$model" > /dev/null
  echo "$model"
}
case "${1:-tests}" in
tests)
  for build in fat ptx; do
    "$here/cuda_backend_$build" --include-ignored --nocapture --test-threads=4 > "$out/cuda_backend_$build.log" 2>&1 || status=1
    echo "== cuda_backend ($build build)"
    grep -E "^test |test result|largest|error|relative|describe|panicked|decode steps|identical" "$out/cuda_backend_$build.log" | cut -c1-600
  done
  ;;
bench)
  shift
  models=${*:-llama-7b:q4_0 llama-7b:q8_0}
  bench=$here/${BENCH_LIB:+$BENCH_LIB/}m40-bench
  for spec in $models; do
    preset=${spec%%:*} ty=${spec##*:}
    model=$(synthetic "$preset" "$ty")
    # shellcheck disable=SC2086
    "$bench" -m "$model" -d 0 ${BENCH_ARGS:--p 512 -n 128 -r 3 -b 1,8} 2>&1 | tee "$out/bench-$preset-$ty${BENCH_LIB:+-$BENCH_LIB}.log" || status=1
  done
  ;;
profile)
  shift
  for spec in ${*:-llama-7b:q4_0}; do
    model=$(synthetic "${spec%%:*}" "${spec##*:}")
    "$here/op_profile" "$model" 0 512 1,8 2>&1 | tee "$out/profile-${spec%%:*}-${spec##*:}.log" || status=1
  done
  ;;
gemv)
  shift
  shape=${1:-7b}
  shift
  for ty in ${*:-2 12 8}; do
    "$here/${BENCH_LIB:+$BENCH_LIB/}gemv_bench" "$shape" "$ty" 2>&1 | tee -a "$out/gemv-$shape.log" || status=1
  done
  ;;
gemma)
  M40_TEST_DEVICE=0 "$here/gemma_reference" --nocapture --test-threads=1 > "$out/gemma.log" 2>&1 || status=1
  grep -E "^test |test result|median|p95|steps|panicked" "$out/gemma.log" | cut -c1-600
  ;;
esac
exit $status
