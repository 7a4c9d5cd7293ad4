//! Allocators the preloaded library cannot interpose, recorded in the process all the
//! same: the library hooks their functions' entries (`alloc::hooks`, `preload/c/hooks.h`)
//! in every process the target starts (at each image's connection) and in what a
//! process dlopens (after the dlopen).
//!
//! - A C parent (`exec_child`, libc's malloc through the wrappers) that execs a Rust
//!   child built with tikv-jemallocator, and one with the mimalloc crate (`alloc_crates`):
//!   every site of both processes exact.
//! - A program (`dlopen_sites`) that dlopens a plugin linked with libmimalloc and
//!   allocates through mimalloc's own API: every site of the plugin exact.
//! - rustc (its executable carries jemalloc, unprefixed) compiling one file, run directly
//!   and as the child of a shell: its process's allocations within 1% of each other and
//!   of the BPF path's (`--no-preload`).

mod common;

use std::path::Path;

use cargo_trace_tests::expected::{self, HeapSite};
use cargo_trace_tests::fixtures;
use common::{bpf_available, csv_fields, quoted, shell_quote, trace, Run};

/// One stack of the CSV: its frames (root first) and values by column.
struct Row {
    frames: Vec<String>,
    values: Vec<(String, i64)>,
}

impl Row {
    fn value(&self, column: &str) -> i64 {
        self.values
            .iter()
            .find(|(name, _)| name == column)
            .map_or(0, |(_, v)| *v)
    }
}

fn read_csv(run: &Run) -> Vec<Row> {
    let text = std::fs::read_to_string(run.scratch.path("heap.csv"))
        .unwrap_or_else(|e| panic!("no CSV: {e}\n{}", run.stderr));
    let mut lines = text.lines();
    let header = csv_fields(lines.next().expect("a header"));
    lines
        .map(|line| {
            let fields = csv_fields(line);
            Row {
                frames: fields[3].split(';').map(str::to_string).collect(),
                values: header
                    .iter()
                    .zip(&fields)
                    .filter_map(|(name, value)| Some((name.clone(), value.parse().ok()?)))
                    .collect(),
            }
        })
        .collect()
}

/// Runs `command` in the process (asserted: `--bpf-stats` names the in-process path and
/// its hooks, none refused) and checks every site it printed: allocations, bytes, frees
/// and leaks exactly, every walk complete. Returns the run.
fn check_exact(name: &str, command: &str, sites_expected: usize) -> Run {
    let run = trace(
        name,
        &["alloc"],
        command,
        &["--csv", "heap.csv", "--bpf-stats", "--json", "heap.json"],
    );
    assert!(run.status.success(), "{name}: {}", run.stderr);
    assert!(
        run.stderr.contains("in-process: hooks: ")
            && !run.stderr.contains("bpf on_alloc")
            && !run.stderr.contains("could not be hooked"),
        "{name}: not recorded in the process, every allocator function hooked:\n{}",
        run.stderr
    );
    run.assert_every_walk_complete();
    let sites: Vec<HeapSite> = expected::parse_heap_sites(&run.stdout).unwrap();
    assert_eq!(sites.len(), sites_expected, "{name}: {}", run.stdout);
    let rows = read_csv(&run);
    for site in &sites {
        let of_site: Vec<&Row> = rows
            .iter()
            .filter(|row| row.frames.contains(&site.function))
            .collect();
        let sum = |column: &str| of_site.iter().map(|row| row.value(column)).sum::<i64>() as u64;
        let what = format!("{name}: {}", site.function);
        assert_eq!(sum("allocs"), site.allocs, "{what} allocations");
        assert_eq!(sum("alloc_space"), site.bytes, "{what} bytes");
        assert_eq!(sum("frees"), site.frees, "{what} frees");
        assert_eq!(sum("leaked_blocks"), site.leaked, "{what} leaks");
    }
    run
}

/// The hooks line of `--bpf-stats`: functions hooked in how many processes.
fn hooked(run: &Run) -> (u64, u64) {
    let line = run
        .stderr
        .lines()
        .find(|line| line.contains("in-process: hooks: "))
        .unwrap_or_else(|| panic!("no hooks line:\n{}", run.stderr));
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

/// A C parent that execs a Rust child built with each allocator crate: the child's
/// allocator is hooked at its own connection, and both processes' sites are exact. (Both
/// processes have a hook: the dynamic linker's `_dl_debug_state`.)
#[test]
fn a_child_with_an_allocator_crate_is_hooked() {
    if !bpf_available("a_child_with_an_allocator_crate_is_hooked") {
        return;
    }
    let parent = fixtures::c_fixture("exec_child");
    for (feature, sites) in [("jemalloc", 10), ("mimalloc", 9)] {
        let child = fixtures::cargo_fixture("alloc_crates", feature)
            .unwrap_or_else(|error| panic!("building alloc_crates with {feature}: {error}"));
        let run = check_exact(
            &format!("hooks-child-{feature}"),
            &format!("{} {}", quoted(&parent), quoted(&child)),
            sites,
        );
        let (functions, processes) = hooked(&run);
        assert!(
            functions >= 4 && processes == 2,
            "{feature}: {}",
            run.stderr
        );
        // The profile says what was counted where: the child's allocator by hooks, libc
        // by the wrappers in both.
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.scratch.path("heap.json")).unwrap()).unwrap();
        let entries = json["heap"]["allocators"].as_array().unwrap();
        let texts = |executable: &std::path::Path| -> Vec<String> {
            let entry = entries
                .iter()
                .find(|e| {
                    let canonical = std::fs::canonicalize(executable).unwrap();
                    e["executable"].as_str() == canonical.to_str()
                })
                .unwrap_or_else(|| panic!("{feature}: no entry for {executable:?}: {entries:?}"));
            assert!(entry["missed"].is_null(), "{feature}: {entry}");
            entry["allocators"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["text"].as_str().unwrap().to_string())
                .collect()
        };
        let wrappers = "libc by the preloaded library's wrappers".to_string();
        assert_eq!(texts(&parent), std::slice::from_ref(&wrappers), "{feature}");
        let child_counted = texts(&child);
        assert!(
            child_counted.contains(&wrappers)
                && child_counted.iter().any(|t| t.starts_with(feature)
                    && t.ends_with(&format!(
                        "{} by hooks in the process",
                        std::fs::canonicalize(&child).unwrap().display()
                    ))),
            "{feature}: {child_counted:?}"
        );
        assert!(
            run.stderr.contains(feature)
                && run.stderr.contains("by hooks in the process (1 process)"),
            "{feature}: the summary names the hooked allocator: {}",
            run.stderr
        );
    }
}

/// A plugin that brings mimalloc into the process when it is dlopened: mimalloc's own
/// API (which no wrapper reaches) is hooked before dlopen returns, and the plugin's sites
/// are exact.
#[test]
fn a_dlopened_allocator_is_hooked() {
    if !bpf_available("a_dlopened_allocator_is_hooked") {
        return;
    }
    if !Path::new("/usr/include/mimalloc.h").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "/usr/include/mimalloc.h is missing: .ci/setup.sh installs it"
        );
        eprintln!("skipping: no /usr/include/mimalloc.h (bash .ci/setup.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("libaplug.so");
    let source = fixtures::source_path(fixtures::Lang::C, "alloc_plugin");
    let status = std::process::Command::new("cc")
        .args([
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-shared",
            "-fPIC",
            "-o",
        ])
        .arg(&plugin)
        .arg(&source)
        .arg("-lmimalloc")
        .status()
        .unwrap();
    assert!(status.success(), "building the plugin");
    let program = fixtures::c_fixture("dlopen_sites");
    let run = check_exact(
        "hooks-dlopen",
        &format!("{} {}", quoted(&program), quoted(&plugin)),
        3,
    );
    let (functions, _) = hooked(&run);
    assert!(functions >= 3, "{}", run.stderr);
}

/// The allocations of the process that made the most of them, from `run`'s JSON.
fn busiest_process(run: &Run) -> u64 {
    let text = std::fs::read_to_string(run.scratch.path("heap.json"))
        .unwrap_or_else(|e| panic!("no JSON: {e}\n{}", run.stderr));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["heap"]["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["allocations"].as_u64())
        .max()
        .expect("a process")
}

/// rustc compiling one file: its executable carries jemalloc (unprefixed, exported, so
/// first in the lookup order: the wrappers never see it). Hooked, its process counts the
/// same run directly and as the child of a shell, and the same as the BPF path, which
/// probes rustc's jemalloc by its symbols when rustc is the launched target: within 1%.
#[test]
fn rustc_directly_and_under_a_shell_alike() {
    if !bpf_available("rustc_directly_and_under_a_shell_alike") {
        return;
    }
    let sysroot = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|out| out.status.success());
    let Some(sysroot) = sysroot else {
        eprintln!("skipping: no rustc on PATH");
        return;
    };
    // The toolchain's rustc itself, not rustup's proxy (which runs it in the same process).
    let rustc = Path::new(String::from_utf8_lossy(&sysroot.stdout).trim()).join("bin/rustc");
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("main.rs");
    std::fs::write(&source, RUSTC_SOURCE).unwrap();
    let compile = format!(
        "{} --edition 2021 -o {} {}",
        quoted(&rustc),
        quoted(&dir.path().join("x")),
        quoted(&source)
    );
    let run = |name: &str, command: &str, extra: &[&str]| {
        let mut args = vec!["--json", "heap.json", "--bpf-stats"];
        args.extend(extra);
        let run = trace(name, &["alloc"], command, &args);
        assert!(run.status.success(), "{name}: {}", run.stderr);
        run
    };
    let direct = run("hooks-rustc", &compile, &[]);
    let shell = run(
        "hooks-rustc-sh",
        &format!("sh -c {}", shell_quote(&format!("{compile}; true"))),
        &[],
    );
    let bpf = run("hooks-rustc-bpf", &compile, &["--no-preload"]);
    for (name, recorded) in [("direct", &direct), ("under sh", &shell)] {
        assert!(
            recorded.stderr.contains("in-process: hooks: ")
                && !recorded.stderr.contains("could not be hooked"),
            "{name}: {}",
            recorded.stderr
        );
        assert!(hooked(recorded).0 >= 3, "{name}: {}", recorded.stderr);
    }
    assert!(bpf.stderr.contains("bpf on_alloc"), "{}", bpf.stderr);
    let (a, b, c) = (
        busiest_process(&direct),
        busiest_process(&shell),
        busiest_process(&bpf),
    );
    eprintln!("rustc's allocations: {a} directly, {b} under sh, {c} on the BPF path");
    let near = |x: u64, y: u64| x.abs_diff(y) * 100 <= x.max(y);
    assert!(a > 10_000, "rustc's jemalloc not counted: {a}");
    assert!(near(a, b), "directly {a}, under sh {b}");
    assert!(near(a, c), "in the process {a}, on the BPF path {c}");
}

/// A file with some work for rustc: traits, generics, derives, formatting.
const RUSTC_SOURCE: &str = r#"
use std::collections::{BTreeMap, HashMap};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Token { Number(i64), Word(String), Symbol(char) }

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Number(n) => write!(f, "{n}"),
            Token::Word(w) => write!(f, "{w}"),
            Token::Symbol(c) => write!(f, "{c}"),
        }
    }
}

fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_ascii_digit() {
            let mut n = 0i64;
            while let Some(&d) = chars.peek() {
                if let Some(v) = d.to_digit(10) { n = n * 10 + v as i64; chars.next(); } else { break; }
            }
            tokens.push(Token::Number(n));
        } else if c.is_alphabetic() {
            let mut w = String::new();
            while let Some(&d) = chars.peek() {
                if d.is_alphanumeric() { w.push(d); chars.next(); } else { break; }
            }
            tokens.push(Token::Word(w));
        } else { if !c.is_whitespace() { tokens.push(Token::Symbol(c)); } chars.next(); }
    }
    tokens
}

trait Summary { fn summary(&self) -> String; }
impl<T: fmt::Display> Summary for Vec<T> {
    fn summary(&self) -> String { self.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" ") }
}

fn main() {
    let text = "let x = 42 + y * (3 - z); print x 7 8 9";
    let tokens = tokenize(text);
    let mut counts: HashMap<Token, usize> = HashMap::new();
    for t in &tokens { *counts.entry(t.clone()).or_default() += 1; }
    let sorted: BTreeMap<_, _> = counts.into_iter().collect();
    println!("{} {:?}", tokens.summary(), sorted);
}
"#;

/// An allocator named (`--alloc-prefix my_`) one of whose functions cannot be hooked
/// (`alloc_prefixed`'s my_free, a lone `ret`): the session is not recorded in the process
/// with that function's calls missing, but probed with BPF, with a note that says which
/// function and why; its site counted exactly there.
#[test]
fn a_named_allocator_that_cannot_be_hooked_is_probed_with_bpf() {
    if !bpf_available("a_named_allocator_that_cannot_be_hooked_is_probed_with_bpf") {
        return;
    }
    let path = fixtures::c_fixture("alloc_prefixed");
    let run = trace(
        "alloc-prefixed",
        &["alloc"],
        &quoted(&path),
        &["--alloc-prefix", "my_", "--csv", "heap.csv", "--bpf-stats"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let note = run
        .stderr
        .lines()
        .find(|line| line.contains("is probed with BPF"))
        .unwrap_or_else(|| panic!("no note:\n{}", run.stderr));
    assert!(
        note.starts_with("cargo-trace: note: alloc is probed with BPF: my_free of ")
            && note.contains("cannot be hooked (it is shorter than the 5-byte jump"),
        "{note}"
    );
    assert!(
        run.stderr.contains("bpf on_alloc: ") && !run.stderr.contains("in-process:"),
        "{}",
        run.stderr
    );
    let sites: Vec<HeapSite> = expected::parse_heap_sites(&run.stdout).unwrap();
    assert_eq!(sites.len(), 1, "{}", run.stdout);
    let rows = read_csv(&run);
    let of_site: Vec<&Row> = rows
        .iter()
        .filter(|row| row.frames.contains(&sites[0].function))
        .collect();
    let sum = |column: &str| of_site.iter().map(|row| row.value(column)).sum::<i64>() as u64;
    assert_eq!(
        (sum("allocs"), sum("alloc_space"), sum("frees")),
        (sites[0].allocs, sites[0].bytes, sites[0].frees),
        "{}",
        run.stdout
    );
}
