//! What reporting costs as stacks multiply: cargo-trace on the `paths` fixture (2^BITS
//! distinct malloc stacks, each called twice) under `uprobe:libc:malloc`, writing the
//! flamegraph and the HTML report, at a small and a large number of distinct stacks in the
//! same run; then the time headless chromium takes to load and draw each report (a
//! screenshot, the first paint of the whole page), the small one as the baseline.
//!
//! Prints figures only; asserts nothing about time. Needs root (and chromium for the
//! second part: `bash .ci/setup.sh` installs it).
//! `cargo bench -p cargo-trace --bench report [-- SMALL_BITS LARGE_BITS]` (default 10 17;
//! 20 is the million stacks, minutes of work).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cargo_trace_tests::fixtures;

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
    println!("report benchmark: paths fixture, uprobe:libc:malloc, 2^{small} and 2^{large} stacks");
    let mut reports = Vec::new();
    for bits in [small, large] {
        let report = scratch.path().join(format!("report-{bits}.html"));
        let started = Instant::now();
        let output = Command::new(cargo_trace)
            .arg("uprobe:libc:malloc")
            .arg("-c")
            .arg(format!("{} {bits}", paths.display()))
            .arg("-o")
            .arg(scratch.path().join(format!("flamegraph-{bits}.svg")))
            .arg("--report")
            .arg(&report)
            .arg("-q")
            .output()
            .expect("run cargo-trace");
        let wall = started.elapsed();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "cargo-trace failed: {stderr}");
        let summary = stderr
            .lines()
            .find(|line| line.contains(" events, "))
            .unwrap_or("");
        let size = std::fs::metadata(&report).map_or(0, |m| m.len());
        println!(
            "  2^{bits:<2} paths: {:>8.2} s wall for the whole run, report {:>6.1} MB; {summary}",
            wall.as_secs_f64(),
            size as f64 / 1e6
        );
        reports.push((bits, report));
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
