//! Weights unpacked a panel of rows at a time for products with many tokens
//! (a prompt, a batch of sessions).
//!
//! A one-row dot unpacks each block of weights for the tokens at hand and
//! pays a float conversion and scaling per block, row and token. A panel
//! holds [`PANEL_ROWS`] rows as unsigned 8-bit codes, interleaved four
//! columns at a time, so that one integer dot instruction multiplies four
//! columns of all eight rows with one token's four activations (broadcast),
//! and the conversion and scaling happen once per eight rows. Unpacking costs
//! about what one token's dots do, so it pays from a handful of tokens on
//! ([`GEMM_MIN_TOKENS`]).
//!
//! Every format is brought to `w = scale · u − offset` per sub-block of
//! [`Panel::sub`] columns (16 or 32), `u` in 0..=255: a dot with a Q8 block
//! `d · q` is then `scale · d · Σ u·q − offset · d · Σ q`.

use std::marker::PhantomData;

/// Rows a panel holds: the eight lanes of a 256-bit vector.
pub const PANEL_ROWS: usize = 8;

/// Tokens from which a matrix product unpacks its weights into panels.
pub const GEMM_MIN_TOKENS: usize = 8;

/// [`PANEL_ROWS`] rows of one matrix, unpacked.
pub struct Panel {
    /// `cols / 4` chunks of 32 bytes: chunk k holds codes 4k..4k + 4 of
    /// each row, row r at bytes 4r..4r + 4.
    pub(crate) codes: Vec<u8>,
    /// Per sub-block: the eight rows' scales, then their offsets.
    pub(crate) factors: Vec<f32>,
    pub(crate) cols: usize,
    pub(crate) sub: usize,
}

impl Panel {
    /// An empty panel for rows of `cols` values (a multiple of `sub`, which
    /// is 16 or 32).
    pub fn new(cols: usize, sub: usize) -> Panel {
        assert!(sub == 16 || sub == 32, "sub-block of {sub} columns");
        assert_eq!(cols % 32, 0, "{cols} columns");
        Panel {
            codes: vec![0; PANEL_ROWS * cols],
            factors: vec![0.0; cols / sub * 2 * PANEL_ROWS],
            cols,
            sub,
        }
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Columns that share a scale and an offset.
    pub fn sub(&self) -> usize {
        self.sub
    }

    /// Row r's value at column c, from its code, scale and offset (what the
    /// products compute with; for tests).
    pub fn value(&self, r: usize, c: usize) -> f32 {
        let code = self.codes[c / 4 * 32 + r * 4 + c % 4];
        let f = &self.factors[c / self.sub * 2 * PANEL_ROWS..];
        f[r] * f32::from(code) - f[PANEL_ROWS + r]
    }
}

/// Where a panel product writes its sums: for each of `tokens` tokens a
/// run of `width` values (a panel's 8 rows or a pair's 16), token t's at
/// `t · stride` values from the first, so that a product's tasks, each
/// owning a band of rows, write straight into the token-major output.
/// Written as each tile of tokens is done, the stores drain while the next
/// tile is computed; copied from a buffer after the whole product, they
/// came all at once, a cache line a token, and the core waited on them (an
/// eighth of a SmolLM2 prompt chunk's time on one thread).
#[derive(Debug)]
pub struct PanelOut<'a> {
    first: *mut f32,
    stride: usize,
    tokens: usize,
    width: usize,
    out: PhantomData<&'a mut [f32]>,
}

impl<'a> PanelOut<'a> {
    /// `out` as runs of `width` values back to back, one a token.
    pub fn contiguous(out: &'a mut [f32], width: usize) -> PanelOut<'a> {
        assert!(
            width > 0 && out.len().is_multiple_of(width),
            "{} values in runs of {width}",
            out.len()
        );
        PanelOut {
            first: out.as_mut_ptr(),
            stride: width,
            tokens: out.len() / width,
            width,
            out: PhantomData,
        }
    }

    /// Runs of `width` values at `first + t · stride` for t in 0..tokens.
    ///
    /// # Safety
    /// Each run is valid for writes for `'a` and nothing else reads or
    /// writes it meanwhile.
    pub unsafe fn strided(
        first: *mut f32,
        stride: usize,
        tokens: usize,
        width: usize,
    ) -> PanelOut<'a> {
        PanelOut {
            first,
            stride,
            tokens,
            width,
            out: PhantomData,
        }
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Values a token's run holds.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Token t's run.
    pub(crate) fn run(&mut self, t: usize) -> &mut [f32] {
        assert!(t < self.tokens, "token {t} of {}", self.tokens);
        // SAFETY: run t is valid and this value's alone (`strided`,
        // `contiguous`); the borrow of self keeps it the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.first.add(t * self.stride), self.width) }
    }
}

/// The panel code of one format.
#[derive(Clone, Copy)]
pub struct GemmKernels {
    /// Columns a panel's scale covers for this format.
    pub sub: usize,
    /// `pack(rows, row_bytes, panel)`: unpacks [`PANEL_ROWS`] consecutive
    /// rows of `row_bytes` bytes each (`rows` holds exactly those) into
    /// `panel`, made with this format's `sub` and the rows' column count.
    pub pack: fn(&[u8], usize, &mut Panel),
    /// `product(panel, acts, out)`: for each token t of `acts` (its Q8
    /// blocks, `panel.cols() / 32` a token, tokens back to back), value r
    /// of `out`'s run t = row r · token t. `out` has 8 values a run.
    pub product: PanelProduct,
    /// The product of two panels at once, where the instruction set's
    /// vectors hold sixteen rows (AVX-512).
    pub pair: Option<PairProduct>,
}

/// See [`GemmKernels::product`].
pub type PanelProduct = fn(&Panel, &[crate::quant::Q8Block], PanelOut);

/// `pair(a, b, acts, out)`: as [`GemmKernels::product`] for the sixteen
/// rows of `a` then `b` (`out` has 16 values a run); each row's sums are
/// those of `product`, bit for bit.
pub type PairProduct = fn(&Panel, &Panel, &[crate::quant::Q8Block], PanelOut);
