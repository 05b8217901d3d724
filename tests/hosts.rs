//! Host programs built the way their users build them: a C program against an
//! installed copy of the library found with pkg-config (`make install`), the
//! C++ wrapper's example, the wrapper's own checks, a Zig program that
//! `@cImport`s the header, and the Go package's tests (cgo, through pkg-config). Each runs Gemma 3 270M
//! on the CPU (when the model is present) and must print llama.cpp's greedy
//! continuation of a reference prompt (tests/data/reference) up to its
//! first near-tie.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::c_build::{compile, compile_cpp, library_dir, root};
use common::reference;
use m40llm::model::{LoadOptions, Model};

/// What a greedy run of `prompt` must print first: the prompt and llama.cpp's
/// greedy continuation up to its first near-tie (see `confident_greedy_prefix`).
fn confident_reference_text(model: &Path, prompt: &str) -> String {
    let case = reference::case(prompt);
    let options = LoadOptions {
        device: -1,
        n_threads: 1,
        use_mmap: true,
        vocab_only: true,
    };
    let vocab = Model::load(model, options).unwrap();
    let continuation = reference::confident_greedy_prefix(&case);
    assert!(continuation.len() >= 3, "{prompt:?}: a useful prefix");
    let mut tokens = case.prompt_ids.clone();
    tokens.extend(continuation);
    let bytes = vocab.tokenizer().detokenize(&tokens, true, false).unwrap();
    String::from_utf8(bytes).unwrap()
}

/// A greedy run of `prompt` succeeded and printed the reference first.
fn assert_greedy_output(out: &Output, model: &Path, prompt: &str) {
    let stdout = stdout_of(out);
    let expected = confident_reference_text(model, prompt);
    assert!(
        stdout.starts_with(&expected),
        "{stdout:?}\nshould start with\n{expected:?}"
    );
}

/// A host run on a missing model file exits with 1 and says `what` and the path.
fn assert_reports_a_missing_model(exe: &Path, what: &str) {
    let out = Command::new(exe)
        .args(["/nonexistent.gguf", "hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(what) && stderr.contains("/nonexistent.gguf"),
        "{stderr}"
    );
}

fn stdout_of(out: &Output) -> String {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    stdout.into_owned()
}

fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("m40llm")
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("pkg-config on PATH");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// `make install` of the test build's library into a fresh scratch prefix.
fn install(name: &str) -> std::path::PathBuf {
    let prefix = common::scratch_path(name);
    let _ = std::fs::remove_dir_all(&prefix);
    // The library is already built (library_dir); CARGO=true skips make's build step.
    let status = Command::new("make")
        .arg("install")
        .arg(format!("PREFIX={}", prefix.display()))
        .arg(format!("LIB={}", library_dir().display()))
        .arg("CARGO=true")
        .current_dir(root())
        .status()
        .expect("make on PATH");
    assert!(status.success());
    prefix
}

#[test]
fn a_c_program_builds_against_the_installed_library_with_pkg_config() {
    let prefix = install("install-prefix");
    for file in [
        "lib/libm40llm.so",
        "lib/libm40llm.a",
        "include/m40llm.h",
        "include/m40llm.hpp",
        "lib/pkgconfig/m40llm.pc",
    ] {
        assert!(prefix.join(file).is_file(), "{file} installed");
    }
    let cflags = pkg_config(&prefix, &["--cflags"]);
    let libs = pkg_config(&prefix, &["--libs"]);
    assert_eq!(cflags, [format!("-I{}/include", prefix.display())]);
    // The rpath lets the program run from a prefix the loader does not
    // search (PREFIX=$HOME/.local), as the README's command builds it.
    assert_eq!(
        libs,
        [
            format!("-L{}/lib", prefix.display()),
            format!("-Wl,-rpath,{}/lib", prefix.display()),
            "-lm40llm".to_string()
        ]
    );

    let exe = common::scratch_path("generate-installed");
    let source = root().join("examples-c/generate.c");
    let mut args: Vec<&str> = vec!["-O2", "-std=c11", "-Wall", "-Werror"];
    args.extend(cflags.iter().map(String::as_str));
    args.push(source.to_str().unwrap());
    args.extend(libs.iter().map(String::as_str));
    args.extend(["-o", exe.to_str().unwrap()]);
    compile(&args);

    // It runs against the installed copy: errors come back through it...
    assert_reports_a_missing_model(&exe, "error:");
    // ...and so does llama.cpp's text.
    let model = common::gemma_path();
    let prompt = "Water boils at a temperature of";
    let out = Command::new(&exe)
        .arg(&model)
        .args([
            prompt, "-n", "32", "--temp", "0", "--device", "-1", "-t", "2",
        ])
        .output()
        .unwrap();
    assert_greedy_output(&out, &model, prompt);
}

/// Compiles a C++ source against the shared library and the header wrapper.
fn build_cpp(source: &str, name: &str) -> std::path::PathBuf {
    let lib = library_dir();
    let exe = common::scratch_path(name);
    let rpath = format!("-Wl,-rpath,{}", lib.display());
    compile_cpp(&[
        "-O2",
        "-std=c++17",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-I",
        root().join("include").to_str().unwrap(),
        root().join(source).to_str().unwrap(),
        "-L",
        lib.to_str().unwrap(),
        &rpath,
        "-lm40llm",
        "-o",
        exe.to_str().unwrap(),
    ]);
    exe
}

#[test]
fn the_cpp_example_streams_llama_cpps_greedy_text() {
    let exe = build_cpp("examples-cpp/generate.cpp", "generate-cpp");
    assert_reports_a_missing_model(&exe, "error (I/O error)");
    let model = common::gemma_path();
    for prompt in [
        "The capital of France is",
        "Once upon a time, in a small village,",
    ] {
        let out = Command::new(&exe)
            .arg(&model)
            .args([prompt, "32", "0"])
            .output()
            .unwrap();
        assert_greedy_output(&out, &model, prompt);
    }
}

#[test]
fn the_cpp_wrapper_passes_its_checks() {
    let model = common::gemma_path();
    let exe = build_cpp("tests/cpp/wrapper_test.cpp", "wrapper_test");
    let stdout = stdout_of(&Command::new(&exe).arg(&model).output().unwrap());
    println!("{stdout}");
    assert!(stdout.trim_end().ends_with(" 0 failed"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

// The Zig and Go hosts need toolchains a Rust machine may lack, so they run
// only when asked (`cargo test --test hosts -- --ignored`); `make test` asks
// for each one whose toolchain it finds and says which it skipped.
#[test]
#[ignore = "needs Zig 0.15 (tests/setup.sh installs it into .venv): make test runs it"]
fn a_zig_program_imports_the_header_and_streams_llama_cpps_greedy_text() {
    // Zig from PyPI (`ziglang==0.15.2`; 0.17.1 rejects @cImport), or the
    // compiler $ZIG names.
    let lib = library_dir();
    let exe = common::scratch_path("generate-zig");
    let mut zig = match std::env::var("ZIG") {
        Ok(path) => Command::new(path),
        Err(_) => {
            let mut python = common::python();
            python.args(["-m", "ziglang"]);
            python
        }
    };
    let out = zig
        .arg("build-exe")
        .arg(root().join("bindings/zig/generate.zig"))
        .arg("-I")
        .arg(root().join("include"))
        .arg("-L")
        .arg(&lib)
        .args(["-lm40llm", "-lc", "-O", "ReleaseSafe", "-rpath"])
        .arg(&lib)
        .arg(format!("-femit-bin={}", exe.display()))
        .arg("--cache-dir")
        .arg(common::scratch_path("zig-cache"))
        .output()
        .expect("zig (python3 -m ziglang, from tests/setup.sh)");
    assert!(
        out.status.success(),
        "zig build-exe failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_reports_a_missing_model(&exe, "error: loading the model");
    let model = common::gemma_path();
    let prompt = "The capital of France is";
    let out = Command::new(&exe)
        .arg(&model)
        .args([prompt, "32"])
        .output()
        .unwrap();
    assert_greedy_output(&out, &model, prompt);
}

#[test]
#[ignore = "needs Go (Debian's golang-go): make test runs it where go is on PATH"]
fn the_go_package_passes_its_tests_against_the_installed_library() {
    // Go from Debian's golang-go; the package finds the library with pkg-config.
    let prefix = install("install-prefix-go");
    let mut go = Command::new("go");
    go.args(["test", "-count=1", "-v", "./..."])
        .current_dir(root().join("bindings/go"))
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .env("GOCACHE", common::scratch_path("go-cache"))
        .env("GOFLAGS", "-mod=mod");
    go.env("M40_GEMMA_GGUF", common::gemma_path());
    // The official openai client (tests/setup.sh installs it into .venv).
    let python = root().join(".venv/bin/python3");
    assert!(python.exists(), "no .venv: tests/setup.sh makes it");
    go.env("M40_PYTHON", &python);
    let out = go.output().expect("go on PATH (Debian's golang-go)");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    for package in ["go", "go/server", "go/store", "go/cmd/m40"] {
        let passed = format!("ok  \tm40llm/bindings/{package}\t");
        assert!(stdout.contains(&passed), "{package}: {stdout}");
    }
    // Nothing skipped: the model and the openai client are here.
    assert!(!stdout.contains("--- SKIP"), "{stdout}");
    assert!(stdout.contains("--- PASS: TestTheOpenAIClient"), "{stdout}");
}
