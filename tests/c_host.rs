//! Builds `tests/c/abi_host.c` against `include/m40llm.h` and the library as a
//! C host would (the shared library, then the static one), runs it, and checks
//! that every check it makes passes. Also compiles the header as C++.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::c_build::{compile, library_dir, root};
use common::tiny_model::{tiny_model, TINY};

fn host_inputs() -> (PathBuf, PathBuf) {
    let valid = common::scratch_path("host-valid.gguf");
    std::fs::write(&valid, tiny_model("llama").build()).unwrap();
    let malformed = common::scratch_path("host-malformed.gguf");
    let mut bytes = tiny_model("llama").build();
    bytes.truncate(bytes.len() / 3);
    std::fs::write(&malformed, bytes).unwrap();
    (valid, malformed)
}

fn run_host(exe: &Path) {
    let (valid, malformed) = host_inputs();
    let mut cmd = Command::new(exe);
    cmd.arg(&valid)
        .arg(&malformed)
        .arg(TINY.n_vocab.to_string());
    cmd.arg(common::gemma_path());
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the C host reported failures:\n{stdout}"
    );
    assert!(stdout.trim_end().ends_with("0 failed"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

#[test]
fn a_c_host_using_the_shared_library_passes_all_its_checks() {
    let lib = library_dir();
    let exe = common::scratch_path("abi_host_shared");
    let rpath = format!("-Wl,-rpath,{}", lib.display());
    compile(&[
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-I",
        root().join("include").to_str().unwrap(),
        root().join("tests/c/abi_host.c").to_str().unwrap(),
        "-L",
        lib.to_str().unwrap(),
        &rpath,
        "-lm40llm",
        "-lpthread",
        "-o",
        exe.to_str().unwrap(),
    ]);
    run_host(&exe);
}

#[test]
fn a_c_host_linking_the_static_library_passes_all_its_checks() {
    let lib = library_dir().join("libm40llm.a");
    let exe = common::scratch_path("abi_host_static");
    compile(&[
        "-std=c11",
        "-I",
        root().join("include").to_str().unwrap(),
        root().join("tests/c/abi_host.c").to_str().unwrap(),
        lib.to_str().unwrap(),
        "-lpthread",
        "-ldl",
        "-lm",
        "-o",
        exe.to_str().unwrap(),
    ]);
    run_host(&exe);
}

#[test]
fn the_header_compiles_as_cpp() {
    let src = common::scratch_path("header_check.cpp");
    std::fs::write(&src, "#include \"m40llm.h\"\nint main() { return m40_abi_version() == M40_ABI_VERSION ? 0 : 1; }\n")
        .unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let out = Command::new(&cxx)
        .args(["-std=c++17", "-Wall", "-Werror", "-fsyntax-only", "-I"])
        .arg(root().join("include"))
        .arg(&src)
        .output()
        .expect("a C++ compiler (c++) on PATH");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
