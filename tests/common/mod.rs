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

/// The workplace's shared folder (reference data, tools): `$M40_SHARED_DIR`,
/// else `../shared` beside the repository.
pub fn shared_dir() -> PathBuf {
    std::env::var_os("M40_SHARED_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"),
        PathBuf::from,
    )
}

/// The device the model tests run on: `$M40_TEST_DEVICE` (a CUDA index),
/// else the CPU (-1).
pub fn test_device() -> i32 {
    std::env::var("M40_TEST_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// The real Gemma 3 270M Q4_K_M file: `$M40_GEMMA_GGUF`, else the cache path
/// `tests/fetch-model.sh` writes to. `None` when it is not there; the tests
/// that need it fail when `M40_REQUIRE_MODEL=1` (as `make test` and CI set).
pub fn gemma_path() -> Option<PathBuf> {
    let path = std::env::var_os("M40_GEMMA_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("M40_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    let base = std::env::var_os("XDG_CACHE_HOME")
                        .map(PathBuf::from)
                        .unwrap_or_else(|| {
                            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                                .join(".cache")
                        });
                    base.join("m40llm")
                });
            cache.join("gemma-3-270m-q4_k_m.gguf")
        });
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("M40_REQUIRE_MODEL").as_deref() != Ok("1"),
        "the Gemma 3 270M model is required but {} is missing: run tests/fetch-model.sh",
        path.display()
    );
    eprintln!(
        "skipping: {} is missing (run tests/fetch-model.sh)",
        path.display()
    );
    None
}
