//! What tracing costs the target, end to end through the cargo-trace binary,
//! against the same program run untraced in the same benchmark run.
//!
//! The workload is the `storm` fixture: N × malloc(32)/free under a chain of
//! ten functions (C, -O2, no frame pointers), which times its own loop. Rounds
//! alternate untraced and traced runs; medians are reported.
//! - `uprobe:libc:malloc`: µs added per malloc event, each with its full stack
//!   walked in the kernel.
//! - `profile:hz:99`: the share of the loop's time lost to sampling, measured
//!   (noisy on a shared VM: the spread is printed) and computed from the
//!   kernel's BPF statistics (`--bpf-stats`: runs × ns per run / loop time).
//!
//! The per-event cost of the BPF programs alone (no probe / a probe that
//! counts without a stack / full unwinding) and the kernel's BPF run-time
//! statistics are in bpf-prog's `uprobe` benchmark.
//!
//! Prints figures only; asserts nothing about time. Needs root.
//! `cargo bench -p cargo-trace --bench overhead [-- ROUNDS]`

use std::path::Path;
use std::process::Command;

use cargo_trace_tests::fixtures;

/// Mallocs per run of the uprobe benchmark.
const PROBED_CALLS: u64 = 1_000_000;
/// Mallocs per run of the sampling benchmark: long enough for ~100 samples.
const SAMPLED_CALLS: u64 = 40_000_000;

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipping: tracing needs root");
        return;
    }
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(7);
    let storm = fixtures::c_fixture("storm");
    let cargo_trace = env!("CARGO_BIN_EXE_cargo-trace");

    println!("storm: N x malloc(32)/free under 10 frames; {rounds} interleaved rounds, medians");
    let probed = compare(
        rounds,
        &storm,
        PROBED_CALLS,
        cargo_trace,
        "uprobe:libc:malloc",
    );
    let (plain, traced) = (median(&probed.plain), median(&probed.traced));
    let added_us = (traced - plain) / PROBED_CALLS as f64 / 1e3;
    println!(
        "uprobe:libc:malloc  N={PROBED_CALLS}: untraced {:.1} ns/call, traced {:.1} ns/call \
         → {added_us:.3} µs added per event with its full stack ({:.1}× the untraced call); \
         BPF program {:.0} ns per event",
        plain / PROBED_CALLS as f64,
        traced / PROBED_CALLS as f64,
        traced / plain,
        median(&probed.bpf_ns_per_run),
    );

    let sampled = compare(rounds, &storm, SAMPLED_CALLS, cargo_trace, "profile:hz:99");
    let (plain, traced) = (median(&sampled.plain), median(&sampled.traced));
    println!(
        "profile:hz:99       N={SAMPLED_CALLS}: untraced {:.1} ms (spread {:.1}-{:.1}), \
         traced {:.1} ms (spread {:.1}-{:.1}) → measured {:+.2}%; \
         BPF {:.1} µs per sample = {:.3}% of the loop's time",
        plain / 1e6,
        quartile(&sampled.plain, 1) / 1e6,
        quartile(&sampled.plain, 3) / 1e6,
        traced / 1e6,
        quartile(&sampled.traced, 1) / 1e6,
        quartile(&sampled.traced, 3) / 1e6,
        (traced / plain - 1.0) * 100.0,
        median(&sampled.bpf_ns_per_run) / 1e3,
        median(&sampled.bpf_share) * 100.0,
    );
}

/// Loop times (ns) of untraced and traced runs, and what the BPF statistics said.
struct Comparison {
    plain: Vec<f64>,
    traced: Vec<f64>,
    bpf_ns_per_run: Vec<f64>,
    /// BPF run time over the loop's time, per traced run.
    bpf_share: Vec<f64>,
}

/// `storm calls`, untraced and under `cargo-trace probe`, `rounds` times each, interleaved.
fn compare(rounds: usize, storm: &Path, calls: u64, cargo_trace: &str, probe: &str) -> Comparison {
    let command = format!("{} {calls}", storm.display());
    // One traced run first: it compiles and caches the unwind tables.
    run_traced(cargo_trace, probe, &command, calls);
    let mut result = Comparison {
        plain: Vec::new(),
        traced: Vec::new(),
        bpf_ns_per_run: Vec::new(),
        bpf_share: Vec::new(),
    };
    for _ in 0..rounds {
        let output = Command::new(storm)
            .arg(calls.to_string())
            .output()
            .expect("run storm");
        assert!(output.status.success(), "storm failed");
        result
            .plain
            .push(loop_ns(&String::from_utf8_lossy(&output.stdout)));
        let traced = run_traced(cargo_trace, probe, &command, calls);
        result.traced.push(traced.loop_ns);
        result.bpf_ns_per_run.push(traced.bpf_ns_per_run);
        result.bpf_share.push(traced.bpf_ns_total / traced.loop_ns);
    }
    result
}

struct Traced {
    loop_ns: f64,
    bpf_ns_per_run: f64,
    bpf_ns_total: f64,
}

/// Runs one traced storm; checks every malloc was seen.
fn run_traced(cargo_trace: &str, probe: &str, command: &str, calls: u64) -> Traced {
    let output = Command::new(cargo_trace)
        .args([probe, "--no-svg", "--bpf-stats", "-c", command])
        .output()
        .expect("run cargo-trace");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cargo-trace failed: {stderr}");
    if probe.starts_with("uprobe") {
        let events: u64 = stderr
            .lines()
            .find_map(|line| line.strip_prefix("cargo-trace: "))
            .and_then(|line| line.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no summary in {stderr}"));
        assert!(
            events >= calls,
            "{events} events for {calls} mallocs: {stderr}"
        );
    }
    // `cargo-trace: bpf on_uprobe: 200001 runs, 1089 ns per run`
    let (runs, ns_per_run) = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("cargo-trace: bpf "))
        .find_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            Some((
                words.get(1)?.parse::<f64>().ok()?,
                words.get(3)?.parse::<f64>().ok()?,
            ))
        })
        .unwrap_or_else(|| panic!("no BPF statistics in {stderr}"));
    Traced {
        loop_ns: loop_ns(&String::from_utf8_lossy(&output.stdout)),
        bpf_ns_per_run: ns_per_run,
        bpf_ns_total: runs * ns_per_run,
    }
}

fn loop_ns(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("loop_ns "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no loop_ns line in {stdout:?}"))
}

fn median(values: &[f64]) -> f64 {
    quartile(values, 2)
}

/// The `q`th quartile (0 = min, 2 = median, 4 = max), nearest rank.
fn quartile(values: &[f64], q: usize) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[(sorted.len() - 1) * q / 4]
}
