//! The panel pair product (sixteen rows times many tokens, the inner loop of
//! a prompt's matrix products) in each instruction set that has one, timed
//! alone on one thread.
//!
//!     cargo bench --bench panel_pair                 # Q4_1, 576 columns, 128 tokens
//!     cargo bench --bench panel_pair -- q4_k 2048 64 # type, columns, tokens

use std::time::Instant;

use m40llm::quant::{quantize_row_q8, GgmlType, Isa, Kernels, Panel, Q8Block, PANEL_ROWS};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let ty = args.first().map_or(GgmlType::Q4_1, |name| {
        GgmlType::SUPPORTED
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .unwrap_or_else(|| panic!("{name}: not a supported type"))
    });
    let cols: usize = args.get(1).map_or(576, |v| v.parse().expect("columns"));
    let n_tokens: usize = args.get(2).map_or(128, |v| v.parse().expect("tokens"));
    let row_bytes = ty.row_bytes(cols as u64).expect("whole blocks a row") as usize;
    // Codes of every value, scales small and finite (the values do not
    // change the speed; NaNs could).
    let block = ty.block_bytes() as usize;
    let mut raw: Vec<u8> = (0..2 * PANEL_ROWS * row_bytes)
        .map(|i| (i * 131 % 251) as u8)
        .collect();
    for b in raw.chunks_exact_mut(block) {
        for half in b[..4.min(block)].chunks_exact_mut(2) {
            half.copy_from_slice(&0x2c00u16.to_le_bytes());
        }
    }
    let x: Vec<f32> = (0..n_tokens * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut act = vec![Q8Block::default(); n_tokens * cols / 32];
    quantize_row_q8(&x, &mut act);
    println!("{ty}, 16 rows x {cols} columns, {n_tokens} tokens, one thread");
    for isa in Isa::all_available() {
        let kernels = Kernels::for_isa(isa).expect("available");
        let Some(gemm) = kernels.gemm(ty) else {
            continue;
        };
        let Some(pair) = gemm.pair else { continue };
        let panels: Vec<Panel> = raw
            .chunks_exact(PANEL_ROWS * row_bytes)
            .map(|rows| {
                let mut p = Panel::new(cols, gemm.sub);
                (gemm.pack)(rows, row_bytes, &mut p);
                p
            })
            .collect();
        let mut out = vec![0f32; n_tokens * 2 * PANEL_ROWS];
        let calls = (2_000_000_000 / (16 * cols * n_tokens)).max(10);
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..calls {
                pair(&panels[0], &panels[1], &act, &mut out);
            }
            best = best.min(t.elapsed().as_secs_f64() / calls as f64);
        }
        let macs = (16 * cols * n_tokens) as f64;
        println!(
            "{:>8}: {:7.2} us a pair product, {:6.1} G multiply-adds/s",
            isa.name(),
            best * 1e6,
            macs / best / 1e9
        );
    }
}
