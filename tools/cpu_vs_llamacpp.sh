#!/usr/bin/env bash
# Issue 34's comparison on the CPU: for each model, thread count (1, 2) and depth (0, 2,048) in
# turn, m40-bench then llama-bench with the same prompt and generation lengths, one line each:
#   tools/cpu_vs_llamacpp.sh LLAMA_BENCH MODEL.gguf [MODEL.gguf ...]
#   tools/cpu_vs_llamacpp.sh --decode-only LLAMA_BENCH MODEL.gguf [...]
# --decode-only: the large synthetic models' rows, tg16 at depth 0 (-r 2), llama.cpp reading the
# model into memory (-lm none: through the mapped file a VM's page cache can drop it mid-run).
# LLAMA_BENCH: llama.cpp 0c1e57098's llama-bench, a native CPU build (with GCC 12 its AMX kernels
# crash: build it with CC=clang-16 CXX=clang++-16, docs/cpu.md says why). Run `make examples` first.
set -euo pipefail
cd "$(dirname "$0")/.."
decode_only=false
if [ "${1:-}" = --decode-only ]; then
  decode_only=true
  shift
fi
llama_bench=$1
shift
# The t/s column: m40-bench's is followed by its roofline column, llama-bench's is the last.
rates() { grep -E "pp128|tg64|tg16" | awk -F'|' -v back="$1" '{printf "%s ", $(NF - back)}'; }
for model in "$@"; do
  for threads in 1 2; do
    if $decode_only; then
      ours=$(target/release/m40-bench -m "$model" -d -1 -t $threads -r 2 -p 0 -n 16 -b 1 2>&1 |
        rates 2)
      theirs=$("$llama_bench" -m "$model" -t $threads -r 2 -p 0 -n 16 -lm none 2>&1 | rates 1)
      echo "$(basename "$model") t=$threads | ours (tg16) $ours| llama.cpp $theirs"
      continue
    fi
    for depth in 0 2048; do
      reps=3
      [ "$depth" = 2048 ] && reps=2
      ours=$(target/release/m40-bench -m "$model" -d -1 -t $threads -r $reps -p 128 -n 64 -b 1 \
        --n-depth $depth 2>&1 | rates 2)
      theirs=$("$llama_bench" -m "$model" -t $threads -r $reps -p 128 -n 64 -d $depth 2>&1 | rates 1)
      echo "$(basename "$model") t=$threads d=$depth | ours (pp128 tg64) $ours| llama.cpp $theirs"
    done
  done
done
