#!/usr/bin/env python3
"""Instructions per weight of the Tesla M40's decode kernels, read from the
library's sm_52 SASS (no GPU needed: nvcc 11.8 builds it, cuobjdump reads it).

    python3 tools/sass_cost.py target/release/libm40llm.so [--json]
    python3 tools/sass_cost.py saved.sass          (cuobjdump -sass -arch sm_52 output)

On the M40 a one-session decode product is as often limited by instruction
issue as by memory: it issues ~3.4 T lane-instructions/s and streams ~250
GB/s, so a format whose weight costs more lane-instructions than
3.4e12 / 250e9 x (its bytes per weight) is bound by issue, not memory. This
prints, for each format's one-session FP32-path kernel (cuda/gemv.cu,
`gemv_kernel<Gemv<T>, R, 1, NORM, CHUNK, false>`, R = 2 as the M40 launches
it, with and without the RMSNorm prologue), the lane-instructions each
weight costs:

  inner   the loop that multiplies weights (a chunk's rounds of units, or
          a direct format's unrolled units): every instruction of its body
          once per iteration, divided by the weights an iteration
          multiplies. Exact where the body is straight-line; where a chunk
          has at most two rounds (Q8_0, the K formats) the compiler unrolls
          it whole, the chunk loop is this loop, and both sides of its
          branches count (an upper bound);
  chunk   the chunk loop's other instructions (staging, the next chunk's
          loads, index arithmetic) per chunk, divided by a chunk's weights;
  row     the row-group loop's other instructions (the sums' reduction,
          the epilogue, the next group's setup) per row group, divided by
          a row group's weights at llama-7b shapes (rows of 4096 and 11008
          columns, weighted as a token reads them);
  total   their sum.

`chunk` and `row` are upper bounds: every instruction in those loop bodies
counts once per iteration, both sides of each branch included (the steady
state takes one side). `inner` is exact. The inner loop's instructions are
also given by class, with the issue cost the M40 pays for them (sm_52
throughput per SM per clock: FP32 and integer add/logic 128; shifts,
compares, min/max, bit fields 64, so 2 issue slots; conversions and
shuffles 32, so 4; loads and stores count 1 and are listed apart, their
limit being the load/store units).
"""
import json
import os
import re
import subprocess
import sys

# ggml type id: (name, values per block, bytes per block, FP32-path unit
# values, units per block, direct). Mirrors the Gemv<T> specializations in
# cuda/gemv.cu; check_tables() below compares it with the source.
FORMATS = {
    0: ("f32", 8, 32, 8, 1, True),
    1: ("f16", 8, 16, 8, 1, True),
    30: ("bf16", 8, 16, 8, 1, True),
    2: ("q4_0", 32, 18, 8, 4, False),
    3: ("q4_1", 32, 20, 8, 4, False),
    6: ("q5_0", 32, 22, 8, 4, False),
    7: ("q5_1", 32, 24, 8, 4, False),
    8: ("q8_0", 32, 34, 8, 4, False),
    12: ("q4_k", 256, 144, 16, 16, False),
    13: ("q5_k", 256, 176, 16, 16, False),
    14: ("q6_k", 256, 210, 16, 16, False),
}
# The instructions a weight may cost (lane-instructions, all overheads
# included) for each format to stay memory-bound on the M40 (docs/cuda.md).
TARGETS = {"q4_0": 6, "q4_1": 7, "q5_0": 7, "q5_1": 7, "q4_k": 7, "q5_k": 7, "q6_k": 8, "q8_0": 9, "f16": 4}
# Rounds of the staged inner loop per iteration (`#pragma unroll 2`) and
# units per lane per iteration of the direct loop (UNROLL), as in gemv.cu.
STAGED_UNROLL, DIRECT_UNROLL = 2, 4
ROWS = 2  # weight rows per warp of the M40's one-session kernel (m40_single_rows)
# llama-7b's matrices (rows, columns) of one layer, for the row overhead.
LLAMA_7B = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)]

# Shifts (LEA and ISCADD shift too), compares, min/max and bit fields at 64 per SM per clock.
HALF_RATE = re.compile(r"^(SHL|SHR|ISETP|FSETP|PSETP|ISCADD|LEA|BFE|BFI|IMNMX|FMNMX|FCMP|ICMP)$")
# Conversions, shuffles, special functions, bit counts at 32.
QUARTER_RATE = re.compile(r"^(I2F|F2I|F2F|I2I|SHFL|MUFU|POPC|FLO)$")
MEMORY = re.compile(r"^(LDG|LDS|LD|LDC|STG|STS|ST|LDL|STL|TEX|TLD|ATOM|RED|ATOMS)$")
CONTROL = re.compile(r"^(BRA|SSY|SYNC|PBK|BRK|PCNT|CONT|EXIT|CAL|RET|BAR|NOP|DEPBAR|MEMBAR|JCAL)$")


def kernel_name(ty, rows, norm, chunk):
    return f"_Z11gemv_kernelI4GemvILi{ty}EELi{rows}ELi1ELb{int(norm)}ELi{chunk}ELb0EEv7M40Gemv"


def chunk_row_bytes(name):
    # m40_chunk_row_bytes in cuda/gemv.cu
    return 1152 if name in ("q4_0", "q4_1", "q5_0", "q5_1") else 576


def chunk_blocks(units, block_bytes, chunk_bytes):
    # m40_chunk_blocks in cuda/gemv.cu
    round_ = 1 if units >= 32 else 32 // units
    blocks = chunk_bytes // block_bytes // round_ * round_
    return max(blocks, round_)


def functions(sass):
    """{mangled name: [(address, opcode, text)]} from cuobjdump -sass."""
    out = {}
    for part in re.split(r"\n\s*Function : ", sass)[1:]:
        name = part.split("\n", 1)[0].strip()
        body = []
        for addr, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*(?:;|\n|})", part):
            text = text.strip().lstrip("{").strip()
            if not text:
                continue
            words = re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()
            if not words:
                continue
            body.append((int(addr, 16), words[0].split(".")[0], text))
        out[name] = body
    return out


def loops(body):
    """Back edges as (header, last) address ranges, innermost first."""
    found = set()
    for addr, op, text in body:
        m = re.search(r"\bBRA\s+(?:CC\.\w+,\s*)?0x([0-9a-f]+)", text)
        if op == "BRA" and m and int(m.group(1), 16) < addr:
            found.add((int(m.group(1), 16), addr))
    return sorted(found, key=lambda r: r[1] - r[0])


def inside(body, rng):
    return [i for i in body if rng[0] <= i[0] <= rng[1]]


def classes(instrs):
    counts = {"fp32": 0, "int/logic": 0, "half-rate": 0, "quarter-rate": 0, "memory": 0, "control": 0}
    for _, op, _ in instrs:
        if MEMORY.match(op):
            counts["memory"] += 1
        elif CONTROL.match(op):
            counts["control"] += 1
        elif QUARTER_RATE.match(op):
            counts["quarter-rate"] += 1
        elif HALF_RATE.match(op):
            counts["half-rate"] += 1
        elif op.startswith("F") or op.startswith("H"):
            counts["fp32"] += 1
        else:
            counts["int/logic"] += 1
    counts["issue cost"] = (counts["fp32"] + counts["int/logic"] + counts["memory"] + counts["control"]
                            + 2 * counts["half-rate"] + 4 * counts["quarter-rate"])
    return counts


def ffmas(body, rng):
    return sum(1 for i in inside(body, rng) if i[1] == "FFMA")


def analyse(body, fmt):
    name, values, block_bytes, unit, units, direct = fmt
    found = loops(body)
    # The loop that multiplies weights: of the loops holding FFMAs that hold
    # no such loop themselves (a direct format's unrolled loop has a
    # remainder loop beside it), the one with the most.
    multiplying = [r for r in found if ffmas(body, r) >= 8]
    innermost = [r for r in multiplying if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in multiplying)]
    if not innermost:
        raise SystemExit(f"{name}: no multiplying loop found in the kernel")
    inner = max(innermost, key=lambda r: ffmas(body, r))
    enclosing = sorted((r for r in found if r[0] <= inner[0] and inner[1] <= r[1] and r != inner),
                       key=lambda r: r[1] - r[0])
    inner_instrs = inside(body, inner)
    row_cols = sum(r * c for r, c in LLAMA_7B) / sum(r for r, _ in LLAMA_7B)  # a row's weights, as read
    chunk_weights = chunk_blocks(units, block_bytes, chunk_row_bytes(name)) * values * ROWS
    chunk_instrs = 0
    if direct:
        inner_weights = DIRECT_UNROLL * 32 * unit * ROWS
        loops_out = enclosing[:1]
    elif len(enclosing) >= 2:
        # A chunk of several rounds: the round loop (unrolled by 2) inside
        # the chunk loop inside the row-group loop.
        inner_weights = STAGED_UNROLL * 32 * unit * ROWS
        chunk_instrs = len(inside(body, enclosing[0])) - len(inner_instrs)
        loops_out = enclosing[1:2]
    else:
        # A chunk of at most two rounds is unrolled whole: the chunk loop
        # is the inner loop (and its branches count in full).
        inner_weights = chunk_weights
        loops_out = enclosing[:1]
    if not loops_out:
        raise SystemExit(f"{name}: no row-group loop around the multiplying loop")
    below = enclosing[0] if chunk_instrs else inner
    group_instrs = len(inside(body, loops_out[0])) - len(inside(body, below))
    result = {
        "inner": 32 * len(inner_instrs) / inner_weights,
        "inner_exact": direct or len(enclosing) >= 2,
        "chunk": 32 * chunk_instrs / chunk_weights,
        "row": 32 * group_instrs / (ROWS * row_cols),
    }
    result["total"] = result["inner"] + result["chunk"] + result["row"]
    result["inner_classes_per_weight"] = {k: 32 * v / inner_weights for k, v in classes(inner_instrs).items()}
    return result


def check_tables(source):
    """The table above against cuda/gemv.cu's specializations."""
    half = re.search(r"struct GemvHalf \{\s*static constexpr int VALUES = (\d+), BYTES = (\d+), "
                     r"UNIT = (\d+), UNITS = (\d+)", source)
    k = re.search(r"struct GemvK \{\s*static constexpr int VALUES = (\d+), UNIT = (\d+), UNITS = (\d+)", source)
    for name, values, block_bytes, unit, units, _ in FORMATS.values():
        if name in ("f16", "bf16"):
            got = tuple(int(g) for g in half.groups()) if half else None
        elif name in ("q4_k", "q5_k"):
            b = re.search(rf"struct Gemv<M40_{name.upper()}> : GemvK<M40_{name.upper()}> \{{\s*"
                          r"static constexpr int BYTES = (\d+)", source)
            got = (int(k.group(1)), int(b.group(1)), int(k.group(2)), int(k.group(3))) if k and b else None
        else:
            m = re.search(rf"struct Gemv<M40_{name.upper()}> \{{\s*static constexpr int VALUES = (\d+), "
                          r"BYTES = (\d+), UNIT = (\d+), UNITS = (\d+)", source)
            got = tuple(int(g) for g in m.groups()) if m else None
        if got != (values, block_bytes, unit, units):
            raise SystemExit(f"tools/sass_cost.py's table for {name} {(values, block_bytes, unit, units)} "
                             f"differs from cuda/gemv.cu {got}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        raise SystemExit(__doc__)
    here = os.path.dirname(os.path.abspath(__file__))
    check_tables(open(os.path.join(here, "..", "cuda", "gemv.cu")).read())
    if args[0].endswith(".sass"):  # cuobjdump's output, saved
        sass = open(args[0]).read()
    else:
        sass = subprocess.run(["cuobjdump", "-sass", "-arch", "sm_52", args[0]], check=True,
                              capture_output=True, text=True).stdout
    funcs = functions(sass)
    rows = []
    for ty, fmt in FORMATS.items():
        name = fmt[0]
        for norm in (False, True):
            kernel = kernel_name(ty, ROWS, norm, chunk_row_bytes(name))
            if kernel not in funcs:
                continue
            r = analyse(funcs[kernel], fmt)
            r.update(format=name, norm=norm, target=TARGETS.get(name))
            rows.append(r)
    if not rows:
        raise SystemExit(f"no sm_52 decode kernels in {args[0]} (build with M40_CUDA_ARCHS including 52)")
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))
        return
    print("Lane-instructions per weight of the sm_52 one-session decode kernels (FP32 path, 2 rows a warp).")
    print("inner: the multiplying loop, exact; where a chunk is unrolled whole (Q8_0, K formats) the loop is")
    print("the chunk loop and its value (marked <=) counts both sides of its branches. chunk, row: upper")
    print("bounds, every instruction of the loop once. total <= inner + chunk + row. By class: the inner")
    print("loop's instructions per weight; issue cost counts half-rate classes twice, quarter-rate 4 times.\n")
    print("| format | norm | inner | chunk <= | row <= | total <= | target | fp32 | int/logic | half-rate "
          "| quarter-rate | memory | control | issue cost |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c = r["inner_classes_per_weight"]
        inner = f"{r['inner']:.2f}" if r["inner_exact"] else f"<= {r['inner']:.2f}"
        print(f"| {r['format']} | {'yes' if r['norm'] else 'no'} | {inner} | {r['chunk']:.2f} | {r['row']:.2f} "
              f"| {r['total']:.2f} | {r['target'] or ''} | {c['fp32']:.2f} | {c['int/logic']:.2f} "
              f"| {c['half-rate']:.2f} | {c['quarter-rate']:.2f} | {c['memory']:.2f} | {c['control']:.2f} "
              f"| {c['issue cost']:.2f} |")


if __name__ == "__main__":
    main()
