#!/usr/bin/env python3
"""An independent float64 forward pass of llama / qwen2 / gemma3 / gemma4 GGUF models.

The reference that tests/synthetic_models.rs compares the library with. It
shares no code with the library: weights are dequantized by gguf-py (the
`gguf` package from llama.cpp's repository) and the transformer is written
here in numpy, in float64, from the model definitions (LLaMA: RMSNorm, RoPE
on adjacent pairs, grouped-query attention, SwiGLU; Qwen2: plus Q/K/V biases
and RoPE on halves; Gemma 3: √d embedding scale, Q/K RMSNorm, post-norms,
tanh-GELU, sliding-window attention on all but every sixth layer with RoPE
base 10000 there; Gemma 4, as llama.cpp's src/models/gemma4.cpp builds it:
Gemma 3's layer with the sliding-window layers named per layer and given
their own head width, KV heads, rotated dimensions and RoPE base, an
attention scale of 1, each value head RMS-normed without a weight, the keys'
projection as values where a layer has no value projection, the
`rope_freqs` frequency divisors on the full-attention layers, each layer's
output times `layer_output_scale`, and the logits soft-capped).

    forward_f64.py MODEL.gguf TOKENS OUT [POSITIONS]

TOKENS: comma-separated ids. Writes the logits of each position in POSITIONS
(comma-separated, default: all) as little-endian float32 rows to OUT.
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def load(path):
    reader = GGUFReader(path)
    arch = field(reader, "general.architecture")
    hp = {k: field(reader, f"{arch}.{k}") for k in [
        "embedding_length", "block_count", "attention.head_count", "attention.head_count_kv",
        "attention.key_length", "attention.value_length", "rope.freq_base",
        "attention.layer_norm_rms_epsilon", "attention.sliding_window", "rope.dimension_count",
        "attention.key_length_swa", "rope.dimension_count_swa", "rope.freq_base_swa",
        "attention.sliding_window_pattern", "final_logit_softcapping"]}
    weights = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float64)
        # gguf-py gives numpy order: (rows, row_length)
        weights[t.name] = w.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else w.reshape(-1)
    return arch, hp, weights


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, base, dims, neox, factors=None):
    # x: (n, heads, head_dim); pair i turns at base^(-2i/dims) / factors[i]
    half = dims // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / dims)
    if factors is not None:
        inv = inv / factors[:half]
    ang = positions[:, None].astype(np.float64) * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:dims]
        out[..., :half] = a * cos - b * sin
        out[..., half:dims] = a * sin + b * cos
    else:
        a, b = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2] = a * cos - b * sin
        out[..., 1:dims:2] = a * sin + b * cos
    return out


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def per_layer(value, n_layer):
    return list(value) if isinstance(value, (list, tuple)) else [value] * n_layer


def forward(arch, hp, W, tokens):
    if arch == "gemma4":
        return forward_gemma4(hp, W, tokens)
    d = hp["embedding_length"]
    n_layer = hp["block_count"]
    n_head = hp["attention.head_count"]
    n_kv = hp["attention.head_count_kv"] or n_head
    hd = hp["attention.key_length"] or d // n_head
    hdv = hp["attention.value_length"] or d // n_head
    eps = hp["attention.layer_norm_rms_epsilon"]
    rope_dims = hp["rope.dimension_count"] or hd
    gemma = arch == "gemma3"
    neox = arch in ("qwen2", "gemma3")
    base = hp["rope.freq_base"] or (1e6 if gemma else 1e4)
    n = len(tokens)
    pos = np.arange(n)

    x = W["token_embd.weight"][tokens]
    if gemma:
        x = x * np.float64(np.float32(np.sqrt(np.float32(d))))
    for il in range(n_layer):
        p = f"blk.{il}."
        local = gemma and (il + 1) % 6 != 0
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        q = h @ W[p + "attn_q.weight"].T
        k = h @ W[p + "attn_k.weight"].T
        v = h @ W[p + "attn_v.weight"].T
        if p + "attn_q.bias" in W:
            q, k, v = q + W[p + "attn_q.bias"], k + W[p + "attn_k.bias"], v + W[p + "attn_v.bias"]
        q, k, v = q.reshape(n, n_head, hd), k.reshape(n, n_kv, hd), v.reshape(n, n_kv, hdv)
        if gemma:
            q = rms_norm(q, W[p + "attn_q_norm.weight"], eps)
            k = rms_norm(k, W[p + "attn_k_norm.weight"], eps)
        layer_base = 10000.0 if local else base
        q, k = rope(q, pos, layer_base, rope_dims, neox), rope(k, pos, layer_base, rope_dims, neox)
        group = n_head // n_kv
        out = np.zeros((n, n_head, hdv))
        mask = pos[None, :] <= pos[:, None]
        if local:
            mask &= (pos[:, None] - pos[None, :]) < hp["attention.sliding_window"]
        for hh in range(n_head):
            s = (q[:, hh, :] @ k[:, hh // group, :].T) / np.sqrt(hd)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, hh, :] = s @ v[:, hh // group, :]
        o = out.reshape(n, n_head * hdv) @ W[p + "attn_output.weight"].T
        if gemma:
            o = rms_norm(o, W[p + "post_attention_norm.weight"], eps)
        x = x + o
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
        f = ((gelu_tanh(g) if gemma else silu(g)) * u) @ W[p + "ffn_down.weight"].T
        if gemma:
            f = rms_norm(f, W[p + "post_ffw_norm.weight"], eps)
        x = x + f
    x = rms_norm(x, W["output_norm.weight"], eps)
    out_w = W.get("output.weight", W["token_embd.weight"])
    return x @ out_w.T


def forward_gemma4(hp, W, tokens):
    d = hp["embedding_length"]
    n_layer = hp["block_count"]
    n_head = hp["attention.head_count"]
    n_kv = per_layer(hp["attention.head_count_kv"], n_layer)
    swa = per_layer(hp["attention.sliding_window_pattern"], n_layer)
    hd_full = hp["attention.key_length"]
    hd_swa = hp["attention.key_length_swa"]
    rot_full = hp["rope.dimension_count"] or hd_full
    rot_swa = hp["rope.dimension_count_swa"] or rot_full
    base_full = hp["rope.freq_base"] or 1e4
    base_swa = hp["rope.freq_base_swa"] or 1e4
    eps = hp["attention.layer_norm_rms_epsilon"]
    cap = hp["final_logit_softcapping"] or 0.0
    n = len(tokens)
    pos = np.arange(n)

    x = W["token_embd.weight"][tokens] * np.float64(np.float32(np.sqrt(np.float32(d))))
    for il in range(n_layer):
        p = f"blk.{il}."
        local = bool(swa[il])
        hd = hd_swa if local else hd_full
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        q = (h @ W[p + "attn_q.weight"].T).reshape(n, n_head, hd)
        k = (h @ W[p + "attn_k.weight"].T).reshape(n, n_kv[il], hd)
        v = (h @ W[p + "attn_v.weight"].T).reshape(n, n_kv[il], hd) if p + "attn_v.weight" in W else k
        q = rms_norm(q, W[p + "attn_q_norm.weight"], eps)
        k = rms_norm(k, W[p + "attn_k_norm.weight"], eps)
        v = rms_norm(v, 1.0, eps)
        if local:
            q, k = rope(q, pos, base_swa, rot_swa, True), rope(k, pos, base_swa, rot_swa, True)
        else:
            f = W.get("rope_freqs.weight")
            q, k = rope(q, pos, base_full, rot_full, True, f), rope(k, pos, base_full, rot_full, True, f)
        group = n_head // n_kv[il]
        out = np.zeros((n, n_head, hd))
        mask = pos[None, :] <= pos[:, None]
        if local:
            mask &= (pos[:, None] - pos[None, :]) < hp["attention.sliding_window"]
        for hh in range(n_head):
            s = q[:, hh, :] @ k[:, hh // group, :].T
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, hh, :] = s @ v[:, hh // group, :]
        o = out.reshape(n, n_head * hd) @ W[p + "attn_output.weight"].T
        x = x + rms_norm(o, W[p + "post_attention_norm.weight"], eps)
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
        f = (gelu_tanh(g) * u) @ W[p + "ffn_down.weight"].T
        x = x + rms_norm(f, W[p + "post_ffw_norm.weight"], eps)
        if p + "layer_output_scale.weight" in W:
            x = x * W[p + "layer_output_scale.weight"][0]
    x = rms_norm(x, W["output_norm.weight"], eps)
    logits = x @ W.get("output.weight", W["token_embd.weight"]).T
    return cap * np.tanh(logits / cap) if cap > 0 else logits


def main():
    path, tokens, out = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3]
    positions = [int(p) for p in sys.argv[4].split(",")] if len(sys.argv) > 4 else list(range(len(tokens)))
    arch, hp, W = load(path)
    logits = forward(arch, hp, W, np.array(tokens))
    logits[positions].astype("<f4").tofile(out)


if __name__ == "__main__":
    main()
