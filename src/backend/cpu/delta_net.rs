//! Gated DeltaNet (the linear attention of Qwen3.5's hybrid layers) on the
//! CPU, as [`crate::backend::Backend::delta_net`] defines it and llama.cpp
//! computes it (`ggml_ssm_conv`, then `ggml_gated_delta_net`).
//!
//! Each sequence's rows go through the causal convolution in order, then
//! each (sequence, value head) pair is a task of the pool that runs the
//! recurrence over the sequence's rows: one pass over the head's
//! `head_dim × head_dim` state per row, which stays in the core's cache.
//! Where a prompt has many rows the recurrence costs a few percent of the
//! layer's projections (2·head_dim² multiply-adds per head and row, against
//! the projections' 2·n_embd·(2·key + 2·value) per row), so the rows are
//! taken one after another rather than in the chunked form a GPU needs for
//! parallelism.

use super::ThreadPool;
use crate::backend::{DeltaNetShape, SeqPos};
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::quant::{exp, sigmoid, silu};

/// A layer's constants as f32: the convolution's taps (`channels` rows of
/// `conv_kernel`), and per value head the decay's bias and −e^A.
pub struct LayerConstants {
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub a: Vec<f32>,
}

/// ggml's softplus: ln(1 + e^x), x itself above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + exp(x)).ln()
    }
}

/// Σ a[i]·b[i] in eight running sums (so that the compiler keeps them in a
/// vector register), added pairwise at the end.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        sum += x * y;
    }
    sum
}

/// x / √(Σx² + ε), as llama.cpp's `build_gdn_l2_norm` computes it: an RMS
/// norm with ε/n, then 1/√n.
fn l2_normalize(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (sum / f64::from(n)) as f32;
    let scale = 1.0 / (mean + eps / n).sqrt();
    let root = 1.0 / n.sqrt();
    x.iter_mut().for_each(|v| *v = *v * scale * root);
}

/// The causal convolution of `rows` new inputs (`channels` values each)
/// after the `conv_kernel − 1` inputs of `state`, SiLU, and the L2 norms of
/// the query and key heads: `rows × channels` values. `state` becomes the
/// last `conv_kernel − 1` inputs.
fn convolve(
    shape: &DeltaNetShape,
    taps: &[f32],
    state: &mut [f32],
    inputs: &[f32],
    eps: f32,
) -> Vec<f32> {
    let (k, c) = (shape.conv_kernel, shape.channels());
    let rows = inputs.len() / c;
    // The state's inputs, then the new ones: row t's output reads rows
    // t..t + k of this.
    let mut window = Vec::with_capacity((k - 1 + rows) * c);
    window.extend_from_slice(state);
    window.extend_from_slice(inputs);
    let mut out = vec![0f32; rows * c];
    for (t, row) in out.chunks_exact_mut(c).enumerate() {
        for (ch, y) in row.iter_mut().enumerate() {
            let w = &taps[ch * k..(ch + 1) * k];
            let mut sum = 0f32;
            for (i, &tap) in w.iter().enumerate() {
                sum += window[(t + i) * c + ch] * tap;
            }
            *y = silu(sum);
        }
        for head in row[..2 * shape.key_width()].chunks_exact_mut(shape.head_dim) {
            l2_normalize(head, eps);
        }
    }
    state.copy_from_slice(&window[rows * c..]);
    out
}

/// One value head of one sequence: its state, and its output rows.
struct HeadTask<'a> {
    /// Index into the step's sequences.
    seq: usize,
    head: usize,
    state: &'a mut [f32],
    out: Vec<f32>,
}

/// The recurrence of one value head over a sequence's convolved rows.
#[allow(clippy::too_many_arguments)]
fn run_head(
    shape: &DeltaNetShape,
    consts: &LayerConstants,
    conv_out: &[f32],
    row_index: &[usize],
    alpha: &[f32],
    beta: &[f32],
    task: &mut HeadTask,
) {
    let (s, h) = (shape.head_dim, task.head);
    let (c, kw, n_v) = (shape.channels(), shape.key_width(), shape.n_v_heads);
    let kh = h % shape.n_k_heads;
    let scale = 1.0 / (s as f32).sqrt();
    for (t, &row) in row_index.iter().enumerate() {
        let x = &conv_out[t * c..(t + 1) * c];
        let q = &x[kh * s..(kh + 1) * s];
        let k = &x[kw + kh * s..kw + (kh + 1) * s];
        let v = &x[2 * kw + h * s..2 * kw + (h + 1) * s];
        let decay = exp(softplus(alpha[row * n_v + h] + consts.dt_bias[h]) * consts.a[h]);
        let strength = sigmoid(beta[row * n_v + h]);
        let out = &mut task.out[t * s..(t + 1) * s];
        // Column j of S (stored as row j): decay it, write the error of its
        // prediction of v[j] along k, then read it with q.
        for (j, col) in task.state.chunks_exact_mut(s).enumerate() {
            col.iter_mut().for_each(|m| *m *= decay);
            let delta = (v[j] - dot(col, k)) * strength;
            col.iter_mut().zip(k).for_each(|(m, &ki)| *m += delta * ki);
            out[j] = dot(col, q) * scale;
        }
    }
}

/// [`crate::backend::Backend::delta_net`] for the CPU.
#[allow(clippy::too_many_arguments)]
pub fn delta_net(
    pool: &ThreadPool,
    caches: &mut [&mut KvCache],
    layer: usize,
    rows: &[SeqPos],
    shape: &DeltaNetShape,
    consts: &LayerConstants,
    eps: f32,
    qkv: &[f32],
    alpha: &[f32],
    beta: &[f32],
    out: &mut [f32],
) -> Result<()> {
    let (c, s) = (shape.channels(), shape.head_dim);
    // Each sequence's rows, in batch order.
    let mut seqs: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        match seqs.iter_mut().find(|(seq, _)| *seq == r.seq) {
            Some((_, list)) => list.push(i),
            None => seqs.push((r.seq, vec![i])),
        }
    }
    // Each sequence's state, checked before any state changes. A
    // sequence's rows are grouped above, so each cache is taken once.
    let mut caches: Vec<Option<&mut KvCache>> = caches.iter_mut().map(|c| Some(&mut **c)).collect();
    let mut states = Vec::with_capacity(seqs.len());
    for (seq, list) in &seqs {
        let state = caches[*seq]
            .take()
            .and_then(|cache| cache.recurrent_mut(layer))
            .ok_or_else(|| Error::internal(format!("layer {layer} has no recurrent state")))?;
        let in_order = list
            .iter()
            .enumerate()
            .all(|(t, &i)| rows[i].pos == state.tokens + t);
        if !in_order {
            return Err(Error::internal(format!(
                "a linear-attention layer's state holds {} tokens of sequence {seq}, but its rows start at position {}",
                state.tokens, rows[list[0]].pos
            )));
        }
        states.push(state);
    }
    let convolved: Vec<Vec<f32>> = seqs
        .iter()
        .zip(states.iter_mut())
        .map(|((_, list), state)| {
            let inputs: Vec<f32> = list
                .iter()
                .flat_map(|&i| &qkv[i * c..(i + 1) * c])
                .copied()
                .collect();
            convolve(shape, &consts.conv, &mut state.conv, &inputs, eps)
        })
        .collect();
    let mut tasks: Vec<HeadTask> = Vec::new();
    for (i, ((_, list), state)) in seqs.iter().zip(states.iter_mut()).enumerate() {
        for (head, chunk) in state.ssm.chunks_exact_mut(s * s).enumerate() {
            tasks.push(HeadTask {
                seq: i,
                head,
                state: chunk,
                out: vec![0f32; list.len() * s],
            });
        }
    }
    pool.for_each_chunk(&mut tasks, 1, &|_, task| {
        let task = &mut task[0];
        let (conv_out, list) = (&convolved[task.seq], &seqs[task.seq].1);
        run_head(shape, consts, conv_out, list, alpha, beta, task);
    });
    let width = shape.value_width();
    for task in &tasks {
        for (t, &i) in seqs[task.seq].1.iter().enumerate() {
            out[i * width + task.head * s..][..s].copy_from_slice(&task.out[t * s..(t + 1) * s]);
        }
    }
    drop(tasks);
    for ((_, list), state) in seqs.iter().zip(states) {
        state.tokens += list.len();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recurrence written out as the definition states it, in f64,
    /// with S as a key × value matrix.
    fn reference(
        shape: &DeltaNetShape,
        consts: &LayerConstants,
        x: &[f32],
        alpha: &[f32],
        beta: &[f32],
        eps: f64,
    ) -> Vec<f64> {
        let (k, c, s) = (shape.conv_kernel, shape.channels(), shape.head_dim);
        let (kw, n_v) = (shape.key_width(), shape.n_v_heads);
        let rows = x.len() / c;
        let mut conv = vec![0f64; rows * c];
        for t in 0..rows {
            for ch in 0..c {
                let mut sum = 0f64;
                for i in 0..k {
                    // Input row t + i − (k − 1); the state before the first is zero.
                    if let Some(r) = (t + i).checked_sub(k - 1) {
                        sum += f64::from(x[r * c + ch]) * f64::from(consts.conv[ch * k + i]);
                    }
                }
                conv[t * c + ch] = sum / (1.0 + (-sum).exp());
            }
            for head in conv[t * c..t * c + 2 * kw].chunks_exact_mut(s) {
                let norm = (head.iter().map(|v| v * v).sum::<f64>() + eps).sqrt();
                head.iter_mut().for_each(|v| *v /= norm);
            }
        }
        let mut out = vec![0f64; rows * shape.value_width()];
        for h in 0..n_v {
            let kh = h % shape.n_k_heads;
            let mut state = vec![vec![0f64; s]; s]; // state[i][j], i key dim
            for t in 0..rows {
                let row = &conv[t * c..(t + 1) * c];
                let (q, key, v) = (
                    &row[kh * s..(kh + 1) * s],
                    &row[kw + kh * s..kw + (kh + 1) * s],
                    &row[2 * kw + h * s..2 * kw + (h + 1) * s],
                );
                let a = f64::from(alpha[t * n_v + h]) + f64::from(consts.dt_bias[h]);
                let g = (1.0 + a.exp()).ln() * f64::from(consts.a[h]);
                let b = 1.0 / (1.0 + (-f64::from(beta[t * n_v + h])).exp());
                for r in state.iter_mut() {
                    r.iter_mut().for_each(|m| *m *= g.exp());
                }
                for j in 0..s {
                    let predicted: f64 = (0..s).map(|i| state[i][j] * key[i]).sum();
                    let delta = (v[j] - predicted) * b;
                    (0..s).for_each(|i| state[i][j] += key[i] * delta);
                }
                for j in 0..s {
                    let read: f64 = (0..s).map(|i| state[i][j] * q[i]).sum();
                    out[t * shape.value_width() + h * s + j] = read / (s as f64).sqrt();
                }
            }
        }
        out
    }

    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut rng = crate::sampling::Rng::new(seed);
        (0..n)
            .map(|_| ((rng.next_f64() - 0.5) * 2.0 * f64::from(scale)) as f32)
            .collect()
    }

    #[test]
    fn rows_in_pieces_equal_the_f64_definition_and_each_other() {
        let shape = DeltaNetShape {
            conv_kernel: 4,
            head_dim: 16,
            n_k_heads: 2,
            n_v_heads: 4,
        };
        let (c, n_v, rows) = (shape.channels(), shape.n_v_heads, 11);
        let consts = LayerConstants {
            conv: values(c * shape.conv_kernel, 1, 0.6),
            dt_bias: values(n_v, 2, 1.0),
            a: values(n_v, 3, 1.0).iter().map(|v| -v.abs() - 0.1).collect(),
        };
        let x = values(rows * c, 4, 1.0);
        let alpha = values(rows * n_v, 5, 2.0);
        let beta = values(rows * n_v, 6, 2.0);
        let eps = 1e-6;
        let expected = reference(&shape, &consts, &x, &alpha, &beta, f64::from(eps));
        let pool = ThreadPool::new(3);
        let state = [crate::kv_cache::LayerState::Recurrent(shape)];
        // All rows at once, and the same rows as a prompt of 4 then single
        // steps, each from where the state stands.
        let mut outputs = Vec::new();
        // Piece boundaries: the whole at once, or a prompt of 4 then steps.
        for ends in [vec![rows], vec![4, 5, 6, rows]] {
            let pieces = ends.iter().scan(0, |start, &end| {
                let p = *start..end;
                *start = end;
                Some(p)
            });
            let mut cache = KvCache::with_layers(1, &state).unwrap();
            let mut out = vec![0f32; rows * shape.value_width()];
            for p in pieces {
                let n = p.len();
                let positions: Vec<SeqPos> = p.clone().map(|pos| SeqPos { seq: 0, pos }).collect();
                let mut piece_out = vec![0f32; n * shape.value_width()];
                delta_net(
                    &pool,
                    &mut [&mut cache],
                    0,
                    &positions,
                    &shape,
                    &consts,
                    eps,
                    &x[p.start * c..p.end * c],
                    &alpha[p.start * n_v..p.end * n_v],
                    &beta[p.start * n_v..p.end * n_v],
                    &mut piece_out,
                )
                .unwrap();
                out[p.start * shape.value_width()..p.end * shape.value_width()]
                    .copy_from_slice(&piece_out);
            }
            assert!(cache.recurrent_holds(rows));
            for (i, (&got, &want)) in out.iter().zip(&expected).enumerate() {
                assert!(
                    (f64::from(got) - want).abs() <= 1e-5,
                    "value {i}: {got} vs {want}"
                );
            }
            outputs.push(out);
        }
        assert_eq!(outputs[0], outputs[1], "pieces differ from the whole");
    }

    #[test]
    fn rows_out_of_step_with_the_state_are_refused() {
        let shape = DeltaNetShape {
            conv_kernel: 2,
            head_dim: 4,
            n_k_heads: 1,
            n_v_heads: 1,
        };
        let consts = LayerConstants {
            conv: vec![0.5; shape.channels() * 2],
            dt_bias: vec![0.0],
            a: vec![-1.0],
        };
        let state = [crate::kv_cache::LayerState::Recurrent(shape)];
        let mut cache = KvCache::with_layers(1, &state).unwrap();
        let rows = [SeqPos { seq: 0, pos: 3 }];
        let err = delta_net(
            &ThreadPool::new(1),
            &mut [&mut cache],
            0,
            &rows,
            &shape,
            &consts,
            1e-6,
            &vec![0.1; shape.channels()],
            &[0.0],
            &[0.0],
            &mut [0.0; 4],
        )
        .unwrap_err();
        assert!(err.to_string().contains("start at position 3"), "{err}");
        assert!(cache.recurrent_holds(0));
    }
}
