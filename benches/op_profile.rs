//! Where a forward pass's time goes, operation by operation: the model runs
//! through a wrapper backend that sums the time of each operation by
//! operation and shape. A prompt's operations are timed between waits for
//! the device (each large enough for the waits not to matter). A decode
//! step's small operations are timed on the device's own timeline where the
//! backend has one (CUDA: an event recorded after each operation, no waits),
//! next to the host's time to enqueue them: when the two are close, the
//! device was waiting for the host. Without a timeline (CPU) decode steps
//! are timed between waits too. `m40-bench` measures speed; this says why.
//!
//!   cargo bench --features cuda --bench op_profile -- MODEL.gguf [DEVICE] [PROMPT] [BATCHES] [CPU THREADS]
//!
//! DEVICE: a CUDA device index, or -1 for the CPU (default 0); PROMPT: the
//! prompt length profiled as one chunk (default 512); BATCHES: the session
//! counts whose decode step (one row per session, after the prompt) is
//! profiled, comma-separated (default 1,8).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use m40llm::backend::{
    AttentionShape, AttentionStep, Backend, DeltaNetStep, Experts, GatedFfn, Glu, LayerState,
    ModelBackend, Norm, Product, Rope, Scratch, SeqPos, SharedExpert, SharedScratch,
};
use m40llm::error::Result;
use m40llm::model::transformer::{forward, logits_on_device};
use m40llm::model::{LoadOptions, Model, Weight};

/// Marks in a device's stream of work, read back once the work is done.
trait Timeline {
    /// Records mark `i` after the work enqueued so far.
    fn mark(&self, i: usize) -> Result<()>;
    /// Device time between marks `a` and `b`, both done.
    fn between(&self, a: usize, b: usize) -> Result<Duration>;
}

#[cfg(feature = "cuda")]
struct CudaTimeline<'a> {
    backend: &'a m40llm::backend::cuda::CudaBackend,
    events: Vec<m40llm::backend::cuda::runtime::OwnedEvent>,
}

#[cfg(feature = "cuda")]
impl<'a> CudaTimeline<'a> {
    fn new(backend: &'a m40llm::backend::cuda::CudaBackend, marks: usize) -> Result<Self> {
        let events = (0..marks)
            .map(|_| m40llm::backend::cuda::runtime::OwnedEvent::timed())
            .collect::<Result<_>>()?;
        Ok(CudaTimeline { backend, events })
    }
}

#[cfg(feature = "cuda")]
impl Timeline for CudaTimeline<'_> {
    fn mark(&self, i: usize) -> Result<()> {
        let event = self.events.get(i).ok_or_else(|| {
            m40llm::error::Error::internal("more operations in a step than timeline marks")
        })?;
        self.backend.record_event(event)
    }
    fn between(&self, a: usize, b: usize) -> Result<Duration> {
        let ms = self.events[b].elapsed_since(&self.events[a])?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) * 1e-3))
    }
}

/// One timeline-timed step: per operation, its name and the host's time
/// (since the step began) when it had been enqueued; mark i + 1 follows it.
#[derive(Default)]
struct Step {
    started: Option<Instant>,
    ops: Vec<(String, Duration)>,
}

/// A backend that times each operation of the one it wraps.
struct Profiled<'a, B: Backend> {
    inner: &'a B,
    /// One value read back to wait for the device.
    probe: B::Buffer,
    /// Per operation: calls and total time.
    times: RefCell<BTreeMap<String, (u32, Duration)>>,
    /// Set while decode steps are timed on the device's timeline.
    timeline: Cell<Option<&'a dyn Timeline>>,
    step: RefCell<Step>,
    /// Per timeline-timed pass: device time and host time to enqueue it.
    pass_times: RefCell<(Duration, Duration)>,
}

impl<'a, B: Backend> Profiled<'a, B> {
    fn new(inner: &'a B) -> Result<Self> {
        Ok(Profiled {
            inner,
            probe: inner.buffer(1)?,
            times: RefCell::new(BTreeMap::new()),
            timeline: Cell::new(None),
            step: RefCell::new(Step::default()),
            pass_times: RefCell::new(Default::default()),
        })
    }

    fn wait(&self) -> Result<()> {
        self.inner.read(&self.probe, &mut [0f32])
    }

    fn time<T>(&self, op: String, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if let Some(timeline) = self.timeline.get() {
            let result = f()?;
            let mut step = self.step.borrow_mut();
            let host = step.started.expect("a timed step began").elapsed();
            step.ops.push((op, host));
            timeline.mark(step.ops.len())?;
            return Ok(result);
        }
        self.wait()?;
        let start = Instant::now();
        let result = f()?;
        self.wait()?;
        self.add(op, start.elapsed());
        Ok(result)
    }

    fn add(&self, op: String, time: Duration) {
        let mut times = self.times.borrow_mut();
        let entry = times.entry(op).or_default();
        entry.0 += 1;
        entry.1 += time;
    }

    /// Runs `pass` (one forward pass) timed on `timeline`, after the device
    /// has finished earlier work: each operation's device time is from the
    /// mark before it to the mark after it.
    fn on_timeline(
        &self,
        timeline: &'a dyn Timeline,
        pass: impl FnOnce(&Self) -> Result<()>,
    ) -> Result<()> {
        self.wait()?;
        *self.step.borrow_mut() = Step {
            started: Some(Instant::now()),
            ops: Vec::new(),
        };
        timeline.mark(0)?;
        self.timeline.set(Some(timeline));
        let result = pass(self);
        self.timeline.set(None);
        result?;
        self.wait()?;
        let step = std::mem::take(&mut *self.step.borrow_mut());
        let device = timeline.between(0, step.ops.len())?;
        let mut enqueued = Duration::ZERO;
        for (i, (op, host)) in step.ops.into_iter().enumerate() {
            // The host's time excludes the final read, which waits.
            if op != "read to host" {
                enqueued = host;
            }
            self.add(op, timeline.between(i, i + 1)?);
        }
        let mut totals = self.pass_times.borrow_mut();
        totals.0 += device;
        totals.1 += enqueued;
        Ok(())
    }

    /// Prints the operations, slowest first, and clears the table.
    fn report(&self, title: &str, repeats: u32) {
        let mut rows: Vec<_> = std::mem::take(&mut *self.times.borrow_mut())
            .into_iter()
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.1 .1));
        let total: Duration = rows.iter().map(|r| r.1 .1).sum();
        let per_pass = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(repeats);
        println!(
            "\n{title}: {:.3} ms per pass (sum of timed operations)",
            per_pass(total)
        );
        let (device, host) = std::mem::take(&mut *self.pass_times.borrow_mut());
        if device > Duration::ZERO {
            println!(
                "device timeline: {:.3} ms per pass; the host enqueued it in {:.3} ms",
                per_pass(device),
                per_pass(host)
            );
        }
        println!("{:>9} {:>7} {:>6}  operation", "ms/pass", "calls", "share");
        for (op, (calls, time)) in rows {
            println!(
                "{:9.3} {:7} {:5.1}%  {op}",
                per_pass(time),
                calls / repeats,
                100.0 * time.as_secs_f64() / total.as_secs_f64()
            );
        }
    }
}

fn shape(w: &Weight) -> String {
    format!("{}×{} {}", w.rows, w.cols, w.ty.name())
}

impl<B: Backend> Backend for Profiled<'_, B> {
    type Buffer = B::Buffer;
    type KvCache = B::KvCache;

    fn buffer(&self, len: usize) -> Result<B::Buffer> {
        self.inner.buffer(len)
    }
    fn read(&self, buffer: &B::Buffer, out: &mut [f32]) -> Result<()> {
        self.time("read to host".into(), || self.inner.read(buffer, out))
    }
    fn read_rows(
        &self,
        buffer: &B::Buffer,
        row_len: usize,
        rows: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        self.time("read to host".into(), || {
            self.inner.read_rows(buffer, row_len, rows)
        })
    }
    fn write(&self, buffer: &mut B::Buffer, values: &[f32]) -> Result<()> {
        self.inner.write(buffer, values)
    }
    fn kv_cache(&self, n_ctx: usize, layers: &[LayerState]) -> Result<B::KvCache> {
        self.inner.kv_cache(n_ctx, layers)
    }
    fn reset_recurrent(&self, cache: &mut B::KvCache) {
        self.inner.reset_recurrent(cache)
    }
    fn embed(&self, table: &Weight, tokens: &[u32], scale: f32, out: &mut B::Buffer) -> Result<()> {
        self.time("embed".into(), || {
            self.inner.embed(table, tokens, scale, out)
        })
    }
    fn matmul(&self, w: &Weight, x: &B::Buffer, rows: usize, out: &mut B::Buffer) -> Result<()> {
        self.time(format!("matmul {}", shape(w)), || {
            self.inner.matmul(w, x, rows, out)
        })
    }
    fn add_bias(&self, x: &mut B::Buffer, bias: &Weight, rows: usize) -> Result<()> {
        self.time("add_bias".into(), || self.inner.add_bias(x, bias, rows))
    }
    fn rms_norm(&self, x: &mut B::Buffer, weight: &Weight, eps: f32, len: usize) -> Result<()> {
        self.time("rms_norm".into(), || {
            self.inner.rms_norm(x, weight, eps, len)
        })
    }
    fn rms_normalize(&self, x: &mut B::Buffer, group: usize, eps: f32, len: usize) -> Result<()> {
        self.time("rms_normalize".into(), || {
            self.inner.rms_normalize(x, group, eps, len)
        })
    }
    fn scale_by(&self, x: &mut B::Buffer, factor: &Weight, len: usize) -> Result<()> {
        self.time("scale_by".into(), || self.inner.scale_by(x, factor, len))
    }
    fn soft_cap(&self, x: &mut B::Buffer, cap: f32, len: usize) -> Result<()> {
        self.time("soft_cap".into(), || self.inner.soft_cap(x, cap, len))
    }
    fn gather_rows(
        &self,
        src: &B::Buffer,
        width: usize,
        rows: &[usize],
        out: &mut B::Buffer,
    ) -> Result<()> {
        self.time("gather_rows".into(), || {
            self.inner.gather_rows(src, width, rows, out)
        })
    }
    fn add(&self, x: &mut B::Buffer, y: &B::Buffer, len: usize) -> Result<()> {
        self.time("add".into(), || self.inner.add(x, y, len))
    }
    fn rope(
        &self,
        x: &mut B::Buffer,
        n_heads: usize,
        head_dim: usize,
        positions: &[SeqPos],
        rope: &Rope,
    ) -> Result<()> {
        self.time("rope".into(), || {
            self.inner.rope(x, n_heads, head_dim, positions, rope)
        })
    }
    fn glu(
        &self,
        glu: Glu,
        gate: &B::Buffer,
        up: &B::Buffer,
        len: usize,
        out: &mut B::Buffer,
    ) -> Result<()> {
        self.time("glu".into(), || self.inner.glu(glu, gate, up, len, out))
    }
    fn store_kv(
        &self,
        caches: &mut [&mut B::KvCache],
        layer: usize,
        k: &B::Buffer,
        v: &B::Buffer,
        rows: &[SeqPos],
    ) -> Result<()> {
        self.time("store_kv".into(), || {
            self.inner.store_kv(caches, layer, k, v, rows)
        })
    }
    fn attention(
        &self,
        caches: &[&mut B::KvCache],
        layer: usize,
        q: &B::Buffer,
        rows: &[SeqPos],
        shape: &AttentionShape,
        out: &mut B::Buffer,
    ) -> Result<()> {
        let window = shape
            .window
            .map_or(String::new(), |w| format!(", window {w}"));
        self.time(format!("attention{window}"), || {
            self.inner.attention(caches, layer, q, rows, shape, out)
        })
    }
    fn delta_net(
        &self,
        caches: &mut [&mut B::KvCache],
        step: DeltaNetStep,
        qkv: &B::Buffer,
        alpha: &B::Buffer,
        beta: &B::Buffer,
        out: &mut B::Buffer,
    ) -> Result<()> {
        let s = step.shape;
        let name = format!("gated delta net {} × {}²", s.n_v_heads, s.head_dim);
        self.time(name, || {
            self.inner.delta_net(caches, step, qkv, alpha, beta, out)
        })
    }
    fn split_halves(
        &self,
        x: &B::Buffer,
        groups: usize,
        half: usize,
        first: &mut B::Buffer,
        second: &mut B::Buffer,
    ) -> Result<()> {
        self.time("split query and gate".into(), || {
            self.inner.split_halves(x, groups, half, first, second)
        })
    }
    fn sigmoid_gate(&self, x: &mut B::Buffer, gate: &B::Buffer, len: usize) -> Result<()> {
        self.time("sigmoid gate".into(), || {
            self.inner.sigmoid_gate(x, gate, len)
        })
    }
    fn gated_add(
        &self,
        x: &mut B::Buffer,
        y: &B::Buffer,
        gate: &B::Buffer,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        self.time("gated add".into(), || {
            self.inner.gated_add(x, y, gate, rows, width)
        })
    }
    fn norm_moe_ffn_residual(
        &self,
        x: &mut B::Buffer,
        norm: Norm,
        rows: usize,
        experts: &Experts,
        glu: Glu,
        post_norm: Option<Norm>,
        scratch: Scratch<B::Buffer>,
    ) -> Result<()> {
        let name = format!(
            "norm + experts ({} of {}) {} + residual",
            experts.n_used,
            experts.n_expert,
            shape(&experts.gate.part(0, experts.n_expert))
        );
        self.time(name, || {
            self.inner
                .norm_moe_ffn_residual(x, norm, rows, experts, glu, post_norm, scratch)
        })
    }
    fn norm_moe_shared_ffn_residual(
        &self,
        x: &mut B::Buffer,
        norm: Norm,
        rows: usize,
        experts: &Experts,
        shared: &SharedExpert,
        glu: Glu,
        post_norm: Option<Norm>,
        scratch: Scratch<B::Buffer>,
        shared_scratch: SharedScratch<B::Buffer>,
    ) -> Result<()> {
        let name = format!(
            "norm + experts ({} of {}) {} + shared expert + residual",
            experts.n_used,
            experts.n_expert,
            shape(&experts.gate.part(0, experts.n_expert))
        );
        self.time(name, || {
            self.inner.norm_moe_shared_ffn_residual(
                x,
                norm,
                rows,
                experts,
                shared,
                glu,
                post_norm,
                scratch,
                shared_scratch,
            )
        })
    }
    fn norm_matmuls(
        &self,
        x: &B::Buffer,
        norm: Norm,
        rows: usize,
        normed: &mut B::Buffer,
        products: &mut [Product<B::Buffer>],
    ) -> Result<()> {
        let shapes: Vec<String> = products.iter().map(|p| shape(p.w)).collect();
        self.time(format!("norm + matmuls {}", shapes.join(", ")), || {
            self.inner.norm_matmuls(x, norm, rows, normed, products)
        })
    }
    fn norm_qkv_attention_inputs(
        &self,
        x: &B::Buffer,
        norm: Norm,
        normed: &mut B::Buffer,
        qkv: &mut [Product<B::Buffer>; 3],
        caches: &mut [&mut B::KvCache],
        step: AttentionStep,
    ) -> Result<()> {
        let shapes: Vec<String> = qkv.iter().map(|p| shape(p.w)).collect();
        self.time(
            format!("norm + Q/K/V {} + attention inputs", shapes.join(", ")),
            || {
                self.inner
                    .norm_qkv_attention_inputs(x, norm, normed, qkv, caches, step)
            },
        )
    }
    fn norm_gated_ffn(
        &self,
        x: &B::Buffer,
        norm: Norm,
        rows: usize,
        ffn: GatedFfn,
        scratch: Scratch<B::Buffer>,
        out: &mut B::Buffer,
    ) -> Result<()> {
        self.time(
            format!("norm + gate/up + glu 2 × {}", shape(ffn.gate)),
            || self.inner.norm_gated_ffn(x, norm, rows, ffn, scratch, out),
        )
    }
    fn matmul_residual(
        &self,
        w: &Weight,
        bias: Option<&Weight>,
        a: &B::Buffer,
        rows: usize,
        post_norm: Option<Norm>,
        product: &mut B::Buffer,
        x: &mut B::Buffer,
    ) -> Result<()> {
        self.time(format!("matmul + residual {}", shape(w)), || {
            self.inner
                .matmul_residual(w, bias, a, rows, post_norm, product, x)
        })
    }
    fn attention_inputs(
        &self,
        caches: &mut [&mut B::KvCache],
        step: AttentionStep,
        q: &mut B::Buffer,
        k: &mut B::Buffer,
        v: &B::Buffer,
    ) -> Result<()> {
        self.time("attention inputs (norms, RoPE, KV store)".into(), || {
            self.inner.attention_inputs(caches, step, q, k, v)
        })
    }
}

fn profile<'a, B: Backend>(
    b: &'a B,
    timeline: Option<&'a dyn Timeline>,
    model: &Model,
    prompt: usize,
    batches: &[usize],
) -> Result<()> {
    let (_, hp) = model.config();
    // The prompt, then a warm-up and the timed steps of each batch size.
    let n_ctx = prompt + 8 * batches.len().max(1);
    let (n_layer, n_vocab) = (hp.n_layer as usize, hp.n_vocab as usize);
    let sessions = batches.iter().copied().max().unwrap_or(1);
    let profiled = Profiled::new(b)?;
    let tokens: Vec<u32> = (0..prompt)
        .map(|i| (i * 7919 % n_vocab.max(1)) as u32)
        .collect();
    let chunk: Vec<SeqPos> = (0..prompt).map(|pos| SeqPos { seq: 0, pos }).collect();
    // Keys and values for the attention layers, a state for the others.
    let layers: Vec<LayerState> = (0..n_layer).map(|il| hp.layer_state(il)).collect();
    let mut caches = (0..sessions)
        .map(|_| b.kv_cache(n_ctx, &layers))
        .collect::<Result<Vec<_>>>()?;

    // Every session's prompt, the first one timed after a warm-up pass.
    for cache in caches.iter_mut() {
        forward(b, model, &mut [cache], &tokens, &chunk, &[prompt - 1])?;
    }
    // The timed pass takes the prompt again from the start: a recurrent
    // state cannot, so it starts anew.
    b.reset_recurrent(&mut caches[0]);
    let mut prompt_pass = |p: &Profiled<B>| {
        forward(
            p,
            model,
            &mut [&mut caches[0]],
            &tokens,
            &chunk,
            &[prompt - 1],
        )
        .map(|_| ())
    };
    match timeline {
        Some(timeline) => profiled.on_timeline(timeline, prompt_pass)?,
        None => prompt_pass(&profiled)?,
    }
    profiled.report(&format!("prompt of {prompt} rows"), 1);

    // Each session's steps go on from where it stands (a recurrent state
    // takes every token once).
    const STEPS: u32 = 5;
    let mut lengths = vec![prompt; sessions];
    for &batch in batches {
        let step_tokens = vec![1u32; batch];
        let logit_rows: Vec<usize> = (0..batch).collect();
        let rows_now = |lengths: &[usize]| -> Vec<SeqPos> {
            (0..batch)
                .map(|seq| SeqPos {
                    seq,
                    pos: lengths[seq],
                })
                .collect()
        };
        let mut own: Vec<&mut B::KvCache> = caches.iter_mut().take(batch).collect();
        forward(
            b,
            model,
            &mut own,
            &step_tokens,
            &rows_now(&lengths),
            &logit_rows,
        )?;
        lengths[..batch].iter_mut().for_each(|l| *l += 1);
        // Each session's logits land in its own vector, as in
        // Session::decode_batch.
        let mut logits = vec![Vec::new(); batch];
        for _ in 0..STEPS {
            let rows = rows_now(&lengths);
            let mut pass = |p: &Profiled<B>| {
                let device =
                    logits_on_device(p, model, &mut own, &step_tokens, &rows, &logit_rows)?;
                let mut out: Vec<&mut Vec<f32>> = logits.iter_mut().collect();
                p.read_rows(&device, n_vocab, &mut out)
            };
            match timeline {
                Some(timeline) => profiled.on_timeline(timeline, pass)?,
                None => pass(&profiled)?,
            }
            lengths[..batch].iter_mut().for_each(|l| *l += 1);
        }
        profiled.report(
            &format!("decode step of {batch} session(s) from position {prompt}"),
            STEPS,
        );
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let Some(path) = args.first() else {
        eprintln!("usage: op_profile MODEL.gguf [DEVICE (-1: CPU)] [PROMPT] [BATCHES, e.g. 1,8] [CPU THREADS]");
        std::process::exit(2);
    };
    let number = |i: usize, default: i64| -> i64 {
        args.get(i).map_or(default, |v| {
            v.parse().unwrap_or_else(|_| {
                eprintln!("op_profile: '{v}' is not a number");
                std::process::exit(2)
            })
        })
    };
    let device = number(1, 0) as i32;
    let prompt = number(2, 512).max(1) as usize;
    let batches: Vec<usize> = args
        .get(3)
        .map_or("1,8", |s| s.as_str())
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .filter(|&b| b > 0)
        .collect();
    let options = LoadOptions {
        device,
        n_threads: number(4, 0).max(0) as u32,
        use_mmap: true,
        vocab_only: false,
    };
    let result = Model::load(path.as_ref(), options).and_then(|model| {
        println!("{} on {}", path, model.device().name());
        match &model.stages()[0].backend {
            ModelBackend::Cpu(b) => profile(b, None, &model, prompt, &batches),
            #[cfg(feature = "cuda")]
            ModelBackend::Cuda(b) => {
                // Marks for every operation of a decode step, with room to spare.
                let timeline = CudaTimeline::new(b, 4096)?;
                profile(&**b, Some(&timeline), &model, prompt, &batches)
            }
        }
    });
    if let Err(e) = result {
        eprintln!("op_profile: {e}");
        std::process::exit(1);
    }
}
