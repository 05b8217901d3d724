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

/// [`PANEL_ROWS`] rows of one matrix unpacked, or two such sets of rows
/// side by side (a pair: [`Panel::pair`]), as the pair products read them.
pub struct Panel {
    /// `cols / 4` chunks: chunk k holds codes 4k..4k + 4 of each row, row r
    /// at bytes 4r..4r + 4, in 32 bytes a half (a pair's chunk is half 0's
    /// 32 bytes, then half 1's: four columns of sixteen rows, one 512-bit
    /// vector or one AMX tile row).
    pub(crate) codes: Vec<u8>,
    /// Per sub-block: each half's eight scales, then each half's eight
    /// offsets (a pair's sixteen scales and sixteen offsets are one vector
    /// each).
    pub(crate) factors: Vec<f32>,
    pub(crate) cols: usize,
    pub(crate) sub: usize,
    /// 1, or 2 for a pair.
    pub(crate) halves: usize,
}

impl Panel {
    /// An empty panel for [`PANEL_ROWS`] rows of `cols` values (a multiple
    /// of `sub`, which is 16 or 32).
    pub fn new(cols: usize, sub: usize) -> Panel {
        Panel::with_halves(cols, sub, 1)
    }

    /// An empty pair of panels, for the pair products
    /// ([`GemmKernels::pair`]): twice [`PANEL_ROWS`] rows.
    pub fn pair(cols: usize, sub: usize) -> Panel {
        Panel::with_halves(cols, sub, 2)
    }

    fn with_halves(cols: usize, sub: usize, halves: usize) -> Panel {
        assert!(sub == 16 || sub == 32, "sub-block of {sub} columns");
        assert_eq!(cols % 32, 0, "{cols} columns");
        Panel {
            codes: vec![0; halves * PANEL_ROWS * cols],
            factors: vec![0.0; cols / sub * 2 * halves * PANEL_ROWS],
            cols,
            sub,
            halves,
        }
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Columns that share a scale and an offset.
    pub fn sub(&self) -> usize {
        self.sub
    }

    /// Rows it holds: [`PANEL_ROWS`], or twice that for a pair.
    pub fn rows(&self) -> usize {
        self.halves * PANEL_ROWS
    }

    /// Half h's rows (h = 0 for a panel, 0 or 1 for a pair), to be packed.
    pub fn half(&mut self, h: usize) -> PanelHalf<'_> {
        assert!(h < self.halves, "half {h} of {}", self.halves);
        PanelHalf { panel: self, h }
    }

    /// Row r's value at column c (r < [`Panel::rows`]), from its code,
    /// scale and offset (what the products compute with; for tests).
    pub fn value(&self, r: usize, c: usize) -> f32 {
        assert!(r < self.rows(), "row {r} of {}", self.rows());
        let (h, r) = (r / PANEL_ROWS, r % PANEL_ROWS);
        let code = self.codes[(c / 4 * self.halves + h) * 32 + r * 4 + c % 4];
        let f = &self.factors[c / self.sub * 2 * self.rows()..];
        f[h * PANEL_ROWS + r] * f32::from(code) - f[self.rows() + h * PANEL_ROWS + r]
    }
}

/// One half of a [`Panel`]: where a packer writes [`PANEL_ROWS`] rows.
pub struct PanelHalf<'a> {
    panel: &'a mut Panel,
    h: usize,
}

impl PanelHalf<'_> {
    pub fn cols(&self) -> usize {
        self.panel.cols
    }

    /// Columns that share a scale and an offset.
    pub fn sub(&self) -> usize {
        self.panel.sub
    }

    /// Chunk k of these rows: codes 4k..4k + 4 of each, row r at bytes
    /// 4r..4r + 4.
    #[inline(always)]
    pub(crate) fn chunk(&mut self, k: usize) -> &mut [u8; 32] {
        let at = (k * self.panel.halves + self.h) * 32;
        (&mut self.panel.codes[at..at + 32])
            .try_into()
            .expect("32 bytes")
    }

    /// Sub-block g's scales and offsets of these rows.
    #[inline(always)]
    pub(crate) fn factors(&mut self, g: usize) -> (&mut [f32; PANEL_ROWS], &mut [f32; PANEL_ROWS]) {
        let rows = self.panel.rows();
        let at = g * 2 * rows + self.h * PANEL_ROWS;
        let (scales, offsets) = self.panel.factors[at..at + rows + PANEL_ROWS].split_at_mut(rows);
        (
            (&mut scales[..PANEL_ROWS]).try_into().expect("8 scales"),
            (&mut offsets[..PANEL_ROWS]).try_into().expect("8 offsets"),
        )
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
    /// `pack(rows, row_bytes, half)`: unpacks [`PANEL_ROWS`] consecutive
    /// rows of `row_bytes` bytes each (`rows` holds exactly those) into
    /// `half`, of a panel made with this format's `sub` and the rows'
    /// column count.
    pub pack: fn(&[u8], usize, PanelHalf<'_>),
    /// `product(panel, acts, out)`: for each token t of `acts` (its Q8
    /// blocks, `panel.cols() / 32` a token, tokens back to back), value r
    /// of `out`'s run t = row r · token t. `out` has 8 values a run; the
    /// panel is not a pair.
    pub product: PanelProduct,
    /// The product of a pair of panels ([`Panel::pair`]), where the
    /// instruction set's vectors hold sixteen rows (AVX-512).
    pub pair: Option<PairProduct>,
}

/// See [`GemmKernels::product`].
pub type PanelProduct = fn(&Panel, &[crate::quant::Q8Block], PanelOut);

/// `pair(pair, acts, out)`: as [`GemmKernels::product`] for the sixteen
/// rows of a pair of panels (`out` has 16 values a run); each row's sums
/// are those of `product` on a panel of its half's rows, bit for bit.
pub type PairProduct = fn(&Panel, &[crate::quant::Q8Block], PanelOut);
