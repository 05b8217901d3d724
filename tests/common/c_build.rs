//! Building C programs against the library the way hosts do.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding libm40llm.so / libm40llm.a for this test build.
/// `cargo test` builds the library only as an rlib, so the C libraries are
/// built here, once, with the same profile and target directory.
pub fn library_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            // target/<profile>/deps/<test>-<hash> → target/<profile>
            let exe = std::env::current_exe().unwrap();
            let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
            let mut cargo = Command::new(env!("CARGO"));
            cargo
                .args(["build", "--lib", "--quiet"])
                .current_dir(root())
                .env("CARGO_TARGET_DIR", dir.parent().unwrap());
            if dir.ends_with("release") {
                cargo.arg("--release");
            }
            let status = cargo.status().expect("cargo runs");
            assert!(
                status.success(),
                "building libm40llm for the C hosts failed"
            );
            dir
        })
        .clone()
}

pub fn compile(args: &[&str]) {
    compile_with(
        &std::env::var("CC").unwrap_or_else(|_| "cc".to_string()),
        args,
    );
}

/// Compiles C++ with $CXX (default c++).
pub fn compile_cpp(args: &[&str]) {
    compile_with(
        &std::env::var("CXX").unwrap_or_else(|_| "c++".to_string()),
        args,
    );
}

fn compile_with(cc: &str, args: &[&str]) {
    let out = Command::new(cc)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running the compiler {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles `examples-c/<name>.c` against the shared library, as the
/// Makefile does, once per test binary, and returns the executable's path.
pub fn build_example(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, path)) = built.iter().find(|(n, _)| n == name) {
        return path.clone();
    }
    let lib = library_dir();
    let exe = super::scratch_path(name);
    let rpath = format!("-Wl,-rpath,{}", lib.display());
    let source = root().join(format!("examples-c/{name}.c"));
    compile(&[
        "-O2",
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
        root().join("include").to_str().unwrap(),
        source.to_str().unwrap(),
        "-L",
        lib.to_str().unwrap(),
        &rpath,
        "-lm40llm",
        "-lpthread",
        "-lm",
        "-o",
        exe.to_str().unwrap(),
    ]);
    built.push((name.to_string(), exe.clone()));
    exe
}
