//! Matrix products over quantized weights: y = W·x for one token (matrix ×
//! vector) or many (matrix × matrix), split over the pool's threads by rows.
//!
//! Each task takes a band of weight rows and dots every row with every
//! token's activations, so a row is read from memory once per call and then
//! reused from cache across the tokens.

use std::sync::{Arc, Mutex, PoisonError};

use super::ThreadPool;
use crate::error::{Error, Result};
use crate::quant::{
    interleaved_group_bytes, round_scales, ActivationScales, DotKernel, GgmlType,
    InterleavedKernels, Kernels, PairProduct, Panel, PanelHalf, PanelOut, PanelProduct, Q8Block,
    DOT_TOKENS, GEMM_MIN_TOKENS, INTERLEAVED_ROWS, PANEL_ROWS, Q8_BLOCK,
};

/// A weight matrix in its stored format: `rows` rows of `cols` values.
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    /// The same matrix interleaved ([`crate::quant::interleave`]), used
    /// where the kernels have code for it.
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

/// Tasks a product is split into when it runs alone: enough to even out
/// the threads' shares, few enough that each streams a long run of rows.
fn tasks_alone(n_threads: usize) -> usize {
    n_threads * 8
}

/// Rows per task for about `tasks` tasks (bands of more than 4096 rows do
/// not stream faster).
fn rows_per_task(m: &WeightMatrix, tasks: usize) -> usize {
    m.rows.div_ceil(tasks.max(1)).clamp(1, 4096)
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

    /// Rows `first..first + width` of each of `tokens` tokens (`rows` a
    /// token), for a panel product.
    ///
    /// # Safety
    /// No other task touches those elements while the result lives.
    unsafe fn panel_runs(
        &self,
        first: usize,
        width: usize,
        rows: usize,
        tokens: usize,
    ) -> PanelOut<'_> {
        assert!(tokens == 0 || (tokens - 1) * rows + first + width <= self.len);
        assert!(first + width <= rows);
        // SAFETY: each run is in bounds (checked), and the caller owns it.
        unsafe { PanelOut::strided(self.ptr.add(first), rows, tokens, width) }
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
    let product = Product {
        w: *w,
        x,
        n_tokens,
        y,
    };
    matmul_many(pool, kernels, &ActivationBuffers::default(), &mut [product])
}

/// One product of [`matmul_many`].
pub struct Product<'a> {
    pub w: WeightMatrix<'a>,
    pub x: &'a [f32],
    pub n_tokens: usize,
    pub y: &'a mut [f32],
}

/// Buffers for products' quantized activations, kept from one product to
/// the next: a prompt chunk runs hundreds of products, and a buffer of
/// more than the allocator's mapping threshold (128 KiB for glibc at
/// first) made anew for each can come fresh from the OS, to be faulted in
/// and zeroed page by page.
#[derive(Default)]
pub struct ActivationBuffers {
    free: Mutex<Vec<Vec<Q8Block>>>,
}

impl ActivationBuffers {
    /// Bytes of buffers kept at most; past them a buffer is let go.
    const KEPT_BYTES: usize = 64 << 20;

    /// A buffer of `n` blocks (their values unspecified), a kept one if
    /// there is one.
    fn take(&self, n: usize) -> Result<Vec<Q8Block>> {
        let kept = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut act = kept.unwrap_or_default();
        act.clear();
        act.try_reserve_exact(n)
            .map_err(|_| Error::out_of_memory("the activations of a matrix product"))?;
        act.resize(n, Q8Block::default());
        Ok(act)
    }

    /// Keeps `act` for a later product, within [`Self::KEPT_BYTES`].
    fn give_back(&self, act: Vec<Q8Block>) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes = |v: &Vec<Q8Block>| v.capacity() * std::mem::size_of::<Q8Block>();
        if free.iter().map(bytes).sum::<usize>() + bytes(&act) <= Self::KEPT_BYTES {
            free.push(act);
        }
    }
}

/// Several products in one parallel loop (a mixture layer's experts, each
/// with its own rows): one wait for all of them rather than one each.
/// Products of the same input (Q/K/V, gate and up) quantize it once, into
/// a buffer of `buffers`.
pub fn matmul_many(
    pool: &ThreadPool,
    kernels: Kernels,
    buffers: &ActivationBuffers,
    products: &mut [Product],
) -> Result<()> {
    // The products share the tasks one product alone would have.
    let tasks = tasks_alone(pool.n_threads()) / products.len().max(1);
    let mut quantized = Vec::new();
    let plans = products
        .iter_mut()
        .map(|p| plan(pool, kernels, buffers, p, tasks, &mut quantized))
        .collect::<Result<Vec<_>>>()?;
    let starts: Vec<usize> = plans
        .iter()
        .scan(0, |at, p| {
            let start = *at;
            *at += p.n_tasks;
            Some(start)
        })
        .collect();
    let total = plans.iter().map(|p| p.n_tasks).sum();
    pool.run(total, &|task| {
        let i = starts.partition_point(|&s| s <= task) - 1;
        (plans[i].task)(task - starts[i]);
    });
    // The plans hold the other references to the activations.
    drop(plans);
    for (_, act) in quantized {
        if let Ok(act) = Arc::try_unwrap(act) {
            buffers.give_back(act);
        }
    }
    Ok(())
}

/// A product's parallel loop: `task(i)` for i in 0..n_tasks.
struct Plan<'a> {
    n_tasks: usize,
    task: Box<dyn Fn(usize) + Sync + 'a>,
}

/// Activations quantized for a product, by the input they came from and
/// their scales' rounding, so that products of one input share them.
type Quantized = Vec<((*const f32, usize, ActivationScales), Arc<Vec<Q8Block>>)>;

/// `x`'s tokens quantized to Q8 blocks with their scales rounded as
/// `scales` says: taken from `quantized` when a product of the same input
/// made them, else made (across the pool, into a buffer of `buffers`) and
/// kept there.
fn quantized_input(
    pool: &ThreadPool,
    kernels: Kernels,
    buffers: &ActivationBuffers,
    x: &[f32],
    cols: usize,
    scales: ActivationScales,
    quantized: &mut Quantized,
) -> Result<Arc<Vec<Q8Block>>> {
    let key = (x.as_ptr(), x.len(), scales);
    if let Some((_, act)) = quantized.iter().find(|(k, _)| *k == key) {
        return Ok(Arc::clone(act));
    }
    let blocks = cols / Q8_BLOCK;
    let n = x.len() / Q8_BLOCK;
    let mut act = buffers.take(n)?;
    let quantize = if scales == ActivationScales::Q8K {
        kernels.q8_k_quantizer()
    } else {
        kernels.quantizer()
    };
    // Tokens a task: a few thousand values each, so that a prompt's
    // quantization spreads over the threads and a token's does not.
    let per_task = 4096usize.div_ceil(cols);
    pool.for_each_chunk(&mut act, per_task * blocks, &|i, acts| {
        let x = &x[i * per_task * cols..][..acts.len() * Q8_BLOCK];
        quantize(x, acts);
        round_scales(acts, scales);
    });
    let act = Arc::new(act);
    quantized.push((key, Arc::clone(&act)));
    Ok(act)
}

/// Checks a product's shapes, quantizes its activations (or takes them
/// from `quantized`) and chooses its kernels and its split into about
/// `tasks` tasks.
fn plan<'a>(
    pool: &ThreadPool,
    kernels: Kernels,
    buffers: &ActivationBuffers,
    p: &'a mut Product<'_>,
    tasks: usize,
    quantized: &mut Quantized,
) -> Result<Plan<'a>> {
    let (w, x, n_tokens, y) = (&p.w, p.x, p.n_tokens, &mut *p.y);
    let format = kernels
        .format(w.ty)
        .ok_or_else(|| Error::unsupported(format!("no CPU kernels for {} weights", w.ty)))?;
    if w.cols == 0
        || w.ty.row_bytes(w.cols as u64).is_none()
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
    let w = *w;
    let band = rows_per_task(&w, tasks);
    let n_tasks = w.rows.div_ceil(band);
    let out = Output {
        ptr: y.as_mut_ptr(),
        len: y.len(),
    };
    let rows = w.rows;
    // Computed once: `GgmlType::row_bytes` (checked arithmetic) showed in
    // profiles of a decode step when called for every row.
    let row_bytes = w.row_bytes();
    let row_at = move |r: usize| &w.data[r * row_bytes..(r + 1) * row_bytes];
    let (dot, dot4) = match format.dot {
        DotKernel::F32(dot) => {
            let task = move |task: usize| {
                for r in task * band..((task + 1) * band).min(rows) {
                    let row = row_at(r);
                    for (t, xt) in x.chunks_exact(w.cols).enumerate() {
                        // SAFETY: row r belongs to this task alone.
                        unsafe { out.write(t * rows + r, dot(row, xt)) };
                    }
                }
            };
            return Ok(Plan {
                n_tasks,
                task: Box::new(task),
            });
        }
        DotKernel::Q8(dot, dot4) => (dot, dot4),
    };
    let blocks = w.cols / Q8_BLOCK;
    let act = quantized_input(
        pool,
        kernels,
        buffers,
        x,
        w.cols,
        w.ty.activation_scales(),
        quantized,
    )?;
    if let Some((data, code, group_bytes)) = interleaved(kernels, &w) {
        if n_tokens >= GEMM_MIN_TOKENS {
            let pack = move |g: usize, half: PanelHalf| {
                (code.pack)(&data[g * group_bytes..(g + 1) * group_bytes], half)
            };
            let products = PanelProducts {
                sub: code.sub,
                one: code.product,
                pair: code.pair,
            };
            return Ok(panel_product(pool, w, products, pack, act, n_tokens, out));
        }
        let band = band.next_multiple_of(INTERLEAVED_ROWS);
        return Ok(interleaved_rows(band, code, w, data, act, n_tokens, out));
    }
    if let Some(gemm) = kernels.gemm(w.ty) {
        if n_tokens >= GEMM_MIN_TOKENS && rows.is_multiple_of(PANEL_ROWS) {
            let panel_bytes = PANEL_ROWS * row_bytes;
            let pack = move |p: usize, half: PanelHalf| {
                let rows = &w.data[p * panel_bytes..(p + 1) * panel_bytes];
                (gemm.pack)(rows, row_bytes, half)
            };
            let products = PanelProducts {
                sub: gemm.sub,
                one: gemm.product,
                pair: gemm.pair,
            };
            return Ok(panel_product(pool, w, products, pack, act, n_tokens, out));
        }
    }
    // Tokens in groups of four where a four-token kernel exists.
    let grouped = if dot4.is_some() {
        n_tokens / DOT_TOKENS * DOT_TOKENS
    } else {
        0
    };
    let dot_rows = kernels.dot_rows(w.ty);
    let task = move |task: usize| {
        let token = |t: usize| &act[t * blocks..(t + 1) * blocks];
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
    };
    Ok(Plan {
        n_tasks,
        task: Box::new(task),
    })
}

/// The interleaved copy of `w`, its code and the bytes of a group of its
/// rows, where the copy and the code exist and fit.
fn interleaved<'a>(
    kernels: Kernels,
    w: &WeightMatrix<'a>,
) -> Option<(&'a [u8], InterleavedKernels, usize)> {
    let data = w.interleaved?;
    let group = interleaved_group_bytes(w.ty, w.cols)?;
    let fits =
        w.rows.is_multiple_of(INTERLEAVED_ROWS) && data.len() == w.rows / INTERLEAVED_ROWS * group;
    fits.then_some(())?;
    Some((data, kernels.interleaved(w.ty)?, group))
}

/// `out[t][r]` = row r · token t over an interleaved matrix, a band of
/// whole groups of rows a task.
fn interleaved_rows<'a>(
    band: usize,
    code: InterleavedKernels,
    w: WeightMatrix<'a>,
    data: &'a [u8],
    act: Arc<Vec<Q8Block>>,
    n_tokens: usize,
    out: Output,
) -> Plan<'a> {
    let row_bytes = data.len() / w.rows;
    let blocks = w.cols / Q8_BLOCK;
    let task = move |task: usize| {
        let (first, end) = (task * band, ((task + 1) * band).min(w.rows));
        let rows = &data[first * row_bytes..end * row_bytes];
        for t in 0..n_tokens {
            // SAFETY: rows first..end belong to this task alone.
            let y = unsafe { out.slice(t * w.rows + first, end - first) };
            (code.dot_rows)(rows, w.cols, &act[t * blocks..(t + 1) * blocks], y);
        }
    };
    Plan {
        n_tasks: w.rows.div_ceil(band),
        task: Box::new(task),
    }
}

/// A format's panel products: `one` panel's, and where the instruction
/// set has it, a `pair`'s at once.
#[derive(Clone, Copy)]
struct PanelProducts {
    sub: usize,
    one: PanelProduct,
    pair: Option<PairProduct>,
}

/// `out[t][r]` = row r · token t through panels: each task unpacks a band
/// of its rows a panel at a time (`pack(p, half)` fills a panel or half a
/// pair with panel p, rows 8p..8p + 8) and multiplies the panels with every
/// token, a pair at a time where the products allow.
fn panel_product<'a>(
    pool: &ThreadPool,
    w: WeightMatrix<'a>,
    products: PanelProducts,
    pack: impl Fn(usize, PanelHalf) + Sync + 'a,
    act: Arc<Vec<Q8Block>>,
    n_tokens: usize,
    out: Output,
) -> Plan<'a> {
    let panels = w.rows / PANEL_ROWS;
    let mut per_task = panels.div_ceil(pool.n_threads() * 4).clamp(1, 16);
    if products.pair.is_some() {
        per_task = per_task.next_multiple_of(2);
    }
    let task = move |task: usize| {
        let mut one = Panel::new(w.cols, products.sub);
        let mut two = products.pair.map(|_| Panel::pair(w.cols, products.sub));
        let end = ((task + 1) * per_task).min(panels);
        let mut p = task * per_task;
        while p < end {
            let pair = products.pair.filter(|_| p + 1 < end);
            let taken = if pair.is_some() { 2 } else { 1 };
            // SAFETY: the panels' rows belong to this task alone.
            let runs =
                unsafe { out.panel_runs(p * PANEL_ROWS, taken * PANEL_ROWS, w.rows, n_tokens) };
            match (pair, two.as_mut()) {
                (Some(pair), Some(two)) => {
                    pack(p, two.half(0));
                    pack(p + 1, two.half(1));
                    pair(two, &act, runs);
                }
                _ => {
                    pack(p, one.half(0));
                    (products.one)(&one, &act, runs);
                }
            }
            p += taken;
        }
    };
    Plan {
        n_tasks: panels.div_ceil(per_task),
        task: Box::new(task),
    }
}
