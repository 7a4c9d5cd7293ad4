//! Memory over a long run: `profile:hz:999` on a shell loop that keeps exec'ing short
//! children (`/bin/true`, a few hundred a second), as issue 13 asks, with cargo-trace's
//! resident memory and the kernel memory of its BPF maps sampled every few seconds.
//! Per-process state (the pid filter, the processes' registered mappings, their
//! counters in the kernel) must be released as processes exit, and a table shared by
//! many processes kept once; stacks are stored by object, one copy for every process
//! that meets them, and past `--keep-exited` the exited processes' counts add up under
//! pid 0. What grows then is the profile's distinct stacks (the summary line gives
//! them), no longer anything per process. Hence the growth per process started, which
//! does not move with the machine's load.
//!
//! Printed: a line per sample (seconds, processes started so far by the loop, RSS, the
//! kernel maps' bytes in all, the stack storage's files and the biggest movers), then the growth per minute after
//! the first sample of each (by least squares) and whether it stays under 1%/min, the
//! report's time and peak RSS, and cargo-trace's summary line. Asserts nothing.
//!
//! `cargo bench -p cargo-trace --bench long_run` (60 s by default;
//! `CARGO_TRACE_LONG_RUN_SECS=600` for the 10 minutes;
//! `CARGO_TRACE_LONG_RUN_PROBE=uprobe:libc:malloc` for another probe: malloc's call
//! paths in the loop are few, so the profile stops growing and what memory does then
//! is all that is left to see). Needs root.

mod common;

use common::status_kib;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Seconds between samples.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("long_run benchmark skipped: loading BPF programs needs root");
        return;
    }
    let probe =
        std::env::var("CARGO_TRACE_LONG_RUN_PROBE").unwrap_or_else(|_| "profile:hz:999".into());
    let seconds: u64 = std::env::var("CARGO_TRACE_LONG_RUN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let scratch = tempfile::tempdir().unwrap();
    let counter = scratch.path().join("started");
    // The loop counts its children in a file every 100 execs, for the figures.
    let command = format!(
        "sh -c 'n=0; while :; do /bin/true; n=$((n+1)); \
         [ $((n % 100)) -eq 0 ] && echo $n > {}; done'",
        counter.display()
    );
    let cargo_trace = Path::new(env!("CARGO_BIN_EXE_cargo-trace"));
    let mut child = Command::new(cargo_trace)
        .args([probe.as_str(), "-q", "--no-svg", "--folded"])
        .arg(scratch.path().join("out.folded"))
        .arg("-c")
        .arg(&command)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    println!(
        "long run: {probe} on a loop of /bin/true for {seconds} s, sampled every {} s",
        SAMPLE_EVERY.as_secs()
    );
    println!(
        "{:>6} {:>9} {:>10} {:>12} {:>10}  biggest maps (KiB)",
        "s", "started", "RSS KiB", "maps KiB", "files KiB"
    );
    let started = Instant::now();
    let mut rss = Vec::new();
    let mut maps = Vec::new();
    let mut first_maps: Option<BTreeMap<String, u64>> = None;
    // Processes the loop started, by time.
    let mut started_at = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(SAMPLE_EVERY);
        let at = started.elapsed().as_secs_f64();
        let rss_kib = status_kib(pid, "VmRSS:");
        let by_name = map_bytes(pid);
        let total: u64 = by_name.values().sum();
        let first = first_maps.get_or_insert_with(|| by_name.clone());
        let mut movers: Vec<(&String, i64)> = by_name
            .iter()
            .map(|(name, bytes)| (name, *bytes as i64 - *first.get(name).unwrap_or(&0) as i64))
            .filter(|(_, delta)| *delta != 0)
            .collect();
        movers.sort_by_key(|(_, delta)| -delta.abs());
        let movers: Vec<String> = movers
            .iter()
            .take(4)
            .map(|(name, delta)| format!("{name} {:+}", delta / 1024))
            .collect();
        let processes = std::fs::read_to_string(&counter).unwrap_or_default();
        println!(
            "{at:>6.0} {:>9} {rss_kib:>10} {:>12} {:>10}  {}",
            processes.trim(),
            total / 1024,
            unlinked_file_bytes(pid) / 1024,
            movers.join(", ")
        );
        if let Ok(started) = processes.trim().parse::<f64>() {
            started_at.push((at, started));
        }
        rss.push((at, rss_kib as f64 * 1024.0));
        maps.push((at, total as f64));
    }
    let before_report = status_kib(pid, "VmHWM:");
    let report_started = Instant::now();
    // SAFETY: kill(2) on our own child: Ctrl-C, the session ends and writes its outputs.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    // The peak RSS with the report: the last high-water mark read before it exits.
    let mut peak = before_report;
    let mut second_interrupt = false;
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(status_kib(pid, "VmHWM:"));
        std::thread::sleep(Duration::from_millis(20));
        // The shell may survive its child's SIGINT and loop on: a second Ctrl-C kills it.
        if !second_interrupt && report_started.elapsed() > Duration::from_secs(2) {
            second_interrupt = true;
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGINT) };
        }
    }
    let stderr = reader.join().unwrap();
    let report = report_started.elapsed();
    // Processes started per minute: growth per process does not move with the load.
    let processes_per_minute = slope(&started_at) * 60.0;
    println!("processes started: {processes_per_minute:.0} a minute");
    for (name, samples) in [("cargo-trace RSS", &rss), ("kernel maps", &maps)] {
        let (first, last) = (samples.first().unwrap().1, samples.last().unwrap().1);
        let per_minute = slope(samples) * 60.0;
        let share = per_minute / first * 100.0;
        println!(
            "{name}: {:.1} MiB at the first sample, {:.1} MiB at the last; {:+.1} KiB/min ({share:+.2}%/min), {:.0} B per process started: {}",
            first / 1048576.0,
            last / 1048576.0,
            per_minute / 1024.0,
            per_minute / processes_per_minute,
            if share.abs() < 1.0 { "flat" } else { "grows" }
        );
    }
    println!(
        "report (Ctrl-C to exit, a second Ctrl-C after 2 s if the loop runs on): {:.2} s; peak RSS {:.1} MiB while running, {:.1} MiB with the report",
        report.as_secs_f64(),
        before_report as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    for line in stderr.lines().filter(|line| line.contains(" events, ")) {
        println!("{line}");
    }
}

/// Bytes of the unlinked files process `pid` holds open: the stack storage's files.
fn unlinked_file_bytes(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().ends_with(" (deleted)"))
        })
        .filter_map(|fd| std::fs::metadata(fd.path()).ok())
        .filter(|meta| meta.is_file())
        .map(|meta| meta.len())
        .sum()
}

/// The kernel's memory of each BPF map process `pid` holds (the `memlock` of its
/// fdinfo, which on Linux 6.4+ is what the map uses, elements allocated on use
/// included), by map name (from bpftool).
fn map_bytes(pid: u32) -> BTreeMap<String, u64> {
    let mut by_id = BTreeMap::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
        let field = |key: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(key))
                .and_then(|value| value.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) {
            by_id.insert(id, memlock);
        }
    }
    let mut by_name = BTreeMap::new();
    for (id, bytes) in by_id {
        let output = Command::new("bpftool")
            .args(["map", "show", "id", &id.to_string()])
            .output();
        let name = output
            .ok()
            .and_then(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                let name = text
                    .split("name ")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .to_string();
                Some(name)
            })
            .unwrap_or_else(|| format!("map {id}"));
        *by_name.entry(name).or_insert(0) += bytes;
    }
    by_name
}

/// Least-squares slope of `(x, y)` points, per unit of x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let cov: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let var: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    cov / var
}
