#!/bin/bash
# Runs on the GPU machine, from the folder tests/gpu/pack.sh filled (see there).
#   run.sh tests   the CUDA test suite twice: fat binary, then compute_52 PTX only
#   run.sh bench [PRESET:TYPE ...]
#                  m40-bench on synthetic models (default llama-7b:q4_0 llama-7b:q8_0),
#                  with $BENCH_ARGS (default -p 512 -n 128 -r 3 -b 1,8) and the
#                  library in $BENCH_LIB (default: the fat build; ptx for compute_52 PTX)
#   run.sh gemma   the Gemma 3 270M reference on CUDA device 0 ($M40_GEMMA_GGUF)
#   run.sh arch2   the 2026 architectures against llama.cpp's logits on CUDA device 0,
#                  fat build and compute_52 PTX only (without cuBLAS), side by side
#   run.sh split   tests/split.rs on GPU + CPU, CPU + GPU, GPU 0 twice, and every GPU
#                  where there are several (fat build; GPU + CPU and the GPUs also PTX);
#                  the Gemma test only where $M40_GEMMA_GGUF names the model
#   run.sh splitbench DEVICES SHARES [PRESET:TYPE ...]
#                  m40-bench with the layers split over DEVICES (e.g. 0,1) by SHARES
#                  (e.g. 1,1), beside llama.cpp's llama-bench and llama-batched-bench
#                  (in $LLAMA_BIN) with the same split (-sm layer -ts, or -ngl when
#                  DEVICES is -1,0: its share of GPU layers), two rounds
#   run.sh gemv [7b|1b] [TYPE ...]
#                  gemv_bench: each decode product of the model's shapes against a
#                  plain read of its bytes, for GGUF type ids (default 2 12 8: Q4_0 Q4_K Q8_0);
#                  BENCH_LIB=ptx: the compute_52 build (the M40's scaled path; the
#                  FP32 kernel on grid values for the table-lookup formats)
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
arch2)
  export M40_CACHE=$here/cache
  mkdir -p "$M40_TEST_TMPDIR"/arch2-{fat,ptx}
  # Skipped on the fat build: the three models that carry the rounding of
  # f16 prompt operands past the bounds (docs/cuda.md). The compute_52 PTX
  # build runs without cuBLAS (M40_CUBLAS=0): every product on the CPU's
  # 8-bit grid, as the M40's FP32 cuBLAS prompts are.
  # Both builds skip Gemma 4's Q4_K test: its exact float64 pass needs gguf-py,
  # which the device's Python lacks (the GPU's logits are held to the CPU's by
  # cuda_backend).
  exact="gemma4_q4_k_is_as_close_to_an_exact_pass_as_llama_cpp"
  skip_fat="gemma4_q8_0_matches_llama_cpp qwen35_q8_0_matches_llama_cpp qwen3moe_q4_k_matches_llama_cpp $exact"
  skip_ptx="$exact"
  for build in fat ptx; do
    skip=skip_$build
    args=()
    for t in ${!skip}; do args+=(--skip "$t"); done
    cublas=1
    [ $build = ptx ] && cublas=0
    M40_CUBLAS=$cublas M40_TEST_DEVICE=0 M40_TEST_TMPDIR=$M40_TEST_TMPDIR/arch2-$build \
      "$here/arch2_reference_$build" --nocapture --test-threads=2 "${args[@]}" > "$out/arch2_$build.log" 2>&1 &
  done
  wait
  for build in fat ptx; do
    skip=skip_$build
    echo "== arch2_reference ($build build); skipped on the GPU: ${!skip:-none}"
    grep -E "^test |test result|steps: relative|panicked" "$out/arch2_$build.log" | cut -c1-400
    grep -q "test result: ok" "$out/arch2_$build.log" || status=1
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
split)
  gpus=$(nvidia-smi -L | wc -l)
  splits="0,-1 -1,0 0,0"
  all=$(seq -s, 0 $((gpus - 1)))
  [ "$gpus" -ge 2 ] && splits="$splits $all"
  skip=()
  [ -n "${M40_GEMMA_GGUF:-}" ] || skip=(--skip split_gemma)
  for build in fat ptx; do
    for split in $splits; do
      if [ $build = ptx ] && [ "$split" != 0,-1 ] && [ "$split" != "$all" ]; then continue; fi
      log=$out/split_${build}_$split.log
      M40_TEST_SPLIT=$split "$here/split_$build" "${skip[@]}" --nocapture --test-threads=2 > "$log" 2>&1 || status=1
      echo "== split $split ($build build)"
      grep -E "^test |test result|split \[|panicked|error" "$log" | cut -c1-400
    done
  done
  ;;
splitbench)
  devices=$2 shares=$3
  shift 3
  bench=$here/${BENCH_LIB:+$BENCH_LIB/}m40-bench
  for spec in ${*:-llama-13b:q4_k}; do
    model=$(synthetic "${spec%%:*}" "${spec##*:}")
    for round in 1 2; do
      echo "== $spec split $devices shares $shares round $round"
      # shellcheck disable=SC2086
      ours=$("$bench" -m "$model" -d "$devices" --ts "$shares" -t "${THREADS:-16}" ${BENCH_ARGS:--p 512 -n 128 -r 3 -b 1,8} 2>&1)
      echo "$ours" | grep -E '^split|\| (pp|tg)' | tee -a "$out/splitbench.log"
      if [ "$devices" = -1,0 ]; then
        # Partial offload: llama.cpp's -ngl, as many layers on the GPU as ours holds.
        gpu_layers=$(echo "$ours" | grep '^split' | python3 -c 'import json, sys; s = sys.stdin.read(); d = json.loads(s[s.index("["):]); print(d[-1]["layers"][1] - d[-1]["layers"][0])')
        llama=(-ngl "$gpu_layers" -t "${THREADS:-16}")
      else
        llama=(-ngl 99 -sm layer -ts "${shares//,//}")
      fi
      "$LLAMA_BIN/llama-bench" -m "$model" "${llama[@]}" -p 512 -n 128 -r 3 2>&1 | grep -E '\| +(pp|tg)' | tee -a "$out/splitbench.log"
      "$LLAMA_BIN/llama-batched-bench" -m "$model" "${llama[@]}" -c 4096 -npp 128 -ntg 128 -npl 8 2>&1 | grep -E '^\| +128' | tee -a "$out/splitbench.log"
    done
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
