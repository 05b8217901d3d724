//! A session: one sequence's KV cache over a shared model, the tokens it
//! holds, and the logits of its last decode.

use std::sync::Arc;

use crate::backend::{CandidateRequest, Candidates, SeqPos, SequenceCache, StepOutput};
use crate::error::{Error, ErrorKind, Result};
use crate::kv_cache::LayerState;
use crate::model::transformer::run;
use crate::model::Model;
use crate::sampling::{self, Rng, SamplerParams};

/// The engine's view of `m40_session_params`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionParams {
    /// KV capacity in tokens; 0: min(training context, 4096).
    pub n_ctx: u32,
    /// Most tokens one forward pass takes; 0: 512.
    pub n_batch: u32,
}

pub struct Session {
    model: Arc<Model>,
    /// The KV cache of each stage of the model, holding its layers.
    kv: Vec<SequenceCache>,
    /// Positions the cache holds.
    n_ctx: usize,
    n_batch: usize,
    /// The tokens whose keys and values the cache holds, in order.
    tokens: Vec<u32>,
    /// Next-token logits after the last decode; empty before it. Each
    /// decode writes its logits over the last one's, in place: there is
    /// nothing to allocate a token, and nothing taken out that a panic in
    /// the forward pass could lose.
    logits: Vec<f32>,
    /// The sampler's random state and the seed it came from.
    rng: Option<(u64, Rng)>,
}

impl Session {
    pub fn new(model: Arc<Model>, params: SessionParams) -> Result<Session> {
        if !model.can_compute() {
            return Err(Error::invalid_argument(
                "the model was loaded vocab_only: it has no weights to run a session on",
            ));
        }
        let hp = model
            .hparams()
            .expect("a computing model has hyper-parameters");
        let n_ctx = match params.n_ctx {
            0 => hp.n_ctx_train.min(4096) as usize,
            n => n as usize,
        };
        let n_batch = match params.n_batch {
            0 => 512,
            n => n as usize,
        };
        let kv = model
            .stages()
            .iter()
            .map(|stage| {
                let layers: Vec<LayerState> =
                    stage.layers.clone().map(|il| hp.layer_state(il)).collect();
                stage.backend.kv_cache(n_ctx, &layers)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Session {
            model,
            kv,
            n_ctx,
            n_batch,
            tokens: Vec::new(),
            logits: Vec::new(),
            rng: None,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
    pub fn n_past(&self) -> usize {
        self.tokens.len()
    }
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    /// Bytes of memory its caches hold, on whichever devices: keys and
    /// values for `n_ctx` positions of the attention layers, and a hybrid
    /// model's recurrent states.
    pub fn memory_bytes(&self) -> usize {
        self.kv.iter().map(SequenceCache::size_bytes).sum()
    }
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    pub fn logits(&self) -> Option<&[f32]> {
        (!self.logits.is_empty()).then_some(&self.logits)
    }

    /// Forgets every token.
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.logits.clear();
        self.rng = None;
    }

    /// Forgets the sampler's random state: the next sampling seeds it anew.
    pub fn reset_sampler(&mut self) {
        self.rng = None;
    }

    /// Keeps the first `n_keep` tokens. The logits of the last decode no
    /// longer follow the kept tokens, so they are dropped.
    pub fn truncate(&mut self, n_keep: usize) -> Result<()> {
        if n_keep > self.tokens.len() {
            return Err(Error::invalid_argument(format!(
                "n_keep {n_keep} is more than the {} tokens the session holds",
                self.tokens.len()
            )));
        }
        if n_keep < self.tokens.len() {
            self.tokens.truncate(n_keep);
            self.logits.clear();
        }
        Ok(())
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let n_vocab = self.model.n_vocab();
        if let Some((i, &t)) = tokens.iter().enumerate().find(|(_, &t)| t >= n_vocab) {
            return Err(Error::invalid_argument(format!(
                "token {i} is id {t}, outside the vocabulary of {n_vocab}"
            )));
        }
        Ok(())
    }

    fn check_room(&self, n: usize) -> Result<()> {
        if self.tokens.len() + n > self.n_ctx() {
            return Err(Error::new(
                ErrorKind::ContextFull,
                format!(
                    "the session holds {} of {} tokens; {n} more do not fit (reset or truncate it, or use a larger n_ctx)",
                    self.tokens.len(),
                    self.n_ctx()
                ),
            ));
        }
        Ok(())
    }

    /// Appends `tokens` and runs the model over them in chunks of `n_batch`;
    /// afterwards `logits()` holds the next-token logits. On failure the
    /// session is as it was.
    pub fn decode(&mut self, tokens: &[u32]) -> Result<()> {
        self.decode_tokens(tokens, true)
    }

    /// Appends `tokens` as `decode` does but computes no logits (the output
    /// layer is skipped; `logits()` is None afterwards): for the leading
    /// parts of a prompt decoded in pieces.
    pub fn decode_without_logits(&mut self, tokens: &[u32]) -> Result<()> {
        self.decode_tokens(tokens, false)
    }

    fn decode_tokens(&mut self, tokens: &[u32], logits: bool) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::invalid_argument("no tokens to decode"));
        }
        self.check_tokens(tokens)?;
        self.check_room(tokens.len())?;
        self.catch_up_recurrent()?;
        // On failure the tokens are not appended: cache entries past them
        // are ignored from now on.
        self.decode_chunks(tokens, logits)?;
        if !logits {
            self.logits.clear();
        }
        Ok(())
    }

    /// Brings the recurrent states of a hybrid model's linear-attention
    /// layers to the session's tokens, where a truncation or a failed step
    /// left them elsewhere: they restart from no tokens and take in the
    /// session's tokens again, in the chunks a fresh session would. (The
    /// states cannot run backwards; the price of a truncation or of a
    /// failed step is one prefill of the tokens the session holds.) Keys
    /// and values are written again, computed as before. The tokens stay
    /// whatever happens; on failure the states are caught up on the next
    /// decode.
    fn catch_up_recurrent(&mut self) -> Result<()> {
        let n = self.tokens.len();
        if self.kv.iter().all(|c| c.recurrent_holds(n)) {
            return Ok(());
        }
        self.kv.iter_mut().for_each(SequenceCache::reset_recurrent);
        let tokens = self.tokens.clone();
        self.run_chunks(&tokens, 0, false)
    }

    /// Runs the model over `tokens` at positions from `start` and appends
    /// them to the session's tokens, chunk by chunk.
    fn decode_chunks(&mut self, tokens: &[u32], logits: bool) -> Result<()> {
        let start = self.tokens.len();
        self.run_chunks(tokens, start, logits)?;
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Runs the model over `tokens` at positions from `start`, in chunks of
    /// `n_batch`; with `logits`, the last token's go to `self.logits`.
    fn run_chunks(&mut self, tokens: &[u32], start: usize, logits: bool) -> Result<()> {
        let model = Arc::clone(&self.model);
        let n_chunks = tokens.len().div_ceil(self.n_batch);
        for (i, chunk) in tokens.chunks(self.n_batch).enumerate() {
            let start = start + i * self.n_batch;
            let rows: Vec<SeqPos> = (0..chunk.len())
                .map(|j| SeqPos {
                    seq: 0,
                    pos: start + j,
                })
                .collect();
            // Only the last token of the last chunk needs logits.
            let last = chunk.len() - 1;
            let wanted: &[usize] = if logits && i + 1 == n_chunks {
                std::slice::from_ref(&last)
            } else {
                &[]
            };
            let rows_out: &mut [&mut Vec<f32>] = if wanted.is_empty() {
                &mut []
            } else {
                &mut [&mut self.logits]
            };
            let mut out = StepOutput::Logits(rows_out);
            run(
                &model,
                &mut [&mut self.kv[..]],
                chunk,
                &rows,
                wanted,
                &mut out,
            )?;
        }
        Ok(())
    }

    /// One token for each session, in one forward pass over all of them.
    /// All sessions must share one model; each must have room. On failure no
    /// session changes.
    pub fn decode_batch(sessions: &mut [&mut Session], tokens: &[u32]) -> Result<()> {
        let model = Self::check_batch(sessions, tokens)?;
        Self::catch_up_all(sessions)?;
        let rows = Self::batch_rows(sessions);
        let wanted: Vec<usize> = (0..sessions.len()).collect();
        // The step's logits go straight into each session's logits vector,
        // with no batch-wide vector between (32 sessions of a 32000-token
        // vocabulary: 4 MB a step to allocate, zero and copy); on failure
        // run leaves them as they were.
        let (mut caches, mut logits): (Vec<&mut [SequenceCache]>, Vec<&mut Vec<f32>>) = sessions
            .iter_mut()
            .map(|s| (&mut s.kv[..], &mut s.logits))
            .unzip();
        let mut out = StepOutput::Logits(&mut logits);
        run(&model, &mut caches, tokens, &rows, &wanted, &mut out)?;
        for (s, &t) in sessions.iter_mut().zip(tokens) {
            s.tokens.push(t);
        }
        Ok(())
    }

    /// `decode_batch`, then each session's next token sampled with
    /// `params[i]` exactly as `sample` would pick it, the random state
    /// advanced the same way. The logits stay where the step computed them:
    /// the backend hands back only what each sampler needs (its `top_k`
    /// best, or the greedy pick, and the penalized tokens' logits; the
    /// whole row where it has no small top-k), so afterwards the sessions
    /// hold no logits. On failure no session changes.
    pub fn decode_batch_sample(
        sessions: &mut [&mut Session],
        tokens: &[u32],
        params: &[SamplerParams],
    ) -> Result<Vec<u32>> {
        let model = Self::check_batch(sessions, tokens)?;
        if params.len() != sessions.len() {
            return Err(Error::invalid_argument(format!(
                "{} sessions but {} sampler parameters",
                sessions.len(),
                params.len()
            )));
        }
        for (i, p) in params.iter().enumerate() {
            p.check().map_err(|e| e.context(format!("session {i}")))?;
        }
        Self::catch_up_all(sessions)?;
        let n_vocab = model.n_vocab() as usize;
        // What each sampler needs: its best logits and those of its
        // penalized tokens, over its history with the token it decodes now
        // (what `sample` sees after `decode_batch`).
        let requests: Vec<CandidateRequest> = sessions
            .iter()
            .zip(tokens)
            .zip(params)
            .map(|((s, &t), p)| {
                let pen = sampling::penalized(&s.tokens, &[t], p);
                match sampling::candidates_wanted(p, n_vocab, pen.len()) {
                    Some(want) => CandidateRequest::Best { want, extra: pen },
                    None => CandidateRequest::Row,
                }
            })
            .collect();
        let rows = Self::batch_rows(sessions);
        let wanted: Vec<usize> = (0..sessions.len()).collect();
        let mut answers = vec![Candidates::default(); sessions.len()];
        {
            let mut caches: Vec<&mut [SequenceCache]> =
                sessions.iter_mut().map(|s| &mut s.kv[..]).collect();
            let mut out = StepOutput::Candidates {
                requests: &requests,
                out: &mut answers,
            };
            run(&model, &mut caches, tokens, &rows, &wanted, &mut out)?;
        }
        let mut next = Vec::with_capacity(sessions.len());
        for (i, s) in sessions.iter_mut().enumerate() {
            s.tokens.push(tokens[i]);
            s.logits.clear();
            let p = &params[i];
            let answer = std::mem::take(&mut answers[i]);
            let token = match &requests[i] {
                CandidateRequest::Row => {
                    sampling::sample(&answer.values, &s.tokens, p, rng_for(&mut s.rng, p))
                }
                CandidateRequest::Best { extra, .. } => {
                    let cand = sampling::with_penalty(answer.best, extra, &answer.values, p);
                    sampling::sample_candidates(cand, p, rng_for(&mut s.rng, p))
                }
            };
            next.push(token);
        }
        Ok(next)
    }

    /// [`Session::catch_up_recurrent`] for each session of a batch.
    fn catch_up_all(sessions: &mut [&mut Session]) -> Result<()> {
        for (i, s) in sessions.iter_mut().enumerate() {
            s.catch_up_recurrent()
                .map_err(|e| e.context(format!("session {i}")))?;
        }
        Ok(())
    }

    /// The model the sessions of a batch share, once each session is
    /// checked: same model, a valid token, room for it.
    fn check_batch(sessions: &[&mut Session], tokens: &[u32]) -> Result<Arc<Model>> {
        if sessions.len() != tokens.len() {
            return Err(Error::invalid_argument(format!(
                "{} sessions but {} tokens",
                sessions.len(),
                tokens.len()
            )));
        }
        let Some(first) = sessions.first() else {
            return Err(Error::invalid_argument("no sessions to decode"));
        };
        let model = Arc::clone(&first.model);
        for (i, (s, &t)) in sessions.iter().zip(tokens).enumerate() {
            if !Arc::ptr_eq(&s.model, &model) {
                return Err(Error::invalid_argument(format!(
                    "session {i} belongs to a different model than session 0"
                )));
            }
            s.check_tokens(&[t])
                .map_err(|e| e.context(format!("session {i}")))?;
            s.check_room(1)
                .map_err(|e| e.context(format!("session {i}")))?;
        }
        Ok(model)
    }

    /// A batch's rows: session i's next position.
    fn batch_rows(sessions: &[&mut Session]) -> Vec<SeqPos> {
        sessions
            .iter()
            .enumerate()
            .map(|(i, s)| SeqPos {
                seq: i,
                pos: s.n_past(),
            })
            .collect()
    }

    /// Picks the next token from the last logits.
    pub fn sample(&mut self, params: &SamplerParams) -> Result<u32> {
        params.check()?;
        if self.logits.is_empty() {
            return Err(Error::invalid_argument(
                "no logits to sample from: decode first",
            ));
        }
        let rng = rng_for(&mut self.rng, params);
        Ok(sampling::sample(&self.logits, &self.tokens, params, rng))
    }

    /// Tokenizes `prompt` (BOS added if the session is empty, special tokens
    /// parsed), decodes it, then samples up to `max_tokens` tokens, each
    /// decoded into the session, and hands their text to `on_piece` in whole
    /// UTF-8 characters (bytes of a character split over tokens are held back
    /// until it is complete). Stops at an end-of-generation token, after
    /// `max_tokens`, or when `on_piece` returns false. Returns the number of
    /// tokens generated.
    pub fn generate(
        &mut self,
        prompt: &str,
        params: &SamplerParams,
        max_tokens: u32,
        mut on_piece: impl FnMut(&[u8], u32) -> bool,
    ) -> Result<u32> {
        params.check()?;
        let model = Arc::clone(&self.model);
        let tokenizer = model.tokenizer();
        let tokens = tokenizer.tokenize(prompt, self.tokens.is_empty(), true)?;
        if !tokens.is_empty() {
            self.decode(&tokens)?;
        } else if self.logits.is_empty() {
            return Err(Error::invalid_argument(
                "the prompt is empty and the session has no logits to continue from",
            ));
        }
        let mut pending: Vec<u8> = Vec::new();
        let mut generated = 0;
        let mut last = 0;
        while generated < max_tokens {
            let token = self.sample(params)?;
            if tokenizer.is_eog(token) {
                break;
            }
            self.decode(&[token])?;
            generated += 1;
            last = token;
            pending.extend_from_slice(tokenizer.token_to_piece(token, 0, false)?);
            let complete = complete_utf8_prefix(&pending);
            if complete > 0 {
                let rest = pending.split_off(complete);
                let go_on = on_piece(&pending, token);
                pending = rest;
                if !go_on {
                    return Ok(generated);
                }
            }
        }
        if !pending.is_empty() {
            on_piece(&pending, last);
        }
        Ok(generated)
    }
}

/// The length of the longest prefix of `bytes` that does not end inside a
/// UTF-8 character (bytes that are not UTF-8 at all count as complete).
fn complete_utf8_prefix(bytes: &[u8]) -> usize {
    // A character is at most 4 bytes: look for its first byte among the last 3.
    for back in 1..=bytes.len().min(3) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 == 0x80 {
            continue; // continuation byte
        }
        let needed = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if needed > back {
            bytes.len() - back
        } else {
            bytes.len()
        };
    }
    bytes.len()
}

/// A session's random state for sampling with `params`: seeded from its
/// seed at the first sampling and whenever the seed changes.
fn rng_for<'a>(slot: &'a mut Option<(u64, Rng)>, params: &SamplerParams) -> &'a mut Rng {
    if slot.as_ref().is_none_or(|(seed, _)| *seed != params.seed) {
        *slot = Some((params.seed, Rng::new(params.seed)));
    }
    &mut slot.as_mut().expect("set above").1
}

#[cfg(test)]
mod tests {
    use super::complete_utf8_prefix;

    #[test]
    fn split_characters_are_held_back_until_complete() {
        let e_acute = "é".as_bytes(); // C3 A9
        let euro = "€".as_bytes(); // E2 82 AC
        assert_eq!(complete_utf8_prefix(b"abc"), 3);
        assert_eq!(complete_utf8_prefix(&[b'a', e_acute[0]]), 1);
        assert_eq!(complete_utf8_prefix(e_acute), 2);
        assert_eq!(complete_utf8_prefix(&euro[..2]), 0);
        assert_eq!(complete_utf8_prefix(euro), 3);
        assert_eq!(complete_utf8_prefix(&[0x80, 0x80, 0x80, 0x80]), 4);
        assert_eq!(complete_utf8_prefix(&[]), 0);
    }
}
