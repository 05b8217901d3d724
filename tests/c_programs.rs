//! The C programs in examples-c/, built against the library as the Makefile
//! builds them and run the way users run them.

mod common;

use std::process::Command;

use common::c_build::build_example;
use m40llm::chat::{ChatMessage, ChatTemplate};

#[test]
fn m40_bench_reports_prompt_generation_and_batched_rows_as_json() {
    let model = common::scratch_path("bench-llama-q4_0.gguf");
    common::synth_model(
        &["--preset", "tiny", "--type", "q4_0", "--n-vocab", "2000"],
        &model,
    );
    let bench = build_example("m40-bench");
    let out = Command::new(&bench)
        .arg("-m")
        .arg(&model)
        .args([
            "-d",
            "-1",
            "-t",
            "2",
            "-p",
            "32",
            "-n",
            "8",
            "-r",
            "2",
            "-b",
            "1,4",
            "--n-batch",
            "8",
            "--n-depth",
            "0,16",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout.lines().filter(|l| l.contains("\"test\"")).collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    let field = |row: &str, key: &str| -> String {
        let at = row
            .find(&format!("\"{key}\": "))
            .unwrap_or_else(|| panic!("{key} in {row}"))
            + key.len()
            + 4;
        row[at..]
            .split([',', '}'])
            .next()
            .unwrap()
            .trim()
            .trim_matches('"')
            .to_string()
    };
    let size = std::fs::metadata(&model).unwrap().len().to_string();
    // llama-bench's names: the depth (tokens of context before the test) after " @ d".
    let tests = [
        ("pp32", 0),
        ("tg8", 0),
        ("tg8@4", 0),
        ("pp32 @ d16", 16),
        ("tg8 @ d16", 16),
        ("tg8@4 @ d16", 16),
    ];
    for (row, (test, depth)) in rows.iter().zip(tests) {
        assert_eq!(field(row, "test"), test);
        assert_eq!(field(row, "n_depth"), depth.to_string());
        assert_eq!(field(row, "size"), size);
        let tps: f64 = field(row, "avg_ts").parse().unwrap();
        assert!(tps > 0.0, "{row}");
        let roofline = field(row, "roofline");
        if test.starts_with("tg") {
            let r: f64 = roofline.parse().unwrap();
            assert!(r > 0.0 && r < 2.0, "{row}");
        } else {
            assert_eq!(roofline, "null");
        }
        assert!(field(row, "peak_rss_bytes").parse::<u64>().unwrap() > 0);
        // Device memory is a GPU's figure: -1 on the CPU.
        assert_eq!(field(row, "device_memory_peak_bytes"), "-1");
    }
    // The default output is a markdown table with the same rows.
    let table = Command::new(&bench)
        .arg("-m")
        .arg(&model)
        .args(["-t", "1", "-p", "8", "-n", "2", "-r", "1"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("| model | size | params | backend | threads | test | t/s | roofline |"),
        "{table}"
    );
    assert!(
        table.contains("| pp8 |") && table.contains("| tg2 |"),
        "{table}"
    );
    let _ = std::fs::remove_file(&model);
}

#[test]
fn m40_bench_rejects_bad_arguments_with_usage() {
    let bench = build_example("m40-bench");
    for bad in [
        &["-p"][..],
        &["-m", "x.gguf", "-b", "1,0"],
        &["-m", "x.gguf", "--n-depth", "-1"],
        &["-m", "x.gguf", "--n-depth", "1,,2"],
    ] {
        let out = Command::new(&bench).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("usage"));
    }
    let out = Command::new(&bench)
        .args(["-m", "/nonexistent.gguf"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.gguf"));
}

#[test]
fn generate_streams_gemma_text_and_reports_speeds() {
    let model = common::gemma_path();
    let generate = build_example("generate");
    let out = Command::new(&generate)
        .arg(&model)
        .args([
            "The capital of France is",
            "-n",
            "8",
            "--temp",
            "0",
            "-t",
            "2",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    // llama.cpp's greedy continuation starts " the capital of the"
    // (tests/gemma_reference.rs checks the tokens themselves).
    assert!(
        stdout.starts_with("The capital of France is the capital of the"),
        "{stdout}"
    );
    assert!(
        stderr.contains("prompt: 6 tokens,") && stderr.contains("| generation: 8 tokens,"),
        "{stderr}"
    );
    assert!(stderr.contains("tokens/s"), "{stderr}");
}

#[test]
fn generate_reports_a_missing_model_and_bad_options() {
    let generate = build_example("generate");
    let out = Command::new(&generate)
        .args(["/nonexistent.gguf", "hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.gguf"));
    let out = Command::new(&generate)
        .args(["m.gguf", "hi", "-n", "lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a number"));
}

#[test]
fn chat_keeps_the_conversation_in_the_session_and_formats_it_with_gemmas_template() {
    let model = common::gemma_path();
    let chat = build_example("chat");
    let run = |input: &str| {
        let mut child = Command::new(&chat)
            .arg(&model)
            // Replies cut at 8 tokens end mid-sentence: a reply that ends
            // in whitespace, which Gemma's template trims, rightly makes the
            // example start the session over, and this test is about the
            // turns it keeps.
            .args(["-n", "8", "--temp", "0", "--device", "-1", "-t", "2"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "{stdout}{stderr}");
        (stdout, stderr)
    };
    let (stdout, stderr) = run("Hello!\n\nWhat is the capital of France?\n");
    assert!(stderr.starts_with("chat template: gemma\n"), "{stderr}");
    // Two turns (the empty line is skipped): the first decodes its whole
    // prompt, the second keeps all of it and the reply and decodes only the
    // new turn.
    let turns: Vec<(u32, u32)> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[turn: "))
        .map(|l| {
            let numbers: Vec<u32> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse().ok())
                .collect();
            (numbers[0], numbers[1])
        })
        .collect();
    assert_eq!(turns.len(), 2, "{stderr}");
    assert_eq!(turns[0].0, 0);
    assert_eq!(turns[1].0, turns[0].1, "{stderr}");
    assert!(turns[1].1 > 0);

    // The first reply is the greedy continuation of the formatted turn, as
    // the generate example produces it from the same text.
    let formatted = ChatTemplate::Gemma.apply(
        &[ChatMessage {
            role: "user",
            content: "Hello!",
        }],
        true,
    );
    let generated = Command::new(build_example("generate"))
        .arg(&model)
        .args([
            formatted.as_str(),
            "-n",
            "8",
            "--temp",
            "0",
            "--device",
            "-1",
            "-t",
            "2",
        ])
        .output()
        .unwrap();
    let generated = String::from_utf8_lossy(&generated.stdout);
    let first_reply = &generated[formatted.len()..];
    assert!(!first_reply.trim().is_empty());
    assert!(
        stdout.starts_with(first_reply),
        "{stdout:?} vs {first_reply:?}"
    );
    assert!(
        stdout.len() > first_reply.len() + 1,
        "a second reply: {stdout:?}"
    );
}

#[test]
fn chat_reports_a_model_without_a_chat_template() {
    let path = common::scratch_path("chat-no-template.gguf");
    std::fs::write(&path, common::tiny_model::tiny_model("llama").build()).unwrap();
    let out = Command::new(build_example("chat"))
        .arg(&path)
        .args(["--device", "-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no chat template"), "{stderr}");
    let out = Command::new(build_example("chat"))
        .arg("-n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
