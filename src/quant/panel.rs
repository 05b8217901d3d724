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
    /// blocks, `panel.cols() / 32` a token, tokens back to back),
    /// `out[t · 8 + r]` = row r · token t. `out` holds 8 values a token.
    pub product: fn(&Panel, &[crate::quant::Q8Block], &mut [f32]),
    /// The product of two panels at once, where the instruction set's
    /// vectors hold sixteen rows (AVX-512).
    pub pair: Option<PairProduct>,
}

/// `pair(a, b, acts, out)`: as [`GemmKernels::product`] for the sixteen
/// rows of `a` then `b`: `out[t · 16 + r]`; each row's sums are those of
/// `product`, bit for bit.
pub type PairProduct = fn(&Panel, &Panel, &[crate::quant::Q8Block], &mut [f32]);
