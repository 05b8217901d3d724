//! Matrix products over quantized weights: y = W·x for one token (matrix ×
//! vector) or many (matrix × matrix), split over the pool's threads by rows.
//!
//! Each task takes a band of weight rows and dots every row with every
//! token's activations, so a row is read from memory once per call and then
//! reused from cache across the tokens.

use super::ThreadPool;
use crate::error::{Error, Result};
use crate::quant::{
    DotKernel, GgmlType, InterleavedKernels, Kernels, Panel, Q8Block, DOT_TOKENS, GEMM_MIN_TOKENS,
    INTERLEAVED_ROWS, PANEL_ROWS, Q8_BLOCK,
};

/// A weight matrix in its stored format: `rows` rows of `cols` values.
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    /// The same Q8_0 matrix interleaved ([`crate::quant::interleave_q8_0`]),
    /// used where the kernels have code for it.
    pub interleaved: Option<&'a [u8]>,
}

impl<'a> WeightMatrix<'a> {
    /// `rows` rows of `cols` values of `ty` in `data`.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> WeightMatrix<'a> {
        WeightMatrix {
            ty,
            rows,
            cols,
            data,
            interleaved: None,
        }
    }
}

impl WeightMatrix<'_> {
    fn row_bytes(&self) -> usize {
        self.ty
            .row_bytes(self.cols as u64)
            .map_or(0, |b| b as usize)
    }
}

/// Rows per task: enough work to amortize claiming it, few enough bytes to
/// spread the matrix evenly over the threads.
fn rows_per_task(m: &WeightMatrix, n_threads: usize) -> usize {
    let per_thread = m.rows.div_ceil(n_threads * 8);
    per_thread.clamp(1, 4096)
}

/// The output matrix, written by tasks at disjoint (token, row) positions.
struct Output {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: tasks write disjoint elements (each owns a band of rows), and the
// pool's `run` returns only after every task has finished.
unsafe impl Sync for Output {}

impl Output {
    /// # Safety
    /// No other task writes index `i` during the loop.
    unsafe fn write(&self, i: usize, v: f32) {
        assert!(i < self.len);
        unsafe { *self.ptr.add(i) = v };
    }

    /// Elements `i..i + len`.
    ///
    /// # Safety
    /// No other task touches those elements while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, i: usize, len: usize) -> &mut [f32] {
        assert!(i + len <= self.len);
        // SAFETY: in bounds (checked), and the caller owns these elements.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i), len) }
    }

    /// # Safety
    /// No other task writes indices `i..i + v.len()` during the loop.
    unsafe fn write_run(&self, i: usize, v: &[f32]) {
        assert!(i + v.len() <= self.len);
        // SAFETY: in bounds (checked), and the caller owns these elements.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(i), v.len()) };
    }
}

/// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `n_tokens` tokens: `x` holds
/// `n_tokens × cols` values, `y` gets `n_tokens × rows`.
pub fn matmul(
    pool: &ThreadPool,
    kernels: Kernels,
    w: &WeightMatrix,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    let format = kernels
        .format(w.ty)
        .ok_or_else(|| Error::unsupported(format!("no CPU kernels for {} weights", w.ty)))?;
    if w.ty.row_bytes(w.cols as u64).is_none()
        || w.data.len() != w.rows * w.row_bytes()
        || x.len() != n_tokens * w.cols
        || y.len() != n_tokens * w.rows
    {
        return Err(Error::internal(format!(
            "matmul shapes: {} weights {}x{} in {} bytes, x {} values, y {} values, {n_tokens} tokens",
            w.ty,
            w.rows,
            w.cols,
            w.data.len(),
            x.len(),
            y.len()
        )));
    }
    let band = rows_per_task(w, pool.n_threads());
    let n_tasks = w.rows.div_ceil(band);
    let out = Output {
        ptr: y.as_mut_ptr(),
        len: y.len(),
    };
    let rows = w.rows;
    // Computed once: `GgmlType::row_bytes` (checked arithmetic) showed in
    // profiles of a decode step when called for every row.
    let row_bytes = w.row_bytes();
    let row_at = |r: usize| &w.data[r * row_bytes..(r + 1) * row_bytes];
    match format.dot {
        DotKernel::F32(dot) => pool.run(n_tasks, &|task| {
            for r in task * band..((task + 1) * band).min(rows) {
                let row = row_at(r);
                for (t, xt) in x.chunks_exact(w.cols).enumerate() {
                    // SAFETY: row r belongs to this task alone.
                    unsafe { out.write(t * rows + r, dot(row, xt)) };
                }
            }
        }),
        DotKernel::Q8(dot, dot4) => {
            let blocks = w.cols / Q8_BLOCK;
            let mut act = vec![Q8Block::default(); n_tokens * blocks];
            let quantize = kernels.quantizer();
            // Tokens a task: a few thousand values each, so that a prompt's
            // quantization spreads over the threads and a token's does not.
            let per_task = 4096usize.div_ceil(w.cols);
            pool.for_each_chunk(&mut act, per_task * blocks, &|i, acts| {
                let x = &x[i * per_task * w.cols..][..acts.len() * Q8_BLOCK];
                quantize(x, acts);
            });
            if let Some((data, code)) = interleaved(kernels, w) {
                let group_bytes = INTERLEAVED_ROWS * row_bytes;
                if n_tokens >= GEMM_MIN_TOKENS {
                    let pack = |g: usize, panel: &mut Panel| {
                        (code.pack)(&data[g * group_bytes..(g + 1) * group_bytes], panel)
                    };
                    let product = kernels.gemm(GgmlType::Q8_0).map(|g| g.product);
                    if let Some(product) = product {
                        panel_product(pool, w, 32, &pack, product, &act, n_tokens, &out);
                        return Ok(());
                    }
                } else {
                    interleaved_rows(pool, code, w, data, &act, n_tokens, &out);
                    return Ok(());
                }
            }
            if let Some(gemm) = kernels.gemm(w.ty) {
                if n_tokens >= GEMM_MIN_TOKENS && rows.is_multiple_of(PANEL_ROWS) {
                    let panel_bytes = PANEL_ROWS * row_bytes;
                    let pack = |p: usize, panel: &mut Panel| {
                        let rows = &w.data[p * panel_bytes..(p + 1) * panel_bytes];
                        (gemm.pack)(rows, row_bytes, panel)
                    };
                    panel_product(pool, w, gemm.sub, &pack, gemm.product, &act, n_tokens, &out);
                    return Ok(());
                }
            }
            let token = |t: usize| &act[t * blocks..(t + 1) * blocks];
            // Tokens in groups of four where a four-token kernel exists.
            let grouped = if dot4.is_some() {
                n_tokens / DOT_TOKENS * DOT_TOKENS
            } else {
                0
            };
            let dot_rows = kernels.dot_rows(w.ty);
            pool.run(n_tasks, &|task| {
                let (first, end) = (task * band, ((task + 1) * band).min(rows));
                if let Some(dot4) = dot4 {
                    for r in first..end {
                        let row = row_at(r);
                        for t0 in (0..grouped).step_by(DOT_TOKENS) {
                            let sums = dot4(row, std::array::from_fn(|k| token(t0 + k)));
                            for (k, v) in sums.into_iter().enumerate() {
                                // SAFETY: row r belongs to this task alone.
                                unsafe { out.write((t0 + k) * rows + r, v) };
                            }
                        }
                    }
                }
                for t in grouped..n_tokens {
                    if let Some(dot_rows) = dot_rows {
                        let band = &w.data[first * row_bytes..end * row_bytes];
                        // SAFETY: rows first..end belong to this task alone.
                        let y = unsafe { out.slice(t * rows + first, end - first) };
                        dot_rows(band, row_bytes, token(t), y);
                    } else {
                        for r in first..end {
                            // SAFETY: row r belongs to this task alone.
                            unsafe { out.write(t * rows + r, dot(row_at(r), token(t))) };
                        }
                    }
                }
            })
        }
    }
    Ok(())
}

/// The interleaved copy of `w` and its code, where both exist and fit.
fn interleaved<'a>(
    kernels: Kernels,
    w: &WeightMatrix<'a>,
) -> Option<(&'a [u8], InterleavedKernels)> {
    let data = w.interleaved?;
    let fits = w.ty == GgmlType::Q8_0
        && w.rows.is_multiple_of(INTERLEAVED_ROWS)
        && data.len() == w.data.len();
    fits.then_some(())?;
    Some((data, kernels.interleaved_q8_0()?))
}

/// `out[t][r]` = row r · token t over an interleaved Q8_0 matrix, a band of
/// whole groups of rows a task.
fn interleaved_rows(
    pool: &ThreadPool,
    code: InterleavedKernels,
    w: &WeightMatrix,
    data: &[u8],
    act: &[Q8Block],
    n_tokens: usize,
    out: &Output,
) {
    let band = rows_per_task(w, pool.n_threads()).next_multiple_of(INTERLEAVED_ROWS);
    let row_bytes = w.row_bytes();
    let blocks = w.cols / Q8_BLOCK;
    pool.run(w.rows.div_ceil(band), &|task| {
        let (first, end) = (task * band, ((task + 1) * band).min(w.rows));
        let rows = &data[first * row_bytes..end * row_bytes];
        for t in 0..n_tokens {
            // SAFETY: rows first..end belong to this task alone.
            let y = unsafe { out.slice(t * w.rows + first, end - first) };
            (code.dot_rows)(rows, w.cols, &act[t * blocks..(t + 1) * blocks], y);
        }
    })
}

/// `out[t][r]` = row r · token t through panels: each task unpacks a band
/// of its rows a panel at a time (`pack(p, panel)` fills panel p, rows
/// 8p..8p + 8) and multiplies the panel with every token.
#[allow(clippy::too_many_arguments)]
fn panel_product(
    pool: &ThreadPool,
    w: &WeightMatrix,
    sub: usize,
    pack: &(dyn Fn(usize, &mut Panel) + Sync),
    product: fn(&Panel, &[Q8Block], &mut [f32]),
    act: &[Q8Block],
    n_tokens: usize,
    out: &Output,
) {
    let panels = w.rows / PANEL_ROWS;
    let per_task = panels.div_ceil(pool.n_threads() * 4).clamp(1, 16);
    pool.run(panels.div_ceil(per_task), &|task| {
        let mut panel = Panel::new(w.cols, sub);
        let mut sums = vec![0f32; n_tokens * PANEL_ROWS];
        for p in task * per_task..((task + 1) * per_task).min(panels) {
            pack(p, &mut panel);
            product(&panel, act, &mut sums);
            for (t, s) in sums.chunks_exact(PANEL_ROWS).enumerate() {
                // SAFETY: the panel's rows belong to this task alone.
                unsafe { out.write_run(t * w.rows + p * PANEL_ROWS, s) };
            }
        }
    })
}
