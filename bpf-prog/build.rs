//! Builds the BPF object and its libbpf-rs skeleton.
//!
//! With a clang (`$BPF_CLANG`, else `clang`, else `clang-19` … `clang-14`),
//! `src/bpf/trace.bpf.c` is compiled and the skeleton generated from the
//! result. Without one, the skeleton is generated from the committed object
//! `src/bpf/prebuilt/trace.bpf.o`, provided the hash of the sources recorded
//! beside it matches the sources: a stale object fails the build rather than
//! load a program that disagrees with `layout.rs`.
//!
//! `BPF_PROG_UPDATE_PREBUILT=1` copies the freshly compiled object and its
//! source hash over the committed ones; `BPF_PROG_USE_PREBUILT=1` ignores clang
//! (to try the no-clang path on a machine that has one).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

/// Every file the object is compiled from, in hashing order.
const INPUTS: [&str; 8] = [
    "src/bpf/trace.bpf.c",
    "src/bpf/walk.bpf.h",
    "src/bpf/memo.bpf.h",
    "src/bpf/alloc.bpf.h",
    "src/bpf/offcpu.bpf.h",
    "src/bpf/interval.bpf.h",
    "src/bpf/cargo_trace.h",
    "src/bpf/vmlinux.h",
];
const SOURCE: &str = "src/bpf/trace.bpf.c";
const PREBUILT: &str = "src/bpf/prebuilt/trace.bpf.o";
const PREBUILT_HASH: &str = "src/bpf/prebuilt/trace.bpf.o.source-hash";
const CLANGS: [&str; 7] = [
    "clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14",
];

fn main() {
    for path in INPUTS.iter().chain(&[PREBUILT, PREBUILT_HASH]) {
        println!("cargo:rerun-if-changed={path}");
    }
    for var in [
        "BPF_CLANG",
        "BPF_PROG_UPDATE_PREBUILT",
        "BPF_PROG_USE_PREBUILT",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let root = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let skeleton = out_dir.join("trace.skel.rs");
    let hash = source_hash(&root);
    println!("cargo:rustc-env=BPF_PROG_SOURCE_HASH={hash}");

    let clang = if env::var_os("BPF_PROG_USE_PREBUILT").is_some() {
        None
    } else {
        find_clang()
    };
    let origin = match clang {
        Some(clang) => {
            let object = out_dir.join("trace.bpf.o");
            let result = SkeletonBuilder::new()
                .source(root.join(SOURCE))
                .obj(&object)
                .clang(&clang)
                // v3: atomic fetch-and-or (nesting levels) and 32-bit jumps.
                .clang_args(["-Wall", "-Wno-unused-function", "-mcpu=v3"])
                .build_and_generate(&skeleton);
            if let Err(error) = result {
                panic!("compiling {SOURCE} with {clang}: {error:#}");
            }
            if env::var_os("BPF_PROG_UPDATE_PREBUILT").is_some() {
                fs::copy(&object, root.join(PREBUILT)).expect("copy the prebuilt object");
                fs::write(root.join(PREBUILT_HASH), format!("{hash}\n"))
                    .expect("write the prebuilt object's source hash");
            } else if recorded_hash(&root).as_deref() != Some(hash.as_str()) {
                println!(
                    "cargo:warning={PREBUILT} is stale: refresh it with \
                     BPF_PROG_UPDATE_PREBUILT=1 cargo build -p bpf-prog"
                );
            }
            format!("compiled with {clang}")
        }
        None => {
            let recorded = recorded_hash(&root);
            if recorded.as_deref() != Some(hash.as_str()) {
                panic!(
                    "no clang found ($BPF_CLANG, {}) and {PREBUILT} does not match the BPF \
                     sources (recorded source hash {recorded:?}, current {hash}). Install clang \
                     (.ci/setup.sh does) or refresh the object on a machine that has one: \
                     BPF_PROG_UPDATE_PREBUILT=1 cargo build -p bpf-prog",
                    CLANGS.join(", ")
                );
            }
            if let Err(error) = SkeletonBuilder::new()
                .obj(root.join(PREBUILT))
                .generate(&skeleton)
            {
                panic!("generating the skeleton of {PREBUILT}: {error:#}");
            }
            "prebuilt".to_string()
        }
    };
    println!("cargo:rustc-env=BPF_PROG_OBJECT_ORIGIN={origin}");
}

/// The first clang that runs: `$BPF_CLANG` if set, else the usual names.
fn find_clang() -> Option<String> {
    let runs = |clang: &str| {
        Command::new(clang)
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success())
    };
    if let Some(clang) = env::var_os("BPF_CLANG") {
        let clang = clang.to_string_lossy().into_owned();
        assert!(runs(&clang), "$BPF_CLANG={clang} does not run");
        return Some(clang);
    }
    CLANGS
        .iter()
        .find(|clang| runs(clang))
        .map(|clang| clang.to_string())
}

fn recorded_hash(root: &Path) -> Option<String> {
    let text = fs::read_to_string(root.join(PREBUILT_HASH)).ok()?;
    Some(text.trim().to_string())
}

/// FNV-1a (64-bit) over each input's name, length and bytes. It only has to
/// notice an edit, not resist one.
fn source_hash(root: &Path) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for input in INPUTS {
        let bytes = fs::read(root.join(input)).unwrap_or_else(|e| panic!("reading {input}: {e}"));
        feed(input.as_bytes());
        feed(&(bytes.len() as u64).to_le_bytes());
        feed(&bytes);
    }
    format!("fnv1a64:{hash:016x}")
}
