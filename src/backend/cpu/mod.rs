//! The CPU backend: a pool of worker threads, the matrix products over the
//! quantized formats of [`crate::quant`], and the transformer's other
//! operations on f32 rows.

mod delta_net;
mod matmul;
mod ops;
mod pool;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

pub use matmul::{matmul, matmul_many, ActivationBuffers, Product, WeightMatrix};
pub use pool::{check_thread_count, ThreadPool, MAX_THREADS};

use super::{
    candidates_of_rows, fill_rows, route, AttentionShape, Backend, CandidateRequest, Candidates,
    DeltaNetStep, Experts, Glu, Norm, ProductHelper, Rope, Scratch, SeqPos, Weight,
};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kv_cache::{KvCache, LayerState};
use crate::quant::{
    dequantize_row, interleave_groups, interleaved_group_bytes, sigmoid, Kernels, INTERLEAVED_ROWS,
};

/// A matrix's interleaved copy, shared by the products that read it.
type InterleavedCopy = Arc<Vec<u8>>;

pub struct CpuBackend {
    file: Arc<GgufFile>,
    pool: ThreadPool,
    kernels: Kernels,
    /// Matrices interleaved for the products (`quant::interleaved`), by
    /// their offset in the data section and row count: made on a matrix's
    /// first product and kept; `None` where the copy could not be made (out
    /// of memory), so that it is not tried again.
    interleaved: Mutex<HashMap<(usize, usize), Option<InterleavedCopy>>>,
    /// The products' quantized activations, reused.
    activations: ActivationBuffers,
    /// The RoPE angles of the latest steps' positions (`step_angles`).
    rope_angles: Mutex<VecDeque<Arc<ops::StepAngles>>>,
    /// Where products of at least [`HELPER_MIN_ROWS`] rows run instead (a
    /// GPU of the same split model), if anywhere.
    helper: Option<Box<dyn ProductHelper>>,
}

/// Rows from which a product goes to the helper: a prompt chunk's, not a
/// decode step's or a small batch's. From 65 rows a CUDA device takes a
/// product through cuBLAS, whose results lie as close to the CPU's as the
/// whole GPU's do; its f16 tensor-core route for 9–64 rows lay 2.6% of the
/// logit scale from the CPU's on a Qwen3 model split CPU-then-GPU (H100).
const HELPER_MIN_ROWS: usize = 65;

/// Steps' RoPE angles kept: a model's layers take one or two RoPEs (Gemma's
/// local and global layers), and sessions stepped from several threads
/// interleave their steps.
const KEPT_ANGLES: usize = 4;

impl CpuBackend {
    /// A backend over the weights of `file` with `threads` threads.
    pub fn new(file: Arc<GgufFile>, threads: usize) -> Result<CpuBackend> {
        if file.data().is_none() {
            return Err(Error::internal("the CPU backend needs the tensor data"));
        }
        Ok(CpuBackend {
            file,
            pool: ThreadPool::try_new(threads)?,
            kernels: Kernels::best(),
            interleaved: Mutex::new(HashMap::new()),
            activations: ActivationBuffers::default(),
            rope_angles: Mutex::new(VecDeque::new()),
            helper: None,
        })
    }

    /// This backend handing its products of many rows to `helper`.
    pub fn with_helper(mut self, helper: Option<Box<dyn ProductHelper>>) -> CpuBackend {
        self.helper = helper;
        self
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The angles of `table` at the rows' positions: kept ones where a
    /// call of the same step (the other of Q and K, an earlier layer) made
    /// them, else made and kept.
    fn step_angles(&self, table: ops::RopeTable, rows: &[SeqPos]) -> Arc<ops::StepAngles> {
        let positions = || rows.iter().map(|r| r.pos);
        let lock = || {
            self.rope_angles
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        if let Some(kept) = lock().iter().find(|a| a.serves(&table, positions())) {
            return Arc::clone(kept);
        }
        let angles = Arc::new(ops::StepAngles::new(table, positions().collect()));
        let mut kept = lock();
        if kept.len() == KEPT_ANGLES {
            kept.pop_front();
        }
        kept.push_back(Arc::clone(&angles));
        angles
    }

    /// `f(start, piece)` over pieces of `data` made of whole rows of
    /// `width` values, `start` the piece's first index, in parallel: a
    /// piece has enough values to be worth a task, so a decode step's rows
    /// stay on the calling thread.
    fn rows_in_parallel(
        &self,
        data: &mut [f32],
        width: usize,
        f: &(dyn Fn(usize, &mut [f32]) + Sync),
    ) {
        const VALUES_PER_TASK: usize = 16 * 1024;
        let rows_per_task = VALUES_PER_TASK.div_ceil(width.max(1));
        let piece = rows_per_task * width.max(1);
        self.pool
            .for_each_chunk(data, piece, &|i, part| f(i * piece, part));
    }

    /// `w` interleaved, for a matrix whose type these kernels have
    /// interleaved code for: made on first use, after which the mapped
    /// file's pages of `w` are let go (embedding lookups of a tied output
    /// matrix read them again as needed).
    fn interleaved_copy(&self, w: &Weight) -> Option<InterleavedCopy> {
        let fits = w.rows.is_multiple_of(INTERLEAVED_ROWS)
            && w.rows > INTERLEAVED_ROWS
            && self.kernels.interleaved(w.ty).is_some();
        if !fits {
            return None;
        }
        // The copy is made under the lock: a first product waits for it
        // whichever session asked first, and no matrix is copied twice.
        let mut copies = self.interleaved.lock().unwrap_or_else(|p| p.into_inner());
        let key = (w.offset, w.rows);
        if let Some(copy) = copies.get(&key) {
            return copy.clone();
        }
        let copy = self.make_interleaved(w);
        copies.insert(key, copy.clone());
        copy
    }

    /// `w` interleaved, the mapped file's pages of `w` let go as the copy
    /// is made; `None` for a shape without a layout or out of memory.
    fn make_interleaved(&self, w: &Weight) -> Option<InterleavedCopy> {
        let group = interleaved_group_bytes(w.ty, w.cols)?;
        let source_group = INTERLEAVED_ROWS * w.row_bytes();
        let len = w.rows / INTERLEAVED_ROWS * group;
        let mut copy = Vec::new();
        copy.try_reserve_exact(len).ok()?;
        copy.resize(len, 0);
        // About 16 MiB of the file a task, whose pages the task lets go once
        // copied: the process never holds a large matrix twice.
        let per_task = ((16 << 20) / source_group).max(1);
        let (rows, data) = (self.bytes(w), self.file.data().expect("checked in new"));
        self.pool
            .for_each_chunk(&mut copy, per_task * group, &|i, dst| {
                let start = i * per_task * source_group;
                let src = &rows[start..start + dst.len() / group * source_group];
                interleave_groups(w.ty, src, w.cols, dst);
                data.release(w.offset + start..w.offset + start + src.len());
            });
        Some(Arc::new(copy))
    }

    /// The interleaved copy of a 3-D expert tensor `whole` of `n` experts,
    /// made whole (its experts' rows are whole groups of eight), so that the
    /// first tokens do not each pay for the experts they happen to be the
    /// first to use.
    fn experts_interleaved(&self, whole: &Weight, n: usize) -> Option<InterleavedCopy> {
        let rows = whole.rows / n;
        rows.is_multiple_of(INTERLEAVED_ROWS)
            .then(|| self.interleaved_copy(whole))
            .flatten()
    }

    /// Expert `e` of the `n` experts of `whole`, with its part of the
    /// tensor's interleaved copy.
    fn expert_matrix<'a>(
        &'a self,
        whole: &Weight,
        copy: &'a Option<InterleavedCopy>,
        e: usize,
        n: usize,
    ) -> WeightMatrix<'a> {
        let w = whole.part(e, n);
        let part = copy.as_ref().map(|c| {
            let per = c.len() / n;
            &c[e * per..(e + 1) * per]
        });
        WeightMatrix {
            interleaved: part,
            ..WeightMatrix::new(w.ty, w.rows, w.cols, self.bytes(&w))
        }
    }

    fn bytes(&self, w: &Weight) -> &[u8] {
        let data = self.file.data().expect("checked in new").bytes();
        &data[w.offset..w.offset + w.n_bytes]
    }

    /// out = Σ w_e · expert_e(h) for `rows` rows of h (`d` wide), over
    /// each row's routed experts, each product plus its bias where the
    /// mixture has them (the router's before routing). Rows are grouped by
    /// expert, so that each chosen expert's matrices are read once per
    /// call; a row's weighted expert outputs are summed in the router's
    /// order, as llama.cpp does.
    fn mixture(
        &self,
        ex: &Experts,
        glu: Glu,
        h: &Vec<f32>,
        rows: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let (d, k) = (ex.router.cols, ex.n_used);
        let mut logits = self.buffer(rows * ex.n_expert)?;
        self.matmul(&ex.router, h, rows, &mut logits)?;
        if let Some(biases) = &ex.biases {
            self.add_bias(&mut logits, &biases.router, rows)?;
        }
        let choices: Vec<Vec<(usize, f32)>> = logits
            .chunks_exact(ex.n_expert)
            .map(|l| route(l, k))
            .collect();
        // Each expert's users: (row, slot of the row's choices).
        let mut users: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ex.n_expert];
        for (r, chosen) in choices.iter().enumerate() {
            for (slot, &(e, _)) in chosen.iter().enumerate() {
                users[e].push((r, slot));
            }
        }
        // The weighted output of every (row, slot).
        let mut weighted = self.buffer(rows * k * d)?;
        let n = ex.n_expert;
        let ff = ex.gate.part(0, n).rows;
        let used: Vec<(usize, &Vec<(usize, usize)>)> = users
            .iter()
            .enumerate()
            .filter(|(_, u)| !u.is_empty())
            .collect();
        // Each used expert's rows of h, then all their gate and up products
        // in one parallel loop, and all their down products in another.
        let mut xs = Vec::with_capacity(used.len());
        for &(_, users) in &used {
            let mut xe = self.buffer(users.len() * d)?;
            for (row, &(r, _)) in xe.chunks_exact_mut(d).zip(users.iter()) {
                row.copy_from_slice(&h[r * d..(r + 1) * d]);
            }
            xs.push(xe);
        }
        // One buffer of `width` values for each row of each used expert.
        let buffers = |width: usize| -> Result<Vec<Vec<f32>>> {
            used.iter()
                .map(|(_, u)| self.buffer(u.len() * width))
                .collect()
        };
        let (mut g, mut u, mut act) = (buffers(ff)?, buffers(ff)?, buffers(ff)?);
        let mut ye = buffers(d)?;
        let copies = [&ex.gate, &ex.up, &ex.down].map(|w| self.experts_interleaved(w, n));
        let mut products = Vec::with_capacity(2 * used.len());
        for (((&(e, users), x), g), u) in used.iter().zip(&xs).zip(&mut g).zip(&mut u) {
            let m = users.len();
            for (whole, copy, y) in [(&ex.gate, &copies[0], g), (&ex.up, &copies[1], u)] {
                let w = self.expert_matrix(whole, copy, e, n);
                products.push(Product {
                    w,
                    x: &x[..m * d],
                    n_tokens: m,
                    y: &mut y[..m * ff],
                });
            }
        }
        matmul_many(&self.pool, self.kernels, &self.activations, &mut products)?;
        drop(products);
        if let Some(biases) = &ex.biases {
            for ((&(e, users), g), u) in used.iter().zip(&mut g).zip(&mut u) {
                let [gate_bias, up_bias, _] = biases.expert(e, n);
                self.add_bias(g, &gate_bias, users.len())?;
                self.add_bias(u, &up_bias, users.len())?;
            }
        }
        for (((&(_, users), g), u), a) in used.iter().zip(&g).zip(&u).zip(&mut act) {
            self.glu(glu, g, u, users.len() * ff, a)?;
        }
        let mut products = Vec::with_capacity(used.len());
        for ((&(e, users), a), y) in used.iter().zip(&act).zip(&mut ye) {
            let m = users.len();
            let w = self.expert_matrix(&ex.down, &copies[2], e, n);
            products.push(Product {
                w,
                x: &a[..m * ff],
                n_tokens: m,
                y: &mut y[..m * d],
            });
        }
        matmul_many(&self.pool, self.kernels, &self.activations, &mut products)?;
        drop(products);
        if let Some(biases) = &ex.biases {
            for (&(e, users), y) in used.iter().zip(&mut ye) {
                let [_, _, down_bias] = biases.expert(e, n);
                self.add_bias(y, &down_bias, users.len())?;
            }
        }
        for (&(_, users), y) in used.iter().zip(&ye) {
            for (y, &(r, slot)) in y.chunks_exact(d).zip(users.iter()) {
                let w = choices[r][slot].1;
                let dst = &mut weighted[(r * k + slot) * d..][..d];
                dst.iter_mut().zip(y).for_each(|(o, &v)| *o = v * w);
            }
        }
        for (o, w) in out[..rows * d]
            .chunks_exact_mut(d)
            .zip(weighted.chunks_exact(k * d))
        {
            o.copy_from_slice(&w[..d]);
            for slot in w.chunks_exact(d).skip(1) {
                o.iter_mut().zip(slot).for_each(|(a, &b)| *a += b);
            }
        }
        Ok(())
    }

    /// A one-row weight (norm, bias) as f32.
    fn vector(&self, w: &Weight) -> Vec<f32> {
        let mut out = vec![0f32; w.cols * w.rows];
        dequantize_row(w.ty, self.bytes(w), &mut out);
        out
    }
}

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;
    type KvCache = KvCache;

    fn buffer(&self, len: usize) -> Result<Vec<f32>> {
        let mut v = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| Error::out_of_memory(format!("cannot allocate {len} activations")))?;
        v.resize(len, 0.0);
        Ok(v)
    }

    fn read(&self, buffer: &Vec<f32>, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&buffer[..out.len()]);
        Ok(())
    }

    fn read_rows(
        &self,
        buffer: &Vec<f32>,
        row_len: usize,
        rows: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        fill_rows(buffer, row_len, rows);
        Ok(())
    }

    fn read_candidates(
        &self,
        buffer: &Vec<f32>,
        row_len: usize,
        requests: &[CandidateRequest],
        out: &mut [Candidates],
    ) -> Result<()> {
        candidates_of_rows(buffer, row_len, requests, out);
        Ok(())
    }

    fn write(&self, buffer: &mut Vec<f32>, values: &[f32]) -> Result<()> {
        buffer[..values.len()].copy_from_slice(values);
        Ok(())
    }

    fn kv_cache(&self, n_ctx: usize, layers: &[LayerState]) -> Result<KvCache> {
        KvCache::with_layers(n_ctx, layers)
    }

    fn reset_recurrent(&self, cache: &mut KvCache) {
        cache.reset_recurrent();
    }

    fn embed(&self, table: &Weight, tokens: &[u32], scale: f32, out: &mut Vec<f32>) -> Result<()> {
        let row_bytes = table.row_bytes();
        let data = self.bytes(table);
        for (&t, row) in tokens.iter().zip(out.chunks_exact_mut(table.cols)) {
            let t = t as usize;
            dequantize_row(table.ty, &data[t * row_bytes..(t + 1) * row_bytes], row);
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    fn matmul(&self, w: &Weight, x: &Vec<f32>, rows: usize, out: &mut Vec<f32>) -> Result<()> {
        self.matmuls(&[w], x, rows, &mut [out])
    }

    fn matmuls(
        &self,
        ws: &[&Weight],
        x: &Vec<f32>,
        rows: usize,
        outs: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        if let Some(helper) = self
            .helper
            .as_ref()
            .filter(|h| rows >= HELPER_MIN_ROWS && ws.iter().all(|w| h.takes(w.ty)))
        {
            match helper.products(ws, x, rows, outs) {
                // A GPU without room for the batch's weights leaves the
                // products to the CPU.
                Err(e) if e.kind() == crate::error::ErrorKind::OutOfMemory => {}
                done => return done,
            }
        }
        let copies: Vec<Option<InterleavedCopy>> =
            ws.iter().map(|w| self.interleaved_copy(w)).collect();
        let mut products = Vec::with_capacity(ws.len());
        for ((w, copy), out) in ws.iter().zip(&copies).zip(outs.iter_mut()) {
            products.push(Product {
                w: WeightMatrix {
                    interleaved: copy.as_ref().map(|v| v.as_slice()),
                    ..WeightMatrix::new(w.ty, w.rows, w.cols, self.bytes(w))
                },
                x: &x[..rows * w.cols],
                n_tokens: rows,
                y: &mut out[..rows * w.rows],
            });
        }
        matmul_many(&self.pool, self.kernels, &self.activations, &mut products)
    }

    fn add_bias(&self, x: &mut Vec<f32>, bias: &Weight, rows: usize) -> Result<()> {
        let b = self.vector(bias);
        for row in x[..rows * b.len()].chunks_exact_mut(b.len()) {
            row.iter_mut().zip(&b).for_each(|(v, b)| *v += b);
        }
        Ok(())
    }

    fn rms_norm(&self, x: &mut Vec<f32>, weight: &Weight, eps: f32, len: usize) -> Result<()> {
        let w = self.vector(weight);
        self.rows_in_parallel(&mut x[..len], w.len(), &|_, rows| {
            for group in rows.chunks_exact_mut(w.len()) {
                ops::rms_norm(group, &w, eps);
            }
        });
        Ok(())
    }

    fn rms_normalize(&self, x: &mut Vec<f32>, group: usize, eps: f32, len: usize) -> Result<()> {
        self.rows_in_parallel(&mut x[..len], group, &|_, rows| {
            for g in rows.chunks_exact_mut(group) {
                ops::rms_normalize(g, eps);
            }
        });
        Ok(())
    }

    fn scale_by(&self, x: &mut Vec<f32>, factor: &Weight, len: usize) -> Result<()> {
        let factor = self.vector(factor)[0];
        self.rows_in_parallel(&mut x[..len], 1, &|_, xs| {
            xs.iter_mut().for_each(|v| *v *= factor);
        });
        Ok(())
    }

    fn soft_cap(&self, x: &mut Vec<f32>, cap: f32, len: usize) -> Result<()> {
        self.rows_in_parallel(&mut x[..len], 1, &|_, xs| ops::soft_cap(xs, cap));
        Ok(())
    }

    fn gather_rows(
        &self,
        src: &Vec<f32>,
        width: usize,
        rows: &[usize],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        for (i, &r) in rows.iter().enumerate() {
            out[i * width..(i + 1) * width].copy_from_slice(&src[r * width..(r + 1) * width]);
        }
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) -> Result<()> {
        self.rows_in_parallel(&mut x[..len], 1, &|start, xs| {
            let ys = &y[start..start + xs.len()];
            xs.iter_mut().zip(ys).for_each(|(a, b)| *a += b);
        });
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        n_heads: usize,
        head_dim: usize,
        positions: &[SeqPos],
        rope: &Rope,
    ) -> Result<()> {
        let factors = rope.freq_factors.map(|w| self.vector(w));
        let angles = self.step_angles(ops::RopeTable::new(rope, factors.as_deref()), positions);
        let width = n_heads * head_dim;
        let x = &mut x[..positions.len() * width];
        self.rows_in_parallel(x, width, &|start, rows| {
            let first = start / width;
            for (j, row) in rows.chunks_exact_mut(width).enumerate() {
                let (cos, sin) = angles.row(first + j);
                for head in row.chunks_exact_mut(head_dim) {
                    ops::rotate(head, rope.mode, cos, sin);
                }
            }
        });
        Ok(())
    }

    fn glu(
        &self,
        glu: Glu,
        gate: &Vec<f32>,
        up: &Vec<f32>,
        len: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let kernels = self.kernels.glu();
        let activation = match glu {
            Glu::Swiglu => kernels.swiglu,
            Glu::Geglu => kernels.geglu,
            Glu::SwigluOai => kernels.swiglu_oai,
        };
        self.rows_in_parallel(&mut out[..len], 1, &|start, out| {
            let range = start..start + out.len();
            activation(out, &gate[range.clone()], &up[range]);
        });
        Ok(())
    }

    fn delta_net(
        &self,
        caches: &mut [&mut KvCache],
        step: DeltaNetStep,
        qkv: &Vec<f32>,
        alpha: &Vec<f32>,
        beta: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let n = step.rows.len();
        let shape = step.shape;
        let consts = delta_net::LayerConstants {
            conv: self.vector(step.conv),
            dt_bias: self.vector(step.dt_bias),
            a: self.vector(step.a),
        };
        delta_net::delta_net(
            &self.pool,
            caches,
            step.layer,
            step.rows,
            &shape,
            &consts,
            step.eps,
            &qkv[..n * shape.channels()],
            &alpha[..n * shape.n_v_heads],
            &beta[..n * shape.n_v_heads],
            &mut out[..n * shape.value_width()],
        )
    }

    fn split_halves(
        &self,
        x: &Vec<f32>,
        groups: usize,
        half: usize,
        first: &mut Vec<f32>,
        second: &mut Vec<f32>,
    ) -> Result<()> {
        let pairs = x[..groups * 2 * half].chunks_exact(2 * half);
        let outs = first
            .chunks_exact_mut(half)
            .zip(second.chunks_exact_mut(half));
        for (group, (a, b)) in pairs.zip(outs) {
            a.copy_from_slice(&group[..half]);
            b.copy_from_slice(&group[half..]);
        }
        Ok(())
    }

    fn sigmoid_gate(&self, x: &mut Vec<f32>, gate: &Vec<f32>, len: usize) -> Result<()> {
        self.rows_in_parallel(&mut x[..len], 1, &|start, xs| {
            let gs = &gate[start..start + xs.len()];
            xs.iter_mut().zip(gs).for_each(|(v, &g)| *v *= sigmoid(g));
        });
        Ok(())
    }

    fn gated_add(
        &self,
        x: &mut Vec<f32>,
        y: &Vec<f32>,
        gate: &Vec<f32>,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        self.rows_in_parallel(&mut x[..rows * width], width, &|start, xs| {
            for (i, row) in xs.chunks_exact_mut(width).enumerate() {
                let r = start / width + i;
                let g = sigmoid(gate[r]);
                let ys = &y[r * width..(r + 1) * width];
                row.iter_mut().zip(ys).for_each(|(a, &b)| *a += g * b);
            }
        });
        Ok(())
    }

    fn store_kv(
        &self,
        caches: &mut [&mut KvCache],
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        rows: &[SeqPos],
    ) -> Result<()> {
        for (i, r) in rows.iter().enumerate() {
            let cache = &mut caches[r.seq];
            let (kw, vw) = (cache.k_width(layer), cache.v_width(layer));
            cache.store(
                layer,
                r.pos,
                &k[i * kw..(i + 1) * kw],
                &v[i * vw..(i + 1) * vw],
            );
        }
        Ok(())
    }

    fn norm_moe_ffn_residual(
        &self,
        x: &mut Vec<f32>,
        norm: Norm,
        rows: usize,
        experts: &Experts,
        glu: Glu,
        post_norm: Option<Norm>,
        scratch: Scratch<Vec<f32>>,
    ) -> Result<()> {
        let len = rows * experts.router.cols;
        let (h, out) = (scratch.normed, scratch.product);
        h[..len].copy_from_slice(&x[..len]);
        self.rms_norm(h, norm.weight, norm.eps, len)?;
        self.mixture(experts, glu, h, rows, out)?;
        if let Some(n) = post_norm {
            self.rms_norm(out, n.weight, n.eps, len)?;
        }
        self.add(x, out, len)
    }

    fn attention(
        &self,
        caches: &[&mut KvCache],
        layer: usize,
        q: &Vec<f32>,
        rows: &[SeqPos],
        shape: &AttentionShape,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let sinks = shape.sinks.as_ref().map(|w| self.vector(w));
        ops::attention(
            &self.pool,
            self.kernels,
            caches,
            layer,
            q,
            rows,
            shape,
            sinks.as_deref(),
            out,
        );
        Ok(())
    }
}
