#!/usr/bin/env bash
# The tests that need a toolchain or device a machine may lack are #[ignore]d, so a
# plain `cargo test` reports them as ignored rather than passing them unseen. This runs
# each group whose toolchain is here and prints one line for each group skipped.
#   tests/optional.sh [CARGO_TEST_ARGS...]     (make test passes --release and the features)
set -uo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
status=0
run() { # run NAME TEST_BINARY FILTER: the ignored tests of one group
  echo "optional: $1" >&2
  "$cargo" test "${args[@]}" --test "$2" -- --ignored "$3" || status=1
}
args=("$@")
if [ -x .venv/bin/python3 ] && .venv/bin/python3 -m ziglang version > /dev/null 2>&1 || [ -n "${ZIG:-}" ]; then
  run "the Zig host" hosts zig_program
else
  echo "skipped: the Zig host test (no Zig: tests/setup.sh installs it into .venv, or set ZIG)"
fi
if [ -x .venv/bin/python3 ] && .venv/bin/python3 -c "import bpe_openai, gguf" > /dev/null 2>&1; then
  run "gpt-oss's vocabulary against bpe-openai's encoder and llama.cpp" tokenizer gpt_oss_vocab
  run "gpt-oss's chat format on its vocabulary" chat gpt_oss_vocab
else
  echo "skipped: gpt-oss's vocabulary tests (no bpe-openai: tests/setup.sh installs it into .venv)"
fi
if command -v go > /dev/null; then
  run "the Go binding, the m40 program and its server (with the openai client)" hosts go_package
else
  echo "skipped: the Go binding's tests (no go on PATH: Debian's golang-go)"
fi
if [[ " $* " == *cuda* ]]; then
  if nvidia-smi -L > /dev/null 2>&1; then
    run "the CUDA backend against the CPU" cuda_backend ""
  else
    echo "skipped: the CUDA backend's GPU tests (no NVIDIA GPU here; tests/gpu/ runs them on one)"
  fi
fi
exit $status
