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

/// The next token after `history` given `logits`.
pub fn sample(logits: &[f32], history: &[u32], p: &SamplerParams, rng: &mut Rng) -> u32 {
    let mut logits = logits.to_vec();
    apply_repeat_penalty(&mut logits, history, p);
    if p.temperature <= 0.0 {
        return argmax(&logits);
    }
    // Candidates as (token, logit), best first where an order is needed.
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
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

fn apply_repeat_penalty(logits: &mut [f32], history: &[u32], p: &SamplerParams) {
    if p.repeat_penalty == 1.0 || p.repeat_last_n == 0 {
        return;
    }
    let window = match p.repeat_last_n {
        n if n < 0 => history.len(),
        n => (n as usize).min(history.len()),
    };
    let mut seen = std::collections::HashSet::new();
    for &t in &history[history.len() - window..] {
        if seen.insert(t) {
            let l = &mut logits[t as usize];
            *l = if *l > 0.0 {
                *l / p.repeat_penalty
            } else {
                *l * p.repeat_penalty
            };
        }
    }
}

/// The highest logit's token; the lowest id among equals.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
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
        apply_repeat_penalty(&mut logits, &[2, 0, 1, 0], &p);
        // the window is the last two tokens: 1 and 0
        assert_eq!(logits, vec![1.0, -4.0, 2.0]);
    }
}
