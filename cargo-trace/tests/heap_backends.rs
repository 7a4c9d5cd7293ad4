//! The two ways of recording the heap agree: a launched target recorded in the process
//! by the preloaded library (the default) and the same program probed by the BPF heap
//! programs (`--no-preload`, which probes libc's functions themselves) give every site of
//! the fixtures the same values under the same chain of callers.
//!
//! The innermost frame differs by design (the library's wrapper of malloc, or libc's
//! malloc where the BPF probe fires) and is left out of the comparison (an allocator the
//! library hooks, linked into the executable or brought by a library, starts its walk
//! where the BPF path probes it: the stacks are the same, the innermost frame too); so are the values
//! that depend on when a call ran (temporaries, lifetimes, ages), whose clocks differ.
//! Only stacks through the fixtures' own sites are compared: the BPF probes also see
//! libc's calls to its own malloc (stdio's buffers), which no wrapper does.
//!
//! Allocators named (`alloc:jemalloc`, `alloc:mimalloc`, `alloc:PATH`, `--alloc-prefix`)
//! are compared too: in the process, their functions hooked and the wrappers passing
//! calls through with a tail jump, so that a library's hooked malloc reached through a
//! wrapper has the program's frame as its caller (a wrapper's frame left in its stack
//! fails `named_allocators_alike_in_process_and_in_bpf`).

mod common;

use std::collections::BTreeMap;

use cargo_trace_tests::expected::{self, HeapSite};
use cargo_trace_tests::fixtures;
use common::{bpf_available, quoted, trace, Run};

/// The values compared: those that do not depend on the clock (nor, but in a program of
/// one thread, on the order in which threads ran: `peak_bytes`).
const COMPARED: &[&str] = &[
    "allocs",
    "alloc_space",
    "frees",
    "freed_space",
    "leaked_blocks",
    "leaked_bytes",
    "untracked",
];

/// Each site's stacks (callers of the innermost frame, root first) and their values.
type BySite = BTreeMap<String, BTreeMap<Vec<String>, BTreeMap<String, i64>>>;

fn run(name: &str, probe: &[&str], command: &str, extra: &[&str]) -> Run {
    // The fixtures' anonymous mappings compared as the sites they are.
    let mut args = vec!["--csv", "heap.csv", "--mmap"];
    args.extend(extra);
    let (probe, flags) = probe.split_first().expect("a probe");
    args.extend(flags);
    let run = trace(name, &[probe], command, &args);
    assert!(run.status.success(), "{name}: {}", run.stderr);
    run
}

/// The compared values of every stack through a site of `sites`, from `run`'s CSV; with
/// `peak`, the bytes live at the process's peak too.
fn by_site(run: &Run, sites: &[HeapSite], peak: bool) -> BySite {
    let text = std::fs::read_to_string(run.scratch.path("heap.csv"))
        .unwrap_or_else(|e| panic!("no CSV: {e}\n{}", run.stderr));
    let mut lines = text.lines();
    let header = common::csv_fields(lines.next().expect("a header"));
    let mut found = BySite::new();
    for line in lines {
        let fields = common::csv_fields(line);
        let frames: Vec<String> = fields[3].split(';').map(str::to_string).collect();
        let Some(site) = sites.iter().find(|s| frames.contains(&s.function)) else {
            continue;
        };
        assert!(fields[2].is_empty(), "a truncated stack: {line}");
        // Root first: the innermost frame is the last.
        let callers = frames[..frames.len() - 1].to_vec();
        let values = found
            .entry(site.function.clone())
            .or_default()
            .entry(callers)
            .or_default();
        for (name, value) in header.iter().zip(&fields) {
            if COMPARED.contains(&name.as_str()) || (peak && name == "peak_bytes") {
                *values.entry(name.clone()).or_default() += value.parse::<i64>().unwrap();
            }
        }
        for bucket in header
            .iter()
            .zip(&fields)
            .filter(|(n, _)| n.starts_with("size_bucket_"))
        {
            *values.entry(bucket.0.clone()).or_default() += bucket.1.parse::<i64>().unwrap();
        }
    }
    found
}

/// Runs `command` both ways and compares its sites; `one_thread`: the program has one
/// thread, so the moment of its peak is the same both ways.
fn check_same(name: &str, command: &str, one_thread: bool) {
    check_same_with(name, &["alloc"], command, one_thread);
}

/// [`check_same`] with `probe`: the probe and its flags (`alloc:jemalloc`, `alloc
/// --alloc-prefix _rjem_`). Recorded in the process with every function hooked.
fn check_same_with(name: &str, probe: &[&str], command: &str, one_thread: bool) {
    if !bpf_available(name) {
        return;
    }
    let in_process = run(
        &format!("{name}-in-process"),
        probe,
        command,
        &["--bpf-stats"],
    );
    assert!(
        in_process.stderr.contains("in-process:")
            && !in_process.stderr.contains("bpf on_")
            && !in_process.stderr.contains("could not be hooked"),
        "{name}: not recorded in the process:\n{}",
        in_process.stderr
    );
    let bpf = run(
        &format!("{name}-bpf"),
        probe,
        command,
        &["--no-preload", "--bpf-stats"],
    );
    assert!(bpf.stderr.contains("bpf on_alloc: "), "{}", bpf.stderr);
    let sites = expected::parse_heap_sites(&in_process.stdout).expect("the fixture's sites");
    assert!(!sites.is_empty(), "{}", in_process.stdout);
    let ours = by_site(&in_process, &sites, one_thread);
    let theirs = by_site(&bpf, &sites, one_thread);
    for site in sites.iter().filter(|site| site.allocs > 0) {
        assert!(
            ours.contains_key(&site.function),
            "{name}: {} not seen",
            site.function
        );
    }
    let mut differences = Vec::new();
    for site in ours.keys().chain(theirs.keys()) {
        let (a, b) = (ours.get(site), theirs.get(site));
        let stacks: std::collections::BTreeSet<_> = a
            .into_iter()
            .chain(b)
            .flat_map(|stacks| stacks.keys())
            .collect();
        for stack in stacks {
            let (x, y) = (a.and_then(|s| s.get(stack)), b.and_then(|s| s.get(stack)));
            if x != y {
                differences.push(format!(
                    "{site} under ...{}: in the process {x:?}, in BPF {y:?}",
                    stack[stack.len().saturating_sub(3)..].join(";")
                ));
            }
        }
    }
    differences.dedup();
    assert!(
        differences.is_empty(),
        "{name}: the two recordings differ:\n{}",
        differences.join("\n")
    );
}

/// Every function of libc's malloc API, from C.
#[test]
fn every_libc_function_alike_in_process_and_in_bpf() {
    check_same(
        "backends-alloc-c",
        &quoted(&fixtures::c_fixture("alloc_c")),
        true,
    );
}

/// Rust's global allocator (the system's), through Vec, Box, String and their growth.
#[test]
fn rust_sites_alike_in_process_and_in_bpf() {
    check_same(
        "backends-alloc-sites",
        &quoted(&fixtures::rust_fixture("alloc_sites")),
        false,
    );
}

/// Threads that free what others allocated, and a process that forks and execs.
#[test]
fn threads_and_children_alike_in_process_and_in_bpf() {
    let free_log = quoted(&fixtures::c_fixture("free_log"));
    check_same("backends-threads", &format!("{free_log} thread"), false);
    let alloc_c = quoted(&fixtures::c_fixture("alloc_c"));
    check_same(
        "backends-children",
        &format!(
            "sh -c {}",
            common::shell_quote(&format!("{alloc_c} && {alloc_c}"))
        ),
        true,
    );
}

/// jemalloc linked into the executable (unprefixed, first in the lookup order): hooked in
/// the process, probed by its symbols from the kernel.
#[test]
fn jemalloc_in_the_executable_alike_in_process_and_in_bpf() {
    let Some(path) = common::fixture_with(
        "alloc_jemalloc",
        "/usr/include/jemalloc/jemalloc.h",
        &[
            "-Wl,--whole-archive",
            "-l:libjemalloc.a",
            "-Wl,--no-whole-archive",
            "-lstdc++",
            "-lm",
        ],
    ) else {
        return;
    };
    check_same("backends-jemalloc", &quoted(&path), true);
}

/// mimalloc as a library: its own API hooked in the process (its malloc reached through
/// the wrappers), probed from the kernel.
#[test]
fn mimalloc_as_a_library_alike_in_process_and_in_bpf() {
    let Some(path) = common::fixture_with(
        "alloc_mimalloc",
        "/usr/include/mimalloc.h",
        &["-Wl,--no-as-needed", "-lmimalloc"],
    ) else {
        return;
    };
    check_same("backends-mimalloc", &quoted(&path), true);
}

/// Rust's allocator crates linked into the executable (tikv-jemallocator's `_rjem_*`, the
/// mimalloc crate's `mi_*`), threads included.
#[test]
fn allocator_crates_alike_in_process_and_in_bpf() {
    for feature in ["jemalloc", "mimalloc"] {
        let path = fixtures::cargo_fixture("alloc_crates", feature)
            .unwrap_or_else(|error| panic!("building alloc_crates with {feature}: {error}"));
        check_same(&format!("backends-crate-{feature}"), &quoted(&path), false);
    }
}

/// The jemalloc fixture linked with libjemalloc.so (its malloc replaces libc's), if
/// installed.
fn jemalloc_library_fixture() -> Option<std::path::PathBuf> {
    common::fixture_with(
        "alloc_jemalloc",
        "/usr/include/jemalloc/jemalloc.h",
        &["-Wl,--no-as-needed", "-ljemalloc"],
    )
}

/// Allocators named (`alloc:jemalloc`, `alloc:mimalloc`, `alloc:PATH`), recorded in the
/// process by hooks on exactly their functions, the wrappers passing every call through:
/// jemalloc in the executable, and the libraries whose malloc the wrappers reach
/// (program -> the wrapper's tail jump -> the hooked malloc: the program's frame is the
/// caller, as on the BPF path).
#[test]
fn named_allocators_alike_in_process_and_in_bpf() {
    let jemalloc_header = "/usr/include/jemalloc/jemalloc.h";
    if let Some(path) = common::fixture_with(
        "alloc_jemalloc",
        jemalloc_header,
        &[
            "-Wl,--whole-archive",
            "-l:libjemalloc.a",
            "-Wl,--no-whole-archive",
            "-lstdc++",
            "-lm",
        ],
    ) {
        check_same_with(
            "backends-named-jemalloc",
            &["alloc:jemalloc"],
            &quoted(&path),
            true,
        );
    }
    if let Some(path) = jemalloc_library_fixture() {
        check_same_with(
            "backends-named-jemalloc-library",
            &["alloc:jemalloc"],
            &quoted(&path),
            true,
        );
        let library = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]
            .iter()
            .map(|dir| std::path::Path::new(dir).join("libjemalloc.so.2"))
            .find(|path| path.exists())
            .expect("libjemalloc.so.2 beside its header");
        check_same_with(
            "backends-named-path",
            &[&format!("alloc:{}", library.display())],
            &quoted(&path),
            true,
        );
    }
    if let Some(path) = common::fixture_with(
        "alloc_mimalloc",
        "/usr/include/mimalloc.h",
        &["-Wl,--no-as-needed", "-lmimalloc"],
    ) {
        check_same_with(
            "backends-named-mimalloc",
            &["alloc:mimalloc"],
            &quoted(&path),
            true,
        );
    }
}

/// Rust's allocator crates named (`alloc:jemalloc`, `alloc:mimalloc`), and
/// tikv-jemallocator's prefix given (`--alloc-prefix _rjem_`, which counts libc's
/// functions too: the wrappers record those).
#[test]
fn named_allocator_crates_alike_in_process_and_in_bpf() {
    for (feature, probe) in [
        ("jemalloc", &["alloc:jemalloc"][..]),
        ("jemalloc", &["alloc", "--alloc-prefix", "_rjem_"][..]),
        ("mimalloc", &["alloc:mimalloc"][..]),
    ] {
        let path = fixtures::cargo_fixture("alloc_crates", feature)
            .unwrap_or_else(|error| panic!("building alloc_crates with {feature}: {error}"));
        let name = format!("backends-named-crate-{feature}-{}", probe.len());
        check_same_with(&name, probe, &quoted(&path), false);
    }
}
