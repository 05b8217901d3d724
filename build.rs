//! Build script: records what this build contains for `m40_version()`, and
//! with the `cuda` feature compiles `cuda/*.cu` with nvcc into the library.
//!
//! CUDA targets: SASS for every architecture in `M40_CUDA_ARCHS` (default
//! 52,61,70,75,80,86,90: Tesla M40 through H100) plus compute_52 PTX, which
//! the driver compiles for any newer GPU. `M40_CUDA_ARCHS=ptx` builds the PTX
//! alone: the tests run that build too, so the M40's code path is executed
//! on whatever GPU the tests run on.

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    println!("cargo:rerun-if-changed=build.rs");
    let backends = if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        let archs = build_cuda();
        format!("cpu, cuda ({archs})")
    } else {
        "cpu".to_string()
    };
    println!("cargo:rustc-env=M40_BUILD_INFO={backends}; {target}; {profile}");
}

const DEFAULT_ARCHS: &str = "52,61,70,75,80,86,90";

/// Compiles the kernels; returns the targets built, for the build info.
fn build_cuda() -> String {
    println!("cargo:rerun-if-env-changed=M40_CUDA_ARCHS");
    println!("cargo:rerun-if-env-changed=NVCC_CCBIN");
    println!("cargo:rerun-if-changed=cuda");
    let archs = std::env::var("M40_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_string());
    let mut build = cc::Build::new();
    build
        .cuda(true)
        // cudart is linked below as a static library of its own, so that the
        // staticlib carries it and the cdylib needs only the driver.
        .cudart("none")
        // Cargo's debug info setting must not reach nvcc: cc turns it into
        // -G, device debug code with every optimization off (found on the
        // H100 as kernels running ~20x below their memory bandwidth).
        .debug(false)
        .flag("-std=c++17")
        .flag("-O3")
        .flag("-Wno-deprecated-gpu-targets");
    // nvcc 11.8 accepts host compilers up to gcc 11.
    let ccbin = std::env::var("NVCC_CCBIN").unwrap_or_else(|_| "g++-11".to_string());
    build.ccbin(false).flag(format!("-ccbin={ccbin}"));
    let mut built = Vec::new();
    for arch in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        if arch == "ptx" {
            continue;
        }
        assert!(
            arch.chars().all(|c| c.is_ascii_digit()),
            "M40_CUDA_ARCHS: '{arch}' is not an SM number (e.g. 52,90) or 'ptx'"
        );
        build.flag(format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
        built.push(format!("sm_{arch}"));
    }
    build.flag("-gencode=arch=compute_52,code=compute_52");
    built.push("compute_52 PTX".to_string());

    // One translation unit that includes the others (see cuda/m40llm.cu).
    build.file("cuda/m40llm.cu");
    build.compile("m40llm_cuda");

    if let Some(dir) = cudart_dir() {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    println!("cargo:rustc-link-lib=static=cudart_static");
    for lib in ["rt", "dl", "pthread"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    built.join(" ")
}

/// The folder holding `libcudart_static.a`: beside the toolkit that provides
/// nvcc (NVIDIA's layout) or the distribution's library folder (Debian's).
fn cudart_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let mut candidates: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = std::env::var_os(var) {
            candidates.push(PathBuf::from(&root).join("lib64"));
            candidates.push(PathBuf::from(&root).join("targets/x86_64-linux/lib"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("nvcc").is_file() {
                candidates.push(dir.join("../lib64"));
                candidates.push(dir.join("../targets/x86_64-linux/lib"));
            }
        }
    }
    candidates.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    candidates.push(PathBuf::from("/usr/local/cuda/lib64"));
    candidates
        .into_iter()
        .find(|dir| dir.join("libcudart_static.a").is_file())
}
