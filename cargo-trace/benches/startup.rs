//! How long a whole session takes on a program that exits at once (`/bin/true`),
//! phase by phase, against bpftrace's whole run of the same probe in the same rounds.
//!
//! Each round runs, for each session, bpftrace and then cargo-trace (with `--timings`,
//! whose report gives the phases: load, verify, guard, launch, tables, attach, run,
//! read, symbolize, write, teardown). Printed per session: the wall time of the whole
//! command, its CPU time (user + system, of it and its children) and its peak RSS
//! (`getrusage` of the reaped child), median [min–max] of the rounds, cargo-trace's
//! against bpftrace's, and the median of each phase.
//!
//! - `uprobe`: `uprobe:libc:malloc`; bpftrace `uprobe:libc:malloc { @[ustack] = count(); }`
//! - `profile`: `profile:hz:99`; bpftrace `profile:hz:99 { @[ustack] = count(); }`
//! - `alloc`: the heap profiler, against bpftrace's `uprobe` run (bpftrace has none);
//!   `alloc --no-preload`, the same with libc's functions probed.
//!
//! Without bpftrace (`apt-get install bpftrace`) the sessions are measured alone.
//! `--baseline PATH`: another cargo-trace binary (a build from before a change) run in
//! the same rounds, its figures printed beside this one's.
//!
//! A session's links are released after it ends, in a process of its own, and their
//! release (~350 ms of the kernel's grace periods) holds locks that attaching uprobes
//! takes: each run waits until the last one's are gone, as it would on a machine where
//! sessions do not follow each other at once. Other users of uprobes on the machine
//! slow the attach phase too: the medians and ranges are of rounds in the same hour.
//!
//! Prints figures only; asserts nothing about time. Needs root.
//! `cargo bench -p cargo-trace --bench startup [-- ROUNDS] [--baseline PATH] [uprobe|profile|alloc|alloc-no-preload...]`

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::Spread;

/// A session to measure: cargo-trace's arguments and bpftrace's program.
struct Session {
    name: &'static str,
    args: &'static [&'static str],
    bpftrace: &'static str,
}

const SESSIONS: [Session; 4] = [
    Session {
        name: "uprobe",
        args: &["uprobe:libc:malloc"],
        bpftrace: "uprobe:libc:malloc { @[ustack] = count(); }",
    },
    Session {
        name: "profile",
        args: &["profile:hz:99"],
        bpftrace: "profile:hz:99 { @[ustack] = count(); }",
    },
    Session {
        name: "alloc",
        args: &["alloc"],
        bpftrace: "uprobe:libc:malloc { @[ustack] = count(); }",
    },
    Session {
        name: "alloc-no-preload",
        args: &["alloc", "--no-preload"],
        bpftrace: "uprobe:libc:malloc { @[ustack] = count(); }",
    },
];

const PHASES: [&str; 11] = [
    "load",
    "verify",
    "guard",
    "launch",
    "tables",
    "attach",
    "run",
    "read",
    "symbolize",
    "write",
    "teardown",
];

/// What one run of a command took.
struct Run {
    wall_ms: f64,
    cpu_ms: f64,
    peak_rss_mib: f64,
    stderr: String,
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("startup benchmark skipped: loading BPF programs needs root");
        return;
    }
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let baseline = args.iter().position(|arg| arg == "--baseline").map(|at| {
        std::path::PathBuf::from(args.drain(at..at + 2).nth(1).expect("--baseline PATH"))
    });
    let rounds: usize = args.iter().find_map(|arg| arg.parse().ok()).unwrap_or(7);
    // The sessions named, or all of them.
    let named = |session: &&Session| args.iter().any(|arg| arg == session.name);
    let mut chosen: Vec<&Session> = SESSIONS.iter().filter(named).collect();
    if chosen.is_empty() {
        chosen = SESSIONS.iter().collect();
    }
    let cargo_trace = Path::new(env!("CARGO_BIN_EXE_cargo-trace"));
    let bpftrace = which("bpftrace");
    let dir = tempfile::tempdir().expect("a scratch directory");
    println!(
        "startup benchmark: {rounds} rounds of `cargo-trace PROBE -c /bin/true --timings`{}",
        if bpftrace.is_some() {
            " and bpftrace's run of the same probe"
        } else {
            " (no bpftrace found: cargo-trace alone)"
        }
    );

    // Each session's runs by who ran: this binary, the baseline, bpftrace.
    let mut runs: BTreeMap<(&str, &str), Vec<Run>> = BTreeMap::new();
    let binaries: Vec<(&str, &Path, bool)> = [("cargo-trace", cargo_trace)]
        .into_iter()
        .chain(baseline.as_deref().map(|path| ("baseline", path)))
        .map(|(who, path)| (who, path, has_timings(path)))
        .collect();
    for _ in 0..rounds {
        for session in &chosen {
            if let Some(bpftrace) = &bpftrace {
                settle();
                let run = measure(
                    Command::new(bpftrace)
                        .args(["-e", session.bpftrace, "-c", "/bin/true"])
                        .current_dir(dir.path()),
                );
                runs.entry((session.name, "bpftrace"))
                    .or_default()
                    .push(run);
            }
            for &(who, binary, timings) in &binaries {
                settle();
                let run = measure(
                    Command::new(binary)
                        .args(session.args)
                        .args(["-c", "/bin/true", "-q"])
                        .args(timings.then_some("--timings"))
                        .current_dir(dir.path()),
                );
                runs.entry((session.name, who)).or_default().push(run);
            }
        }
    }

    for session in &chosen {
        println!();
        println!(
            "{} (cargo-trace {} -c /bin/true), median [min–max] of {rounds} rounds:",
            session.name,
            session.args.join(" ")
        );
        let bpftrace_wall = runs
            .get(&(session.name, "bpftrace"))
            .map(|runs| Spread::of(runs.iter().map(|r| r.wall_ms)).median);
        for who in ["cargo-trace", "baseline", "bpftrace"] {
            let Some(runs) = runs.get(&(session.name, who)) else {
                continue;
            };
            let wall = Spread::of(runs.iter().map(|r| r.wall_ms));
            let ratio = match bpftrace_wall {
                Some(theirs) if who != "bpftrace" => {
                    format!(", x{:.2} bpftrace's", wall.median / theirs)
                }
                _ => String::new(),
            };
            println!(
                "  {who:<12} wall {} ms{ratio}, CPU {} ms, peak RSS {} MiB",
                wall.show(0),
                Spread::of(runs.iter().map(|r| r.cpu_ms)).show(0),
                Spread::of(runs.iter().map(|r| r.peak_rss_mib)).show(1)
            );
            if who == "bpftrace" {
                continue;
            }
            let phases: Vec<BTreeMap<String, f64>> =
                runs.iter().map(|run| phases_of(&run.stderr)).collect();
            let mut line = String::from("    phases (median ms):");
            for phase in PHASES {
                let times: Vec<f64> = phases
                    .iter()
                    .filter_map(|p| p.get(phase).copied())
                    .collect();
                if !times.is_empty() {
                    line.push_str(&format!(" {phase} {:.1}", Spread::of(times).median));
                }
            }
            println!("{line}");
        }
    }
}

/// Waits until no session's uprobe events are left (the last session's links are
/// released), at most 3 s.
fn settle() {
    let deadline = Instant::now() + std::time::Duration::from_secs(3);
    while Instant::now() < deadline {
        let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events")
            .or_else(|_| std::fs::read_to_string("/sys/kernel/debug/tracing/uprobe_events"))
            .unwrap_or_default();
        if !events.contains("cargo_trace") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs `command` to its end, its output captured; panics if it fails.
// Reaped with wait4 below, which gives its rusage: not through `Child::wait`.
#[allow(clippy::zombie_processes)]
fn measure(command: &mut Command) -> Run {
    let started = Instant::now();
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    let pid = child.id() as libc::pid_t;
    let stderr = {
        use std::io::Read;
        let mut text = String::new();
        let _ = child.stderr.expect("piped").read_to_string(&mut text);
        text
    };
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child, with pointers to locals that outlive the call.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    let status = std::process::ExitStatus::from_raw(status);
    assert!(status.success(), "{command:?}: {status}\n{stderr}");
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    Run {
        wall_ms,
        cpu_ms: ms(usage.ru_utime) + ms(usage.ru_stime),
        peak_rss_mib: usage.ru_maxrss as f64 / 1024.0,
        stderr,
    }
}

/// Whether `binary` has `--timings` (a baseline from before it has not).
fn has_timings(binary: &Path) -> bool {
    Command::new(binary)
        .arg("--help")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).contains("--timings"))
}

/// The phases of a `--timings` report: `  NAME  MS  what it is`.
fn phases_of(stderr: &str) -> BTreeMap<String, f64> {
    stderr
        .lines()
        .skip_while(|line| !line.starts_with("cargo-trace: timings"))
        .skip(1)
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            let ms = words.next()?.parse().ok()?;
            PHASES.contains(&name).then(|| (name.to_string(), ms))
        })
        .collect()
}

/// The program `name` on the PATH.
fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
}
