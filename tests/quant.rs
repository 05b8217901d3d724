//! Tensor formats on the CPU: dequantization bit-exact with gguf-py, dot
//! products and matrix products within stated bounds of an f64 reference, on
//! every instruction set this CPU runs.

mod common;

use std::path::Path;

use m40llm::backend::cpu::{
    matmul, matmul_many, ActivationBuffers, Product, ThreadPool, WeightMatrix,
};
use m40llm::quant::q8::dot_error_bound;
use m40llm::quant::{
    dequantize_row, interleave, quantize_row_q8, quantize_row_q8_k, DotKernel, GgmlType,
    GluKernels, Isa, Kernels, Panel, PanelOut, Q8Block, GEMM_MIN_TOKENS, PANEL_ROWS,
};

const TYPES: [GgmlType; 16] = GgmlType::SUPPORTED;

/// A fixture written by tests/fixtures/make_quant_fixtures.py (gguf-py).
struct Fixture {
    row_elements: usize,
    raw: Vec<u8>,
    expected: Vec<f32>,
}

fn read_fixture(path: &Path) -> Fixture {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let (row_elements, n_rows, n_bytes) = (u32_at(0), u32_at(4), u32_at(8));
    let raw = bytes[12..12 + n_bytes].to_vec();
    let expected: Vec<f32> = bytes[12 + n_bytes..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(expected.len(), row_elements * n_rows, "{}", path.display());
    Fixture {
        row_elements,
        raw,
        expected,
    }
}

fn fixture_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

#[test]
fn dequantization_matches_gguf_py_bit_for_bit() {
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("bin") {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let ty = TYPES
            .iter()
            .copied()
            .find(|t| name.starts_with(&format!("{}.", t.name())))
            .unwrap();
        let f = read_fixture(&path);
        let row_bytes = ty.row_bytes(f.row_elements as u64).unwrap() as usize;
        let mut out = vec![0f32; f.row_elements];
        for (r, (raw, expected)) in f
            .raw
            .chunks_exact(row_bytes)
            .zip(f.expected.chunks_exact(f.row_elements))
            .enumerate()
        {
            dequantize_row(ty, raw, &mut out);
            for (i, (a, b)) in out.iter().zip(expected).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{name} row {r} value {i}: ours {a}, gguf-py {b}"
                );
            }
        }
        checked.push(name);
    }
    for ty in TYPES {
        assert!(
            checked.contains(&format!("{}.random.bin", ty.name())),
            "no random fixture for {ty}"
        );
    }
    for ty in ["Q8_0", "Q5_0", "Q4_K", "Q6_K"] {
        assert!(
            checked.contains(&format!("{ty}.gemma.bin")),
            "no Gemma fixture for {ty}"
        );
    }
}

/// A small deterministic PRNG (xorshift64*), so the tests need no crates.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform().max(1e-7), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

/// Offsets of the f16 scale fields in each block (ggml-common.h).
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Iq4Nl | GgmlType::Iq4Xs => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        _ => &[],
    }
}

/// `rows × cols` weights of `ty`: random codes with sane scales, or random
/// normal floats.
fn random_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.normal().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32(rng.normal()).to_le_bytes())
            .collect(),
        GgmlType::Bf16 => (0..n)
            .flat_map(|_| half::bf16::from_f32(rng.normal()).to_le_bytes())
            .collect(),
        _ => {
            let block_bytes = ty.block_bytes() as usize;
            let mut raw: Vec<u8> = (0..ty.row_bytes(cols as u64).unwrap() as usize * rows)
                .map(|_| rng.next_u64() as u8)
                .collect();
            for block in raw.chunks_exact_mut(block_bytes) {
                for &at in scale_fields(ty) {
                    let scale = half::f16::from_f32((rng.uniform() - 0.5) * 0.1);
                    block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
                }
                if ty == GgmlType::Mxfp4 {
                    // The block's power of two, 2^-10 to 2^-3 (its E8M0
                    // byte, 2^(e − 128)).
                    block[0] = 118 + (rng.next_u64() % 8) as u8;
                }
            }
            raw
        }
    }
}

fn random_activations(n: usize, rng: &mut Rng) -> Vec<f32> {
    // Mostly small values with a few large ones, as real activations have.
    (0..n)
        .map(|i| rng.normal() * if i % 97 == 0 { 20.0 } else { 1.0 })
        .collect()
}

fn dequantized(ty: GgmlType, raw: &[u8], cols: usize) -> Vec<f32> {
    let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut out = vec![0f32; raw.len() / row_bytes * cols];
    for (r, o) in raw.chunks_exact(row_bytes).zip(out.chunks_exact_mut(cols)) {
        dequantize_row(ty, r, o);
    }
    out
}

fn reference_dot(w: &[f32], x: &[f32]) -> f64 {
    w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// How far a dot of `ty` may land from the f64 reference: the activation
/// rounding bound for quantized formats, f32 summation error for floats.
fn allowed_error(ty: GgmlType, w: &[f32], x: &[f32]) -> f64 {
    let magnitude: f64 = w
        .iter()
        .zip(x)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => magnitude * 1e-5 + 1e-30,
        _ => dot_error_bound(ty.activation_scales(), w, x),
    }
}

/// Asserts that `y` (tokens × rows) holds each row of `w` (dequantized,
/// `cols` wide) dotted with each token of `x` within the stated bound.
fn assert_products_within_bound(
    ty: GgmlType,
    w: &[f32],
    x: &[f32],
    y: &[f32],
    cols: usize,
    context: &str,
) {
    let rows = w.len() / cols;
    for (t, xt) in x.chunks_exact(cols).enumerate() {
        for (r, wr) in w.chunks_exact(cols).enumerate() {
            let reference = reference_dot(wr, xt);
            let got = y[t * rows + r] as f64;
            assert!(
                (got - reference).abs() <= allowed_error(ty, wr, xt),
                "{context}, token {t} row {r}: {got} vs {reference}"
            );
        }
    }
}

fn dot(kernels: Kernels, ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    match kernels.format(ty).unwrap().dot {
        DotKernel::F32(f) => f(row, x),
        DotKernel::Q8(f, _) => {
            let mut act = vec![Q8Block::default(); x.len() / 32];
            quantize_row_q8(x, &mut act);
            f(row, &act)
        }
    }
}

#[test]
fn dots_are_within_the_stated_bound_of_an_f64_reference_on_every_instruction_set() {
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let isas = Isa::all_available();
    println!("instruction sets on this CPU: {isas:?}");
    for ty in TYPES {
        for cols in [256, 512, 4096] {
            let raw = random_weights(ty, 4, cols, &mut rng);
            let w = dequantized(ty, &raw, cols);
            let row_bytes = raw.len() / 4;
            for r in 0..4 {
                let x = random_activations(cols, &mut rng);
                let wr = &w[r * cols..(r + 1) * cols];
                let reference = reference_dot(wr, &x);
                let bound = allowed_error(ty, wr, &x);
                for &isa in &isas {
                    let got = dot(
                        Kernels::for_isa(isa).unwrap(),
                        ty,
                        &raw[r * row_bytes..(r + 1) * row_bytes],
                        &x,
                    );
                    let err = (got as f64 - reference).abs();
                    assert!(err <= bound, "{ty} {isa:?} cols {cols} row {r}: got {got}, f64 {reference}, error {err:e} > bound {bound:e}");
                }
            }
        }
    }
}

#[test]
fn float_dots_handle_rows_that_are_not_a_multiple_of_the_vector_width() {
    let mut rng = Rng(7);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16] {
        for cols in [1, 7, 15, 17, 33, 100] {
            let raw = random_weights(ty, 1, cols, &mut rng);
            let w = dequantized(ty, &raw, cols);
            let x = random_activations(cols, &mut rng);
            for isa in Isa::all_available() {
                let got = dot(Kernels::for_isa(isa).unwrap(), ty, &raw, &x) as f64;
                let reference = reference_dot(&w, &x);
                assert!(
                    (got - reference).abs() <= allowed_error(ty, &w, &x),
                    "{ty} {isa:?} cols {cols}"
                );
            }
        }
    }
}

/// Whether `a` and `b` hold the same f32 bit patterns.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn attention_kernels_match_f64_on_every_instruction_set_width_stride_and_head_count() {
    let mut rng = Rng(13);
    for width in [1, 7, 16, 17, 32, 64, 100, 128, 256] {
        for (n, stride_values) in [
            (1, width),
            (5, width + 3),
            (16, width),
            (33, 2 * width),
            (64, width + 1),
        ] {
            for heads in [1, 3, 4, 6, 8, 9, 10, 11, 24] {
                // n rows of `width` F16 values, `stride_values` apart.
                let raw = random_weights(GgmlType::F16, 1, n * stride_values, &mut rng);
                let all = dequantized(GgmlType::F16, &raw, n * stride_values);
                let row = |j: usize| &all[j * stride_values..][..width];
                let stride = stride_values * 2;
                let q = random_activations(heads * width, &mut rng);
                let a = random_activations(heads * n, &mut rng);
                let y0 = random_activations(heads * width, &mut rng);
                for isa in Isa::all_available() {
                    let kernels = Kernels::for_isa(isa).unwrap().attention();
                    let mut dots = vec![0f32; heads * n];
                    (kernels.dots)(&raw, stride, &q, width, &mut dots);
                    // A query's dots are the same bits whichever queries
                    // share the call (a prompt block's or a row's alone;
                    // from eight queries on, most keys take another path).
                    for g in 0..heads {
                        let mut alone = vec![0f32; n];
                        (kernels.dots)(&raw, stride, &q[g * width..][..width], width, &mut alone);
                        assert!(
                            same_bits(&alone, &dots[g * n..(g + 1) * n]),
                            "{isa:?} width {width} head {g} of {heads}: dots alone differ"
                        );
                    }
                    for (at, &got) in dots.iter().enumerate() {
                        let (g, j) = (at / n, at % n);
                        let query = &q[g * width..(g + 1) * width];
                        let reference = reference_dot(row(j), query);
                        let bound = allowed_error(GgmlType::F16, row(j), query);
                        assert!(
                            (f64::from(got) - reference).abs() <= bound,
                            "{isa:?} width {width} head {g} row {j}: {got} vs {reference}"
                        );
                    }
                    let mut y = y0.clone();
                    (kernels.axpys)(&raw, stride, &a, n, &mut y);
                    for g in 0..heads {
                        let mut alone = y0[g * width..][..width].to_vec();
                        (kernels.axpys)(&raw, stride, &a[g * n..][..n], n, &mut alone);
                        assert!(
                            same_bits(&alone, &y[g * width..(g + 1) * width]),
                            "{isa:?} width {width} head {g} of {heads}: weighted sums alone differ"
                        );
                    }
                    for (at, &got) in y.iter().enumerate() {
                        let (g, i) = (at / width, at % width);
                        let terms: Vec<f64> = (0..n)
                            .map(|j| f64::from(a[g * n + j]) * f64::from(row(j)[i]))
                            .collect();
                        let reference = f64::from(y0[at]) + terms.iter().sum::<f64>();
                        // n + 1 f32 roundings of partial sums no larger than Σ|terms| + |y0|.
                        let magnitude =
                            f64::from(y0[at]).abs() + terms.iter().map(|t| t.abs()).sum::<f64>();
                        let bound = (n as f64 + 1.0) * f64::from(f32::EPSILON) * magnitude;
                        assert!(
                            (f64::from(got) - reference).abs() <= bound,
                            "{isa:?} width {width} head {g} value {i}: {got} vs {reference}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gated_activations_match_f64_and_every_instruction_set_gives_the_same_bits() {
    let mut rng = Rng(19);
    // Each activation with the argument of its exponential, whose f32
    // rounding (a few ulps) the exponential turns into a relative error of
    // the same few ulps times the argument.
    let silu = |x: f64| (x / (1.0 + (-x).exp()), x);
    let gelu = |x: f64| {
        let y = 0.797_884_560_802_865_4 * x * (1.0 + 0.044715 * x * x);
        // ½x(1 + tanh y) = x / (1 + e^(−2y)), which cancels nothing in f64
        // where tanh y is near −1.
        (x / (1.0 + (-2.0 * y).exp()), 2.0 * y)
    };
    for n in [1, 7, 16, 33, 1000] {
        let gate: Vec<f32> = random_activations(n, &mut rng)
            .iter()
            .map(|v| 8.0 * v)
            .collect();
        let up = random_activations(n, &mut rng);
        let scalar = Kernels::for_isa(Isa::Scalar).unwrap().glu();
        for (name, reference) in [("swiglu", silu as fn(f64) -> (f64, f64)), ("geglu", gelu)] {
            let pick = |k: GluKernels| if name == "swiglu" { k.swiglu } else { k.geglu };
            let mut expected = vec![0f32; n];
            pick(scalar)(&mut expected, &gate, &up);
            for i in 0..n {
                let (activation, argument) = reference(f64::from(gate[i]));
                let exact = activation * f64::from(up[i]);
                let ulps = 6.0 + 4.0 * argument.abs();
                let bound = ulps * f64::from(f32::EPSILON) * exact.abs() + 1e-30;
                assert!(
                    (f64::from(expected[i]) - exact).abs() <= bound,
                    "{name}({}) · {}: {} vs {exact}",
                    gate[i],
                    up[i],
                    expected[i]
                );
            }
            for isa in Isa::all_available() {
                let mut got = vec![0f32; n];
                pick(Kernels::for_isa(isa).unwrap().glu())(&mut got, &gate, &up);
                assert!(
                    got.iter()
                        .zip(&expected)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?} {name}, {n} values"
                );
            }
        }
    }
}

/// gpt-oss's clamped SwiGLU: within a few ulps of its f64 definition
/// (ggml's swiglu_oai: min(gate, 7) · σ(1.702 · min(gate, 7)) ·
/// (clamp(up, ±7) + 1)), with gates and ups past both clamps, and the same
/// bits on every instruction set.
#[test]
fn clamped_swiglu_matches_f64_and_every_instruction_set_gives_the_same_bits() {
    let mut rng = Rng(23);
    for n in [1, 7, 16, 33, 1000] {
        let gate: Vec<f32> = random_activations(n, &mut rng)
            .iter()
            .map(|v| 12.0 * v)
            .collect();
        let up: Vec<f32> = random_activations(n, &mut rng)
            .iter()
            .map(|v| 12.0 * v)
            .collect();
        let mut expected = vec![0f32; n];
        (Kernels::for_isa(Isa::Scalar).unwrap().glu().swiglu_oai)(&mut expected, &gate, &up);
        for i in 0..n {
            let x = f64::from(gate[i]).min(7.0);
            let y = f64::from(up[i]).clamp(-7.0, 7.0);
            let exact = x / (1.0 + (-1.702 * x).exp()) * (y + 1.0);
            let ulps = 8.0 + 4.0 * (1.702 * x).abs();
            let bound = ulps * f64::from(f32::EPSILON) * exact.abs() + 1e-30;
            assert!(
                (f64::from(expected[i]) - exact).abs() <= bound,
                "swiglu_oai({}, {}): {} vs {exact}",
                gate[i],
                up[i],
                expected[i]
            );
        }
        for isa in Isa::all_available() {
            let mut got = vec![0f32; n];
            (Kernels::for_isa(isa).unwrap().glu().swiglu_oai)(&mut got, &gate, &up);
            assert!(
                got.iter()
                    .zip(&expected)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{isa:?}, {n} values"
            );
        }
    }
}

#[test]
fn softmax_kernels_match_f64_on_every_instruction_set() {
    let mut rng = Rng(17);
    for n in [1, 5, 16, 37, 300] {
        let x = random_activations(n, &mut rng);
        let scale = 0.125;
        let max = x
            .iter()
            .map(|&v| f64::from(v * scale))
            .fold(f64::MIN, f64::max);
        let e: Vec<f64> = x
            .iter()
            .map(|&v| (f64::from(v * scale) - max).exp())
            .collect();
        let sum: f64 = e.iter().sum();
        for isa in Isa::all_available() {
            let mut s = x.clone();
            let (got_max, got_sum) =
                (Kernels::for_isa(isa).unwrap().attention().softmax)(&mut s, scale);
            assert_eq!(f64::from(got_max), max, "{isa:?} {n}");
            assert!(
                (f64::from(got_sum) - sum).abs() <= 1e-6 * sum,
                "{isa:?} {n}: {got_sum} vs {sum}"
            );
            for (g, w) in s.iter().zip(&e) {
                assert!(
                    (f64::from(*g) - w).abs() <= 1e-6 * w.max(1e-30),
                    "{isa:?} {n}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn gemma_rows_dot_within_bound_on_every_instruction_set() {
    let mut rng = Rng(11);
    for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4K, GgmlType::Q6K] {
        let f = read_fixture(&fixture_dir().join(format!("{}.gemma.bin", ty.name())));
        let x = random_activations(f.row_elements, &mut rng);
        let reference = reference_dot(&f.expected, &x);
        let bound = allowed_error(ty, &f.expected, &x);
        for isa in Isa::all_available() {
            let got = dot(Kernels::for_isa(isa).unwrap(), ty, &f.raw, &x) as f64;
            assert!(
                (got - reference).abs() <= bound,
                "{ty} {isa:?}: {got} vs {reference}"
            );
        }
    }
}

#[test]
fn matmul_is_within_bound_for_every_type_odd_row_counts_and_1_to_4_threads() {
    let mut rng = Rng(0xC0FFEE);
    let pools: Vec<ThreadPool> = (1..=4).map(ThreadPool::new).collect();
    for ty in TYPES {
        for (rows, cols, n_tokens) in [
            (1, 256, 1),
            (7, 256, 3),
            (33, 512, 1),
            (65, 256, 5),
            (9, 256, 8),
            // Panels: rows in eights, from GEMM_MIN_TOKENS tokens on, with
            // token counts that leave partial tiles.
            (8, 256, GEMM_MIN_TOKENS),
            (16, 512, 13),
            (24, 256, 21),
        ] {
            let raw = random_weights(ty, rows, cols, &mut rng);
            let w = dequantized(ty, &raw, cols);
            let x = random_activations(n_tokens * cols, &mut rng);
            let matrix = WeightMatrix::new(ty, rows, cols, &raw);
            for isa in Isa::all_available() {
                for pool in &pools {
                    let mut y = vec![f32::NAN; n_tokens * rows];
                    matmul(
                        pool,
                        Kernels::for_isa(isa).unwrap(),
                        &matrix,
                        &x,
                        n_tokens,
                        &mut y,
                    )
                    .unwrap();
                    let context =
                        format!("{ty} {isa:?} {} threads, {rows}x{cols}", pool.n_threads());
                    assert_products_within_bound(ty, &w, &x, &y, cols, &context);
                }
            }
        }
    }
}

#[test]
fn four_token_dots_are_within_the_bound_of_each_tokens_reference() {
    // The four-token kernels sum in another order than the one-token ones
    // (a single token spreads its blocks over several running sums), so the
    // two agree up to f32 rounding; both are held to the f64 reference.
    let mut rng = Rng(0xF00D);
    let cols = 512;
    for ty in TYPES {
        let raw = random_weights(ty, 1, cols, &mut rng);
        let w = dequantized(ty, &raw, cols);
        let xs: Vec<Vec<f32>> = (0..4).map(|_| random_activations(cols, &mut rng)).collect();
        let acts: Vec<Vec<Q8Block>> = xs
            .iter()
            .map(|x| {
                let mut a = vec![Q8Block::default(); cols / 32];
                quantize_row_q8(x, &mut a);
                a
            })
            .collect();
        for isa in Isa::all_available() {
            if let DotKernel::Q8(one, Some(four)) =
                Kernels::for_isa(isa).unwrap().format(ty).unwrap().dot
            {
                let together = four(&raw, std::array::from_fn(|t| &acts[t][..]));
                for t in 0..4 {
                    let reference = reference_dot(&w, &xs[t]);
                    let bound = allowed_error(ty, &w, &xs[t]);
                    for (how, got) in [("four", together[t]), ("one", one(&raw, &acts[t]))] {
                        assert!(
                            (got as f64 - reference).abs() <= bound,
                            "{ty} {isa:?} token {t}, {how}-token kernel: {got} vs {reference}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_quantizer_equals_the_scalar_one_bit_for_bit() {
    let mut rng = Rng(0x51DE);
    let mut x = random_activations(32 * 64, &mut rng);
    // A block of zeros: scale 0.
    x[32..64].fill(0.0);
    // A block whose scale is 1: exact halves, which round to even.
    x[96..100].copy_from_slice(&[127.0, 2.5, -2.5, 3.5]);
    let mut want = vec![Q8Block::default(); 64];
    quantize_row_q8(&x, &mut want);
    for isa in Isa::all_available() {
        let mut got = vec![Q8Block::default(); 64];
        (Kernels::for_isa(isa).unwrap().quantizer())(&x, &mut got);
        assert_eq!(got, want, "{isa:?}");
    }
}

#[test]
fn every_q8_k_quantizer_equals_the_scalar_one_bit_for_bit() {
    let mut rng = Rng(0x58C4);
    let mut x = random_activations(256 * 6, &mut rng);
    // Zeros: scale 0.
    x[256..512].fill(0.0);
    // A negative value of largest magnitude ahead of an equal positive one.
    x[600] = -90.0;
    x[700] = 90.0;
    // A positive one, with values at exact halves of the step (iscale −1).
    x[1024] = 127.0;
    x[1030..1033].copy_from_slice(&[2.5, -2.5, 3.5]);
    let mut want = vec![Q8Block::default(); x.len() / 32];
    quantize_row_q8_k(&x, &mut want);
    assert_eq!(want[32].qs[6..9], [-2, 2, -4]);
    for isa in Isa::all_available() {
        let mut got = vec![Q8Block::default(); x.len() / 32];
        (Kernels::for_isa(isa).unwrap().q8_k_quantizer())(&x, &mut got);
        assert_eq!(got, want, "{isa:?}");
    }
}

#[test]
fn panels_hold_the_dequantized_rows() {
    let mut rng = Rng(0xBA5E);
    let cols = 512;
    for ty in TYPES {
        let raw = random_weights(ty, PANEL_ROWS, cols, &mut rng);
        let w = dequantized(ty, &raw, cols);
        for isa in Isa::all_available() {
            let Some(gemm) = Kernels::for_isa(isa).unwrap().gemm(ty) else {
                continue;
            };
            // A panel, and each half of a pair.
            let mut panel = Panel::new(cols, gemm.sub);
            (gemm.pack)(&raw, raw.len() / PANEL_ROWS, panel.half(0));
            let mut pair = Panel::pair(cols, gemm.sub);
            (gemm.pack)(&raw, raw.len() / PANEL_ROWS, pair.half(1));
            (gemm.pack)(&raw, raw.len() / PANEL_ROWS, pair.half(0));
            assert_eq!((panel.rows(), pair.rows()), (PANEL_ROWS, 2 * PANEL_ROWS));
            for (what, p, first) in [
                ("panel", &panel, 0),
                ("half 0", &pair, 0),
                ("half 1", &pair, 8),
            ] {
                for r in 0..PANEL_ROWS {
                    for c in 0..cols {
                        // scale · u − offset against ggml's d · (q − k) or d · q − m:
                        // the same value up to f32 rounding of the two terms.
                        let (got, want) = (p.value(first + r, c), w[r * cols + c]);
                        let scale = w[r * cols..(r + 1) * cols]
                            .iter()
                            .fold(0f32, |m, v| m.max(v.abs()));
                        assert!(
                            (got - want).abs() <= scale * 1e-6,
                            "{ty} {isa:?} {what} row {r} column {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn pair_products_equal_each_panels_product_bit_for_bit() {
    let mut rng = Rng(0x9A12);
    let cols = 512;
    let mut tested = 0;
    for ty in TYPES {
        let raw = random_weights(ty, 2 * PANEL_ROWS, cols, &mut rng);
        let row_bytes = raw.len() / (2 * PANEL_ROWS);
        for isa in Isa::all_available() {
            let Some(gemm) = Kernels::for_isa(isa).unwrap().gemm(ty) else {
                continue;
            };
            let Some(pair) = gemm.pair else {
                continue;
            };
            let mut two = Panel::pair(cols, gemm.sub);
            let panels: Vec<Panel> = raw
                .chunks_exact(PANEL_ROWS * row_bytes)
                .enumerate()
                .map(|(h, rows)| {
                    (gemm.pack)(rows, row_bytes, two.half(h));
                    let mut panel = Panel::new(cols, gemm.sub);
                    (gemm.pack)(rows, row_bytes, panel.half(0));
                    panel
                })
                .collect();
            // Tiles of every width and a remainder (VNNI: 8 tokens a tile,
            // AMX: 16).
            for n_tokens in [1, 5, 8, 16, 19, 37] {
                let x = random_activations(n_tokens * cols, &mut rng);
                let mut act = vec![Q8Block::default(); n_tokens * cols / 32];
                quantize_row_q8(&x, &mut act);
                // The pair writes its runs into a wider output, as into a
                // product's rows: the values between them stay as they were.
                let stride = 2 * PANEL_ROWS + 3;
                let mut both = vec![f32::NAN; n_tokens * stride];
                // SAFETY: run t, 16 values at t · stride, lies inside `both`,
                // which nothing else touches during the call.
                let runs = unsafe { PanelOut::strided(both.as_mut_ptr(), stride, n_tokens, 16) };
                pair(&two, &act, runs);
                assert!(
                    both.chunks_exact(stride)
                        .all(|t| t[16..].iter().all(|v| v.is_nan())),
                    "{ty} {isa:?}: a value written outside the runs"
                );
                for (half, panel) in panels.iter().enumerate() {
                    let mut alone = vec![f32::NAN; n_tokens * PANEL_ROWS];
                    (gemm.product)(panel, &act, PanelOut::contiguous(&mut alone, PANEL_ROWS));
                    for t in 0..n_tokens {
                        for r in 0..PANEL_ROWS {
                            let (p, a) = (both[t * stride + half * 8 + r], alone[t * 8 + r]);
                            assert_eq!(
                                p.to_bits(),
                                a.to_bits(),
                                "{ty} {isa:?} panel {half} row {r} token {t}: {p} vs {a}"
                            );
                        }
                    }
                }
            }
            tested += 1;
        }
    }
    let pair_isas = Isa::all_available()
        .into_iter()
        .filter(|isa| matches!(isa, Isa::Avx512 | Isa::Amx))
        .count();
    if pair_isas > 0 {
        assert!(
            tested >= 10 * pair_isas,
            "{tested} formats with pair products"
        );
        if !Isa::Amx.is_available() {
            eprintln!("skipped: AMX pair products (this CPU or OS has no AMX tiles)");
        }
    } else {
        eprintln!("skipped: no instruction set here has pair products (AVX-512)");
    }
}

#[test]
fn interleaved_products_are_within_bound_for_one_to_many_tokens() {
    let mut rng = Rng(0x1A7E);
    let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
    for (ty, rows, cols) in [
        (GgmlType::Q8_0, 16, 256),
        (GgmlType::Q8_0, 40, 96),
        (GgmlType::Q4_0, 16, 256),
        (GgmlType::Q4_0, 40, 96),
        (GgmlType::Q4_1, 16, 256),
        (GgmlType::Q4_1, 40, 96),
        (GgmlType::Q5_0, 16, 256),
        (GgmlType::Q5_0, 40, 96),
        (GgmlType::Iq4Nl, 16, 256),
        (GgmlType::Iq4Nl, 40, 96),
        (GgmlType::Mxfp4, 16, 256),
        (GgmlType::Mxfp4, 40, 96),
        (GgmlType::Q4K, 16, 256),
        (GgmlType::Q4K, 40, 512),
        (GgmlType::Iq4Xs, 16, 256),
        (GgmlType::Iq4Xs, 40, 512),
        (GgmlType::Q6K, 16, 256),
        (GgmlType::Q6K, 40, 512),
    ] {
        let mut raw = random_weights(ty, rows, cols, &mut rng);
        if ty == GgmlType::Mxfp4 && rows == 40 {
            // Each row under one exponent, from the subnormal scales (0, 1)
            // to 2^12, which the interleaved kernels decode eight rows at a
            // time: every row's result is held to its own scale.
            for (i, block) in raw.chunks_exact_mut(17).enumerate() {
                block[0] = [0, 1, 2, 100, 127, 128, 140][i / (cols / 32) % 7];
            }
        }
        let w = dequantized(ty, &raw, cols);
        let copy = interleave(ty, &raw, rows, cols).unwrap();
        let matrix = WeightMatrix {
            interleaved: Some(&copy),
            ..WeightMatrix::new(ty, rows, cols, &raw)
        };
        for n_tokens in [1, 3, GEMM_MIN_TOKENS, 11] {
            let x = random_activations(n_tokens * cols, &mut rng);
            for isa in Isa::all_available() {
                for pool in &pools {
                    let mut y = vec![f32::NAN; n_tokens * rows];
                    let kernels = Kernels::for_isa(isa).unwrap();
                    matmul(pool, kernels, &matrix, &x, n_tokens, &mut y).unwrap();
                    let context = format!("{ty} {isa:?} {rows}x{cols}, {n_tokens} tokens");
                    assert_products_within_bound(ty, &w, &x, &y, cols, &context);
                }
            }
        }
    }
}

#[test]
fn codes_past_127_at_their_extremes_do_not_saturate_any_product() {
    // Q8_0's codes -128 and 127 (stored as 0 and 255), IQ4_NL's and IQ4_XS's
    // value -127 (looked up as 1), each times an activation code of 127 of
    // the same sign: the largest pair sums any product meets, where
    // `vpmaddubsw` on the stored codes would saturate.
    let mut rng = Rng(0x5A7E);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let (rows, cols) = (16, 256);
    for ty in [GgmlType::Q8_0, GgmlType::Iq4Nl, GgmlType::Iq4Xs] {
        let mut raw = random_weights(ty, rows, cols, &mut rng);
        let (block_bytes, codes_at) = match ty {
            GgmlType::Q8_0 => (34, 2),
            GgmlType::Iq4Nl => (18, 2),
            _ => (136, 8),
        };
        for block in raw.chunks_exact_mut(block_bytes) {
            for (i, code) in block[codes_at..].iter_mut().enumerate() {
                *code = match ty {
                    GgmlType::Q8_0 if i % 4 < 2 => 0x80,
                    GgmlType::Q8_0 => 0x7F,
                    _ => 0x00,
                };
            }
        }
        let w = dequantized(ty, &raw, cols);
        let copy = interleave(ty, &raw, rows, cols).unwrap();
        let stored = WeightMatrix::new(ty, rows, cols, &raw);
        let interleaved = WeightMatrix {
            interleaved: Some(&copy),
            ..stored
        };
        for n_tokens in [1, 4, GEMM_MIN_TOKENS, 11] {
            // Token t: the signs of row t's weights, so that every product
            // of that row is as large as it gets and of one sign.
            let x: Vec<f32> = (0..n_tokens)
                .flat_map(|t| w[t % rows * cols..][..cols].iter().map(|v| v.signum()))
                .collect();
            for isa in Isa::all_available() {
                for pool in &pools {
                    for (matrix, path) in [(&stored, "stored"), (&interleaved, "interleaved")] {
                        let mut y = vec![f32::NAN; n_tokens * rows];
                        let kernels = Kernels::for_isa(isa).unwrap();
                        matmul(pool, kernels, matrix, &x, n_tokens, &mut y).unwrap();
                        let context = format!("{ty} {isa:?} {path}, {n_tokens} tokens");
                        assert_products_within_bound(ty, &w, &x, &y, cols, &context);
                    }
                }
            }
        }
    }
}

#[test]
fn every_simd_instruction_set_has_panels_and_interleaved_copies_of_every_format_with_them() {
    let simd: Vec<Isa> = Isa::all_available()
        .into_iter()
        .filter(|isa| *isa != Isa::Scalar)
        .collect();
    if simd.is_empty() {
        eprintln!("skipped: this CPU has no SIMD kernels (AVX2)");
        return;
    }
    let float = [GgmlType::F32, GgmlType::F16, GgmlType::Bf16];
    for isa in simd {
        let kernels = Kernels::for_isa(isa).unwrap();
        for ty in TYPES.into_iter().filter(|ty| !float.contains(ty)) {
            assert!(kernels.gemm(ty).is_some(), "{isa:?} has no panels of {ty}");
        }
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Iq4Nl,
            GgmlType::Mxfp4,
            GgmlType::Q4K,
            GgmlType::Iq4Xs,
            GgmlType::Q6K,
        ] {
            assert!(
                kernels.interleaved(ty).is_some(),
                "{isa:?} has no interleaved copy of {ty}"
            );
        }
    }
}

#[test]
fn interleaved_mxfp4_panels_hold_every_exponents_values() {
    // Block i of row r under exponent (8·r + i) mod 251: every exponent up
    // to 250 (2^122; past it the values leave f32), the subnormal scales of
    // 0 and 1 included, each compared with its own magnitude.
    let mut rng = Rng(0xE8E0);
    let (rows, cols) = (PANEL_ROWS, 32 * 32);
    let blocks = cols / 32;
    let mut tested = 0;
    for first in (0..251).step_by(rows * blocks) {
        let mut raw = random_weights(GgmlType::Mxfp4, rows, cols, &mut rng);
        for (i, block) in raw.chunks_exact_mut(17).enumerate() {
            block[0] = ((first + i) % 251) as u8;
        }
        let w = dequantized(GgmlType::Mxfp4, &raw, cols);
        let copy = interleave(GgmlType::Mxfp4, &raw, rows, cols).unwrap();
        for isa in Isa::all_available() {
            let Some(k) = Kernels::for_isa(isa).unwrap().interleaved(GgmlType::Mxfp4) else {
                continue;
            };
            let mut panel = Panel::new(cols, k.sub);
            (k.pack)(&copy, panel.half(0));
            for r in 0..rows {
                for c in 0..cols {
                    let (got, want) = (panel.value(r, c), w[r * cols + c]);
                    let block = &w[r * cols + c / 32 * 32..][..32];
                    let scale = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                    assert!(
                        (got - want).abs() <= scale * 1e-6,
                        "MXFP4 {isa:?} row {r} column {c}: {got} vs {want}"
                    );
                }
            }
            tested += 1;
        }
    }
    if tested == 0 {
        eprintln!("skipped: no instruction set here has interleaved MXFP4 kernels");
    }
}

#[test]
fn products_in_one_loop_equal_the_products_alone() {
    let mut rng = Rng(0x3A7);
    let pool = ThreadPool::new(3);
    let shapes = [
        (GgmlType::Q4K, 24, 256, 1),
        (GgmlType::Q5_0, 40, 64, 1),
        (GgmlType::Q8_0, 16, 96, 9),
        (GgmlType::F16, 5, 32, 2),
    ];
    for isa in Isa::all_available() {
        let kernels = Kernels::for_isa(isa).unwrap();
        let raws: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(ty, rows, cols, _)| random_weights(ty, rows, cols, &mut rng))
            .collect();
        let xs: Vec<Vec<f32>> = shapes
            .iter()
            .map(|&(_, _, cols, n)| random_activations(n * cols, &mut rng))
            .collect();
        let alone: Vec<Vec<f32>> = shapes
            .iter()
            .zip(&raws)
            .zip(&xs)
            .map(|((&(ty, rows, cols, n), raw), x)| {
                let mut y = vec![f32::NAN; n * rows];
                matmul(
                    &pool,
                    kernels,
                    &WeightMatrix::new(ty, rows, cols, raw),
                    x,
                    n,
                    &mut y,
                )
                .unwrap();
                y
            })
            .collect();
        let mut ys: Vec<Vec<f32>> = alone.iter().map(|y| vec![f32::NAN; y.len()]).collect();
        let mut products: Vec<Product> = shapes
            .iter()
            .zip(&raws)
            .zip(&xs)
            .zip(&mut ys)
            .map(|(((&(ty, rows, cols, n), raw), x), y)| Product {
                w: WeightMatrix::new(ty, rows, cols, raw),
                x,
                n_tokens: n,
                y,
            })
            .collect();
        matmul_many(&pool, kernels, &ActivationBuffers::default(), &mut products).unwrap();
        drop(products);
        for (i, (together, alone)) in ys.iter().zip(&alone).enumerate() {
            let same = together
                .iter()
                .zip(alone)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{isa:?} product {i}: {together:?} vs {alone:?}");
        }
    }
}

#[test]
fn matmul_rejects_mismatched_shapes() {
    let pool = ThreadPool::new(1);
    let raw = vec![0u8; 18 * 2];
    let matrix = WeightMatrix::new(GgmlType::Q4_0, 2, 32, &raw);
    let mut y = vec![0f32; 2];
    assert!(matmul(&pool, Kernels::best(), &matrix, &[0.0; 31], 1, &mut y).is_err());
    assert!(matmul(&pool, Kernels::best(), &matrix, &[0.0; 32], 1, &mut y).is_ok());
    let bad = WeightMatrix::new(GgmlType::Q4_0, 3, 32, &raw);
    assert!(matmul(&pool, Kernels::best(), &bad, &[0.0; 32], 1, &mut [0.0; 3]).is_err());
}
