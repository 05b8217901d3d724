//! The real Gemma 3 270M Q4_K_M model against llama.cpp's greedy outputs
//! (`tests/data/reference/gemma3-270m-q4_k_m.greedy.jsonl`), teacher
//! forced: the reference's top-1 token of each step is fed back, and our
//! logits are compared with llama.cpp's at every step.
//!
//! llama.cpp's CPU path quantizes activations to 8 bits, so it is itself
//! off the exact result (an exact f64 forward pass lands at median 0.73%,
//! 95th percentile 2.6% from it). The bounds asserted, from the issue:
//! top-1 equal wherever the reference's top-2 margin exceeds 0.5; relative
//! error |ours − ref| / max(1, |ref|) of the reference's top-1 logit with
//! median ≤ 1.5% and 95th percentile ≤ 4%.
//!
//! `M40_TEST_DEVICE=0` runs the same checks on CUDA device 0.

mod common;

use std::sync::Arc;

use common::reference::{cases, confident_greedy_prefix, TeacherForced};

use m40llm::model::{LoadOptions, Model};
use m40llm::sampling::SamplerParams;
use m40llm::session::{Session, SessionParams};

fn load_gemma() -> Arc<Model> {
    let path = common::gemma_path();
    let options = LoadOptions {
        device: common::test_device(),
        n_threads: 0,
        use_mmap: true,
        vocab_only: false,
    };
    Arc::new(Model::load(&path, options).unwrap())
}

#[test]
fn greedy_generation_reproduces_llama_cpp_greedy_tokens() {
    let model = load_gemma();
    let greedy = SamplerParams {
        temperature: 0.0,
        ..Default::default()
    };
    for case in cases().iter().take(5) {
        let expected = confident_greedy_prefix(case);
        let prompt = model
            .tokenizer()
            .detokenize(&case.prompt_ids[1..], false, false)
            .unwrap();
        let prompt = String::from_utf8(prompt).unwrap();
        let mut session = common::reference::session(&model);
        let mut text = Vec::new();
        let n = session
            .generate(&prompt, &greedy, expected.len() as u32, |piece, _| {
                text.extend_from_slice(piece);
                true
            })
            .unwrap();
        // The prompt tokenizes to the reference's ids, and generation
        // continues with llama.cpp's tokens.
        assert_eq!(
            &session.tokens()[..case.prompt_ids.len()],
            &case.prompt_ids[..],
            "{prompt:?}"
        );
        assert_eq!(n as usize, expected.len());
        assert_eq!(
            &session.tokens()[case.prompt_ids.len()..],
            &expected[..],
            "{prompt:?}"
        );
        let expected_text = model
            .tokenizer()
            .detokenize(&expected, false, false)
            .unwrap();
        assert_eq!(text, expected_text, "{prompt:?}");
        println!("{prompt:?} → {:?}", String::from_utf8_lossy(&text));
    }
}

#[test]
fn generation_stops_when_the_callback_says_so_and_continues_the_session_later() {
    let model = load_gemma();
    let params = SamplerParams {
        temperature: 0.7,
        seed: 7,
        ..Default::default()
    };
    let run = |stop_after: usize| {
        let mut session = Session::new(
            Arc::clone(&model),
            SessionParams {
                n_ctx: 256,
                n_batch: 64,
            },
        )
        .unwrap();
        let mut pieces = Vec::new();
        let n = session
            .generate("Write a story about a cat.", &params, 40, |piece, _| {
                pieces.push(piece.to_vec());
                pieces.len() < stop_after
            })
            .unwrap();
        (n, pieces, session)
    };
    let (n_all, all, _) = run(usize::MAX);
    let (n_few, few, mut session) = run(3);
    assert_eq!(few.len(), 3);
    assert!(
        n_few <= n_all && all.starts_with(&few),
        "same seed, same start"
    );
    for piece in &all {
        assert!(
            std::str::from_utf8(piece).is_ok(),
            "pieces are whole UTF-8 characters: {piece:?}"
        );
    }
    let before = session.n_past();
    session
        .generate(" And then", &params, 5, |_, _| true)
        .unwrap();
    assert!(
        session.n_past() > before + 2,
        "a second call continues the same session"
    );
    let bos = model.tokenizer().bos().unwrap();
    assert_eq!(
        session.tokens().iter().filter(|&&t| t == bos).count(),
        1,
        "BOS only at the start"
    );
}

#[test]
fn gemma_matches_llama_cpp_teacher_forced() {
    let cases = cases();
    let report = TeacherForced::run(&load_gemma(), &cases);
    println!("{} prompts, {}", cases.len(), report.summary());
    assert!(
        report.disagreements.is_empty(),
        "top-1 differs where the margin exceeds 0.5:\n{}",
        report.disagreements.join("\n")
    );
    let (median, p95) = (report.percentile(0.5), report.percentile(0.95));
    assert!(median <= 0.015, "median relative error {median}");
    assert!(p95 <= 0.04, "95th percentile relative error {p95}");
}
