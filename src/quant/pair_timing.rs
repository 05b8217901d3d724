//! Timing of the panel pair product (sixteen rows times many tokens, the
//! inner loop of prompt and batch products), for `benches/panel_pair.rs`:
//! each instruction set's pair product alone, AMX tiles against AVX-512
//! VNNI included (docs/cpu.md, "AMX tiles").

use std::time::Instant;

use super::{quantize_row_q8, GgmlType, Kernels, Panel, PanelOut, Q8Block, PANEL_ROWS};

/// Two panels of `ty` rows of `cols` values and `n_tokens` tokens'
/// activations, ready for pair products.
pub struct PairBench {
    ty: GgmlType,
    cols: usize,
    n_tokens: usize,
    raw: Vec<u8>,
    act: Vec<Q8Block>,
}

impl PairBench {
    /// Codes of every value with small finite scales (the values do not
    /// change the speed; NaNs could). `cols` is a multiple of the type's
    /// block.
    pub fn new(ty: GgmlType, cols: usize, n_tokens: usize) -> PairBench {
        let row_bytes = ty.row_bytes(cols as u64).expect("whole blocks a row") as usize;
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
        PairBench {
            ty,
            cols,
            n_tokens,
            raw,
            act,
        }
    }

    pub fn multiply_adds(&self) -> usize {
        2 * PANEL_ROWS * self.cols * self.n_tokens
    }

    /// The fastest of `rounds` rounds of `calls` pair products with
    /// `kernels`, in seconds a product; `None` where they have no pair
    /// product for the type.
    pub fn seconds(&self, kernels: Kernels, calls: usize, rounds: usize) -> Option<f64> {
        let gemm = kernels.gemm(self.ty)?;
        let pair = gemm.pair?;
        let row_bytes = self.raw.len() / (2 * PANEL_ROWS);
        let mut panels = Panel::pair(self.cols, gemm.sub);
        for (h, rows) in self.raw.chunks_exact(PANEL_ROWS * row_bytes).enumerate() {
            (gemm.pack)(rows, row_bytes, panels.half(h));
        }
        let mut out = vec![0f32; self.n_tokens * 2 * PANEL_ROWS];
        let mut product = || {
            let runs = PanelOut::contiguous(&mut out, 2 * PANEL_ROWS);
            pair(&panels, &self.act, runs)
        };
        product();
        let mut best = f64::MAX;
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..calls {
                product();
            }
            best = best.min(t.elapsed().as_secs_f64() / calls.max(1) as f64);
        }
        std::hint::black_box(&out);
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Isa;

    #[test]
    fn times_the_pair_products_an_instruction_set_has() {
        let bench = PairBench::new(GgmlType::Q4_1, 64, 16);
        assert_eq!(bench.multiply_adds(), 2 * PANEL_ROWS * 64 * 16);
        for isa in Isa::all_available() {
            let kernels = Kernels::for_isa(isa).unwrap();
            let has_pair = kernels.gemm(GgmlType::Q4_1).and_then(|g| g.pair).is_some();
            let seconds = bench.seconds(kernels, 2, 2);
            assert_eq!(seconds.is_some(), has_pair, "{}", isa.name());
            assert!(seconds.is_none_or(|s| s > 0.0 && s.is_finite()));
        }
        // The choice is among what this CPU runs, and the tiles only when
        // asked for.
        let best = Kernels::best().isa();
        assert!(best.is_available());
        if std::env::var("M40_CPU_ISA").as_deref() != Ok("amx") {
            assert_ne!(best, Isa::Amx);
        }
    }
}
