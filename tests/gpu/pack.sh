#!/bin/bash
# Builds the GPU test suite here (nvcc 11.8, from tools/install-cuda.sh) and packs what a
# GPU machine without a Rust toolchain needs into .device/ (listed in .git/info/exclude):
#   cuda_backend_fat   the CUDA tests, SASS for sm_52..sm_90 plus compute_52 PTX
#   cuda_backend_ptx   the same tests built with compute_52 PTX only: the M40's code,
#                      run on a newer GPU through the driver's JIT
#   gemma_reference    the Gemma 3 270M reference test (run with M40_TEST_DEVICE=0)
#   arch2_reference_fat, arch2_reference_ptx  the 2026 architectures against llama.cpp's
#                      logits (tests/arch2_reference.rs) in both builds, with the vocabularies
#                      their tiny models are made with (gpt-oss's in cache/, as $M40_CACHE)
#   split_fat, split_ptx  tests/split.rs in both builds (run with M40_TEST_SPLIT=0,-1 ...),
#                      with the llama.cpp vocabularies its models are made with
#   op_profile         per-operation times of a prompt and decode steps (benches/op_profile.rs)
#   gemv_bench         the decode products alone against a plain read of their bytes
#                      (tests/gpu/gemv_bench.cu, sm_90; ptx/gemv_bench: compute_52, the
#                      M40's scaled path)
#   libm40llm.so, m40-bench, tools/synth_gguf.py, tests/data/reference/, run.sh
#   ptx/               libm40llm.so and m40-bench built with compute_52 PTX only
# The folder is also packed into .devpack/device.tar.xz (the binaries are ~400 MB,
# the archive ~26 MB: small enough for the device tool's carry limit).
# Then, on the GPU machine: tar -C /tmp/d -xJf .devpack/device.tar.xz and
# /tmp/d/run.sh [tests|bench|gemma].
set -euo pipefail
cd "$(dirname "$0")/../.."
executable() { # the binary cargo reports for the source file $1
  grep -o "$1 (\([^)]*\))" | sed 's/.*(\(.*\))/\1/'
}
fat=$(cargo test --release --features cuda --no-run --test cuda_backend --test gemma_reference --test split \
  --test arch2_reference 2>&1)
profiler=$(cargo bench --features cuda --no-run --bench op_profile 2>&1)
ptx=$(M40_CUDA_ARCHS=ptx CARGO_TARGET_DIR=target/ptx cargo test --release --features cuda --no-run --test cuda_backend \
  --test split --test arch2_reference 2>&1)
cargo build --release --features cuda
M40_CUDA_ARCHS=ptx CARGO_TARGET_DIR=target/ptx cargo build --release --features cuda
rm -rf .device && mkdir -p .device/tools .device/tests/data/reference .device/tests/data/vocab .device/ptx \
  .device/cache/bpe-openai-0.1.4
cp "$(echo "$fat" | executable tests/cuda_backend.rs)" .device/cuda_backend_fat
cp "$(echo "$ptx" | executable tests/cuda_backend.rs)" .device/cuda_backend_ptx
cp "$(echo "$fat" | executable tests/gemma_reference.rs)" .device/gemma_reference
cp "$(echo "$fat" | executable tests/split.rs)" .device/split_fat
cp "$(echo "$ptx" | executable tests/split.rs)" .device/split_ptx
cp "$(echo "$fat" | executable tests/arch2_reference.rs)" .device/arch2_reference_fat
cp "$(echo "$ptx" | executable tests/arch2_reference.rs)" .device/arch2_reference_ptx
cp "$(.venv/bin/python3 tests/make-gptoss-vocab.py)" .device/cache/bpe-openai-0.1.4/
for vocab in qwen2 llama-bpe qwen35 gemma-4; do
  cp "$(python3 tests/fetch-vocab.py $vocab)/ggml-vocab-$vocab.gguf" .device/tests/data/vocab/
done
cp "$(echo "$profiler" | executable benches/op_profile.rs)" .device/op_profile
cp target/release/libm40llm.so .device/
cp target/ptx/release/libm40llm.so .device/ptx/
for dir in .device .device/ptx; do
  ${CC:-cc} -O2 -std=c11 -Iinclude examples-c/m40-bench.c -L$dir -Wl,-rpath,'$ORIGIN' -lm40llm -lpthread -lm -o $dir/m40-bench
done
${NVCC:-nvcc} -std=c++17 -O3 -ccbin="${NVCC_CCBIN:-g++-11}" -gencode=arch=compute_90,code=sm_90 -Icuda \
  tests/gpu/gemv_bench.cu -o .device/gemv_bench
${NVCC:-nvcc} -std=c++17 -O3 -ccbin="${NVCC_CCBIN:-g++-11}" -Wno-deprecated-gpu-targets \
  -gencode=arch=compute_52,code=compute_52 -Icuda tests/gpu/gemv_bench.cu -o .device/ptx/gemv_bench
cp tools/synth_gguf.py .device/tools/
cp tests/data/reference/*.jsonl tests/data/reference/*.sha256 .device/tests/data/reference/
cp tests/gpu/run.sh .device/
strip .device/cuda_backend_fat .device/cuda_backend_ptx .device/split_fat .device/split_ptx .device/gemma_reference \
  .device/arch2_reference_fat .device/arch2_reference_ptx .device/op_profile .device/{,ptx/}gemv_bench .device/{,ptx/}libm40llm.so .device/{,ptx/}m40-bench
du -sh .device
# One thread and a dictionary larger than a binary: the fat binaries each
# carry the same ~40 MB of CUDA code, which only a window spanning them
# stores once (~400 MB packs to ~26 MB; in parallel blocks, to ~120 MB).
mkdir -p .devpack && tar -C .device -cf - . | xz -T1 -6 --lzma2=dict=384MiB > .devpack/device.tar.xz
du -sh .devpack/device.tar.xz
