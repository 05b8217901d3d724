//! Matrix × vector throughput of every tensor format on the CPU, in GB/s of
//! weights read, next to this machine's memory read bandwidth measured in the
//! same run.
//!
//!     cargo bench --bench matvec                 # 4096 x 4096, 1 and 2 threads
//!     cargo bench --bench matvec -- q4_0 q4_k    # only these types
//!     cargo bench --bench matvec -- --isa=avx2   # scalar, avx2 or avx512 kernels
//!     cargo bench --bench matvec -- --n=1024     # an n x n matrix instead
//!     cargo bench --bench matvec -- --rows=262144 --cols=640 q8_0   # any shape
//!     cargo bench --bench matvec -- --interleaved q8_0 q4_k   # stored interleaved
//!
//! "hot": one 4096 × 4096 matrix multiplied again and again (it stays in the
//! CPU caches when they hold it). "cold": a different matrix each time, from a
//! set larger than the caches, so every byte comes from DRAM — the decode
//! case for a model bigger than the caches.

use std::time::Instant;

use m40llm::backend::cpu::{matmul, ThreadPool, WeightMatrix};
use m40llm::quant::{GgmlType, Isa, Kernels};

/// Weights cycled through in the cold runs: well past any L3 cache.
const COLD_BYTES: usize = 1 << 30;

const TYPES: [GgmlType; 16] = GgmlType::SUPPORTED;

/// Weights with valid, small f16 scales in every block (the values do not
/// change the speed, but NaNs and infinities could).
fn weights(ty: GgmlType, bytes: usize) -> Vec<u8> {
    let block = ty.block_bytes() as usize;
    let mut state = 0x12345678u32;
    let mut data: Vec<u8> = (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state >> 24) as u8
        })
        .collect();
    // Real weights are normal numbers: keep every f32 / f16 / bf16 value in
    // [2^-8, 2^8) in magnitude (no NaN, infinity or subnormal, whose
    // microcode assists would distort the timing).
    match ty {
        GgmlType::F32 => data
            .chunks_exact_mut(4)
            .for_each(|v| v[3] = 0x3C | (v[3] & 0x83)),
        GgmlType::F16 => data
            .chunks_exact_mut(2)
            .for_each(|v| v[1] = 0x30 | (v[1] & 0x87)),
        GgmlType::Bf16 => data
            .chunks_exact_mut(2)
            .for_each(|v| v[1] = 0x3C | (v[1] & 0x83)),
        _ => {}
    }
    if block > 4 {
        for b in data.chunks_exact_mut(block) {
            for at in [0, 2, block - 2, block - 4] {
                b[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
        }
    }
    data
}

/// GB/s of reading `COLD_BYTES` with `threads` threads (a sum over u64s).
fn read_bandwidth(buffer: &[u64], pool: &ThreadPool) -> f64 {
    let chunks = pool.n_threads() * 16;
    let per = buffer.len() / chunks;
    let sink = std::sync::atomic::AtomicU64::new(0);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        pool.run(chunks, &|c| {
            let part = &buffer[c * per..(c + 1) * per];
            let mut acc = [0u64; 8];
            for w in part.chunks_exact(8) {
                for k in 0..8 {
                    acc[k] = acc[k].wrapping_add(w[k]);
                }
            }
            sink.fetch_add(
                acc.iter().fold(0, |a, &b| a.wrapping_add(b)),
                std::sync::atomic::Ordering::Relaxed,
            );
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.into_inner());
    (per * chunks * 8) as f64 / best / 1e9
}

fn gbps(
    pool: &ThreadPool,
    kernels: Kernels,
    ty: GgmlType,
    matrices: &[(&[u8], Option<&[u8]>)],
    x: &[f32],
    y: &mut [f32],
    reps: usize,
) -> f64 {
    let (rows, cols) = (y.len(), x.len());
    let run = |&(m, interleaved): &(&[u8], Option<&[u8]>), y: &mut [f32]| {
        let w = WeightMatrix {
            interleaved,
            ..WeightMatrix::new(ty, rows, cols, m)
        };
        matmul(pool, kernels, &w, x, 1, y).unwrap();
    };
    run(&matrices[0], y); // warm-up
                          // The fastest of several timed rounds: on a shared machine the others'
                          // work only ever slows a round down.
    let rounds = 5;
    let per_round = reps.div_ceil(rounds).max(1);
    let mut best = f64::MAX;
    for round in 0..rounds {
        let t = Instant::now();
        for i in 0..per_round {
            run(&matrices[(round * per_round + i) % matrices.len()], y);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    (matrices[0].0.len() * per_round) as f64 / best / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.to_uppercase())
        .collect();
    let kernels = match args.iter().find_map(|a| a.strip_prefix("--isa=")) {
        Some(name) => Isa::all_available()
            .into_iter()
            .find(|isa| isa.name() == name)
            .and_then(Kernels::for_isa)
            .unwrap_or_else(|| {
                panic!(
                    "--isa={name}: not one of {:?} on this CPU",
                    Isa::all_available()
                )
            }),
        None => Kernels::best(),
    };
    let n: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("--n="))
        .map_or(4096, |v| v.parse().expect("--n=N"));
    let dim = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(name))
            .map_or(n, |v| v.parse().expect("a number of rows or columns"))
    };
    let (rows, cols) = (dim("--rows="), dim("--cols="));
    let interleave = args.iter().any(|a| a == "--interleaved");
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let buffer = vec![1u64; COLD_BYTES / 8];
    let bandwidth: Vec<f64> = pools.iter().map(|p| read_bandwidth(&buffer, p)).collect();
    drop(buffer);
    println!("kernels: {:?}; matrix {rows} x {cols}; memory read bandwidth: {:.1} GB/s (1 thread), {:.1} GB/s (2 threads)", kernels.isa(), bandwidth[0], bandwidth[1]);
    println!();
    println!("| type | bytes | hot 1 thr GB/s | hot 2 thr GB/s | cold 1 thr GB/s | cold 2 thr GB/s | cold 2 thr % of read bw |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut y = vec![0f32; rows];
    for ty in TYPES {
        if !filter.is_empty() && !filter.iter().any(|f| f == ty.name()) {
            continue;
        }
        let Some(row_bytes) = ty.row_bytes(cols as u64) else {
            continue;
        };
        let bytes = row_bytes as usize * rows;
        let n_cold = COLD_BYTES.div_ceil(bytes);
        let cold: Vec<Vec<u8>> = {
            let one = weights(ty, bytes);
            // Distinct copies: the same bytes at different addresses defeat the caches.
            (0..n_cold).map(|_| one.clone()).collect()
        };
        let copies: Vec<Option<Vec<u8>>> = cold
            .iter()
            .map(|m| {
                interleave
                    .then(|| m40llm::quant::interleave(ty, m, rows, cols))
                    .flatten()
            })
            .collect();
        let cold_refs: Vec<(&[u8], Option<&[u8]>)> = cold
            .iter()
            .zip(&copies)
            .map(|(m, c)| (m.as_slice(), c.as_deref()))
            .collect();
        let hot_refs = &cold_refs[..1];
        let hot: Vec<f64> = pools
            .iter()
            .map(|p| gbps(p, kernels, ty, hot_refs, &x, &mut y, (1 << 30) / bytes + 10))
            .collect();
        let cold_gbps: Vec<f64> = pools
            .iter()
            .map(|p| gbps(p, kernels, ty, &cold_refs, &x, &mut y, n_cold * 2))
            .collect();
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0}% |",
            ty.name(),
            bytes,
            hot[0],
            hot[1],
            cold_gbps[0],
            cold_gbps[1],
            100.0 * cold_gbps[1] / bandwidth[1]
        );
    }
}
