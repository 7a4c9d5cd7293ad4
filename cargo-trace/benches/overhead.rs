//! What tracing costs the target, end to end through the cargo-trace binary,
//! against the same programs run untraced in the same benchmark run.
//!
//! Untraced and traced runs alternate (ABAB…), so drift and the load of other
//! processes on a shared machine fall on both; the median of the rounds is
//! printed with their range.
//!
//! - `uprobe:libc:malloc` on the `storm` fixture: N × malloc(32)/free under a
//!   chain of ten functions (C, -O2, no frame pointers), every malloc an event
//!   whose whole stack is walked in the kernel. The fixture times its own loop,
//!   which gives the µs added per event without cargo-trace's own startup
//!   (unwind tables, BPF load) and report; the wall time of the whole command
//!   is printed beside it, and the part of it outside the loop.
//! - `profile:hz:99` on `fixed_work.c` (beside this file): a fixed number of
//!   xorshift steps, so sampling overhead makes a run longer (a program that
//!   runs for a fixed time would hide it by doing less). It reports its thread
//!   CPU time, which leaves out the time other processes held its core but
//!   keeps the sampling interrupts and their BPF program (interrupt time is
//!   charged to the interrupted task unless the kernel has
//!   CONFIG_IRQ_TIME_ACCOUNTING), and its wall time. The overhead is expected
//!   below the run-to-run noise, so the kernel's BPF statistics
//!   (`--bpf-stats`) give the BPF programs' share of the work as well.
//! - `offcpu` on `ping_pong.c` (beside this file): two processes pass a byte back
//!   and forth over two pipes, every round two stays off the CPU or more, each
//!   walked at the switch out and counted at the switch in. The program times its
//!   loop; the ratio to the untraced loop is the cost on a context-switch-heavy
//!   program.
//!
//! - A bystander: `storm` run outside any session, alone and while a session
//!   probes `uprobe:libc:malloc` in another program (a shell) and its children.
//!   The session's uprobes are bound to the processes it traces: the bystander's
//!   loop should run at its own speed (a ratio of 1 within noise; it was 80 when
//!   uprobes trapped in every process mapping libc).
//!
//! The BPF programs' own cost per event, against a probe that only counts,
//! is bpf-prog's `uprobe` benchmark.
//!
//! Prints figures only; asserts nothing about time. Needs root.
//! `cargo bench -p cargo-trace --bench overhead [-- ROUNDS] [storm|profile|offcpu|bystander...]`

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use cargo_trace_tests::fixtures::{self, Lang};
use common::Spread;

/// Mallocs per storm run: about 2 s traced.
const MALLOC_CALLS: u64 = 1_000_000;
/// The fixed work is sized to about this much CPU time untraced: ~100 samples at 99 Hz.
const PROFILED_CPU_NS: f64 = 1e9;
/// Steps of each of the short runs that size the fixed work.
const CALIBRATION_STEPS: u64 = 100_000_000;
/// Round trips per ping-pong run: about 1 s untraced.
const PING_PONG_ROUNDS: u64 = 100_000;
/// Widths of a table's label and figure columns.
const LABEL: usize = 24;
const COLUMN: usize = 27;

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("overhead benchmark skipped: loading BPF programs needs root");
        return;
    }
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(7);
    let cargo_trace = Path::new(env!("CARGO_BIN_EXE_cargo-trace"));
    let storm = fixtures::c_fixture("storm");
    let fixed_work = fixtures::build_source(
        Lang::C,
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/fixed_work.c"),
        "overhead_fixed_work",
        &[],
    )
    .unwrap_or_else(|error| panic!("building benches/fixed_work.c: {error}"));
    let ping_pong = fixtures::build_source(
        Lang::C,
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/ping_pong.c"),
        "overhead_ping_pong",
        &[],
    )
    .unwrap_or_else(|error| panic!("building benches/ping_pong.c: {error}"));

    println!(
        "cargo-trace overhead, end to end through {}",
        cargo_trace.display()
    );
    println!(
        "{rounds} rounds of an untraced (baseline) and a traced run, alternating; median [min–max]"
    );
    // Words among the arguments pick sections (`storm`, `profile`, `offcpu`); none: all.
    let sections: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-') && arg.parse::<usize>().is_err())
        .collect();
    let wanted = |name: &str| sections.is_empty() || sections.iter().any(|s| s == name);
    if wanted("storm") {
        malloc_storm(cargo_trace, &storm, rounds);
    }
    if wanted("profile") {
        profile(cargo_trace, &fixed_work, rounds);
    }
    if wanted("offcpu") {
        off_cpu(cargo_trace, &ping_pong, rounds);
    }
    if wanted("bystander") {
        bystander(cargo_trace, &storm, rounds);
    }
}

/// What a session probing malloc elsewhere costs a process it does not trace.
fn bystander(cargo_trace: &Path, storm: &Path, rounds: usize) {
    let calls = MALLOC_CALLS;
    let args = [calls.to_string()];
    let (mut alone, mut beside) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let solo = run(Command::new(storm).args(&args));
        alone.push(value_after(&solo.stdout, "loop_ns"));
        // The session's target tells when tracing has begun (its first line runs
        // after the probes are attached) and ends when its stdin closes.
        let mut session = Command::new(cargo_trace)
            .args(["uprobe:libc:malloc", "-q", "--no-svg", "-c"])
            .arg("sh -c 'echo tracing; cat >/dev/null; ls / >/dev/null'")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("running {}: {error}", cargo_trace.display()));
        let mut line = String::new();
        BufReader::new(session.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "tracing\n", "the session did not start");
        let bystander = run(Command::new(storm).args(&args));
        beside.push(value_after(&bystander.stdout, "loop_ns"));
        drop(session.stdin.take());
        let output = session.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "the session failed: {stderr}");
        assert!(
            event_count(&stderr) > 0,
            "the session counted none of its own mallocs: {stderr}"
        );
    }
    let ns_per_call = |ns: &[f64]| Spread::of(ns.iter().map(|ns| ns / calls as f64));
    println!(
        "\na bystander: `storm {calls}` untraced, alone and while a session probes \
         uprobe:libc:malloc in a shell and its children; loop timed by storm"
    );
    row(&["", "alone (baseline)", "beside a session", "beside / alone"]);
    row(&[
        "loop, ns per call",
        &ns_per_call(&alone).show(1),
        &ns_per_call(&beside).show(1),
        &format!("×{}", ratio(&alone, &beside).show(2)),
    ]);
}

/// The cost of `offcpu` on a pipe ping-pong: every round trip two context switches.
fn off_cpu(cargo_trace: &Path, ping_pong: &Path, rounds: usize) {
    let trips = PING_PONG_ROUNDS;
    let args = [trips.to_string()];
    let probe = ["offcpu", "--bpf-stats"];
    run_traced(cargo_trace, &probe, ping_pong, &args);

    let (mut plain, mut traced) = (Rounds::default(), Rounds::default());
    let (mut blocks, mut bpf_ns_per_run) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let run = run(Command::new(ping_pong).args(&args));
        plain.push(&run, value_after(&run.stdout, "loop_ns"));
        let run = run_traced(cargo_trace, &probe, ping_pong, &args);
        let seen = event_count(&run.stderr);
        assert!(
            seen >= trips,
            "{seen} stays off the CPU for {trips} round trips:\n{}",
            run.stderr
        );
        blocks.push(seen as f64);
        bpf_ns_per_run.push(bpf_ns_per_run_of(&run.stderr, "on_off_cpu"));
        traced.push(&run, value_after(&run.stdout, "loop_ns"));
    }
    let us_per_trip = |ns: &[f64]| Spread::of(ns.iter().map(|ns| ns / trips as f64 / 1e3));
    println!(
        "\noffcpu on `ping_pong {trips}`: two processes pass a byte over two pipes; loop \
         timed by the program"
    );
    row(&["", "untraced (baseline)", "traced", "traced / untraced"]);
    row(&[
        "loop, µs per round trip",
        &us_per_trip(&plain.work_ns).show(2),
        &us_per_trip(&traced.work_ns).show(2),
        &format!("×{}", ratio(&plain.work_ns, &traced.work_ns).show(2)),
    ]);
    row(&[
        "stays off the CPU",
        "",
        &Spread::of(blocks).show(0),
        &format!("≥ {trips} round trips in every round"),
    ]);
    row(&[
        "BPF ns per switch",
        "",
        &Spread::of(bpf_ns_per_run).show(0),
        "every context switch of the machine runs it",
    ]);
}

/// Nanoseconds per run of the BPF program `name`, from `--bpf-stats`.
fn bpf_ns_per_run_of(stderr: &str, name: &str) -> f64 {
    let prefix = format!("cargo-trace: bpf {name}: ");
    stderr
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .find_map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            match words[..] {
                [_, "runs,", ns, "ns", "per", "run"] => ns.parse().ok(),
                _ => None,
            }
        })
        .unwrap_or_else(|| panic!("no BPF statistics for {name} in {stderr}"))
}

/// µs added per malloc event by `uprobe:libc:malloc`.
fn malloc_storm(cargo_trace: &Path, storm: &Path, rounds: usize) {
    let calls = MALLOC_CALLS;
    let args = [calls.to_string()];
    let probe = ["uprobe:libc:malloc"];
    // Unmeasured: the first traced run compiles and caches the unwind tables.
    run_traced(cargo_trace, &probe, storm, &args);

    let (mut plain, mut traced) = (Rounds::default(), Rounds::default());
    let mut events = Vec::new();
    for _ in 0..rounds {
        let run = run(Command::new(storm).args(&args));
        plain.push(&run, value_after(&run.stdout, "loop_ns"));
        let run = run_traced(cargo_trace, &probe, storm, &args);
        let seen = event_count(&run.stderr);
        assert!(
            seen >= calls,
            "cargo-trace saw {seen} malloc events of {calls} calls:\n{}",
            run.stderr
        );
        events.push(seen as f64);
        traced.push(&run, value_after(&run.stdout, "loop_ns"));
    }

    let ns_per_call = |ns: &[f64]| Spread::of(ns.iter().map(|ns| ns / calls as f64));
    let us_added = |plain: &[f64], traced: &[f64]| {
        Spread::of(
            plain
                .iter()
                .zip(traced)
                .map(|(a, b)| (b - a) / calls as f64 / 1e3),
        )
    };
    let outside_ms = |r: &Rounds| {
        Spread::of(
            r.wall_ns
                .iter()
                .zip(&r.work_ns)
                .map(|(wall, work)| (wall - work) / 1e6),
        )
    };
    println!(
        "\nuprobe:libc:malloc on `storm {calls}`: malloc(32)/free under 10 frames, each call an \
         event; loop timed by storm"
    );
    row(&["", "untraced (baseline)", "traced", "traced − untraced"]);
    row(&[
        "loop, ns per call",
        &ns_per_call(&plain.work_ns).show(1),
        &ns_per_call(&traced.work_ns).show(1),
        &format!(
            "+{} µs per event (×{:.1})",
            us_added(&plain.work_ns, &traced.work_ns).show(3),
            ratio(&plain.work_ns, &traced.work_ns).median
        ),
    ]);
    row(&[
        "whole command, wall ms",
        &ms(&plain.wall_ns).show(1),
        &ms(&traced.wall_ns).show(1),
        &format!(
            "+{} µs per event",
            us_added(&plain.wall_ns, &traced.wall_ns).show(3)
        ),
    ]);
    row(&[
        "  outside the loop, ms",
        &outside_ms(&plain).show(1),
        &outside_ms(&traced).show(1),
        "cargo-trace's start and report",
    ]);
    row(&[
        "events counted",
        "",
        &Spread::of(events).show(0),
        &format!("≥ {calls} calls in every round"),
    ]);
}

/// The share of a fixed amount of work lost to `profile:hz:99`.
fn profile(cargo_trace: &Path, fixed_work: &Path, rounds: usize) {
    // The least disturbed of a few short runs sizes the work.
    let ns_per_step = (0..3)
        .map(|_| {
            let run = run(Command::new(fixed_work).arg(CALIBRATION_STEPS.to_string()));
            value_after(&run.stdout, "cpu_ns") / CALIBRATION_STEPS as f64
        })
        .fold(f64::INFINITY, f64::min);
    let steps = (PROFILED_CPU_NS / ns_per_step) as u64;
    let args = [steps.to_string()];
    // `--bpf-stats` costs two clock reads per BPF run: nothing at 99 Hz.
    let probe = ["profile:hz:99", "--bpf-stats"];
    run_traced(cargo_trace, &probe, fixed_work, &args);

    let (mut plain, mut traced) = (Rounds::default(), Rounds::default());
    let (mut plain_cpu, mut traced_cpu) = (Vec::new(), Vec::new());
    let (mut samples, mut bpf_ns_per_sample, mut bpf_share) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let run = run(Command::new(fixed_work).args(&args));
        plain.push(&run, value_after(&run.stdout, "wall_ns"));
        plain_cpu.push(value_after(&run.stdout, "cpu_ns"));
        let run = run_traced(cargo_trace, &probe, fixed_work, &args);
        let seen = event_count(&run.stderr);
        assert!(seen > 0, "no samples of the fixed work:\n{}", run.stderr);
        let cpu_ns = value_after(&run.stdout, "cpu_ns");
        // Every CPU's runs, those filtered out for other processes too: an
        // upper bound of what the target's samples cost in BPF.
        let bpf_ns = bpf_run_time_ns(&run.stderr);
        samples.push(seen as f64);
        bpf_ns_per_sample.push(bpf_ns / seen as f64);
        bpf_share.push(bpf_ns / cpu_ns);
        traced.push(&run, value_after(&run.stdout, "wall_ns"));
        traced_cpu.push(cpu_ns);
    }

    let overhead_percent = |plain: &[f64], traced: &[f64]| {
        let percent = ratio(plain, traced).map(|ratio| (ratio - 1.0) * 100.0);
        format!(
            "{:+.2}% [{:+.2}…{:+.2}]",
            percent.median, percent.min, percent.max
        )
    };
    println!(
        "\nprofile:hz:99 on `fixed_work {steps}`: xorshift steps, sized to {:.1} s of CPU \
         untraced; timed by the program",
        PROFILED_CPU_NS / 1e9
    );
    row(&[
        "",
        "untraced (baseline)",
        "traced",
        "traced / untraced − 1, per round",
    ]);
    row(&[
        "thread CPU time, ms",
        &ms(&plain_cpu).show(1),
        &ms(&traced_cpu).show(1),
        &overhead_percent(&plain_cpu, &traced_cpu),
    ]);
    // Disturbances only add time to fixed work: the fastest runs are the least disturbed.
    let (fastest_plain, fastest_traced) = (ms(&plain_cpu).min, ms(&traced_cpu).min);
    row(&[
        "  fastest run",
        &format!("{fastest_plain:.1}"),
        &format!("{fastest_traced:.1}"),
        &format!("{:+.2}%", (fastest_traced / fastest_plain - 1.0) * 100.0),
    ]);
    row(&[
        "wall time, ms",
        &ms(&plain.work_ns).show(1),
        &ms(&traced.work_ns).show(1),
        &overhead_percent(&plain.work_ns, &traced.work_ns),
    ]);
    row(&["samples", "", &Spread::of(samples).show(0), ""]);
    row(&[
        "BPF µs per sample",
        "",
        &Spread::of(bpf_ns_per_sample).map(|ns| ns / 1e3).show(1),
        &format!(
            "{:+.3}% of the CPU time (kernel stats)",
            Spread::of(bpf_share).median * 100.0
        ),
    ]);
}

/// One finished process.
struct Run {
    stdout: String,
    stderr: String,
    wall_ns: f64,
}

fn run(command: &mut Command) -> Run {
    let started = Instant::now();
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("running {command:?}: {error}"));
    let wall_ns = started.elapsed().as_nanos() as f64;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{command:?} failed: {stderr}");
    Run {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr,
        wall_ns,
    }
}

/// `cargo-trace PROBE... --no-svg -c 'PROGRAM ARGS...'`.
fn run_traced(cargo_trace: &Path, probe: &[&str], program: &Path, args: &[String]) -> Run {
    let argv: Vec<String> = std::iter::once(program.display().to_string())
        .chain(args.iter().cloned())
        .collect();
    run(Command::new(cargo_trace)
        .args(probe)
        .arg("--no-svg")
        .arg("-c")
        .arg(shell_words::join(&argv)))
}

/// The runs of one side of a comparison, in round order.
#[derive(Default)]
struct Rounds {
    wall_ns: Vec<f64>,
    /// The work's time by the program's own clock.
    work_ns: Vec<f64>,
}

impl Rounds {
    fn push(&mut self, run: &Run, work_ns: f64) {
        self.wall_ns.push(run.wall_ns);
        self.work_ns.push(work_ns);
    }
}

/// traced / untraced, round by round: each ratio is of two runs made one
/// after the other, under the same load.
fn ratio(plain: &[f64], traced: &[f64]) -> Spread {
    Spread::of(plain.iter().zip(traced).map(|(a, b)| b / a))
}

/// The number after `key` among the words of `text`.
fn value_after(text: &str, key: &str) -> f64 {
    let mut words = text.split_whitespace();
    words
        .find(|word| *word == key)
        .and_then(|_| words.next()?.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {text:?}"))
}

/// N of the summary line `cargo-trace: N events, M distinct stacks in T s; …`.
fn event_count(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|line| line.strip_prefix("cargo-trace: "))
        .find_map(|line| line.split_once(" events, ")?.0.parse().ok())
        .unwrap_or_else(|| panic!("no summary line in {stderr}"))
}

/// Run time of all the session's BPF programs, on every CPU, from the
/// `--bpf-stats` lines `cargo-trace: bpf NAME: R runs, T ns per run`.
fn bpf_run_time_ns(stderr: &str) -> f64 {
    let times: Vec<f64> = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("cargo-trace: bpf "))
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[..] {
                [_, runs, "runs,", ns, "ns", "per", "run"] => {
                    runs.parse::<f64>().unwrap() * ns.parse::<f64>().unwrap()
                }
                _ => panic!("unexpected BPF statistics line {line:?}"),
            }
        })
        .collect();
    assert!(!times.is_empty(), "no BPF statistics in {stderr}");
    times.iter().sum()
}

fn ms(ns: &[f64]) -> Spread {
    Spread::of(ns.iter().map(|ns| ns / 1e6))
}

/// One line of a table: a label and three columns.
fn row(cells: &[&str; 4]) {
    let line = format!(
        "  {:<LABEL$}{:<COLUMN$}{:<COLUMN$}{}",
        cells[0], cells[1], cells[2], cells[3]
    );
    println!("{}", line.trim_end());
}
