//! Choosing the next token from logits: repetition penalty, then top-k,
//! top-p and min-p over the candidates, then temperature and a seeded draw —
//! llama.cpp's default order. Temperature ≤ 0 is greedy (argmax).

use crate::error::{Error, Result};

/// The engine's view of `m40_sampler_params`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerParams {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: i32,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerParams {
    pub fn check(&self) -> Result<()> {
        let finite = [
            self.temperature,
            self.top_p,
            self.min_p,
            self.repeat_penalty,
        ];
        if finite.iter().any(|v| !v.is_finite()) {
            return Err(Error::invalid_argument(format!(
                "sampler parameters must be finite: {self:?}"
            )));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(Error::invalid_argument(format!(
                "repeat_penalty {} must be positive (1: off)",
                self.repeat_penalty
            )));
        }
        Ok(())
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, and the same
/// sequence for the same seed on every platform.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Most candidates a sampler asks of a row's logits in place of the whole
/// row (`candidates_wanted`): a `top_k` (plus the penalized tokens) above it
/// takes the whole row.
pub const MAX_CANDIDATES: usize = 1024;

/// The next token after `history` given `logits`.
pub fn sample(logits: &[f32], history: &[u32], p: &SamplerParams, rng: &mut Rng) -> u32 {
    let pen = penalized(history, &[], p);
    let cand = match candidates_wanted(p, logits.len(), pen.len()) {
        Some(want) => {
            let pen_logits: Vec<f32> = pen.iter().map(|&t| logits[t as usize]).collect();
            with_penalty(best_of(logits, want), &pen, &pen_logits, p)
        }
        None => {
            let mut all: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect();
            for &t in &pen {
                let c = &mut all[t as usize];
                c.1 = penalize(c.1, p);
            }
            all
        }
    };
    sample_candidates(cand, p, rng)
}

/// Candidates for `sample_candidates` from a row's best logits (`best_of`
/// `candidates_wanted`) and the logits of its penalized tokens
/// (`penalized`, in that order): the penalized tokens with their logits
/// penalized, the others as they are.
pub fn with_penalty(
    best: Vec<(u32, f32)>,
    penalized: &[u32],
    penalized_logits: &[f32],
    p: &SamplerParams,
) -> Vec<(u32, f32)> {
    let mut cand: Vec<(u32, f32)> = best
        .into_iter()
        .filter(|c| !penalized.contains(&c.0))
        .collect();
    cand.extend(
        penalized
            .iter()
            .zip(penalized_logits)
            .map(|(&t, &l)| (t, penalize(l, p))),
    );
    cand
}

/// The `want` largest of `values` as (index, value), by f32::total_cmp and
/// the lower index first among equals, in no particular order. One pass
/// that keeps the best so far in a heap: most values fall below its worst
/// and cost one comparison.
pub fn best_of(values: &[f32], want: usize) -> Vec<(u32, f32)> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    // Larger is better: the value's key in f32::total_cmp's order, then
    // the lower index.
    let rank = |i: usize, v: f32| {
        let bits = v.to_bits() as i32;
        let key = bits ^ ((((bits >> 31) as u32) >> 1) as i32);
        (key, Reverse(i as u32))
    };
    let want = want.min(values.len());
    let mut heap: BinaryHeap<Reverse<(i32, Reverse<u32>)>> = BinaryHeap::with_capacity(want + 1);
    for (i, &v) in values.iter().enumerate() {
        let r = rank(i, v);
        if heap.len() < want {
            heap.push(Reverse(r));
        } else if heap.peek().is_some_and(|worst| r > worst.0) {
            heap.pop();
            heap.push(Reverse(r));
        }
    }
    heap.into_iter()
        .map(|Reverse((_, Reverse(i)))| (i, values[i as usize]))
        .collect()
}

/// How many of a row's largest logits `sample` needs to choose exactly as
/// it would from the whole row, given the logits of the `n_penalized`
/// penalized tokens besides (`penalized`): the greedy pick and the `top_k`
/// best after the penalty are among the best `top_k + n_penalized` before
/// it or among the penalized. None: the whole row (no top-k, or a large
/// one).
pub fn candidates_wanted(p: &SamplerParams, n_vocab: usize, n_penalized: usize) -> Option<usize> {
    let keep = if p.temperature <= 0.0 {
        1
    } else if p.top_k > 0 && (p.top_k as usize) < n_vocab {
        p.top_k as usize
    } else {
        return None;
    };
    let want = keep + n_penalized;
    (want <= MAX_CANDIDATES).then_some(want.min(n_vocab))
}

/// The token `sample` picks, from candidates (token, logit after the
/// penalty) that hold at least its `candidates_wanted` best, or every token.
pub fn sample_candidates(mut cand: Vec<(u32, f32)>, p: &SamplerParams, rng: &mut Rng) -> u32 {
    // The order of the candidates: the higher logit (f32::total_cmp), then
    // the lower id, the order m40_top_logits selects by (cuda/top.cu).
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if p.temperature <= 0.0 {
        return cand.iter().min_by(|a, b| by_logit(a, b)).map_or(0, |c| c.0);
    }
    if p.top_k > 0 && (p.top_k as usize) < cand.len() {
        let k = p.top_k as usize;
        cand.select_nth_unstable_by(k - 1, by_logit);
        cand.truncate(k);
    }
    cand.sort_unstable_by(by_logit);
    if p.top_p < 1.0 {
        let probs = softmax(&cand, 1.0);
        let mut cumulative = 0.0;
        let keep = probs
            .iter()
            .position(|&q| {
                cumulative += q;
                cumulative >= f64::from(p.top_p)
            })
            .map_or(cand.len(), |i| i + 1);
        cand.truncate(keep.max(1));
    }
    if p.min_p > 0.0 {
        let max = cand[0].1;
        // p_i ≥ min_p · p_max  ⇔  logit_i ≥ logit_max + ln(min_p)
        let threshold = max + p.min_p.ln();
        let keep = cand.iter().take_while(|c| c.1 >= threshold).count();
        cand.truncate(keep.max(1));
    }
    let probs = softmax(&cand, p.temperature);
    let mut r = rng.next_f64();
    for (c, q) in cand.iter().zip(&probs) {
        if r < *q {
            return c.0;
        }
        r -= q;
    }
    cand[cand.len() - 1].0
}

/// The distinct tokens of the repetition window (the last `repeat_last_n`
/// of `history` followed by `next`, all of them when negative), in their
/// order there; none when the penalty is off. `next`: tokens not yet in the
/// session's history that a sampler after them sees (a batch's decoded
/// token).
pub fn penalized(history: &[u32], next: &[u32], p: &SamplerParams) -> Vec<u32> {
    if p.repeat_penalty == 1.0 || p.repeat_last_n == 0 {
        return Vec::new();
    }
    let len = history.len() + next.len();
    let window = match p.repeat_last_n {
        n if n < 0 => len,
        n => (n as usize).min(len),
    };
    let mut seen = std::collections::HashSet::new();
    history[history
        .len()
        .saturating_sub(window.saturating_sub(next.len()))..]
        .iter()
        .chain(&next[next.len().saturating_sub(window)..])
        .copied()
        .filter(|&t| seen.insert(t))
        .collect()
}

/// A penalized token's logit: positive ones divided by the penalty,
/// negative ones multiplied.
pub fn penalize(logit: f32, p: &SamplerParams) -> f32 {
    if logit > 0.0 {
        logit / p.repeat_penalty
    } else {
        logit * p.repeat_penalty
    }
}

/// The highest logit's token (f32::total_cmp); the lowest id among equals.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l.total_cmp(&logits[best]).is_gt() {
            best = i;
        }
    }
    best as u32
}

fn softmax(cand: &[(u32, f32)], temperature: f32) -> Vec<f64> {
    let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
    let t = f64::from(temperature);
    let e: Vec<f64> = cand
        .iter()
        .map(|c| ((f64::from(c.1) - f64::from(max)) / t).exp())
        .collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SamplerParams {
        SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_the_argmax_and_the_lowest_id_on_ties() {
        let g = SamplerParams {
            temperature: 0.0,
            ..params()
        };
        assert_eq!(sample(&[0.1, 3.0, 3.0, -1.0], &[], &g, &mut Rng::new(1)), 1);
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..50)
                .map(|_| sample(&logits, &[], &params(), &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
    }

    #[test]
    fn top_k_1_and_tiny_top_p_and_strict_min_p_are_greedy() {
        let logits = [1.0, 5.0, 4.9, 0.0];
        let mut rng = Rng::new(3);
        for p in [
            SamplerParams {
                top_k: 1,
                ..params()
            },
            SamplerParams {
                top_p: 0.01,
                ..params()
            },
            SamplerParams {
                min_p: 0.999,
                ..params()
            },
        ] {
            for _ in 0..20 {
                assert_eq!(sample(&logits, &[], &p, &mut rng), 1, "{p:?}");
            }
        }
    }

    #[test]
    fn draws_follow_the_softmax_probabilities() {
        let logits = [0.0f32, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let mut rng = Rng::new(9);
        let ones = (0..20000)
            .filter(|_| sample(&logits, &[], &params(), &mut rng) == 1)
            .count();
        assert!((ones as f64 / 20000.0 - 0.75).abs() < 0.015, "{ones}");
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let mut logits = vec![2.0, -2.0, 2.0];
        let p = SamplerParams {
            repeat_penalty: 2.0,
            repeat_last_n: 2,
            ..params()
        };
        // the window is the last two tokens: 1 and 0
        let window = penalized(&[2, 0, 1, 0], &[], &p);
        assert_eq!(penalized(&[2, 0, 1], &[0], &p), window);
        assert_eq!(penalized(&[], &[2, 0, 1, 0], &p), window);
        assert_eq!(window, vec![1, 0]);
        for t in window {
            logits[t as usize] = penalize(logits[t as usize], &p);
        }
        assert_eq!(logits, vec![1.0, -4.0, 2.0]);
    }

    /// The best `want` of (token, logit) by the candidates' order, as
    /// m40_top_logits selects them.
    fn best(cand: &[(u32, f32)], want: usize) -> Vec<(u32, f32)> {
        let mut sorted = cand.to_vec();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        sorted.truncate(want);
        sorted
    }

    #[test]
    fn the_wanted_candidates_choose_as_the_whole_row_does() {
        // Many ties, negative and positive logits, a repetition window.
        let logits: Vec<f32> = (0..500)
            .map(|i| ((i * 37 % 101) as f32 * 0.05).round() - 2.0)
            .collect();
        let history: Vec<u32> = (0..90).map(|i| (i * 7 % 500) as u32).collect();
        for (temperature, top_k, repeat_penalty) in [
            (0.0, 0, 1.0),
            (0.0, 40, 1.3),
            (0.8, 40, 1.0),
            (0.8, 40, 1.3),
            (1.5, 3, 0.7),
            (0.8, 1, 1.1),
        ] {
            let p = SamplerParams {
                temperature,
                top_k,
                repeat_penalty,
                ..Default::default()
            };
            let pen = penalized(&history, &[], &p);
            let want = candidates_wanted(&p, logits.len(), pen.len()).unwrap();
            let raw: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect();
            let mut cand: Vec<(u32, f32)> = best(&raw, want)
                .into_iter()
                .filter(|c| !pen.contains(&c.0))
                .collect();
            cand.extend(pen.iter().map(|&t| (t, penalize(logits[t as usize], &p))));
            // Every token, penalized: what the sampler chooses from
            // without a top-k.
            let mut all = raw.clone();
            for &t in &pen {
                all[t as usize].1 = penalize(all[t as usize].1, &p);
            }
            let (mut a, mut b, mut c) = (Rng::new(5), Rng::new(5), Rng::new(5));
            for _ in 0..50 {
                let want = sample_candidates(all.clone(), &p, &mut c);
                assert_eq!(sample(&logits, &history, &p, &mut a), want, "{p:?}");
                assert_eq!(sample_candidates(cand.clone(), &p, &mut b), want, "{p:?}");
            }
        }
        let no_top_k = SamplerParams {
            top_k: 0,
            ..Default::default()
        };
        assert_eq!(candidates_wanted(&no_top_k, 500, 0), None);
        let large = SamplerParams {
            top_k: MAX_CANDIDATES as i32,
            ..Default::default()
        };
        assert_eq!(candidates_wanted(&large, 5000, 1), None);
    }

    #[test]
    fn best_of_keeps_the_largest_by_the_total_order_and_the_lower_index() {
        let values = [
            1.0,
            f32::NAN,
            -0.0,
            0.0,
            3.0,
            3.0,
            -1.0,
            0.0,
            f32::NEG_INFINITY,
            3.0,
        ];
        let raw: Vec<(u32, f32)> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v))
            .collect();
        for want in 0..=values.len() + 2 {
            let mut got = best_of(&values, want);
            got.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let ids = |v: &[(u32, f32)]| v.iter().map(|c| c.0).collect::<Vec<_>>();
            assert_eq!(ids(&got), ids(&best(&raw, want)), "want {want}");
        }
    }

    #[test]
    fn greedy_follows_the_total_order() {
        assert_eq!(argmax(&[-0.0, 0.0, 0.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 0);
    }
}
