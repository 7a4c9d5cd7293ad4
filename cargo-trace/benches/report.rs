//! What reporting costs as stacks multiply (issue 13: "report time for 1 M distinct
//! stacks (symbolization and writing), against the same with 1 k"): cargo-trace on the
//! `paths` fixture (2^BITS distinct malloc stacks, each taken twice) under
//! `uprobe:libc:malloc`, writing the flamegraph, the folded stacks, the pprof profile and
//! the HTML report, at a small and a large number of distinct stacks in the same run, the
//! small one as the baseline. Both runs have maps of 2^LARGE_BITS + 1024 stacks and
//! counters (`--max-stacks`, `--max-counts`; at least the defaults), since the defaults'
//! 2^20 hold the million paths but not the fixture's other stack.
//!
//! For each: the report phase, from the target's exit to cargo-trace's (the tracer's
//! poll that sees the exit, up to 20 ms, then reading the counts and the stacks,
//! symbolizing and writing every output), and its ratio to the small one's; cargo-trace's
//! peak RSS (VmHWM, read from /proc/PID/status every 5 ms) when the target exits and at
//! the end; the whole run's wall time and cargo-trace's summary line. The target's exit
//! is timed by the fixture's last line ("paths N mallocs 2N", written as it exits, on the
//! stdout it shares with cargo-trace), read as it streams. Then the time headless chromium
//! takes to load and draw each report (a screenshot, the first paint of the whole page).
//!
//! Prints figures only; asserts nothing about time. Needs root (and chromium for the
//! second part: `bash .ci/setup.sh` installs it).
//! `cargo bench -p cargo-trace --bench report [-- SMALL_BITS LARGE_BITS]` (default 10 17;
//! 20 is the million stacks, minutes of work).

mod common;

use common::status_kib;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use cargo_trace_tests::fixtures;

/// Distinct stacks the fixture has beside its paths' (its stdout buffer's malloc, one
/// or so), with room to spare.
const OTHER_STACKS: u32 = 1024;

/// Between two reads of cargo-trace's peak RSS.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// The outputs of a run, by the name of their flag.
const OUTPUTS: [(&str, &str); 4] = [
    ("-o", "flamegraph.svg"),
    ("--folded", "stacks.folded"),
    ("--pprof", "profile.pb.gz"),
    ("--report", "report.html"),
];

/// One traced run of the fixture.
struct Run {
    /// From cargo-trace's start to its exit.
    wall: Duration,
    /// From the target's exit to cargo-trace's.
    report: Duration,
    /// VmHWM when the target's exit was seen, and the last one read, in KiB.
    peak_at_target_exit: u64,
    peak: u64,
    /// cargo-trace's summary line.
    summary: String,
    /// Each output's size, in the order of [`OUTPUTS`].
    sizes: Vec<u64>,
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("report benchmark skipped: loading BPF programs needs root");
        return;
    }
    let bits: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    let (small, large) = match bits[..] {
        [small, large, ..] => (small, large),
        _ => (10, 17),
    };
    let cargo_trace = Path::new(env!("CARGO_BIN_EXE_cargo-trace"));
    let paths = fixtures::c_fixture("paths");
    let scratch = tempfile::tempdir().expect("a scratch directory");
    // The default maps hold 2^20 stacks and counters: 2^20 paths and the fixture's other
    // stacks would not fit. Both runs get the same maps, sized for the large one.
    let defaults = bpf_prog::Options::default();
    let capacity = (1u32 << large) + OTHER_STACKS;
    let capacity = capacity.max(defaults.max_stacks).max(defaults.max_counts);
    println!(
        "report benchmark: paths fixture, uprobe:libc:malloc, 2^{small} and 2^{large} stacks \
         (--max-stacks and --max-counts {capacity}); flamegraph, folded stacks, pprof and \
         HTML report"
    );
    let mut reports = Vec::new();
    let mut baseline = None;
    for bits in [small, large] {
        let directory = scratch.path().join(format!("run-{bits}"));
        std::fs::create_dir(&directory).expect("a directory for the run's outputs");
        let run = trace_paths(cargo_trace, &paths, bits, capacity, &directory);
        let base = *baseline.get_or_insert(run.report);
        let sizes: Vec<String> = OUTPUTS
            .iter()
            .zip(&run.sizes)
            .map(|((_, name), size)| format!("{name} {}", megabytes(*size)))
            .collect();
        println!(
            "  2^{bits:<2} paths: report {:>7.2} s ({:.1}x the 2^{small} one), peak RSS {:.1} MiB \
             ({:.1} MiB at the target's exit); {:.2} s wall for the whole run",
            run.report.as_secs_f64(),
            run.report.as_secs_f64() / base.as_secs_f64(),
            run.peak as f64 / 1024.0,
            run.peak_at_target_exit as f64 / 1024.0,
            run.wall.as_secs_f64(),
        );
        println!("    {}", sizes.join(", "));
        println!("    {}", run.summary);
        reports.push((bits, directory.join(OUTPUTS[3].1)));
    }
    let Some(browser) = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| Command::new(name).arg("--version").output().is_ok())
    else {
        println!("  no chromium: the first-paint figures are skipped");
        return;
    };
    println!("  first paint in headless {browser} (median of 3 screenshots):");
    let mut baseline = None;
    for (bits, report) in &reports {
        let mut times: Vec<Duration> = (0..3)
            .map(|round| {
                let shot = scratch.path().join(format!("shot-{bits}-{round}.png"));
                let started = Instant::now();
                let status = Command::new(browser)
                    .args(["--headless", "--no-sandbox", "--disable-gpu"])
                    .arg("--window-size=1280,1600")
                    .arg(format!("--screenshot={}", shot.display()))
                    .arg(format!("file://{}", report.display()))
                    .output()
                    .expect("run chromium")
                    .status;
                assert!(status.success() && shot.exists(), "no screenshot");
                started.elapsed()
            })
            .collect();
        times.sort();
        let median = times[1];
        let base = *baseline.get_or_insert(median);
        println!(
            "    2^{bits:<2} paths: {:>6.2} s ({:.2}x the 2^{small} report)",
            median.as_secs_f64(),
            median.as_secs_f64() / base.as_secs_f64()
        );
    }
}

/// Trace the fixture's 2^`bits` paths with maps of `capacity` stacks and counters,
/// writing every output into `directory`.
fn trace_paths(
    cargo_trace: &Path,
    paths: &Path,
    bits: u32,
    capacity: u32,
    directory: &Path,
) -> Run {
    let outputs: Vec<PathBuf> = OUTPUTS
        .iter()
        .map(|(_, name)| directory.join(name))
        .collect();
    let started = Instant::now();
    let mut command = Command::new(cargo_trace);
    command
        .arg("uprobe:libc:malloc")
        .arg("-c")
        .arg(format!("{} {bits}", paths.display()))
        .arg("--max-stacks")
        .arg(capacity.to_string())
        .arg("--max-counts")
        .arg(capacity.to_string())
        .arg("-q");
    for ((flag, _), path) in OUTPUTS.iter().zip(&outputs) {
        command.arg(flag).arg(path);
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cargo-trace");
    let pid = child.id();

    // The fixture's last line, flushed as it exits, on the stdout it inherits: the
    // target's exit, timed as the line arrives.
    let last_line = format!("paths {} mallocs {}", 1u64 << bits, 2u64 << bits);
    let (target_exited, target_exit) = mpsc::channel();
    let stdout = child.stdout.take().expect("cargo-trace's stdout");
    let stdout_reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line == last_line {
                let _ = target_exited.send(Instant::now());
            }
        }
    });
    let mut stderr = child.stderr.take().expect("cargo-trace's stderr");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // cargo-trace's exit, timed by a waiter that leaves it unreaped: its pid names no
    // other process while the peak RSS is still being read.
    let ended = Arc::new(AtomicBool::new(false));
    let waiter = {
        let ended = Arc::clone(&ended);
        std::thread::spawn(move || {
            // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid, which
            // only writes into it.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid on our own child, with a valid pointer; WNOWAIT leaves it
            // to `child.wait()` below to reap.
            let waited =
                unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
            let at = Instant::now();
            ended.store(true, Ordering::Release);
            assert_eq!(waited, 0, "waitid: {}", std::io::Error::last_os_error());
            at
        })
    };

    let mut peak = 0;
    let mut target_exit_at = None;
    let mut peak_at_target_exit = 0;
    while !ended.load(Ordering::Acquire) {
        // A zombie has no VmHWM line: 0, which leaves the peak as it was.
        peak = peak.max(status_kib(pid, "VmHWM:"));
        if target_exit_at.is_none() {
            if let Ok(at) = target_exit.try_recv() {
                target_exit_at = Some(at);
                peak_at_target_exit = peak;
            }
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
    let ended_at = waiter.join().expect("the waiter");
    let status = child.wait().expect("reap cargo-trace");
    stdout_reader.join().expect("the stdout reader");
    let stderr = stderr_reader.join().expect("the stderr reader");
    assert!(status.success(), "cargo-trace failed: {stderr}");
    let target_exit_at = target_exit_at
        .or_else(|| target_exit.try_recv().ok())
        .unwrap_or_else(|| panic!("the fixture's last line never came; stderr: {stderr}"));
    let summary = stderr
        .lines()
        .find(|line| line.contains(" events, "))
        .unwrap_or("(no summary line)")
        .to_string();
    Run {
        wall: ended_at - started,
        report: ended_at - target_exit_at,
        peak_at_target_exit,
        peak,
        summary,
        sizes: outputs
            .iter()
            .map(|path| std::fs::metadata(path).map_or(0, |m| m.len()))
            .collect(),
    }
}

/// A file's size for a person: MB, or kB under one.
fn megabytes(bytes: u64) -> String {
    if bytes < 1_000_000 {
        format!("{:.0} kB", bytes as f64 / 1e3)
    } else {
        format!("{:.1} MB", bytes as f64 / 1e6)
    }
}
