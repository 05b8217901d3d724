//! Build script: records what this build contains for `m40_version()`.
//! (The CUDA kernels under `cuda/` are compiled here once the `cuda`
//! feature exists.)

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    println!("cargo:rustc-env=M40_BUILD_INFO=cpu; {target}; {profile}");
    println!("cargo:rerun-if-changed=build.rs");
}
