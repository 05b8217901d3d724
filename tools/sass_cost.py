#!/usr/bin/env python3
"""Instructions per weight of the Tesla M40's decode kernels, read from the
library's sm_52 SASS (no GPU needed: nvcc 11.8 builds it, cuobjdump reads it).

    python3 tools/sass_cost.py target/release/libm40llm.so [--json]
    python3 tools/sass_cost.py saved.sass          (cuobjdump -sass -arch sm_52 output)

On the M40 a one-session decode product is as often limited by instruction
issue as by memory: it issues ~3.4 T lane-instructions/s and streams ~250
GB/s, so a format whose weight costs more issue slots than
3.4e12 / 250e9 x (its bytes per weight) is bound by issue, not memory. This
prints, for each format's one-session kernel as the M40 runs it (cuda/gemv.cu,
rows a warp as the M40 takes them: 4 on the scaled path), the lane-instructions each weight
costs: the scaled path for the formats that have one
(`gemv_kernel<GemvScaled<T>, 4, 1, false, CHUNK, false, 32>`; its activations
are normalized and scaled by a launch before it, a cost per weight of 1/rows
of the product's: nothing), the FP32 path for the float formats
(`gemv_kernel<Gemv<T>, 2, 1, NORM, CHUNK, false, 32>`, with and without the
RMSNorm on the way).

The count follows the path a warp takes through the kernel's control flow
(SSY/SYNC and PBK/BRK regions resolved as Maxwell runs them), at llama-7b
shapes (rows of 4096 and 11008 columns, weighted as a token reads them):

  chunk   one pass through the chunk loop that multiplies a full chunk
          (every round of units; the round loop's passes where the rounds
          are a loop of their own), stages it and loads the next chunk, with
          no row finish: the pass with the most FFMAs, then the most weight
          loads, then the fewest instructions. Divided by a chunk's weights.
  row     what each row group adds: its last chunk takes instead the pass
          through the row-group loop that reduces the sums (SHFL), runs the
          epilogue and sets up the next group (the most FFMAs and weight
          loads, then the fewest instructions: the cheapest epilogue).
  total   chunk + row: every instruction a warp issues for its rows, per
          weight, taking every chunk as full (the last chunk of a row is
          often partial: an upper bound by that much).

The total's instructions are also given by class, with the issue cost the
M40 pays for them (sm_52 throughput per SM per clock: FP32 and integer
add/logic 128; shifts (funnel shifts too), compares, min/max, bit fields
64, so 2 issue slots; conversions and shuffles 32, so 4; loads and stores
count 1 and are listed apart, their limit being the load/store units). `target` is the issue cost
each format is held to (docs/cuda.md, "The M40's instruction budget").
"""
import json
import os
import re
import subprocess
import sys

# ggml type id: (name, values per block, bytes per block, unit values,
# units per block, direct, path). Mirrors the GemvScaled<T> (path "scaled")
# and Gemv<T> ("fp32") specializations in cuda/gemv.cu; check_tables() below
# compares it with the source.
FORMATS = {
    0: ("f32", 8, 32, 8, 1, True, "fp32"),
    1: ("f16", 8, 16, 8, 1, True, "fp32"),
    30: ("bf16", 8, 16, 8, 1, True, "fp32"),
    2: ("q4_0", 32, 18, 32, 1, False, "scaled"),
    3: ("q4_1", 32, 20, 32, 1, False, "scaled"),
    6: ("q5_0", 32, 22, 32, 1, False, "scaled"),
    7: ("q5_1", 32, 24, 32, 1, False, "scaled"),
    8: ("q8_0", 32, 34, 32, 1, False, "scaled"),
    12: ("q4_k", 256, 144, 32, 8, False, "scaled"),
    13: ("q5_k", 256, 176, 32, 8, False, "scaled"),
    14: ("q6_k", 256, 210, 32, 8, False, "scaled"),
}
# The instructions a weight may cost (lane-instructions, all overheads
# included) for each format to stay memory-bound on the M40 (docs/cuda.md).
TARGETS = {"q4_0": 6, "q4_1": 7, "q5_0": 7, "q5_1": 7, "q4_k": 7, "q5_k": 7, "q6_k": 8, "q8_0": 9, "f16": 4}
# Rounds of the staged inner loop per iteration (`#pragma unroll 2`) and
# units per lane per iteration of the direct loop (UNROLL), as in gemv.cu.
STAGED_UNROLL, DIRECT_UNROLL = 2, 4
# Weight rows per warp of the M40's one-session kernels, by path (m40_single_rows, m40_scaled_rows).
ROWS = {"scaled": 4, "fp32": 2}
# llama-7b's matrices (rows, columns) of one layer, for the row overhead.
LLAMA_7B = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)]

# Shifts (funnel shifts, LEA and ISCADD shift too), compares, min/max and bit fields at 64 per SM per clock.
HALF_RATE = re.compile(r"^(SHL|SHR|SHF|ISETP|FSETP|PSETP|ISCADD|LEA|BFE|BFI|IMNMX|FMNMX|FCMP|ICMP)$")
# Conversions, shuffles, special functions, bit counts at 32.
QUARTER_RATE = re.compile(r"^(I2F|F2I|F2F|I2I|SHFL|MUFU|POPC|FLO)$")
MEMORY = re.compile(r"^(LDG|LDS|LD|LDC|STG|STS|ST|LDL|STL|TEX|TLD|ATOM|RED|ATOMS)$")
CONTROL = re.compile(r"^(BRA|SSY|SYNC|PBK|BRK|PCNT|CONT|EXIT|CAL|RET|BAR|NOP|DEPBAR|MEMBAR|JCAL)$")


def kernel_name(ty, path, rows, norm, chunk):
    struct = "10GemvScaled" if path == "scaled" else "4Gemv"
    return f"_Z11gemv_kernelI{struct}ILi{ty}EELi{rows}ELi1ELb{int(norm)}ELi{chunk}ELb0ELi32EEv7M40Gemv"


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


def target(text):
    m = re.search(r"\b(?:BRA|SSY|PBK|CAL)\s+(?:CC\.\w+,\s*)?0x([0-9a-f]+)", text)
    return int(m.group(1), 16) if m else None


def successors(body):
    """Each instruction's possible successors (indices into body; len(body): the end),
    with Maxwell's structured control flow: SYNC goes to the target of the innermost SSY
    whose region holds it, BRK to that of the innermost PBK; a predicated instruction
    may also fall through. A call (CAL) returns to the next instruction."""
    index = {addr: i for i, (addr, _, _) in enumerate(body)}
    regions = {"SSY": [], "PBK": []}
    for addr, op, text in body:
        if op in regions:
            regions[op].append((addr, target(text)))
    end = len(body)

    def resolve(addr):
        # The instruction at addr, or the next one after it.
        if addr in index:
            return index[addr]
        later = [i for a, i in index.items() if a > addr]
        return min(later) if later else end

    def innermost(kind, addr):
        holding = [(a, t) for a, t in regions[kind] if a < addr < t]
        return resolve(max(holding)[1]) if holding else end

    out = []
    for i, (addr, op, text) in enumerate(body):
        predicated = text.startswith("@") and not text.startswith("@PT")
        conditional = predicated or "CC." in text
        nxt = [i + 1] if i + 1 < end else [end]
        if op == "BRA":
            out.append([resolve(target(text))] + (nxt if conditional else []))
        elif op == "SYNC":
            out.append([innermost("SSY", addr)] + (nxt if predicated else []))
        elif op == "BRK":
            out.append([innermost("PBK", addr)] + (nxt if predicated else []))
        elif op in ("EXIT", "RET"):
            out.append([end] + (nxt if predicated else []))
        else:
            out.append(nxt)
    return out


def weight_load(text):
    # Weights are read 16 bytes a load, through L2 only (.CG) or as a stream
    # (no cache flag on sm_52); activations through the read-only cache (.CI).
    op = text.split()[1 if text.startswith("@") else 0]
    return op.startswith("LDG") and op.endswith(".128") and ".CI" not in op


def best_path(body, succ, rng, finish):
    """The instructions of one pass through loop `rng` (header to its back edge, the back
    edges of the loops inside it not taken): the pass that multiplies the most weights
    (FFMAs), then issues the most weight loads, then costs the fewest instructions; with
    `finish` it must reduce a row group's sums (SHFL), without it must not."""
    first = next(i for i, (a, _, _) in enumerate(body) if a >= rng[0])
    last = next(i for i, (a, _, _) in enumerate(body) if a == rng[1])
    best = {first: ((0, 0, 0, 0), None)}  # (has shuffle, FFMAs, weight loads, -count)
    for i in range(first, last + 1):
        if i not in best:
            continue
        score, _ = best[i]
        _, op, text = body[i]
        shuffle = score[0] or op == "SHFL"
        if op == "SHFL" and not finish:
            continue
        score = (int(shuffle), score[1] + (op == "FFMA"), score[2] + weight_load(text), score[3] - 1)
        if i == last:
            best[i] = (score, best[i][1])
            break
        for j in succ[i]:
            if j <= i or j > last:
                continue  # inner back edges and ways out of the loop
            if j not in best or best[j][0] < score:
                best[j] = (score, i)
    if last not in best or bool(best[last][0][0]) != finish:
        raise SystemExit("no pass through the loop of the kind wanted")
    path, i = [], last
    while i is not None:
        path.append(body[i])
        i = best[i][1] if i != first else None
    return path[::-1]


def analyse(body, fmt):
    """Lane-instructions per weight of a row group at llama-7b shapes, along the
    steady path: every chunk but the last takes the pass through the chunk loop that
    multiplies a full chunk and loads the next, the last the pass through the row
    group's finish (its reduction, epilogue and the next group's setup)."""
    name, values, block_bytes, unit, units, direct, path = fmt
    rows = ROWS[path]
    succ = successors(body)
    found = loops(body)
    shuffles = lambda r: any(op == "SHFL" for _, op, _ in inside(body, r))
    loads = lambda r: any(weight_load(t) for _, _, t in inside(body, r))
    multiplying = [r for r in found if ffmas(body, r) >= 8]
    if not multiplying:
        raise SystemExit(f"{name}: no multiplying loop found in the kernel")
    # The chunk loop: of the multiplying loops that load weights and hold no such
    # loop, the one that multiplies most (a direct format's unrolled loop, not the
    # remainder loop beside it); the round loop, if any, the multiplying loop inside
    # it that loads none; the row-group loop, the innermost around the chunk loop
    # that reduces the sums.
    loading = [r for r in multiplying if loads(r)]
    innermost = [r for r in loading if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in loading)]
    chunk_loop = max(innermost, key=lambda r: ffmas(body, r))
    round_loops = [r for r in multiplying if r != chunk_loop and chunk_loop[0] <= r[0] and r[1] <= chunk_loop[1]
                   and not loads(r)]
    group_loop = min((r for r in found if r[0] <= chunk_loop[0] and chunk_loop[1] <= r[1] and shuffles(r)),
                     key=lambda r: r[1] - r[0], default=None)
    if group_loop is None:
        raise SystemExit(f"{name}: no row-group loop around the multiplying loop")
    if direct:
        chunk_values = DIRECT_UNROLL * 32 * unit
        round_passes = 1
    else:
        chunk_values = chunk_blocks(units, block_bytes, chunk_row_bytes(name)) * values
        rounds = chunk_values // values * units // 32
        round_passes = -(-rounds // STAGED_UNROLL) if round_loops else 1
    round_path = best_path(body, succ, round_loops[0], False) if round_loops else []
    steady = best_path(body, succ, chunk_loop, False) + round_path * (round_passes - 1)
    finish = best_path(body, succ, group_loop, True) + round_path * (round_passes - 1)
    # A token's passes: every row group takes its chunks' steady passes but the
    # last, and one finish.
    weights = sum(r * c for r, c in LLAMA_7B)
    finishes = sum(r / rows for r, _ in LLAMA_7B)
    steadies = sum(r / rows * (-(-c // chunk_values) - 1) for r, c in LLAMA_7B)
    steady_classes, finish_classes = classes(steady), classes(finish)
    chunk = 32 * len(steady) / (rows * chunk_values)
    total = 32 * (len(steady) * steadies + len(finish) * finishes) / weights
    return {
        "chunk": chunk,
        "row": total - chunk,
        "total": total,
        "classes_per_weight": {k: 32 * (steady_classes[k] * steadies + finish_classes[k] * finishes) / weights
                               for k in steady_classes},
    }


def check_tables(source):
    """The table above against cuda/gemv.cu's specializations."""
    half = re.search(r"struct GemvHalf \{\s*static constexpr int VALUES = (\d+), BYTES = (\d+), "
                     r"UNIT = (\d+), UNITS = (\d+)", source)
    nibbles = re.search(r"struct GemvScaledNibbles \{\s*static constexpr int VALUES = (\d+), BYTES = L::BYTES, "
                        r"UNITS = (\d+)", source)
    scaled_k = re.search(r"struct GemvScaledK \{\s*static constexpr int VALUES = (\d+), UNITS = (\d+)", source)
    quant = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cuda", "quant.cuh")).read()
    for name, values, block_bytes, unit, units, _, path in FORMATS.values():
        upper = name.upper()
        if path == "fp32" and name in ("f16", "bf16"):
            got = tuple(int(g) for g in half.groups()) if half else None
        elif path == "fp32":
            m = re.search(rf"struct Gemv<M40_{upper}> \{{\s*static constexpr int VALUES = (\d+), "
                          r"BYTES = (\d+), UNIT = (\d+), UNITS = (\d+)", source)
            got = tuple(int(g) for g in m.groups()) if m else None
        elif re.search(rf"struct GemvScaled<M40_{upper}> : GemvScaledK<", source):
            b = re.search(rf"struct GemvScaled<M40_{upper}> : GemvScaledK<\w+> \{{\s*"
                          r"static constexpr int BYTES = (\d+)", source)
            got = (int(scaled_k.group(1)), int(b.group(1)), 32, int(scaled_k.group(2))) if scaled_k and b else None
        elif re.search(rf"struct GemvScaled<M40_{upper}> : GemvScaledNibbles", source):
            b = re.search(rf"struct NibbleBlock<M40_{upper}> : NibbleLayout<(\d+),", quant)
            got = (int(nibbles.group(1)), int(b.group(1)), 32, int(nibbles.group(2))) if nibbles and b else None
        else:
            m = re.search(rf"struct GemvScaled<M40_{upper}> \{{\s*static constexpr int VALUES = (\d+), "
                          r"BYTES = (\d+), UNITS = (\d+)", source)
            got = (int(m.group(1)), int(m.group(2)), 32, int(m.group(3))) if m else None
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
        name, path = fmt[0], fmt[6]
        for norm in (False, True) if path == "fp32" else (False,):
            kernel = kernel_name(ty, path, ROWS[path], norm, chunk_row_bytes(name))
            if kernel not in funcs:
                continue
            r = analyse(funcs[kernel], fmt)
            r.update(format=name, path=path, norm=norm, target=TARGETS.get(name))
            rows.append(r)
    if not rows:
        raise SystemExit(f"no sm_52 decode kernels in {args[0]} (build with M40_CUDA_ARCHS including 52)")
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))
        return
    print("Lane-instructions per weight of the sm_52 one-session decode kernels (rows a warp: scaled 4, fp32 2),")
    print("at llama-7b shapes, along the steady path: chunk = one pass through a full chunk (its rounds, its")
    print("staging and the next chunk's loads); row = what each row group adds (the last chunk's pass through")
    print("the sums' reduction, the epilogue and the next group's setup); total = their sum. By class: the")
    print("total's instructions; issue cost counts half-rate classes twice, quarter-rate 4 times; target: the")
    print("issue cost each format is held to.\n")
    print("| format | path | norm | chunk | row | total | target | fp32 | int/logic | half-rate "
          "| quarter-rate | memory | control | issue cost |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c = r["classes_per_weight"]
        norm = "prepared" if r["path"] == "scaled" else "yes" if r["norm"] else "no"
        print(f"| {r['format']} | {r['path']} | {norm} | {r['chunk']:.2f} | {r['row']:.2f} "
              f"| {r['total']:.2f} | {r['target'] or ''} | {c['fp32']:.2f} | {c['int/logic']:.2f} "
              f"| {c['half-rate']:.2f} | {c['quarter-rate']:.2f} | {c['memory']:.2f} | {c['control']:.2f} "
              f"| {c['issue cost']:.2f} |")


if __name__ == "__main__":
    main()
