//! Sessions: decoding in chunks or one by one, batched decode across
//! sessions, failures that leave the session unchanged, truncation, seeded
//! sampling, and threads sharing one model. On a small F32 LLaMA model made
//! by the test GGUF writer.

mod common;

use std::sync::Arc;

use common::tiny_model::{tiny_model, TINY};
use m40llm::backend::Device;
use m40llm::error::ErrorKind;
use m40llm::gguf::GgufFile;
use m40llm::model::{LoadOptions, Model};
use m40llm::sampling::SamplerParams;
use m40llm::session::{Session, SessionParams};

fn model(arch: &str, threads: usize) -> Arc<Model> {
    let gguf = GgufFile::from_bytes(&tiny_model(arch).build()).unwrap();
    let options = LoadOptions {
        device: -1,
        n_threads: threads as u32,
        use_mmap: false,
        vocab_only: false,
    };
    Arc::new(Model::from_gguf(gguf, Device::Cpu { threads }, options).unwrap())
}

fn session(model: &Arc<Model>, n_ctx: u32, n_batch: u32) -> Session {
    Session::new(Arc::clone(model), SessionParams { n_ctx, n_batch }).unwrap()
}

const PROMPT: [u32; 11] = [1, 5, 9, 2, 14, 3, 3, 7, 11, 0, 15];

/// Logits after each token of PROMPT, decoding one token at a time.
fn stepwise(model: &Arc<Model>) -> Vec<Vec<f32>> {
    let mut s = session(model, 64, 512);
    PROMPT
        .iter()
        .map(|&t| {
            s.decode(&[t]).unwrap();
            s.logits().unwrap().to_vec()
        })
        .collect()
}

#[test]
fn a_prompt_in_any_chunk_size_gives_the_logits_of_token_by_token_decoding() {
    for arch in [
        "llama",
        "qwen2",
        "gemma3",
        "qwen3moe",
        "llama-moe",
        "qwen35",
        "gpt-oss",
        "gemma4",
    ] {
        let m = model(arch, 2);
        let expected = stepwise(&m);
        for n_batch in [1, 3, 4, 11, 512] {
            let mut s = session(&m, 64, n_batch);
            s.decode(&PROMPT).unwrap();
            assert_eq!(s.n_past(), PROMPT.len());
            assert_eq!(
                s.logits().unwrap(),
                &expected[PROMPT.len() - 1][..],
                "{arch} n_batch {n_batch}"
            );
        }
    }
}

#[test]
fn batched_decode_gives_each_session_the_logits_of_decoding_alone() {
    batched_decode_matches_decoding_alone("gemma3");
}

/// Each session's rows go through its own recurrent state, from where its
/// position stands.
#[test]
fn batched_decode_of_hybrid_sessions_gives_the_logits_of_decoding_alone() {
    batched_decode_matches_decoding_alone("qwen35");
    batched_decode_matches_decoding_alone("qwen35moe");
}

/// With experts, the sessions' rows share a pass but each is routed alone:
/// batching changes which rows an expert's product takes, not the result.
#[test]
fn batched_decode_of_moe_sessions_gives_the_logits_of_decoding_alone() {
    batched_decode_matches_decoding_alone("qwen3moe");
    batched_decode_matches_decoding_alone("llama-moe");
    batched_decode_matches_decoding_alone("gpt-oss");
}

/// Gemma 4's sessions: layers whose caches differ in width, a window the
/// longer session's rows cross.
#[test]
fn batched_decode_of_gemma4_sessions_gives_the_logits_of_decoding_alone() {
    batched_decode_matches_decoding_alone("gemma4");
}

fn batched_decode_matches_decoding_alone(arch: &str) {
    let m = model(arch, 2);
    let prompts: [&[u32]; 3] = [&PROMPT[..3], &PROMPT[2..9], &PROMPT[5..6]];
    let next = [4u32, 8, 12];
    let mut alone = Vec::new();
    for (p, &t) in prompts.iter().zip(&next) {
        let mut s = session(&m, 64, 512);
        s.decode(p).unwrap();
        s.decode(&[t]).unwrap();
        alone.push(s.logits().unwrap().to_vec());
    }
    let mut sessions: Vec<Session> = prompts
        .iter()
        .map(|p| {
            let mut s = session(&m, 64, 512);
            s.decode(p).unwrap();
            s
        })
        .collect();
    let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
    Session::decode_batch(&mut refs, &next).unwrap();
    for (i, s) in sessions.iter().enumerate() {
        assert_eq!(s.logits().unwrap(), &alone[i][..], "{arch} session {i}");
        assert_eq!(s.n_past(), prompts[i].len() + 1);
    }
}

/// The tiny hybrid model: one Gated DeltaNet layer (4 taps over 2 · 16 + 32
/// channels, 4 value heads of 8 × 8) and one attention layer (2 KV heads of
/// 8 + 8 f16 values a position).
#[test]
fn hybrid_models_describe_their_state_and_kv_costs() {
    let json = model("qwen35", 1).describe_json();
    let state_bytes = ((4 - 1) * 64 + 4 * 8 * 8) * 4;
    assert!(
        json.contains(&format!(
            r#""kv_bytes_per_token":64,"recurrent_state_bytes":{state_bytes}"#
        )),
        "{json}"
    );
    // A session of 64 positions: the attention layer's keys and values, and
    // the state.
    let s = session(&model("qwen35", 1), 64, 512);
    assert_eq!(s.memory_bytes(), 64 * 64 + state_bytes);
    let json = model("llama", 1).describe_json();
    assert!(json.contains(r#""recurrent_state_bytes":0"#), "{json}");
}

/// llama.cpp's Gemma 4 (src/models/gemma4.cpp) takes `Vcur = Kcur` in a
/// layer without a value projection: the keys' projection before their
/// norm and RoPE, RMS-normed as any layer's values are. The same model with
/// `attn_v` a copy of `attn_k` in that layer gives the same logits.
#[test]
fn a_gemma4_layer_without_a_value_projection_takes_its_keys_projection() {
    let from_keys = stepwise(&model("gemma4", 2));
    let mut w = tiny_model("gemma4");
    let keys = w.tensor_mut("blk.1.attn_k.weight");
    let (dims, type_id, data) = (keys.dims.clone(), keys.type_id, keys.data.clone());
    let w = w.tensor("blk.1.attn_v.weight", &dims, type_id, data);
    let gguf = GgufFile::from_bytes(&w.build()).unwrap();
    let options = LoadOptions {
        device: -1,
        n_threads: 2,
        use_mmap: false,
        vocab_only: false,
    };
    let with_values =
        Arc::new(Model::from_gguf(gguf, Device::Cpu { threads: 2 }, options).unwrap());
    assert_eq!(stepwise(&with_values), from_keys);
}

/// The tiny Gemma 4: a sliding-window layer of 2 KV heads of 8 (16 + 16
/// f16 values a position) and a full-attention layer of 1 KV head of 32
/// (32 + 32): each layer's cache is as wide as its own heads.
#[test]
fn gemma4_describes_and_holds_each_layers_own_kv_shape() {
    let m = model("gemma4", 1);
    let json = m.describe_json();
    let per_token = (16 + 16) * 2 + (32 + 32) * 2;
    for part in [
        r#""kv_heads":1,"head_dim":32,"sliding_kv_heads":2,"sliding_head_dim":8,"sliding_window":8"#
            .to_string(),
        format!(r#""kv_bytes_per_token":{per_token},"recurrent_state_bytes":0"#),
    ] {
        assert!(json.contains(&part), "{part}: {json}");
    }
    assert_eq!(session(&m, 64, 512).memory_bytes(), 64 * per_token);
    let json = model("llama", 1).describe_json();
    assert!(
        json.contains(r#""sliding_kv_heads":null,"sliding_head_dim":null"#),
        "{json}"
    );
}

#[test]
fn moe_models_describe_their_experts() {
    let json = model("qwen3moe", 1).describe_json();
    assert!(
        json.contains(r#""expert_count":4,"expert_used_count":2"#),
        "{json}"
    );
    assert!(json.contains(r#""architecture":"qwen3moe""#), "{json}");
    let json = model("gpt-oss", 1).describe_json();
    assert!(
        json.contains(r#""sliding_window":8,"expert_count":4,"expert_used_count":2"#),
        "{json}"
    );
    let json = model("llama", 1).describe_json();
    assert!(
        json.contains(r#""expert_count":null,"expert_used_count":null"#),
        "{json}"
    );
}

#[test]
fn a_failed_decode_leaves_the_session_unchanged() {
    let m = model("llama", 1);
    let mut s = session(&m, 8, 512);
    s.decode(&PROMPT[..6]).unwrap();
    let logits = s.logits().unwrap().to_vec();

    let full = s.decode(&PROMPT[..3]).unwrap_err();
    assert_eq!(full.kind(), ErrorKind::ContextFull);
    assert!(full.message().contains("6 of 8"), "{full}");
    let bad = s.decode(&[1, TINY.n_vocab as u32]).unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        s.decode(&[]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );

    assert_eq!(s.n_past(), 6);
    assert_eq!(s.logits().unwrap(), &logits[..]);
    // and it still works: the next token gives the step-by-step logits
    s.decode(&PROMPT[6..8]).unwrap();
    assert_eq!(s.logits().unwrap(), &stepwise(&m)[7][..]);
    assert_eq!(s.decode(&[1]).unwrap_err().kind(), ErrorKind::ContextFull);
}

#[test]
fn a_failed_batched_decode_changes_no_session() {
    let m = model("llama", 1);
    let mut a = session(&m, 8, 512);
    let mut b = session(&m, 2, 512);
    a.decode(&PROMPT[..2]).unwrap();
    b.decode(&PROMPT[..2]).unwrap();
    let logits = a.logits().unwrap().to_vec();
    let err = Session::decode_batch(&mut [&mut a, &mut b], &[1, 2]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ContextFull);
    assert!(err.message().starts_with("session 1"), "{err}");
    assert_eq!((a.n_past(), b.n_past()), (2, 2));
    assert_eq!(a.logits().unwrap(), &logits[..]);
    let other = model("llama", 1);
    let mut c = session(&other, 8, 512);
    let err = Session::decode_batch(&mut [&mut a, &mut c], &[1, 2]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn sampled_batches_pick_what_decoding_then_sampling_picks() {
    for arch in ["llama", "gemma3", "qwen3moe"] {
        let m = model(arch, 2);
        let params = common::batch_samplers(100);
        let prompts: Vec<&[u32]> = (0..params.len()).map(|i| &PROMPT[i..i + 3]).collect();
        let start = |_| -> Vec<Session> {
            prompts
                .iter()
                .map(|p| {
                    let mut s = session(&m, 64, 512);
                    s.decode(p).unwrap();
                    s
                })
                .collect()
        };
        let (mut plain, mut sampled) = (start(0), start(1));
        let mut tokens: Vec<u32> = (0..params.len() as u32).map(|i| i + 1).collect();
        for step in 0..8 {
            let mut refs: Vec<&mut Session> = plain.iter_mut().collect();
            Session::decode_batch(&mut refs, &tokens).unwrap();
            let want: Vec<u32> = plain
                .iter_mut()
                .zip(&params)
                .map(|(s, p)| s.sample(p).unwrap())
                .collect();
            let mut refs: Vec<&mut Session> = sampled.iter_mut().collect();
            let got = Session::decode_batch_sample(&mut refs, &tokens, &params).unwrap();
            assert_eq!(got, want, "{arch} step {step}");
            for (a, b) in plain.iter().zip(&sampled) {
                assert_eq!(a.tokens(), b.tokens(), "{arch} step {step}");
                assert!(
                    b.logits().is_none(),
                    "{arch}: the sampled batch keeps no logits"
                );
            }
            tokens = got;
        }
    }
}

#[test]
fn a_failed_sampled_batch_changes_no_session() {
    let m = model("llama", 1);
    let mut a = session(&m, 8, 512);
    let mut b = session(&m, 8, 512);
    a.decode(&PROMPT[..2]).unwrap();
    b.decode(&PROMPT[..2]).unwrap();
    let logits = a.logits().unwrap().to_vec();
    let bad = SamplerParams {
        repeat_penalty: 0.0,
        ..Default::default()
    };
    let err = Session::decode_batch_sample(
        &mut [&mut a, &mut b],
        &[1, 2],
        &[SamplerParams::default(), bad],
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().starts_with("session 1"), "{err}");
    let err =
        Session::decode_batch_sample(&mut [&mut a, &mut b], &[1, 2], &[SamplerParams::default()])
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!((a.n_past(), b.n_past()), (2, 2));
    assert_eq!(a.logits().unwrap(), &logits[..]);
}

#[test]
fn truncating_and_decoding_again_matches_a_fresh_session() {
    truncating_matches_a_fresh_session("qwen2");
}

/// With a sliding window (gpt-oss: 8 tokens on every second layer) the
/// cache keeps every position, so a truncation back inside or before the
/// window loses nothing a fresh session would see.
#[test]
fn truncating_a_sliding_window_session_and_decoding_again_matches_a_fresh_session() {
    truncating_matches_a_fresh_session("gpt-oss");
}

/// Gemma 4: an 8-token window on its sliding layers, whose caches are
/// narrower than its full-attention layers'.
#[test]
fn truncating_a_gemma4_session_and_decoding_again_matches_a_fresh_session() {
    truncating_matches_a_fresh_session("gemma4");
}

/// A hybrid model's recurrent states cannot run backwards: they take the
/// kept tokens in again, as a fresh session fed them would.
#[test]
fn truncating_a_hybrid_session_and_decoding_again_matches_a_fresh_session() {
    truncating_matches_a_fresh_session("qwen35");
}

fn truncating_matches_a_fresh_session(arch: &str) {
    let m = model(arch, 2);
    let expected = stepwise(&m);
    let mut s = session(&m, 64, 4);
    s.decode(&[9, 9, 9, 9, 9, 9]).unwrap();
    s.truncate(0).unwrap();
    assert!(s.logits().is_none());
    s.decode(&PROMPT[..5]).unwrap();
    s.truncate(3).unwrap();
    assert_eq!(s.n_past(), 3);
    s.decode(&PROMPT[3..]).unwrap();
    assert_eq!(s.logits().unwrap(), &expected[PROMPT.len() - 1][..]);
    assert_eq!(
        s.truncate(100).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    s.reset();
    assert_eq!(s.n_past(), 0);
    assert!(s.logits().is_none());
}

#[test]
fn the_same_seed_samples_the_same_tokens() {
    let m = model("llama", 1);
    let params = SamplerParams {
        temperature: 1.5,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 1234,
        ..Default::default()
    };
    let generate = |s: &mut Session| {
        (0..20)
            .map(|_| {
                let t = s.sample(&params).unwrap();
                s.decode(&[t]).unwrap();
                t
            })
            .collect::<Vec<_>>()
    };
    let run = || {
        let mut s = session(&m, 64, 512);
        s.decode(&PROMPT[..2]).unwrap();
        generate(&mut s)
    };
    let first = run();
    assert_eq!(first, run());
    // A session reused after truncating to the prompt samples as a fresh one
    // once its sampler is reset; without the reset its random state goes on.
    let mut reused = session(&m, 64, 512);
    reused.decode(&PROMPT[..2]).unwrap();
    assert_eq!(generate(&mut reused), first);
    reused.truncate(1).unwrap();
    reused.decode(&PROMPT[1..2]).unwrap();
    assert_ne!(generate(&mut reused), first);
    reused.truncate(1).unwrap();
    reused.decode(&PROMPT[1..2]).unwrap();
    reused.reset_sampler();
    assert_eq!(generate(&mut reused), first);
    assert!(
        first.iter().collect::<std::collections::HashSet<_>>().len() > 1,
        "{first:?}"
    );
    let greedy = SamplerParams {
        temperature: 0.0,
        ..params
    };
    let mut s = session(&m, 64, 512);
    assert_eq!(
        s.sample(&greedy).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    s.decode(&PROMPT[..2]).unwrap();
    assert_eq!(
        s.sample(&greedy).unwrap(),
        m40llm::sampling::argmax(s.logits().unwrap())
    );
}

#[test]
fn threads_with_their_own_sessions_on_one_model_get_identical_results() {
    let m = model("gemma3", 2);
    let expected = stepwise(&m);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let m = &m;
            let expected = &expected;
            scope.spawn(move || {
                for round in 0..5 {
                    let mut s = session(m, 64, 1 + (t + round) as u32 % 4);
                    s.decode(&PROMPT).unwrap();
                    assert_eq!(
                        s.logits().unwrap(),
                        &expected[PROMPT.len() - 1][..],
                        "thread {t} round {round}"
                    );
                }
            });
        }
    });
}

#[test]
fn a_vocab_only_model_cannot_run_a_session() {
    let gguf = GgufFile::from_bytes(&tiny_model("llama").build()).unwrap();
    let options = LoadOptions {
        device: -1,
        n_threads: 1,
        use_mmap: false,
        vocab_only: true,
    };
    let m = Arc::new(Model::from_gguf(gguf, Device::Cpu { threads: 1 }, options).unwrap());
    let err = Session::new(
        m,
        SessionParams {
            n_ctx: 8,
            n_batch: 8,
        },
    )
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn pieces_decoded_without_logits_then_the_last_with_them_match_one_decode() {
    let m = model("llama", 1);
    let mut whole = session(&m, 64, 512);
    whole.decode(&PROMPT).unwrap();
    let mut pieces = session(&m, 64, 512);
    pieces.decode_without_logits(&PROMPT[..2]).unwrap();
    assert!(pieces.logits().is_none());
    assert_eq!(
        pieces.sample(&SamplerParams::default()).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    pieces.decode_without_logits(&PROMPT[2..3]).unwrap();
    pieces.decode(&PROMPT[3..]).unwrap();
    assert_eq!(pieces.logits().unwrap(), whole.logits().unwrap());
}
