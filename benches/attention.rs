//! Attention's kernels on one thread: a query group's dots with a span of
//! F16 keys and its weighted sum of as many values (`Kernels::attention`),
//! in nanoseconds a key (or value) row, for the head shapes of the models we
//! measure, with every instruction set this CPU has. The rows are laid out
//! as a session's cache lays them out (each position holds every KV head),
//! small enough to stay in L2 ("hot") or 30 layers' worth ("cache": the
//! layers of a 2,048-token context, from L3 or memory).
//!
//!     cargo bench --bench attention [-- avx2 avx512 ...]
//!
//! Naming instruction sets runs only theirs.

use std::time::Instant;

use m40llm::quant::{Isa, Kernels};

/// Keys a call sees: the CPU backend's span.
const SPAN: usize = 256;
const POSITIONS: usize = 2048;

struct Shape {
    name: &'static str,
    head_dim: usize,
    kv_heads: usize,
    group: usize,
}

/// The models' shapes with a decode step's query group (one row's query
/// heads of a KV head), and three prompt blocks (eight rows' query heads of a
/// KV head, which share each span's pass in a prompt).
const SHAPES: [Shape; 6] = [
    Shape {
        name: "SmolLM2-135M",
        head_dim: 64,
        kv_heads: 3,
        group: 3,
    },
    Shape {
        name: "SmolLM2-135M prompt block",
        head_dim: 64,
        kv_heads: 3,
        group: 24,
    },
    Shape {
        name: "Gemma 3 270M prompt block",
        head_dim: 256,
        kv_heads: 1,
        group: 32,
    },
    Shape {
        name: "Gemma 3 270M",
        head_dim: 256,
        kv_heads: 1,
        group: 4,
    },
    Shape {
        name: "Qwen3-8B",
        head_dim: 128,
        kv_heads: 8,
        group: 4,
    },
    Shape {
        name: "Qwen3-8B prompt block",
        head_dim: 128,
        kv_heads: 8,
        group: 32,
    },
];

/// Nanoseconds a row of the fastest of several rounds of `pass` over `rows`
/// rows.
fn ns_per_row(rows: usize, mut pass: impl FnMut()) -> f64 {
    pass();
    let mut best = f64::MAX;
    for _ in 0..10 {
        let t = Instant::now();
        pass();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best / rows as f64 * 1e9
}

fn main() {
    // `cargo bench` passes `--bench` among the arguments.
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.to_lowercase())
        .collect();
    println!("| kernels | shape | layers | dots ns/row | weighted sum ns/row |");
    println!("|---|---|---:|---:|---:|");
    for isa in Isa::all_available() {
        if !wanted.is_empty() && !wanted.contains(&format!("{isa:?}").to_lowercase()) {
            continue;
        }
        let kernels = Kernels::for_isa(isa)
            .expect("an available instruction set")
            .attention();
        for s in &SHAPES {
            let stride = s.kv_heads * s.head_dim * 2;
            for layers in [1, 30] {
                // Finite f16 bit patterns (exponent below all-ones).
                let cache: Vec<Vec<u8>> = (0..layers)
                    .map(|l| {
                        (0..POSITIONS * stride)
                            .map(|i| ((i * 7 + l) % 251) as u8 & 0x3b)
                            .collect()
                    })
                    .collect();
                let q: Vec<f32> = (0..s.group * s.head_dim)
                    .map(|i| (i % 97) as f32 * 1e-3)
                    .collect();
                let weights: Vec<f32> = (0..s.group * SPAN)
                    .map(|i| (i % 89) as f32 * 1e-3)
                    .collect();
                let mut scores = vec![0f32; s.group * SPAN];
                let mut sums = vec![0f32; s.group * s.head_dim];
                let rows = layers * s.kv_heads * POSITIONS;
                // Each layer's KV heads in turn, a span at a time, as a
                // decode step takes them.
                let each_span = |f: &mut dyn FnMut(&[u8])| {
                    for layer in &cache {
                        for h in 0..s.kv_heads {
                            for span in 0..POSITIONS / SPAN {
                                f(&layer[span * SPAN * stride + h * s.head_dim * 2..]);
                            }
                        }
                    }
                };
                let dots = ns_per_row(rows, || {
                    each_span(&mut |keys| (kernels.dots)(keys, stride, &q, s.head_dim, &mut scores))
                });
                let axpys = ns_per_row(rows, || {
                    each_span(&mut |values| {
                        (kernels.axpys)(values, stride, &weights, SPAN, &mut sums)
                    })
                });
                std::hint::black_box((&scores, &sums));
                println!(
                    "| {:?} | {} (head {}, {} KV heads, {} queries each) | {layers} | {dots:.2} | {axpys:.2} |",
                    isa, s.name, s.head_dim, s.kv_heads, s.group
                );
            }
        }
    }
}
