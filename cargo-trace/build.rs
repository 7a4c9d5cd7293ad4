//! Builds the heap profiler's preloaded library (`preload/preload.c`), which the binary
//! embeds.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    build_preload();
}

/// `libcargo-trace-preload.so` in `OUT_DIR`, with the C compiler `CC` names (else `cc`).
/// Its sites must start with their nop: no `endbr64` (`-fcf-protection=none`).
fn build_preload() {
    const SOURCE: &str = "preload/preload.c";
    // The layout of a thread's free log, which the BPF programs read.
    const HEADERS: &str = "../bpf-prog/src/bpf";
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed={HEADERS}/cargo_trace.h");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&compiler)
        .args([
            "-O2",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            "-fcf-protection=none",
            "-fasynchronous-unwind-tables",
            "-Wl,-soname,libcargo-trace-preload.so",
            "-I",
            HEADERS,
            "-o",
        ])
        .arg(out.join("libcargo-trace-preload.so"))
        .arg(SOURCE)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|error| panic!("running the C compiler '{compiler}': {error}"));
    assert!(status.success(), "building {SOURCE} failed");
}
