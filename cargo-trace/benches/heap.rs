//! What `cargo trace alloc` costs per malloc/free pair in steady state, against the same
//! program untraced and under heaptrack (LD_PRELOAD, unwinding in the process), all in
//! the same rounds.
//!
//! The `heap_storm` fixture makes N malloc(48)/free pairs at the bottom of a chain of
//! DEPTH frames (C, -O2, no frame pointers). A profiler's start-up and its work at the
//! end (heaptrack's interpreter starting, cargo-trace's verifier or its report) hide
//! inside a short run: per pair, heaptrack falls from 1.7 µs at 100 k pairs to 0.24 µs at
//! 3 M on these machines. So every way runs at two sizes, N1 and N2 pairs, and a pair's
//! cost is the slope of the whole run's wall time between them (start to the end of the
//! profiler's own processing), less the untraced run's slope: the steady state. Each
//! round runs every way at both sizes one after the other, at a shallow (10 frames) and a
//! deep (60 frames) stack; the median of the rounds is printed with their range, and the
//! ratio to heaptrack's added time of the same round.
//!
//! The ways: `alloc` (the default for a launched target: the preloaded library records
//! each call in the process, walking the stack itself from the session's unwind tables,
//! no kernel event), `alloc --no-preload` (libc's functions probed, the stack walked by
//! the BPF programs at each call), and heaptrack.
//!
//! Where a pair's time goes: one more `alloc` run with `--bpf-stats` prints the library's
//! counters (walks, memo answers, ns per frame walked and per memo answer, waits for a
//! full ring), and the fixture's own loop time (`loop_ns`, the time inside the program's
//! loop: the library's share) is printed beside the whole run's.
//!
//! Then the same storm in a Rust program whose global allocator is tikv-jemallocator or
//! the mimalloc crate (allocators linked into the executable: hooked in the process,
//! probed by the BPF path), every way at the same two sizes in the same rounds, the
//! slope again. heaptrack sees none of these calls (they never reach libc's malloc):
//! its column is what it costs such a program, counting nothing; so in the same rounds
//! heaptrack also runs the C storm at 10 frames (glibc, every call seen), the cost it
//! pays to count a pair, which alloc's added time is set against.
//!
//! Prints figures only; asserts nothing about time. Needs root, and heaptrack for its
//! column (`apt-get install heaptrack`).
//! `cargo bench -p cargo-trace --bench heap [-- ROUNDS [N1 N2]]` (default 5, 1 M and 3 M).

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use cargo_trace_tests::fixtures;
use common::Spread;

const DEPTHS: [u64; 2] = [10, 60];

/// One way of running the storm.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Untraced,
    InProcess,
    Bpf,
    Heaptrack,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Untraced => "untraced",
            Way::InProcess => "cargo trace alloc",
            Way::Bpf => "alloc --no-preload",
            Way::Heaptrack => "heaptrack",
        }
    }
}

/// A run's whole wall time and the fixture's own loop time, in ns.
struct Timed {
    wall_ns: f64,
    loop_ns: f64,
}

struct Bench<'a> {
    cargo_trace: &'a Path,
    storm: &'a Path,
    scratch: &'a Path,
    /// The storm is `alloc_crates storm N` (its depth its own), not `heap_storm N DEPTH`.
    crate_storm: bool,
}

impl Bench<'_> {
    fn command(&self, way: Way, pairs: u64, depth: u64, extra: &[&str]) -> Command {
        let args = if self.crate_storm {
            ["storm".to_string(), pairs.to_string()]
        } else {
            [pairs.to_string(), depth.to_string()]
        };
        let line = format!("{} {} {}", self.storm.display(), args[0], args[1]);
        match way {
            Way::Untraced => {
                let mut command = Command::new(self.storm);
                command.args(&args);
                command
            }
            Way::Heaptrack => {
                let mut command = Command::new("heaptrack");
                command
                    .arg("-o")
                    .arg(self.scratch.join("heaptrack.data"))
                    .arg(self.storm)
                    .args(&args);
                command
            }
            Way::InProcess | Way::Bpf => {
                let mut command = Command::new(self.cargo_trace);
                command
                    .args(["alloc", "-c", &line, "--no-svg", "-q", "--report-text"])
                    .arg(self.scratch.join("report.txt"))
                    .args(extra)
                    .current_dir(self.scratch);
                if way == Way::Bpf {
                    command.arg("--no-preload");
                }
                command
            }
        }
    }

    fn run(&self, way: Way, pairs: u64, depth: u64, extra: &[&str]) -> (Timed, Output) {
        let started = Instant::now();
        let output = self
            .command(way, pairs, depth, extra)
            .output()
            .expect("run the storm");
        let wall_ns = started.elapsed().as_nanos() as f64;
        assert!(output.status.success(), "{}: {output:?}", way.name());
        let loop_ns = value_after(&String::from_utf8_lossy(&output.stdout), "loop_ns");
        (Timed { wall_ns, loop_ns }, output)
    }
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("heap benchmark skipped: the BPF way needs root");
        return;
    }
    let numbers: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    let rounds = numbers.first().copied().unwrap_or(5) as usize;
    let (n1, n2) = match numbers[..] {
        [_, n1, n2, ..] if n2 > n1 => (n1, n2),
        _ => (1_000_000, 3_000_000),
    };
    let cargo_trace = Path::new(env!("CARGO_BIN_EXE_cargo-trace"));
    let storm = fixtures::c_fixture("heap_storm");
    let heaptrack = Command::new("heaptrack")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let scratch =
        std::env::temp_dir().join(format!("cargo-trace-heap-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let bench = Bench {
        cargo_trace,
        storm: &storm,
        scratch: &scratch,
        crate_storm: false,
    };
    let mut ways = vec![Way::Untraced, Way::InProcess, Way::Bpf];
    if heaptrack {
        ways.push(Way::Heaptrack);
    }

    println!(
        "cargo trace alloc: cost per malloc(48)/free pair in steady state, `heap_storm N DEPTH`"
    );
    println!(
        "the slope of each run's wall time between N = {n1} and {n2} pairs, less the untraced \
         run's; {rounds} rounds of every way, one after the other; median [min–max]"
    );
    for depth in DEPTHS {
        // Unmeasured: the first runs compile and cache the unwind tables.
        bench.run(Way::InProcess, 1000, depth, &[]);
        bench.run(Way::Bpf, 1000, depth, &[]);
        // Per way, per round: (slope ns per pair, loop ns per pair at N2).
        let mut slopes: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
        let mut loops: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
        for _ in 0..rounds {
            for (index, &way) in ways.iter().enumerate() {
                let (small, _) = bench.run(way, n1, depth, &[]);
                let (large, _) = bench.run(way, n2, depth, &[]);
                slopes[index].push((large.wall_ns - small.wall_ns) / (n2 - n1) as f64);
                loops[index].push(large.loop_ns / n2 as f64);
            }
        }
        println!(
            "\n{depth} frames deep ({} frames walked at malloc)",
            depth + 4
        );
        println!(
            "  {:<22}{:<26}{:<30}in the loop, ns per pair",
            "", "slope, ns per pair", "added per pair, µs"
        );
        let base = &slopes[0];
        let added: Vec<Vec<f64>> = slopes
            .iter()
            .map(|way| base.iter().zip(way).map(|(b, w)| w - b).collect())
            .collect();
        for (index, way) in ways.iter().enumerate() {
            let added_text = match way {
                Way::Untraced => String::new(),
                _ => format!(
                    "+{}",
                    Spread::of(added[index].iter().map(|ns| ns / 1e3)).show(3)
                ),
            };
            println!(
                "  {:<22}{:<26}{:<30}{}",
                way.name(),
                Spread::of(slopes[index].iter().copied()).show(0),
                added_text,
                Spread::of(loops[index].iter().copied()).show(0)
            );
        }
        let ratio = |over: usize, under: usize| {
            Spread::of(added[over].iter().zip(&added[under]).map(|(o, u)| o / u))
        };
        println!(
            "  alloc's added time / alloc --no-preload's: {} (same rounds)",
            ratio(1, 2).show(2)
        );
        if heaptrack {
            println!(
                "  alloc's added time / heaptrack's: {} (same rounds)",
                ratio(1, 3).show(2)
            );
            println!(
                "  alloc --no-preload's added time / heaptrack's: {} (same rounds)",
                ratio(2, 3).show(2)
            );
        }
        let (_, output) = bench.run(Way::InProcess, n2, depth, &["--bpf-stats"]);
        println!("  where a pair's time goes, in the process ({n2} pairs):");
        for line in String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter_map(|line| line.strip_prefix("cargo-trace: in-process: "))
        {
            println!("    {line}");
        }
    }
    allocator_crates(&bench, &ways, rounds, (n1, n2));
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The storm through tikv-jemallocator and the mimalloc crate: every way at `n1` and `n2`
/// pairs in the same rounds, the slope less the untraced one; `alloc` hooks the crate's
/// functions in the process, `--no-preload` probes them from the kernel, heaptrack sees
/// none of them.
fn allocator_crates(outer: &Bench<'_>, ways: &[Way], rounds: usize, (n1, n2): (u64, u64)) {
    for feature in ["jemalloc", "mimalloc"] {
        let fixture = fixtures::cargo_fixture("alloc_crates", feature)
            .unwrap_or_else(|error| panic!("building alloc_crates with {feature}: {error}"));
        let bench = Bench {
            storm: &fixture,
            crate_storm: true,
            ..*outer
        };
        // Unmeasured: the unwind tables compiled and cached.
        bench.run(Way::InProcess, 1000, 0, &[]);
        bench.run(Way::Bpf, 1000, 0, &[]);
        let mut slopes: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
        // heaptrack on the C storm, and the untraced C storm, in the same rounds.
        let heaptrack = ways.contains(&Way::Heaptrack);
        let mut c_slopes: Vec<(f64, f64)> = Vec::new();
        let slope = |bench: &Bench<'_>, way: Way, depth: u64| {
            let (small, _) = bench.run(way, n1, depth, &[]);
            let (large, _) = bench.run(way, n2, depth, &[]);
            (large.wall_ns - small.wall_ns) / (n2 - n1) as f64
        };
        for _ in 0..rounds {
            for (index, &way) in ways.iter().enumerate() {
                slopes[index].push(slope(&bench, way, 0));
            }
            if heaptrack {
                c_slopes.push((
                    slope(outer, Way::Untraced, 10),
                    slope(outer, Way::Heaptrack, 10),
                ));
            }
        }
        println!(
            "\nRust with the {feature} allocator crate (linked into the executable), \
             `alloc_crates storm N`, 48-byte pairs"
        );
        let added: Vec<Vec<f64>> = slopes
            .iter()
            .map(|way| slopes[0].iter().zip(way).map(|(b, w)| w - b).collect())
            .collect();
        for (index, way) in ways.iter().enumerate().skip(1) {
            let note = if *way == Way::Heaptrack {
                " (counts none of these calls)"
            } else {
                ""
            };
            println!(
                "  {:<22}{} µs added per pair{note}",
                way.name(),
                Spread::of(added[index].iter().map(|ns| ns / 1e3)).show(3)
            );
        }
        let ratio = |over: usize, under: usize| {
            Spread::of(added[over].iter().zip(&added[under]).map(|(o, u)| o / u))
        };
        println!(
            "  alloc's added time / alloc --no-preload's: {} (same rounds)",
            ratio(1, 2).show(2)
        );
        if heaptrack {
            let counted: Vec<f64> = c_slopes.iter().map(|(u, h)| h - u).collect();
            println!(
                "  heaptrack on the C storm (10 frames, glibc: every pair counted): +{} µs per \
                 pair",
                Spread::of(counted.iter().map(|ns| ns / 1e3)).show(3)
            );
            println!(
                "  alloc's added time / heaptrack's on the C storm: {} (same rounds)",
                Spread::of(added[1].iter().zip(&counted).map(|(a, h)| a / h)).show(2)
            );
        }
        let (_, output) = bench.run(Way::InProcess, n2, 0, &["--bpf-stats"]);
        for line in String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter_map(|line| line.strip_prefix("cargo-trace: in-process: "))
            .filter(|line| line.starts_with("hooks") || line.contains("walks"))
        {
            println!("    {line}");
        }
    }
}

/// The number after `key` among the words of `text`.
fn value_after(text: &str, key: &str) -> f64 {
    let mut words = text.split_whitespace();
    words
        .find(|word| *word == key)
        .and_then(|_| words.next()?.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {text:?}"))
}
