//! Test utilities shared by the integration tests.
#![allow(dead_code)] // each test binary uses a different part

pub mod c_build;
pub mod gguf_writer;
pub mod reference;
pub mod tiny_model;

use std::path::PathBuf;

/// A fresh file path under cargo's per-target scratch directory (or
/// `$M40_TEST_TMPDIR`, for test binaries run on another machine).
pub fn scratch_path(name: &str) -> PathBuf {
    let base = std::env::var_os("M40_TEST_TMPDIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from);
    let dir = base.join("m40llm-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}-{name}", std::process::id()))
}

/// `n` pseudo-random token ids in 3..n_vocab (past the usual special
/// tokens), the same for the same seed.
pub fn random_tokens(n: usize, seed: u64, n_vocab: u32) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            3 + (s >> 33) as u32 % (n_vocab - 3)
        })
        .collect()
}

/// The repository's files the tests read (`tools/`, `tests/data/`, `.venv`):
/// `$M40_SOURCE_DIR`, for test binaries run on another machine (see
/// tests/gpu/run.sh), else this checkout.
pub fn source_dir() -> PathBuf {
    std::env::var_os("M40_SOURCE_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// A file of `tests/data/` (reference outputs and vocabularies; see its README).
pub fn test_data(rel: &str) -> PathBuf {
    source_dir().join("tests/data").join(rel)
}

/// Writes the random-weight model `tools/synth_gguf.py ARGS --out out`
/// describes (real shapes and metadata), failing the test with the
/// script's message when it cannot.
pub fn synth_model<A: AsRef<std::ffi::OsStr>>(args: &[A], out: &std::path::Path) {
    let result = python()
        .arg(source_dir().join("tools/synth_gguf.py"))
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("python3 runs tools/synth_gguf.py");
    assert!(
        result.status.success(),
        "synth_gguf.py failed (it needs numpy: tests/setup.sh installs it into .venv): {}",
        String::from_utf8_lossy(&result.stderr)
    );
}

/// The model tools/synth_gguf.py writes for `args`, written once into the
/// scratch folder as `name`.
pub fn synth_once<A: AsRef<std::ffi::OsStr>>(name: &str, args: &[A]) -> PathBuf {
    written_once(name, |partial| synth_model(args, partial))
}

/// The scratch file `name`, written by `write` unless it exists: under a
/// name of its own first, then renamed, as tests running in parallel may
/// ask for the same file (and one may have it mapped while another would
/// write it again).
pub fn written_once(name: &str, write: impl FnOnce(&std::path::Path)) -> PathBuf {
    let path = scratch_path(name);
    if !path.exists() {
        let partial = path.with_extension(format!("{:?}.partial", std::thread::current().id()));
        write(&partial);
        std::fs::rename(&partial, &path).unwrap();
    }
    path
}

/// The Python that has the tests' packages (numpy, gguf-py; tests/requirements.txt):
/// `$M40_PYTHON`, else the project's `.venv` that `tests/setup.sh` makes, else `python3`.
pub fn python() -> std::process::Command {
    let program = std::env::var_os("M40_PYTHON").map_or_else(
        || {
            let venv = source_dir().join(".venv/bin/python3");
            if venv.is_file() {
                venv
            } else {
                PathBuf::from("python3")
            }
        },
        PathBuf::from,
    );
    std::process::Command::new(program)
}

/// The logits of an exact float64 forward pass of `model`
/// (tests/reference/forward_f64.py: gguf-py's dequantized weights, no
/// rounding of activations) over `tokens`, at each of `positions`: one row
/// of the vocabulary's size each, one after the other.
pub fn exact_logits(model: &std::path::Path, tokens: &[u32], positions: &[usize]) -> Vec<f32> {
    let out = model.with_extension("exact.bin");
    let join = |v: Vec<String>| v.join(",");
    let run = python()
        .arg(source_dir().join("tests/reference/forward_f64.py"))
        .arg(model)
        .arg(join(tokens.iter().map(u32::to_string).collect()))
        .arg(&out)
        .arg(join(positions.iter().map(usize::to_string).collect()))
        .output()
        .expect("python3 runs tests/reference/forward_f64.py");
    assert!(
        run.status.success(),
        "forward_f64.py failed (it needs numpy and gguf: tests/setup.sh installs them into .venv):\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// llama.cpp's vocabulary-only GGUF file `ggml-vocab-{name}.gguf`: from
/// `tests/data/vocab` where it is small enough to be in the repository, else
/// fetched once from PyPI into the cache (tests/fetch-vocab.py checks its sha256).
pub fn vocab_path(name: &str) -> PathBuf {
    let file = format!("ggml-vocab-{name}.gguf");
    let local = test_data("vocab").join(&file);
    if local.is_file() {
        return local;
    }
    // The script checks the file's sha256 on every run: once per name.
    static FETCHED: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut fetched = FETCHED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = fetched.iter().find(|(n, _)| n == name) {
        return path.clone();
    }
    let path = fetch(&["tests/fetch-vocab.py", name], "a llama.cpp vocabulary").join(file);
    fetched.push((name.to_string(), path.clone()));
    path
}

/// gpt-oss's vocabulary-only GGUF file (o200k with gpt-oss's special
/// tokens), written once into the cache by `tests/make-gptoss-vocab.py`
/// from PyPI's bpe-openai, sha256-checked. Needs bpe-openai and gguf-py in
/// the `.venv` that tests/setup.sh makes.
pub fn gpt_oss_vocab_path() -> PathBuf {
    static WRITTEN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    WRITTEN
        .get_or_init(|| {
            let out = python()
                .arg(source_dir().join("tests/make-gptoss-vocab.py"))
                .stderr(std::process::Stdio::inherit())
                .output()
                .expect("python3 runs tests/make-gptoss-vocab.py");
            assert!(
                out.status.success(),
                "tests/make-gptoss-vocab.py failed (it needs bpe-openai and gguf: tests/setup.sh installs them into .venv)"
            );
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        })
        .clone()
}

/// Runs a fetch script of `tests/` (python3 for `.py`) with its arguments;
/// it prints the path of what it fetched or found in the cache.
fn fetch(command: &[&str], what: &str) -> PathBuf {
    let script = source_dir().join(command[0]);
    let mut process = if script.extension().is_some_and(|e| e == "py") {
        let mut python = std::process::Command::new("python3");
        python.arg(&script);
        python
    } else {
        std::process::Command::new(&script)
    };
    let out = process
        .args(&command[1..])
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    assert!(
        out.status.success(),
        "fetching {what} failed ({}); it needs python3 and access to PyPI",
        script.display()
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The device the model tests run on: `$M40_TEST_DEVICE` (a CUDA index),
/// else the CPU (-1).
pub fn test_device() -> i32 {
    std::env::var("M40_TEST_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// The real Gemma 3 270M Q4_K_M file: `$M40_GEMMA_GGUF`, else the cache that
/// `tests/fetch-model.sh` fills from PyPI, fetched on first use (sha256-checked).
pub fn gemma_path() -> PathBuf {
    if let Some(path) = std::env::var_os("M40_GEMMA_GGUF") {
        return PathBuf::from(path);
    }
    static FETCHED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FETCHED
        .get_or_init(|| fetch(&["tests/fetch-model.sh"], "the Gemma 3 270M model"))
        .clone()
}

/// Samplers of every kind `Session::decode_batch_sample` serves: greedy
/// with a repetition penalty, small top-k with and without one, seeds of
/// their own, and two that take the whole row: top-k off, and `large_top_k`
/// (a top-k past the vocabulary, or past what the device selects).
pub fn batch_samplers(large_top_k: i32) -> [m40llm::sampling::SamplerParams; 6] {
    use m40llm::sampling::SamplerParams;
    let d = SamplerParams::default();
    [
        SamplerParams {
            temperature: 0.0,
            repeat_penalty: 1.5,
            repeat_last_n: 4,
            ..d
        },
        SamplerParams {
            top_k: 3,
            repeat_penalty: 1.3,
            repeat_last_n: -1,
            seed: 7,
            ..d
        },
        SamplerParams {
            top_k: 0,
            temperature: 1.5,
            ..d
        },
        d,
        SamplerParams {
            top_k: 2,
            temperature: 2.0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 11,
            ..d
        },
        SamplerParams {
            top_k: large_top_k,
            repeat_penalty: 0.8,
            seed: 3,
            ..d
        },
    ]
}

/// The model `arch2-{name}.gguf`, written once into the scratch folder by
/// the command the sha256 file records, and checked against its hash.
pub fn arch2_model(name: &str) -> PathBuf {
    let file = format!("arch2-{name}.gguf");
    let manifest = std::fs::read_to_string(test_data("reference/arch2-tiny.sha256")).unwrap();
    let args = manifest
        .lines()
        .find_map(|l| l.strip_prefix(&format!("# {file} (")))
        .and_then(|l| l.split_once("): "))
        .map(|(_, args)| args.to_string())
        .unwrap_or_else(|| panic!("{file} is not in arch2-tiny.sha256"));
    let sha256 = manifest
        .lines()
        .find_map(|l| l.strip_suffix(&format!("  {file}")))
        .unwrap_or_else(|| panic!("no sha256 for {file}"));
    let path = scratch_path(&file);
    let args: Vec<String> = args
        .split_whitespace()
        .map(|a| match a.strip_prefix("$VOCAB/") {
            Some(file) => vocab_file(file).display().to_string(),
            None => a.to_string(),
        })
        .collect();
    synth_model(&args, &path);
    let sum = std::process::Command::new("sha256sum")
        .arg(&path)
        .output()
        .unwrap();
    let sum = String::from_utf8(sum.stdout).unwrap();
    assert!(
        sum.starts_with(sha256),
        "{file}: sha256 {sum} differs from the reference's {sha256}: tools/synth_gguf.py no longer writes the model llama.cpp ran"
    );
    path
}

/// The vocabulary `ggml-vocab-{name}.gguf` a model's command names, from
/// the repository or fetched into the cache.
fn vocab_file(file: &str) -> PathBuf {
    let name = file
        .strip_prefix("ggml-vocab-")
        .and_then(|f| f.strip_suffix(".gguf"))
        .unwrap_or_else(|| panic!("{file} is not a llama.cpp vocabulary file"));
    vocab_path(name)
}
