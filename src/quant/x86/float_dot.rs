//! Dot products of F32 / F16 / BF16 weight rows with f32 activations, and
//! attention's products over F16 rows of a cache (one query's dots with
//! many keys, a weighted sum of many values). Eight (AVX2) or
//! sixteen (AVX-512) lanes of f32 fused multiply-adds; a row length that is
//! not a multiple of the width ends in scalar code.

// The attention kernels index per-head arrays (acc[g], the queries) in step.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::prefetch_lines;
use crate::quant::float::{bf16_to_f32, f16_at, softmax_lanes};

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The lane sums of four vectors at once (three horizontal adds and one
/// fold instead of four reductions).
#[inline(always)]
unsafe fn sums4_256(v: [__m256; 4]) -> [f32; 4] {
    let h = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), s);
    out
}

/// The scalar tail: values `from..n` of the row.
fn tail(row: &[u8], x: &[f32], from: usize, width: usize, value: impl Fn(&[u8]) -> f32) -> f32 {
    (from..x.len().min(row.len() / width))
        .map(|i| value(&row[i * width..]) * x[i])
        .sum()
}

/// Software prefetch a kilobyte ahead (see `int_dot::prefetch`).
#[inline(always)]
unsafe fn prefetch(row: &[u8], at: usize) {
    // Prefetching never faults, so the address may lie past the row's end.
    _mm_prefetch(row.as_ptr().wrapping_add(at + 1024).cast(), _MM_HINT_T0);
}

fn f32_at(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}
fn bf16_at(b: &[u8]) -> f32 {
    bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// A vector width for attention's kernels: f32 lanes, loads of f16 and
/// f32, and a fold to eight lanes for the reductions.
trait Lanes {
    type V: Copy;
    const N: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn f16s(p: *const u8) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn fold(v: Self::V) -> __m256;
    /// Key rows a pass of `dots_group` takes at once (their accumulators,
    /// one a query, and their keys in registers).
    const ROWS: usize;
    /// Vectors of value columns a pass of `axpys_group` takes at once.
    const COLUMNS: usize;
    /// Queries a pass of `dots_many` or `axpys_many` takes at once: with
    /// more than four, `dots_group` takes two rows at a time and
    /// `axpys_group` two vectors of columns, their accumulators in
    /// registers all the same (sixteen of 512 bits; AVX2's sixteen
    /// registers hold no more than four queries').
    const QUERIES: usize;
    /// The largest head dimension whose prompt blocks take
    /// `dots_keys_in_lanes`. The lane sums it saves cost a share of a dot
    /// that shrinks as the head grows, while each tile's transposition and
    /// its loads of the tile cost the same share: past this (in `cargo bench
    /// --bench attention`) `dots_group` was as fast or faster.
    const KEYS_IN_LANES_DIM: usize;
    /// The lane sums of `N` vectors (`v[r]`'s in lane r), by a tree of
    /// shuffles and adds: about three operations a vector where reducing
    /// each on its own takes eight.
    unsafe fn row_sums(v: &[Self::V]) -> Self::V;
    /// Lane-wise sum.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// Transposes the `N` × `N` matrix of `v`'s `N` vectors in place.
    unsafe fn transpose(v: &mut [Self::V]);
}

struct Lanes8;
struct Lanes16;

impl Lanes for Lanes8 {
    type V = __m256;
    const N: usize = 8;
    const ROWS: usize = 2;
    const COLUMNS: usize = 2;
    const QUERIES: usize = 4;
    const KEYS_IN_LANES_DIM: usize = 64;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fold(v: __m256) -> __m256 {
        v
    }
    #[inline(always)]
    unsafe fn row_sums(v: &[__m256]) -> __m256 {
        // Halves of a pair added: half h of pair[i] holds 4 partial sums of
        // v[2i + h].
        // (Loops, not `array::from_fn`: a closure would not inherit the
        // caller's target features, and its intrinsics would not inline.)
        let mut pair = [_mm256_setzero_ps(); 4];
        for i in 0..4 {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            pair[i] = _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            );
        }
        // Within each half: 2 partial sums of each of two rows.
        let mut quad = [_mm256_setzero_ps(); 2];
        for i in 0..2 {
            let (c, d) = (pair[2 * i], pair[2 * i + 1]);
            quad[i] = _mm256_add_ps(
                _mm256_shuffle_ps::<0x44>(c, d),
                _mm256_shuffle_ps::<0xEE>(c, d),
            );
        }
        // Lane l holds row 2l (l < 4) or row 2(l − 4) + 1.
        let (e, f) = (quad[0], quad[1]);
        let sums = _mm256_add_ps(
            _mm256_shuffle_ps::<0x88>(e, f),
            _mm256_shuffle_ps::<0xDD>(e, f),
        );
        _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn transpose(v: &mut [__m256]) {
        // Pairs of rows interleaved, then pairs of pairs: in 128-bit half k,
        // column 4k + c of rows 4h..4h + 4 (h = 0, 1) in u[c + 4h].
        let mut t = [_mm256_setzero_ps(); 8];
        for i in 0..4 {
            t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
        }
        let mut u = [_mm256_setzero_ps(); 8];
        for h in 0..2 {
            let (a, b, c, d) = (t[4 * h], t[4 * h + 1], t[4 * h + 2], t[4 * h + 3]);
            u[4 * h] = _mm256_shuffle_ps::<0x44>(a, c);
            u[4 * h + 1] = _mm256_shuffle_ps::<0xEE>(a, c);
            u[4 * h + 2] = _mm256_shuffle_ps::<0x44>(b, d);
            u[4 * h + 3] = _mm256_shuffle_ps::<0xEE>(b, d);
        }
        // Column c's rows 0–3 from the low halves, 4–7 from the high ones.
        for c in 0..4 {
            v[c] = _mm256_permute2f128_ps::<0x20>(u[c], u[c + 4]);
            v[c + 4] = _mm256_permute2f128_ps::<0x31>(u[c], u[c + 4]);
        }
    }
}

impl Lanes for Lanes16 {
    type V = __m512;
    const N: usize = 16;
    const ROWS: usize = 4;
    const COLUMNS: usize = 4;
    const QUERIES: usize = 8;
    const KEYS_IN_LANES_DIM: usize = 128;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    /// The two 256-bit halves added.
    #[inline(always)]
    unsafe fn fold(v: __m512) -> __m256 {
        let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        _mm256_add_ps(_mm512_castps512_ps256(v), high)
    }
    #[inline(always)]
    unsafe fn row_sums(v: &[__m512]) -> __m512 {
        // 128-bit chunks of a pair added: chunks 0–1 of pair[i] hold 8
        // partial sums of v[2i], chunks 2–3 those of v[2i + 1].
        // (Loops, not `array::from_fn`: see `Lanes8::row_sums`.)
        let mut pair = [_mm512_setzero_ps(); 8];
        for i in 0..8 {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            pair[i] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xEE>(a, b),
            );
        }
        // Chunk c of quad[i] holds 4 partial sums of v[4i + c].
        let mut quad = [_mm512_setzero_ps(); 4];
        for i in 0..4 {
            let (c, d) = (pair[2 * i], pair[2 * i + 1]);
            quad[i] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(c, d),
                _mm512_shuffle_f32x4::<0xDD>(c, d),
            );
        }
        // Chunk c of oct[i]: 2 partial sums of v[8i + c], 2 of v[8i + 4 + c].
        let mut oct = [_mm512_setzero_ps(); 2];
        for i in 0..2 {
            let (e, f) = (quad[2 * i], quad[2 * i + 1]);
            oct[i] = _mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(e, f),
                _mm512_shuffle_ps::<0xEE>(e, f),
            );
        }
        // Lane 4c + m holds row 4m + c.
        let (g, h) = (oct[0], oct[1]);
        let sums = _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(g, h),
            _mm512_shuffle_ps::<0xDD>(g, h),
        );
        _mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
            sums,
        )
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn transpose(v: &mut [__m512]) {
        // Pairs of rows interleaved, then pairs of pairs: in 128-bit chunk k,
        // column 4k + c of rows 4h..4h + 4 (h = 0..4) in u[c + 4h].
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
        }
        let mut u = [_mm512_setzero_ps(); 16];
        for h in 0..4 {
            let (a, b) = (_mm512_castps_pd(t[4 * h]), _mm512_castps_pd(t[4 * h + 1]));
            let (c, d) = (
                _mm512_castps_pd(t[4 * h + 2]),
                _mm512_castps_pd(t[4 * h + 3]),
            );
            u[4 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
            u[4 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
            u[4 * h + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
            u[4 * h + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
        }
        // Column 4k + c gathers chunk k of u[c], u[c + 4], u[c + 8], u[c + 12].
        for c in 0..4 {
            let even_low = _mm512_shuffle_f32x4::<0x88>(u[c], u[c + 4]);
            let even_high = _mm512_shuffle_f32x4::<0x88>(u[c + 8], u[c + 12]);
            let odd_low = _mm512_shuffle_f32x4::<0xDD>(u[c], u[c + 4]);
            let odd_high = _mm512_shuffle_f32x4::<0xDD>(u[c + 8], u[c + 12]);
            v[c] = _mm512_shuffle_f32x4::<0x88>(even_low, even_high);
            v[c + 8] = _mm512_shuffle_f32x4::<0xDD>(even_low, even_high);
            v[c + 4] = _mm512_shuffle_f32x4::<0x88>(odd_low, odd_high);
            v[c + 12] = _mm512_shuffle_f32x4::<0xDD>(odd_low, odd_high);
        }
    }
}

/// The most `Lanes::QUERIES` of any width.
const MAX_QUERIES: usize = 8;

/// The most `Lanes::N`, `Lanes::ROWS` and `Lanes::COLUMNS` of any width.
const MAX_LANES: usize = 16;
const MAX_ROWS: usize = 4;
const MAX_COLUMNS: usize = 4;

/// Cache rows the attention kernels prefetch ahead of the one they read
/// (past a span's end: the next span's rows).
const ROWS_AHEAD: usize = 24;

/// `out[g · n + j]` = row j · query g for the `G` queries of `q`, for rows
/// `done..n` (`done`, a multiple of `N`: rows whose sums are already there,
/// from `dots_keys_in_lanes`).
#[inline(always)]
unsafe fn dots_group<L: Lanes, const G: usize>(
    rows: &[u8],
    stride: usize,
    q: &[f32],
    dk: usize,
    out: &mut [f32],
    n: usize,
    done: usize,
) {
    let full = dk / L::N * L::N;
    assert!(q.len() == G * dk && out.len() == G * n && done.is_multiple_of(L::N) && done <= n);
    let qp = q.as_ptr();
    // Tiles of N rows: each row's products in vectors, reduced together.
    let tiled = n / L::N * L::N;
    let mut products = [[L::zero(); MAX_LANES]; MAX_QUERIES];
    // Rows a step of the pass takes: each query vector loaded once for
    // them all, their accumulators in registers.
    let rows_at_once = if G > 4 { 2 } else { L::ROWS };
    for j0 in (done..tiled).step_by(L::N) {
        for r in (0..L::N).step_by(rows_at_once) {
            let mut rp = [std::ptr::null::<u8>(); MAX_ROWS];
            for (k, p) in rp.iter_mut().enumerate().take(rows_at_once) {
                *p = rows[(j0 + r + k) * stride..][..dk * 2].as_ptr();
                prefetch_lines(p.wrapping_add(ROWS_AHEAD * stride), dk * 2);
            }
            let mut acc = [[L::zero(); MAX_QUERIES]; MAX_ROWS];
            let mut i = 0;
            while i < full {
                let mut k = [L::zero(); MAX_ROWS];
                for m in 0..rows_at_once {
                    // SAFETY: i + N ≤ dk: inside each row and each query.
                    k[m] = L::f16s(rp[m].add(i * 2));
                }
                for g in 0..G {
                    let q = L::load(qp.add(g * dk + i));
                    for m in 0..rows_at_once {
                        acc[m][g] = L::fmadd(k[m], q, acc[m][g]);
                    }
                }
                i += L::N;
            }
            for g in 0..G {
                for m in 0..rows_at_once {
                    products[g][r + m] = acc[m][g];
                }
            }
        }
        for g in 0..G {
            let sums = &mut out[g * n + j0..][..L::N];
            L::store(sums.as_mut_ptr(), L::row_sums(&products[g][..L::N]));
            if full < dk {
                for (r, sum) in sums.iter_mut().enumerate() {
                    let row = &rows[(j0 + r) * stride..][..dk * 2];
                    *sum += tail(row, &q[g * dk..(g + 1) * dk], full, 2, f16_at);
                }
            }
        }
    }
    // The rows past the last tile, each on its own.
    for j in tiled..n {
        let row = &rows[j * stride..][..dk * 2];
        let rp = row.as_ptr();
        prefetch_lines(rp.wrapping_add(ROWS_AHEAD * stride), dk * 2);
        let mut acc = [L::zero(); MAX_QUERIES];
        let mut i = 0;
        while i < full {
            // SAFETY: i + N ≤ dk: inside the row and each query.
            let k = L::f16s(rp.add(i * 2));
            for g in 0..G {
                acc[g] = L::fmadd(k, L::load(qp.add(g * dk + i)), acc[g]);
            }
            i += L::N;
        }
        // Each query's sum on its own, four at a time.
        let fours = [
            sums4_256([
                L::fold(acc[0]),
                L::fold(acc[1]),
                L::fold(acc[2]),
                L::fold(acc[3]),
            ]),
            if G > 4 {
                sums4_256([
                    L::fold(acc[4]),
                    L::fold(acc[5]),
                    L::fold(acc[6]),
                    L::fold(acc[7]),
                ])
            } else {
                [0.0; 4]
            },
        ];
        for g in 0..G {
            let sum = fours[g / 4][g % 4];
            out[g * n + j] = sum + tail(row, &q[g * dk..(g + 1) * dk], full, 2, f16_at);
        }
    }
}

/// Queries from which a call's whole tiles of keys take
/// `dots_keys_in_lanes` (where the head dimension is at most
/// `Lanes::KEYS_IN_LANES_DIM`): its conversion and transposition of each
/// tile cost about what the lane sums of eight queries' dots with it cost
/// in `dots_group`.
const KEYS_IN_LANES_QUERIES: usize = 8;

thread_local! {
    /// Each thread's transposed tile of keys for `dots_keys_in_lanes`
    /// (head dimension × `N` values), kept between calls.
    static KEY_TILE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `dots_group`'s sums for rows `0..tiled` (whole tiles of `N` rows) of
/// every query of `q`, by another route to the same bits. Each tile's keys
/// are converted and transposed once for all queries (vector d: dimension d
/// of the tile's `N` keys), so a multiply-add meets one query value with
/// `N` keys, and a query's `N` lane partials are added vector to vector in
/// `row_sums`' order (`tile_dots`) where `dots_group` adds across lanes:
/// no shuffles a query, and no accumulators copied out for them.
#[inline(always)]
unsafe fn dots_keys_in_lanes<L: Lanes>(
    rows: &[u8],
    stride: usize,
    q: &[f32],
    dk: usize,
    out: &mut [f32],
    tiled: usize,
) {
    let heads = q.len() / dk;
    let n = out.len() / heads;
    assert!(
        dk.is_multiple_of(L::N)
            && tiled.is_multiple_of(L::N)
            && tiled <= n
            && q.len() == heads * dk
    );
    assert!(tiled == 0 || (tiled - 1) * stride + dk * 2 <= rows.len());
    let mut tile = KEY_TILE.take();
    // Every value a tile uses is written before it is read.
    if tile.len() < dk * L::N {
        tile.resize(dk * L::N, 0.0);
    }
    let kt = tile.as_mut_ptr();
    for j0 in (0..tiled).step_by(L::N) {
        for j in 0..L::N {
            let row = rows.as_ptr().wrapping_add((j0 + j) * stride);
            prefetch_lines(row.wrapping_add(ROWS_AHEAD * stride), dk * 2);
        }
        for c in (0..dk).step_by(L::N) {
            let mut v = [L::zero(); MAX_LANES];
            for (j, v) in v.iter_mut().enumerate().take(L::N) {
                // SAFETY: row j0 + j < tiled and c + N ≤ dk (asserted above).
                *v = L::f16s(rows.as_ptr().add((j0 + j) * stride + c * 2));
            }
            L::transpose(&mut v[..L::N]);
            for (l, &v) in v.iter().enumerate().take(L::N) {
                // SAFETY: c + l < dk: inside the tile of dk · N values.
                L::store(kt.add((c + l) * L::N), v);
            }
        }
        let mut g = 0;
        while g < heads {
            let take = (heads - g).min(4);
            // SAFETY: queries g..g + take of `q`; their rows of `out` are sliced.
            let qg = q.as_ptr().add(g * dk);
            let sums = &mut out[g * n..(g + take) * n];
            match take {
                4 => tile_sums::<L, 4>(kt, qg, dk, sums, n, j0),
                3 => tile_sums::<L, 3>(kt, qg, dk, sums, n, j0),
                2 => tile_sums::<L, 2>(kt, qg, dk, sums, n, j0),
                _ => tile_sums::<L, 1>(kt, qg, dk, sums, n, j0),
            }
            g += take;
        }
    }
    KEY_TILE.set(tile);
}

/// The `Q` queries at `q` (dk values each) dotted with the transposed tile
/// `kt`, into columns `j0..j0 + N` of their rows of `out` (n apart).
#[inline(always)]
unsafe fn tile_sums<L: Lanes, const Q: usize>(
    kt: *const f32,
    q: *const f32,
    dk: usize,
    out: &mut [f32],
    n: usize,
    j0: usize,
) {
    let sums = tile_dots::<L, Q>(kt, q, dk);
    for (i, &s) in sums.iter().enumerate() {
        L::store(out[i * n + j0..][..L::N].as_mut_ptr(), s);
    }
}

/// Lane partials l and l + N / 2 of each query's dot with each key of the
/// tile, added (`row_sums`' first halving). Lane partial l is the sum, in
/// order, of the products at dimensions l, l + N, l + 2N, …, as lane l of
/// `dots_group`'s accumulator adds them; the two are computed in one loop,
/// so that twice the chains of multiply-adds are in flight.
#[inline(always)]
unsafe fn lane_pair<L: Lanes, const Q: usize>(
    kt: *const f32,
    q: *const f32,
    dk: usize,
    l: usize,
) -> [L::V; Q] {
    let half = L::N / 2;
    let mut low = [L::zero(); Q];
    let mut high = [L::zero(); Q];
    // SAFETY (the caller's): `kt` holds dk · N values and `q` Q queries of dk
    // each; l < N / 2 and dk is a multiple of N, so d + half < dk.
    for d in (l..dk).step_by(L::N) {
        let (keys_low, keys_high) = (
            L::load(kt.add(d * L::N)),
            L::load(kt.add((d + half) * L::N)),
        );
        for i in 0..Q {
            low[i] = L::fmadd(keys_low, L::splat(*q.add(i * dk + d)), low[i]);
            high[i] = L::fmadd(keys_high, L::splat(*q.add(i * dk + d + half)), high[i]);
        }
    }
    added::<L, Q>(low, high)
}

#[inline(always)]
unsafe fn added<L: Lanes, const Q: usize>(a: [L::V; Q], b: [L::V; Q]) -> [L::V; Q] {
    let mut sum = a;
    for (s, b) in sum.iter_mut().zip(b) {
        *s = L::add(*s, b);
    }
    sum
}

/// Each query's dots with the tile's keys: the lane partials added in the
/// halving tree of `row_sums` (16 lanes: l + 8, then + 4, + 2, + 1; 8
/// lanes: + 4, + 2, + 1), depth first so that few are live at once.
#[inline(always)]
unsafe fn tile_dots<L: Lanes, const Q: usize>(
    kt: *const f32,
    q: *const f32,
    dk: usize,
) -> [L::V; Q] {
    // (Calls, not a closure: see `Lanes8::row_sums`.)
    if L::N == 16 {
        let low = added::<L, Q>(
            added::<L, Q>(
                lane_pair::<L, Q>(kt, q, dk, 0),
                lane_pair::<L, Q>(kt, q, dk, 4),
            ),
            added::<L, Q>(
                lane_pair::<L, Q>(kt, q, dk, 2),
                lane_pair::<L, Q>(kt, q, dk, 6),
            ),
        );
        let high = added::<L, Q>(
            added::<L, Q>(
                lane_pair::<L, Q>(kt, q, dk, 1),
                lane_pair::<L, Q>(kt, q, dk, 5),
            ),
            added::<L, Q>(
                lane_pair::<L, Q>(kt, q, dk, 3),
                lane_pair::<L, Q>(kt, q, dk, 7),
            ),
        );
        added::<L, Q>(low, high)
    } else {
        added::<L, Q>(
            added::<L, Q>(
                lane_pair::<L, Q>(kt, q, dk, 0),
                lane_pair::<L, Q>(kt, q, dk, 2),
            ),
            added::<L, Q>(
                lane_pair::<L, Q>(kt, q, dk, 1),
                lane_pair::<L, Q>(kt, q, dk, 3),
            ),
        )
    }
}

/// `$f::<$lanes, G>($args)` for the group size `$g` (1..=`MAX_QUERIES`), a
/// constant in the call so that its accumulators stay in registers.
macro_rules! for_group_size {
    ($g:expr, $f:ident::<$lanes:ty>($($arg:expr),*)) => {
        match $g {
            8 => $f::<$lanes, 8>($($arg),*),
            7 => $f::<$lanes, 7>($($arg),*),
            6 => $f::<$lanes, 6>($($arg),*),
            5 => $f::<$lanes, 5>($($arg),*),
            4 => $f::<$lanes, 4>($($arg),*),
            3 => $f::<$lanes, 3>($($arg),*),
            2 => $f::<$lanes, 2>($($arg),*),
            _ => $f::<$lanes, 1>($($arg),*),
        }
    };
}

/// `crate::quant::float::f16_dots_many`, the queries in groups of up to
/// `L::QUERIES`; with enough queries, their whole tiles of rows first all
/// together (`dots_keys_in_lanes`).
#[inline(always)]
unsafe fn dots_many<L: Lanes>(rows: &[u8], stride: usize, q: &[f32], dk: usize, out: &mut [f32]) {
    let heads = q.len() / dk.max(1);
    let n = out.len() / heads.max(1);
    let mut done = 0;
    if heads >= KEYS_IN_LANES_QUERIES
        && dk <= L::KEYS_IN_LANES_DIM
        && dk.is_multiple_of(L::N)
        && n >= L::N
    {
        done = n / L::N * L::N;
        dots_keys_in_lanes::<L>(rows, stride, q, dk, out, done);
    }
    let mut g0 = 0;
    while g0 < heads {
        let g = (heads - g0).min(L::QUERIES);
        let (q, out) = (&q[g0 * dk..(g0 + g) * dk], &mut out[g0 * n..(g0 + g) * n]);
        for_group_size!(g, dots_group::<L>(rows, stride, q, dk, out, n, done));
        g0 += g;
    }
}

/// Columns `c..c + width · N` of `axpys_group`: each value vector converted
/// once and each weight broadcast once for all `width` vectors of columns.
/// `width` ≤ `MAX_COLUMNS` is a constant where this is inlined, so that the
/// accumulators stay in registers.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn axpys_columns<L: Lanes, const G: usize>(
    rows: &[u8],
    stride: usize,
    a: &[f32],
    n: usize,
    y: &mut [f32],
    dv: usize,
    c: usize,
    width: usize,
) {
    let mut acc = [[L::zero(); MAX_COLUMNS]; G];
    for g in 0..G {
        for m in 0..width {
            acc[g][m] = L::load(y[g * dv + c + m * L::N..][..L::N].as_ptr());
        }
    }
    for j in 0..n {
        let at = j * stride + c * 2;
        if c == 0 {
            prefetch_lines(rows.as_ptr().wrapping_add(at + ROWS_AHEAD * stride), dv * 2);
        }
        let values = &rows[at..at + width * L::N * 2];
        let mut v = [L::zero(); MAX_COLUMNS];
        for m in 0..width {
            v[m] = L::f16s(values[m * L::N * 2..].as_ptr());
        }
        for g in 0..G {
            let w = L::splat(a[g * n + j]);
            for m in 0..width {
                acc[g][m] = L::fmadd(v[m], w, acc[g][m]);
            }
        }
    }
    for g in 0..G {
        for m in 0..width {
            L::store(y[g * dv + c + m * L::N..][..L::N].as_mut_ptr(), acc[g][m]);
        }
    }
}

/// y_g += Σ_j a[g · n + j] · row j for the `G` weight vectors of `a`, the
/// rows added in order to each value.
#[inline(always)]
unsafe fn axpys_group<L: Lanes, const G: usize>(
    rows: &[u8],
    stride: usize,
    a: &[f32],
    n: usize,
    y: &mut [f32],
    dv: usize,
) {
    let full = dv / L::N * L::N;
    assert!(a.len() == G * n && y.len() == G * dv);
    // More than four queries' accumulators fill the registers at two
    // vectors of columns each.
    let width = if G > 4 { 2 } else { L::COLUMNS };
    let mut c = 0;
    while c < full {
        if c + width * L::N <= full {
            axpys_columns::<L, G>(rows, stride, a, n, y, dv, c, width);
            c += width * L::N;
        } else {
            axpys_columns::<L, G>(rows, stride, a, n, y, dv, c, 1);
            c += L::N;
        }
    }
    // The columns past the last whole vector: the scalar kernel.
    if full < dv {
        for g in 0..G {
            let weights = &a[g * n..(g + 1) * n];
            let y = &mut y[g * dv + full..(g + 1) * dv];
            crate::quant::float::f16_axpys(&rows[full * 2..], stride, weights, y);
        }
    }
}

/// `crate::quant::float::f16_axpys_many`, the weight vectors in groups of up
/// to `L::QUERIES`.
#[inline(always)]
unsafe fn axpys_many<L: Lanes>(rows: &[u8], stride: usize, a: &[f32], n: usize, y: &mut [f32]) {
    let heads = a.len() / n.max(1);
    let dv = y.len() / heads.max(1);
    let mut g0 = 0;
    while g0 < heads {
        let g = (heads - g0).min(L::QUERIES);
        let (a, y) = (&a[g0 * n..(g0 + g) * n], &mut y[g0 * dv..(g0 + g) * dv]);
        for_group_size!(g, axpys_group::<L>(rows, stride, a, n, y, dv));
        g0 += g;
    }
}

pub mod avx2 {
    use super::*;

    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f32(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 4) / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            prefetch(row, i * 4);
            let w = _mm256_loadu_ps(row[i * 4..i * 4 + 32].as_ptr().cast());
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[i..i + 8].as_ptr()), acc);
        }
        hsum256(acc) + tail(row, x, n, 4, f32_at)
    }

    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 2) / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            prefetch(row, i * 2);
            let w = _mm256_cvtph_ps(_mm_loadu_si128(row[i * 2..i * 2 + 16].as_ptr().cast()));
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[i..i + 8].as_ptr()), acc);
        }
        hsum256(acc) + tail(row, x, n, 2, f16_at)
    }

    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn bf16(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 2) / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            prefetch(row, i * 2);
            let bits =
                _mm256_cvtepu16_epi32(_mm_loadu_si128(row[i * 2..i * 2 + 16].as_ptr().cast()));
            let w = _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[i..i + 8].as_ptr()), acc);
        }
        hsum256(acc) + tail(row, x, n, 2, bf16_at)
    }

    /// As `crate::quant::float::f16_dots_many`: each key row converted once
    /// for up to four query heads.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_dots_many(rows: &[u8], stride: usize, q: &[f32], dk: usize, out: &mut [f32]) {
        dots_many::<Lanes8>(rows, stride, q, dk, out)
    }

    /// As `crate::quant::float::f16_axpys_many`: each value row converted
    /// once for up to four query heads.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_axpys_many(rows: &[u8], stride: usize, a: &[f32], n: usize, y: &mut [f32]) {
        axpys_many::<Lanes8>(rows, stride, a, n, y)
    }

    /// As `crate::quant::float::softmax`, 8 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn softmax(scores: &mut [f32], scale: f32) -> (f32, f32) {
        softmax_lanes::<8>(scores, scale)
    }
}

pub mod avx512 {
    use super::*;

    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f32(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 4) / 16 * 16;
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            prefetch(row, i * 4);
            let w = _mm512_loadu_ps(row[i * 4..i * 4 + 64].as_ptr().cast());
            acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x[i..i + 16].as_ptr()), acc);
        }
        _mm512_reduce_add_ps(acc) + tail(row, x, n, 4, f32_at)
    }

    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f16(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 2) / 16 * 16;
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            prefetch(row, i * 2);
            let w = _mm512_cvtph_ps(_mm256_loadu_si256(row[i * 2..i * 2 + 32].as_ptr().cast()));
            acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x[i..i + 16].as_ptr()), acc);
        }
        _mm512_reduce_add_ps(acc) + tail(row, x, n, 2, f16_at)
    }

    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn bf16(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 2) / 16 * 16;
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            prefetch(row, i * 2);
            let bits =
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(row[i * 2..i * 2 + 32].as_ptr().cast()));
            let w = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
            acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x[i..i + 16].as_ptr()), acc);
        }
        _mm512_reduce_add_ps(acc) + tail(row, x, n, 2, bf16_at)
    }

    /// As `avx2::f16_dots_many`, 16 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f16_dots_many(rows: &[u8], stride: usize, q: &[f32], dk: usize, out: &mut [f32]) {
        dots_many::<Lanes16>(rows, stride, q, dk, out)
    }

    /// As `avx2::f16_axpys_many`, 16 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f16_axpys_many(rows: &[u8], stride: usize, a: &[f32], n: usize, y: &mut [f32]) {
        axpys_many::<Lanes16>(rows, stride, a, n, y)
    }

    /// As `crate::quant::float::softmax`, 16 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn softmax(scores: &mut [f32], scale: f32) -> (f32, f32) {
        softmax_lanes::<16>(scores, scale)
    }
}
