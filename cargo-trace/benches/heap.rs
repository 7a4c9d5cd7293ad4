//! What `cargo trace alloc` costs per malloc/free pair, against the same program
//! untraced, under heaptrack (LD_PRELOAD, unwinding in the process) and under the plain
//! `uprobe:libc:malloc` counting probe, all in one benchmark run.
//!
//! The `heap_storm` fixture makes N malloc(48)/free pairs at the bottom of a chain of
//! DEPTH frames (C, -O2, no frame pointers) and times its own loop, so start-up and
//! reports stay out of the figures. Each round runs the four ways one after the other
//! (untraced first), at a shallow (10 frames) and a deep (60 frames) stack; the median
//! of the rounds is printed with their range, and the µs added per pair against the
//! untraced run of the same round.
//!
//! `alloc` runs the storm with the preloaded library (`src/alloc/preload.rs`): one
//! breakpoint per pair, at the site after malloc, which also tells the free logged
//! before it; `alloc --no-preload` probes libc's malloc (entry and return) and free,
//! three events per pair: both are ways of each round.
//!
//! Where the time goes: one more `alloc` run with `--bpf-stats` gives the BPF time per
//! run of each heap program (the site after malloc tells the logged free, walks the
//! stack and tracks the block). `alloc --sample-every 1000` is a way of each round
//! too, and one more run of it with `--bpf-stats` gives the BPF time of an event that
//! is not sampled (the programs' mean per run, the one sampled call in 1000 included).
//! Sampled, the library logs no frees (the kernel leaves most out as they come): its
//! programs do next to nothing, and its added time less their BPF time is the kernel's
//! share of a pair, the breakpoints at the library's two sites.
//!
//! Then the same storm in a Rust program whose global allocator is tikv-jemallocator or
//! the mimalloc crate (`alloc_crates storm N`, 48-byte Vecs), untraced and under `alloc`,
//! beside the C storm on glibc at the same depth in the same rounds: what a pair costs
//! with the allocator's own functions probed, against glibc's.
//!
//! Prints figures only; asserts nothing about time. Needs root, and heaptrack for its
//! column (`apt-get install heaptrack`).
//! `cargo bench -p cargo-trace --bench heap [-- ROUNDS]`

mod common;

use std::path::Path;
use std::process::Command;

use cargo_trace_tests::fixtures;
use common::Spread;

/// Pairs per run.
const PAIRS: u64 = 100_000;
/// `--sample-every` of the sampled way.
const SAMPLE_EVERY: &str = "1000";
const DEPTHS: [u64; 2] = [10, 60];

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("heap benchmark skipped: loading BPF programs needs root");
        return;
    }
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(5);
    let cargo_trace = Path::new(env!("CARGO_BIN_EXE_cargo-trace"));
    let storm = fixtures::c_fixture("heap_storm");
    let heaptrack = Command::new("heaptrack")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let scratch =
        std::env::temp_dir().join(format!("cargo-trace-heap-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();

    println!("cargo trace alloc: cost per malloc(48)/free pair, `heap_storm {PAIRS} DEPTH`");
    println!("{rounds} rounds of each way, one after the other; median [min–max]");
    for depth in DEPTHS {
        let args = [PAIRS.to_string(), depth.to_string()];
        let command = format!("{} {} {}", storm.display(), args[0], args[1]);
        // The report goes to a file: outputs must be regular files.
        let report = scratch.join("report.txt");
        let traced = |probe: &str, extra: &[&str]| {
            let output = Command::new(cargo_trace)
                .args([probe, "-c", &command, "--no-svg", "--report-text"])
                .arg(&report)
                .args(extra)
                .current_dir(&scratch)
                .output()
                .expect("run cargo-trace");
            assert!(output.status.success(), "{output:?}");
            output
        };
        // Unmeasured: the first run compiles and caches the unwind tables.
        traced("alloc", &[]);

        let mut ways: Vec<(&str, Vec<f64>)> = vec![
            ("untraced", Vec::new()),
            ("cargo trace alloc", Vec::new()),
            ("uprobe:libc:malloc", Vec::new()),
            ("alloc sampled 1/1000", Vec::new()),
            ("alloc --no-preload", Vec::new()),
        ];
        if heaptrack {
            ways.push(("heaptrack", Vec::new()));
        }
        for _ in 0..rounds {
            for (way, times) in ways.iter_mut() {
                let stdout = match *way {
                    "untraced" => {
                        let output = Command::new(&storm).args(&args).output().unwrap();
                        assert!(output.status.success(), "{output:?}");
                        output.stdout
                    }
                    "heaptrack" => {
                        let output = Command::new("heaptrack")
                            .arg("-o")
                            .arg(scratch.join("heaptrack.data"))
                            .arg(&storm)
                            .args(&args)
                            .output()
                            .unwrap();
                        assert!(output.status.success(), "{output:?}");
                        output.stdout
                    }
                    "alloc sampled 1/1000" => {
                        traced("alloc", &["--sample-every", SAMPLE_EVERY]).stdout
                    }
                    "alloc --no-preload" => traced("alloc", &["--no-preload"]).stdout,
                    probe => traced(probe.trim_start_matches("cargo trace "), &[]).stdout,
                };
                times.push(value_after(&String::from_utf8_lossy(&stdout), "loop_ns"));
            }
        }

        println!(
            "\n{depth} frames deep ({} frames walked at malloc)",
            depth + 4
        );
        println!(
            "  {:<22}{:<28}added per pair, µs (× untraced)",
            "", "ns per pair"
        );
        let base = ways[0].1.clone();
        for (way, times) in &ways {
            let per_pair = Spread::of(times.iter().map(|ns| ns / PAIRS as f64));
            let added = Spread::of(
                base.iter()
                    .zip(times)
                    .map(|(a, b)| (b - a) / PAIRS as f64 / 1e3),
            );
            let ratio = Spread::of(base.iter().zip(times).map(|(a, b)| b / a));
            let added = if *way == "untraced" {
                String::new()
            } else {
                format!("+{} (×{:.0})", added.show(3), ratio.median)
            };
            println!("  {way:<22}{:<28}{added}", per_pair.show(1));
        }
        let added_ratio = |over: usize, under: usize| {
            Spread::of(
                base.iter()
                    .zip(ways[over].1.iter().zip(&ways[under].1))
                    .map(|(b, (o, u))| (o - b) / (u - b)),
            )
        };
        println!(
            "  alloc's added time / alloc --no-preload's: {} (same rounds)",
            added_ratio(1, 4).show(2)
        );
        if heaptrack {
            println!(
                "  alloc's added time / heaptrack's: {} (same rounds)",
                added_ratio(1, 5).show(2)
            );
            println!(
                "  alloc --no-preload's added time / heaptrack's: {} (same rounds)",
                added_ratio(4, 5).show(2)
            );
        }

        // The target alone: with children followed, the probes fire in every process
        // that maps libc, and the runs the program filters out would dilute the figure.
        let added = |way: usize| {
            Spread::of(
                base.iter()
                    .zip(&ways[way].1)
                    .map(|(a, b)| (b - a) / PAIRS as f64),
            )
            .median
        };
        let exact = heap_programs(&traced("alloc", &["--bpf-stats", "--no-follow-forks"]));
        let sampled = heap_programs(&traced(
            "alloc",
            &[
                "--bpf-stats",
                "--no-follow-forks",
                "--sample-every",
                SAMPLE_EVERY,
            ],
        ));
        for (mode, programs) in [("exact", &exact), ("sampled 1 in 1000", &sampled)] {
            println!("  BPF, {mode}:");
            for program in programs.iter() {
                println!(
                    "    {:<18}{:>6.0} ns per run, {:.2} runs per pair",
                    program.name,
                    program.ns_per_run,
                    program.runs / PAIRS as f64
                );
            }
        }
        let per_pair = |programs: &[HeapProgram]| -> f64 {
            programs
                .iter()
                .map(|p| p.runs * p.ns_per_run / PAIRS as f64)
                .sum()
        };
        println!(
            "  where a pair's time goes: alloc's BPF {:.2} µs (the --bpf-stats run), the \
             kernel's events (the breakpoint of the preloaded library's allocation site; \
             the free is logged and told with the next allocation) and the library the \
             other {:.2} µs of +{:.2}",
            per_pair(&exact) / 1e3,
            (added(1) - per_pair(&exact)) / 1e3,
            added(1) / 1e3
        );
        // The sampled way's programs do next to nothing: the rest is the kernel's.
        println!(
            "  sampled: BPF {:.0} ns per pair, the kernel's events the other {:.2} µs of \
             +{:.2} (a call left out still hits both sites)",
            per_pair(&sampled),
            (added(3) - per_pair(&sampled)) / 1e3,
            added(3) / 1e3,
        );
    }
    allocator_crates(cargo_trace, &storm, &scratch, rounds);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The storm through tikv-jemallocator and the mimalloc crate against glibc's (see the
/// crate docs).
fn allocator_crates(cargo_trace: &Path, storm: &Path, scratch: &Path, rounds: usize) {
    let glibc = format!("{} {PAIRS} 10", storm.display());
    for feature in ["jemalloc", "mimalloc"] {
        let fixture = fixtures::cargo_fixture("alloc_crates", feature)
            .unwrap_or_else(|error| panic!("building alloc_crates with {feature}: {error}"));
        let crate_storm = format!("{} storm {PAIRS}", fixture.display());
        let loop_ns = |traced: bool, command: &str| {
            let output = if traced {
                Command::new(cargo_trace)
                    .args(["alloc", "-c", command, "--no-svg", "--report-text"])
                    .arg(scratch.join("report.txt"))
                    .current_dir(scratch)
                    .output()
            } else {
                let words: Vec<&str> = command.split(' ').collect();
                Command::new(words[0]).args(&words[1..]).output()
            }
            .expect("run the storm");
            assert!(output.status.success(), "{output:?}");
            value_after(&String::from_utf8_lossy(&output.stdout), "loop_ns")
        };
        // Unmeasured: the unwind tables compiled and cached.
        loop_ns(true, &crate_storm);
        let (mut added_crate, mut added_glibc, mut ratios) = (vec![], vec![], vec![]);
        for _ in 0..rounds {
            let crate_base = loop_ns(false, &crate_storm);
            let crate_traced = loop_ns(true, &crate_storm);
            let glibc_base = loop_ns(false, &glibc);
            let glibc_traced = loop_ns(true, &glibc);
            let per_pair = |traced: f64, base: f64| (traced - base) / PAIRS as f64 / 1e3;
            added_crate.push(per_pair(crate_traced, crate_base));
            added_glibc.push(per_pair(glibc_traced, glibc_base));
            ratios.push((crate_traced - crate_base) / (glibc_traced - glibc_base));
        }
        println!(
            "
Rust with the {feature} allocator crate, {PAIRS} pairs of 48 bytes"
        );
        println!(
            "  alloc adds {} µs per pair; to glibc's C storm at 10 frames {} µs; \
             ratio {} (same rounds)",
            Spread::of(added_crate).show(3),
            Spread::of(added_glibc).show(3),
            Spread::of(ratios).show(2)
        );
    }
}

/// A heap program's `--bpf-stats` line.
struct HeapProgram {
    name: String,
    runs: f64,
    ns_per_run: f64,
}

/// The heap programs' figures in the `--bpf-stats` lines of a run
/// (`cargo-trace: bpf NAME: R runs, T ns per run`).
fn heap_programs(output: &std::process::Output) -> Vec<HeapProgram> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let programs: Vec<HeapProgram> = stderr
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cargo-trace: bpf ")?.split_once(": ")?;
            if !matches!(
                name,
                "on_alloc"
                    | "on_resize"
                    | "on_alloc_return"
                    | "on_free"
                    | "on_preload_alloc"
                    | "on_preload_resize"
                    | "on_preload_resized"
                    | "on_preload_freed"
            ) {
                return None;
            }
            let mut numbers = rest
                .split(", ")
                .map(|part| part.split_whitespace().next()?.parse::<f64>().ok());
            Some(HeapProgram {
                name: name.to_string(),
                runs: numbers.next()??,
                ns_per_run: numbers.next()??,
            })
        })
        .collect();
    assert!(
        programs
            .iter()
            .any(|p| p.name == "on_free" || p.name == "on_preload_alloc"),
        "no BPF statistics of the heap programs in {stderr}"
    );
    programs
}

/// The number after `key` among the words of `text`.
fn value_after(text: &str, key: &str) -> f64 {
    let mut words = text.split_whitespace();
    words
        .find(|word| *word == key)
        .and_then(|_| words.next()?.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {text:?}"))
}
