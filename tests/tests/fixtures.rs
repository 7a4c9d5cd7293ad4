//! The fixture programs: they build from source, do and print what
//! `cargo_trace_tests::expected` says, and have no frame pointers — neither in
//! their code (no `mov %rsp,%rbp`) nor in their CFI (no rbp-based CFA). Each
//! of the last two checks is shown to catch a build with frame pointers.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use cargo_trace_tests::expected::{self, SiteCount};
use cargo_trace_tests::fixtures::{self, Lang};
use object::{Object, ObjectSymbol, SymbolKind};
use unwind_tables::{Cfa, Rule};

/// Every fixture, with a test of which of its symbols are its own functions.
const FIXTURES: &[(Lang, &str, &[&str])] = &[
    (Lang::Rust, "chains", &["chains::"]),
    (Lang::Rust, "cpu_split", &["cpu_split::"]),
    (
        Lang::C,
        "chains_c",
        &[
            "deep_leaf",
            "recurse",
            "beta",
            "side_leaf",
            "alpha",
            "delta",
            "worker_leaf",
            "worker_mid",
            "worker_main",
            "on_sigusr1",
            "main",
        ],
    ),
    (Lang::C, "storm", &["storm_", "main"]),
    (Lang::C, "levels", &["level1", "level2", "level3", "main"]),
    (Lang::C, "ifuncs", &["strlen_", "memcpy_", "main"]),
    (
        Lang::C,
        "avx_entry",
        &["avx_first", "call_avx_first", "main"],
    ),
    (Lang::C, "paths", &["path_zero", "path_one", "main"]),
    (Lang::C, "dlopen_plugin", &["call_plugin", "main"]),
    (Lang::Rust, "alloc_sites", &["alloc_sites::"]),
    (Lang::C, "alloc_c", &["site_", "report", "main"]),
    (
        Lang::C,
        "heap_storm",
        &["storm", "descend", "number", "main"],
    ),
    (Lang::C, "leak_rate", &["site_", "main"]),
    (
        Lang::Cpp,
        "cxx_exceptions",
        &["thrower", "middle", "catcher", "GuardD", "main"],
    ),
];

/// The names a fixture's own functions start with (Rust) or are (C, C++).
fn is_own(lang: Lang, patterns: &[&str], name: &str) -> bool {
    match lang {
        Lang::Rust => patterns.iter().any(|p| name.starts_with(p)),
        Lang::C => patterns
            .iter()
            .any(|p| name == *p || (p.ends_with('_') && name.starts_with(p))),
        Lang::Cpp => patterns.iter().any(|p| {
            if *p == "main" {
                name == "main"
            } else {
                name.contains(p)
            }
        }),
    }
}

fn run(path: &Path, args: &[&str]) -> std::process::Output {
    Command::new(path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()))
}

fn expected_counts(lang: Lang) -> Vec<SiteCount> {
    expected::chains_sites(lang)
        .into_iter()
        .map(|site| SiteCount {
            function: site.function,
            calls: site.calls,
            bytes: site.calls * site.size,
            leaked: if site.leaks {
                site.calls * site.size
            } else {
                0
            },
        })
        .collect()
}

fn check_chains_counts(lang: Lang, path: &Path) {
    let output = run(path, &[]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        expected::parse_site_counts(&stdout).unwrap(),
        expected_counts(lang)
    );

    // abort: the same counts, then death by SIGABRT.
    let output = run(path, &["abort"]);
    assert_eq!(
        output.status.signal(),
        Some(nix::libc::SIGABRT),
        "{output:?}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        expected::parse_site_counts(&stdout).unwrap(),
        expected_counts(lang)
    );

    let output = run(path, &["bogus"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

#[test]
fn chains_prints_the_expected_counts() {
    check_chains_counts(Lang::Rust, &fixtures::rust_fixture("chains"));
}

#[test]
fn chains_c_prints_the_expected_counts() {
    check_chains_counts(Lang::C, &fixtures::c_fixture("chains_c"));
}

#[test]
fn storm_counts_its_mallocs() {
    let output = run(&fixtures::c_fixture("storm"), &["12345"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let counts = expected::parse_site_counts(&stdout).unwrap();
    assert_eq!(
        counts,
        [SiteCount {
            function: "storm_10".into(),
            calls: 12345,
            bytes: 12345 * 32,
            leaked: 0
        }]
    );
    let loop_ns: u64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("loop_ns "))
        .and_then(|ns| ns.parse().ok())
        .expect("a loop_ns line");
    assert!(loop_ns > 0);
}

#[test]
fn cpu_split_spends_two_thirds_in_hot() {
    let output = run(&fixtures::rust_fixture("cpu_split"), &["0.3"]);
    assert!(output.status.success(), "{output:?}");
    let (hot, cold) = expected::parse_cpu_split(&String::from_utf8_lossy(&output.stdout)).unwrap();
    assert!(hot + cold >= 0.3, "hot {hot} cold {cold}");
    let ratio = hot / cold;
    assert!(
        (1.8..=2.2).contains(&ratio),
        "hot {hot} cold {cold}: ratio {ratio}"
    );
}

#[test]
fn cxx_exceptions_throws_and_catches() {
    let output = run(&fixtures::cpp_fixture("cxx_exceptions"), &["100"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    // n = 0, 3, ..., 99 throw: 34; every call through middle destroys a guard.
    assert!(
        stdout.starts_with("caught 34 destroyed 100 sum "),
        "{stdout}"
    );
}

/// The fixture's own functions whose code sets up a frame pointer (`push %rbp`
/// directly followed by `mov %rsp,%rbp`, anywhere: shrink-wrapping may move the
/// prologue), by objdump, and how many functions were checked. A lone
/// `mov %rsp,%rbp` is not enough: without frame pointers rbp is an ordinary
/// register, which LLVM may well load with rsp. `None` when objdump is missing.
fn functions_setting_up_rbp(
    path: &Path,
    own: impl Fn(&str) -> bool,
) -> Option<(usize, Vec<String>)> {
    let output = match Command::new("objdump")
        .args(["-d", "-w", "--no-show-raw-insn"])
        .arg(path)
        .output()
    {
        Ok(output) if output.status.success() => output,
        Ok(output) => panic!("objdump failed on {}: {output:?}", path.display()),
        Err(error) => {
            eprintln!("skipping the disassembly check: cannot run objdump ({error})");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let (mut checked, mut with_frame_pointer) = (0, Vec::new());
    let mut current: Option<String> = None;
    let mut previous = String::new();
    for line in text.lines() {
        // "0000000000001820 <recurse>:" opens a function.
        if let Some(name) = line
            .strip_suffix(">:")
            .and_then(|l| l.split_once(" <"))
            .map(|(_, name)| name)
        {
            let name = process_image::demangle(name);
            current = own(&name).then_some(name);
            previous.clear();
            checked += usize::from(current.is_some());
            continue;
        }
        let Some(name) = &current else { continue };
        let instruction = line
            .split('\t')
            .nth(1)
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if previous == "push %rbp"
            && instruction == "mov %rsp,%rbp"
            && !with_frame_pointer.contains(name)
        {
            with_frame_pointer.push(name.clone());
        }
        previous = instruction;
    }
    Some((checked, with_frame_pointer))
}

/// The fixture's own functions whose CFI computes the CFA from rbp at some
/// pc, or leaves some pc uncovered; and how many functions were checked.
fn functions_with_rbp_cfa(path: &Path, own: impl Fn(&str) -> bool) -> (usize, Vec<String>) {
    let compiled = unwind_tables::compile_file(path).expect("compiling the fixture's unwind table");
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let (mut checked, mut bad) = (0, Vec::new());
    for symbol in file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
    {
        let name = process_image::demangle(symbol.name().unwrap_or(""));
        if !own(&name) {
            continue;
        }
        checked += 1;
        let rsp_based = (symbol.address()..symbol.address() + symbol.size()).all(|pc| {
            matches!(
                compiled.table.lookup(pc),
                Rule::Frame {
                    cfa: Cfa::Rsp(_),
                    ..
                }
            )
        });
        if !rsp_based {
            bad.push(name);
        }
    }
    (checked, bad)
}

#[test]
fn fixtures_have_no_frame_pointers() {
    for &(lang, name, patterns) in FIXTURES {
        let path = fixtures::fixture(lang, name);
        let own = |f: &str| is_own(lang, patterns, f);
        if let Some((checked, with_frame_pointer)) = functions_setting_up_rbp(&path, own) {
            assert!(
                checked >= patterns.len(),
                "{name}: only {checked} functions found"
            );
            assert!(
                with_frame_pointer.is_empty(),
                "{name}: functions set up rbp: {with_frame_pointer:?}"
            );
        }
        let (checked, bad) = functions_with_rbp_cfa(&path, own);
        assert!(
            checked >= patterns.len(),
            "{name}: only {checked} functions found"
        );
        assert!(
            bad.is_empty(),
            "{name}: functions with an rbp-based or missing CFA rule: {bad:?}"
        );
    }
}

/// Both checks above catch frame pointers: the same sources built with them fail them.
#[test]
fn frame_pointer_checks_catch_frame_pointers() {
    for (lang, name, flags, patterns) in [
        (
            Lang::C,
            "chains_c",
            &["-fno-omit-frame-pointer"][..],
            FIXTURES[2].2,
        ),
        (
            Lang::Rust,
            "chains",
            &["-C", "force-frame-pointers=yes"][..],
            FIXTURES[0].2,
        ),
    ] {
        let path = fixtures::build(lang, name, flags).unwrap_or_else(|e| panic!("{e}"));
        let own = |f: &str| is_own(lang, patterns, f);
        let expect_caught = |found: &[String], how: &str| {
            for function in ["recurse", "worker_mid"] {
                let qualified = if lang == Lang::Rust {
                    format!("chains::{function}")
                } else {
                    function.into()
                };
                assert!(
                    found.contains(&qualified),
                    "{how} missed {qualified} in {name} {flags:?}: {found:?}"
                );
            }
        };
        if let Some((_, with_frame_pointer)) = functions_setting_up_rbp(&path, own) {
            expect_caught(&with_frame_pointer, "the disassembly check");
        }
        expect_caught(&functions_with_rbp_cfa(&path, own).1, "the CFI check");
    }
}

/// A fixture is rebuilt when its source changes, and reused otherwise.
#[test]
fn fixtures_rebuild_when_the_source_changes() {
    let dir = fixtures::fixtures_dir().join("selftest-src");
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!("selftest_{}", std::process::id());
    let source = dir.join(format!("{name}.c"));
    let build = |code: i32| {
        std::fs::write(&source, format!("int main(void) {{ return {code}; }}\n")).unwrap();
        fixtures::build_source(Lang::C, &source, &name, &[]).unwrap()
    };
    let path = build(3);
    assert_eq!(run(&path, &[]).status.code(), Some(3));
    let built_at = std::fs::metadata(&path).unwrap().modified().unwrap();
    assert_eq!(build(3), path);
    assert_eq!(
        std::fs::metadata(&path).unwrap().modified().unwrap(),
        built_at,
        "rebuilt without a change"
    );
    build(4);
    assert_eq!(
        run(&path, &[]).status.code(),
        Some(4),
        "not rebuilt after a change"
    );
    for file in [path.clone(), path.with_extension("stamp"), source] {
        let _ = std::fs::remove_file(file);
    }
}
