//! Builds, with the C compiler `CC` names (else `cc`), into `OUT_DIR`:
//! - `libcargo-trace-preload.so` from `c/preload.c`: the library the crate embeds. Its
//!   BPF sites must start with their nop, so no `endbr64` (`-fcf-protection=none`).
//! - `libctp-walk-test.so` from `c/walk_test.c`: the C walker over a snapshot, for the
//!   differential test; never embedded.
//! - `layout_c.rs`: the size and field offsets of every struct of `c/shared.h` and the
//!   value of every enum member, as the C compiler lays them out (a program generated
//!   from the header, compiled and run here), which `src/layout.rs` asserts its mirrors
//!   against.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const SHARED: &str = "c/shared.h";
/// The layout of a thread's free log (the BPF sites' mode), which the BPF programs read.
const BPF_HEADERS: &str = "../bpf-prog/src/bpf";

fn main() {
    for file in [
        "c/preload.c",
        "c/record.h",
        "c/hooks.h",
        "c/walk.h",
        "c/walk_test.c",
        SHARED,
    ] {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-changed={BPF_HEADERS}/cargo_trace.h");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    compile(
        &["-shared", "-fPIC", "-Wl,-soname,libcargo-trace-preload.so"],
        "c/preload.c",
        &out.join("libcargo-trace-preload.so"),
        &["-ldl"],
    );
    compile(
        &["-shared", "-fPIC"],
        "c/walk_test.c",
        &out.join("libctp-walk-test.so"),
        &[],
    );
    write_layout(&out);
}

fn compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

fn compile(flags: &[&str], source: &str, output: &Path, libs: &[&str]) {
    let compiler = compiler();
    let status = Command::new(&compiler)
        .args([
            "-O2",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fcf-protection=none",
            "-fasynchronous-unwind-tables",
            "-I",
            "c",
            "-I",
            BPF_HEADERS,
        ])
        .args(flags)
        .arg("-o")
        .arg(output)
        .arg(source)
        .args(libs)
        .status()
        .unwrap_or_else(|error| panic!("running the C compiler '{compiler}': {error}"));
    assert!(status.success(), "building {source} failed");
}

/// A struct of the header: its name and its fields' names, in order.
struct CStruct {
    name: String,
    fields: Vec<String>,
}

/// The structs and enum members of the header, read line by line (the header keeps one
/// declaration per line for this).
fn parse_header(text: &str) -> (Vec<CStruct>, Vec<String>) {
    let mut structs = Vec::new();
    let mut members = Vec::new();
    let mut current: Option<CStruct> = None;
    let mut in_enum = false;
    for raw in text.lines() {
        let line = raw.split("/*").next().unwrap_or("").trim();
        if let Some(rest) = line.strip_prefix("struct ") {
            if let Some(name) = rest.strip_suffix(" {") {
                current = Some(CStruct {
                    name: name.to_string(),
                    fields: Vec::new(),
                });
                continue;
            }
        }
        if line.starts_with("enum ") && line.ends_with('{') {
            in_enum = true;
            continue;
        }
        if line.starts_with("};") {
            if let Some(done) = current.take() {
                structs.push(done);
            }
            in_enum = false;
            continue;
        }
        if in_enum {
            if let Some(name) = line.split('=').next().map(str::trim) {
                if !name.is_empty() {
                    members.push(name.trim_end_matches(',').to_string());
                }
            }
        } else if let Some(s) = current.as_mut() {
            if let Some(decl) = line.strip_suffix(';') {
                let name = decl
                    .rsplit(' ')
                    .next()
                    .expect("a field has a name")
                    .split('[')
                    .next()
                    .expect("split yields one part");
                s.fields.push(name.to_string());
            }
        }
    }
    (structs, members)
}

fn write_layout(out: &Path) {
    let text = std::fs::read_to_string(SHARED).expect("reading c/shared.h");
    let (structs, members) = parse_header(&text);
    let mut program = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"shared.h\"\nint main(void)\n{\n",
    );
    for s in &structs {
        let name = &s.name;
        writeln!(program, "\tprintf(\"pub mod {name} {{\\n\");").unwrap();
        writeln!(
            program,
            "\tprintf(\"pub const SIZE: usize = %zu;\\n\", sizeof(struct {name}));"
        )
        .unwrap();
        writeln!(
            program,
            "\tprintf(\"pub const FIELDS: usize = {n};\\n\");",
            n = s.fields.len()
        )
        .unwrap();
        for field in &s.fields {
            writeln!(
                program,
                "\tprintf(\"pub const {field}: usize = %zu;\\n\", offsetof(struct {name}, {field}));"
            )
            .unwrap();
        }
        writeln!(program, "\tprintf(\"}}\\n\");").unwrap();
    }
    for member in &members {
        writeln!(
            program,
            "\tprintf(\"pub const {member}: i64 = %lld;\\n\", (long long){member});"
        )
        .unwrap();
    }
    program.push_str("\treturn 0;\n}\n");
    let source = out.join("layout_dump.c");
    let binary = out.join("layout_dump");
    std::fs::write(&source, program).expect("writing layout_dump.c");
    let compiler = compiler();
    let status = Command::new(&compiler)
        .args(["-Wall", "-Werror", "-I", "c", "-o"])
        .arg(&binary)
        .arg(&source)
        .status()
        .unwrap_or_else(|error| panic!("running the C compiler '{compiler}': {error}"));
    assert!(status.success(), "building the layout dump failed");
    let output = Command::new(&binary)
        .output()
        .expect("running the layout dump");
    assert!(output.status.success(), "the layout dump failed");
    std::fs::write(out.join("layout_c.rs"), output.stdout).expect("writing layout_c.rs");
}
