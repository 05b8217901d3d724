//! Timing of the panel pair product (sixteen rows times many tokens, the
//! inner loop of prompt and batch products), for `benches/panel_pair.rs` and
//! for [`super::Kernels::best`]'s choice between AMX tiles and AVX-512 VNNI:
//! the two give the same results bit for bit, and which is faster differs
//! from one host to another and from one day to another on the same cloud
//! VM (docs/cpu.md, "On the 2-core Intel VM (AMX)").

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
        let panels: Vec<Panel> = self
            .raw
            .chunks_exact(PANEL_ROWS * row_bytes)
            .map(|rows| {
                let mut p = Panel::new(self.cols, gemm.sub);
                (gemm.pack)(rows, row_bytes, &mut p);
                p
            })
            .collect();
        let mut out = vec![0f32; self.n_tokens * 2 * PANEL_ROWS];
        let mut product = || {
            let runs = PanelOut::contiguous(&mut out, 2 * PANEL_ROWS);
            pair(&panels[0], &panels[1], &self.act, runs)
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

/// Whether `amx`'s pair product beats `vnni`'s on this machine now: a few
/// milliseconds of Q4_1 products (SmolLM2's shape) a side, in alternating
/// rounds so that a passing disturbance slows both.
pub(super) fn amx_is_faster(amx: Kernels, vnni: Kernels) -> bool {
    let bench = PairBench::new(GgmlType::Q4_1, 576, 64);
    let (mut t_amx, mut t_vnni) = (f64::MAX, f64::MAX);
    for _ in 0..4 {
        let (Some(a), Some(v)) = (bench.seconds(amx, 60, 1), bench.seconds(vnni, 60, 1)) else {
            return true;
        };
        t_amx = t_amx.min(a);
        t_vnni = t_vnni.min(v);
    }
    t_amx < t_vnni
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
        // The choice is among what this CPU runs.
        assert!(Kernels::best().isa().is_available());
    }
}
