#!/usr/bin/env python3
"""Fetch llama.cpp's vocabulary-only GGUF files into a cache outside the repository
and print the cache folder.

  tests/fetch-vocab.py [NAME ...]     NAME: e.g. qwen2 for ggml-vocab-qwen2.gguf; default: all

They are the tokenizers of the vocabulary tests and of the random-weight models of
tests/data/reference. Files under 1 MB (llama-spm, phi-3) are in tests/data/vocab;
the larger ones come unchanged from llama.cpp 0c1e57098 `models/`, as vendored in
PyPI's llama-cpp-python 0.3.36 source distribution (76 MB, read once). The archive
and every file taken from it are checked against the sha256 sums below.

Cache: $M40_CACHE (default ~/.cache/m40llm)/llama.cpp-0c1e570/vocab. Standard library only.
"""
import hashlib, os, sys, tarfile, tempfile, urllib.request

SDIST_URL = ("https://files.pythonhosted.org/packages/ec/e9/"
             "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
             "llama_cpp_python-0.3.36.tar.gz")
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MEMBER_DIR = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
VOCABS = {
    "ggml-vocab-gpt-2.gguf": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
    "ggml-vocab-deepseek-llm.gguf": "867f77537b54565f0d81d508c04edc41aa1d4ffc1a92745f225b4c1b02755f76",
    "ggml-vocab-starcoder.gguf": "fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d",
    "ggml-vocab-falcon.gguf": "9f0bf8b0733680398b72e652e90f260f43782f326e75545fc0e49611a5ba35ad",
    "ggml-vocab-qwen2.gguf": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "ggml-vocab-qwen35.gguf": "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c",
    "ggml-vocab-gemma-4.gguf": "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65",
    "ggml-vocab-llama-bpe.gguf": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_dir():
    base = os.environ.get("M40_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "m40llm")
    return os.path.join(base, "llama.cpp-0c1e570", "vocab")


def main():
    out = cache_dir()
    wanted = [f"ggml-vocab-{name}.gguf" for name in sys.argv[1:]] or list(VOCABS)
    unknown = [n for n in wanted if n not in VOCABS]
    if unknown:
        sys.exit(f"fetch-vocab: not one of the fetched vocabularies: {', '.join(unknown)}")
    missing = [n for n in wanted
               if not (os.path.isfile(os.path.join(out, n)) and sha256(os.path.join(out, n)) == VOCABS[n])]
    if missing:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out) as work:
            archive = os.path.join(work, "sdist.tar.gz")
            print(f"fetch-vocab: downloading llama-cpp-python 0.3.36's sdist for {len(missing)} vocabularies",
                  file=sys.stderr)
            with urllib.request.urlopen(SDIST_URL, timeout=300) as response, open(archive, "wb") as f:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
            if sha256(archive) != SDIST_SHA256:
                sys.exit("fetch-vocab: sha256 mismatch for the llama-cpp-python sdist")
            with tarfile.open(archive) as tar:
                for name in missing:
                    member = tar.getmember(MEMBER_DIR + name)
                    if not member.isfile():
                        sys.exit(f"fetch-vocab: {name} is not a regular file in the sdist")
                    part = os.path.join(work, name)
                    with tar.extractfile(member) as src, open(part, "wb") as dst:
                        while chunk := src.read(1 << 20):
                            dst.write(chunk)
                    if sha256(part) != VOCABS[name]:
                        sys.exit(f"fetch-vocab: sha256 mismatch for {name}")
                    os.replace(part, os.path.join(out, name))  # atomic: concurrent fetches are safe
    print(out)


if __name__ == "__main__":
    main()
