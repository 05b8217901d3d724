#!/usr/bin/env python3
"""o200k token ids of texts by bpe-openai's own encoder (its Rust crate, through the
PyPI package pinned in tests/requirements.txt): the reference tests/tokenizer.rs holds
gpt-oss's tokenizer to.

  bpe_openai_encode.py < TEXTS      TEXTS: UTF-8 texts, each followed by a NUL byte

Prints one line per text: its ids, separated by spaces (none for an empty text). The
texts are encoded as ordinary text: special-token spellings are not special.
"""
import sys

import bpe_openai


def main():
    encoding = bpe_openai.get_encoding("o200k_base")
    data = sys.stdin.buffer.read().decode("utf-8")
    texts = data.split("\0")
    if texts[-1] != "":
        sys.exit("bpe_openai_encode: the input must end with a NUL byte")
    out = []
    for text in texts[:-1]:
        out.append(" ".join(str(t) for t in encoding.encode_ordinary(text)))
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
