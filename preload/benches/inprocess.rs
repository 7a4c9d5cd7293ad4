//! Per malloc/free pair, what in-process recording adds to `heap_storm` (the tests'
//! fixture: N pairs at the bottom of a chain of DEPTH frames) in steady state, at 10 and
//! 60 frames, with heaptrack (LD_PRELOAD + libunwind) and the untraced run in the same
//! rounds: the fixture's own `loop_ns` (its loop only, no start-up) at N = 2 M and 4 M,
//! and the slope between them. Then where a pair's time goes:
//! - clock: two `clock_gettime` calls (one per event), measured here;
//! - stacks off: the recorder without a stack (`CTP_OPT_NO_STACKS`): wrapper, clock and
//!   ring; what the memo adds is the full run minus this;
//! - memo off: every stack walked; ns per frame walked from the library's own counters;
//! - consumer: the time spent in `Recorder::poll`, per pair, on the other core.
//!
//! Prints figures only; asserts nothing about time. Needs gcc (the fixture) and
//! `heaptrack` for its column (`apt-get install heaptrack`); no root.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cargo_trace_tests::fixtures::c_fixture;
use preload::{Options, PlainTables, Recorder, Server};

const ROUNDS: usize = 3;
const SIZES: [u64; 2] = [2_000_000, 4_000_000];

struct Traced {
    loop_ns: f64,
    poll_ns: f64,
    walk_ns: u64,
    walked_frames: u64,
    memo_hits: u64,
    waits: u64,
    /// ns per memo answer (one in 1024 timed).
    memo_answer_ns: f64,
}

fn loop_ns(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("loop_ns "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no loop_ns in {stdout}"))
}

fn untraced(exe: &std::path::Path, args: &[String]) -> f64 {
    let out = Command::new(exe).args(args).output().unwrap();
    assert!(out.status.success());
    loop_ns(&String::from_utf8_lossy(&out.stdout))
}

fn heaptrack(exe: &std::path::Path, args: &[String], scratch: &std::path::Path) -> Option<f64> {
    let out = Command::new("heaptrack")
        .arg("-o")
        .arg(scratch.join("heaptrack.data"))
        .arg(exe)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| loop_ns(&String::from_utf8_lossy(&out.stdout)))
}

fn traced(exe: &std::path::Path, args: &[String], options: Options, no_stacks: bool) -> Traced {
    let mut server = Server::new().unwrap();
    let mut recorder = Recorder::new(options);
    let mut tables = PlainTables::new();
    let mut command = Command::new(exe);
    command
        .args(args)
        .envs(server.environment(None))
        .stdout(Stdio::piped());
    if no_stacks {
        command.env("CARGO_TRACE_HEAP_NO_STACKS", "1");
    }
    let child = command.spawn().unwrap();
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let mut poll = Duration::ZERO;
    let mut busy = false;
    while !waiter.is_finished() || server.connections() > 0 {
        // while events flow, the consumer drains every 100 us: often enough that a ring
        // never fills, seldom enough that it does not pull the rings' lines from the
        // target's core at every event
        if busy {
            std::thread::sleep(Duration::from_micros(100));
        }
        let wait = if busy {
            Duration::ZERO
        } else {
            Duration::from_millis(1)
        };
        server.serve(&mut tables, &mut recorder, wait).unwrap();
        let started = Instant::now();
        busy = recorder.poll() > 0;
        poll += started.elapsed();
    }
    let out = waiter.join().unwrap();
    assert!(out.status.success(), "{pid}: {out:?}");
    let counters = recorder.counters();
    Traced {
        loop_ns: loop_ns(&String::from_utf8_lossy(&out.stdout)),
        poll_ns: poll.as_nanos() as f64,
        walk_ns: counters.walk_ns,
        walked_frames: counters.walked_frames,
        memo_hits: counters.memo_hits,
        waits: counters.waits,
        memo_answer_ns: counters.memo_ns as f64 / counters.memo_timed.max(1) as f64,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `clock_gettime`, for scale: the library stamps events with the TSC instead.
fn clock_ns() -> f64 {
    const N: u32 = 1_000_000;
    let started = Instant::now();
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    for _ in 0..N {
        // SAFETY: a valid clock and pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        std::hint::black_box(&ts);
    }
    started.elapsed().as_nanos() as f64 / f64::from(N)
}

fn main() {
    // `cargo bench -p preload --bench inprocess -- [storm] [python]` (default: both)
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let runs = |what: &str| wanted.is_empty() || wanted.iter().any(|w| w == what);
    let exe = c_fixture("heap_storm");
    let scratch = std::env::temp_dir().join(format!("preload-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let has_heaptrack = Command::new("heaptrack")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let clock = clock_ns();
    println!(
        "clock_gettime(CLOCK_MONOTONIC): {clock:.1} ns (the library reads the TSC instead, \
         twice a pair)"
    );
    for depth in [10u64, 60].into_iter().filter(|_| runs("storm")) {
        println!(
            "\nheap_storm, {depth} frames deep (median of {ROUNDS} rounds, ns per pair, loop only)"
        );
        println!(
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "N", "untraced", "heaptrack", "in-process", "no stacks", "memo off", "consumer"
        );
        let mut added = Vec::new();
        for n in SIZES {
            let args = vec![n.to_string(), depth.to_string()];
            let (mut base, mut heap, mut ours, mut bare, mut walked, mut consumer) =
                (vec![], vec![], vec![], vec![], vec![], vec![]);
            let mut per_frame = Vec::new();
            let mut memo_hits = 0;
            let mut waits = 0;
            let mut memo_answer = Vec::new();
            for _ in 0..ROUNDS {
                base.push(untraced(&exe, &args));
                if has_heaptrack {
                    heap.push(heaptrack(&exe, &args, &scratch).unwrap_or(f64::NAN));
                }
                let full = traced(&exe, &args, Options::default(), false);
                memo_hits = full.memo_hits;
                waits += full.waits;
                memo_answer.push(full.memo_answer_ns);
                ours.push(full.loop_ns);
                consumer.push(full.poll_ns);
                bare.push(traced(&exe, &args, Options::default(), true).loop_ns);
                let off = traced(
                    &exe,
                    &args,
                    Options {
                        walk_memo: false,
                        ..Options::default()
                    },
                    false,
                );
                walked.push(off.loop_ns);
                per_frame.push(off.walk_ns as f64 / off.walked_frames.max(1) as f64);
            }
            let per = |v: Vec<f64>| median(v) / n as f64;
            let row = (
                per(base),
                if has_heaptrack { per(heap) } else { f64::NAN },
                per(ours),
                per(bare),
                per(walked),
                per(consumer),
            );
            println!(
                "{n:>10} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                row.0, row.1, row.2, row.3, row.4, row.5
            );
            println!(
                "{:>10} memo answers {memo_hits} ({:.1} ns each, timed in the library), full \
                 rings waited on {waits}, ns per frame walked (memo off) {:.2}",
                "",
                median(memo_answer),
                median(per_frame)
            );
            added.push((n, row));
        }
        let (n1, a) = added[0];
        let (n2, b) = added[1];
        let slope = |x: f64, y: f64| (y * n2 as f64 - x * n1 as f64) / (n2 - n1) as f64;
        let base = slope(a.0, b.0);
        let heap = slope(a.1, b.1) - base;
        let ours = slope(a.2, b.2) - base;
        let bare = slope(a.3, b.3) - base;
        let walked = slope(a.4, b.4) - base;
        println!("  added per pair, slope between N = {n1} and {n2}:");
        println!(
            "    heaptrack {heap:.1} ns, in-process {ours:.1} ns: {:.2}x heaptrack's",
            ours / heap
        );
        println!(
            "    where it goes: wrapper + TSC + ring (no stacks) {bare:.1}, memo {:.1}, consumer \
             (other core) {:.1}; every stack walked instead: {walked:.1}",
            ours - bare,
            b.5
        );
    }
    if let Some(python) = python().filter(|_| runs("python")) {
        python_round_trip(&python, &scratch, has_heaptrack);
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The python3 interpreter itself (not a shim script in front of it).
fn python() -> Option<std::path::PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    let path = String::from_utf8(out.stdout).ok()?;
    Some(path.trim().into()).filter(|p: &std::path::PathBuf| p.is_file())
}

/// A real program: CPython's JSON round trip with `PYTHONMALLOC=malloc` (every object
/// allocation a malloc call), whole runs, wall time: untraced, heaptrack, in-process.
fn python_round_trip(python: &std::path::Path, scratch: &std::path::Path, has_heaptrack: bool) {
    const SCRIPT: &str = "import json\n\
        d = [{'a': i, 'b': str(i) * 3, 'c': [i, i + 1, {'x': i}]} for i in range(150000)]\n\
        s = json.dumps(d)\n\
        assert json.loads(s) == d\n";
    let args = ["-c", SCRIPT];
    let wall = |command: &mut Command| {
        let started = Instant::now();
        let out = command.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        started.elapsed().as_secs_f64()
    };
    let (mut base, mut heap, mut ours) = (vec![], vec![], vec![]);
    let mut events = 0;
    for _ in 0..ROUNDS {
        base.push(wall(
            Command::new(python)
                .args(args)
                .env("PYTHONMALLOC", "malloc"),
        ));
        if has_heaptrack {
            heap.push(wall(
                Command::new("heaptrack")
                    .arg("-o")
                    .arg(scratch.join("heaptrack.python"))
                    .arg(python)
                    .args(args)
                    .env("PYTHONMALLOC", "malloc"),
            ));
        }
        let mut server = Server::new().unwrap();
        let mut recorder = Recorder::new(Options::default());
        let mut tables = PlainTables::new();
        let started = Instant::now();
        let mut child = Command::new(python)
            .args(args)
            .env("PYTHONMALLOC", "malloc")
            .envs(server.environment(None))
            .spawn()
            .unwrap();
        let mut busy = false;
        let mut exited = None;
        while exited.is_none() || server.connections() > 0 {
            if busy {
                std::thread::sleep(Duration::from_micros(100));
            }
            let wait = if busy {
                Duration::ZERO
            } else {
                Duration::from_millis(1)
            };
            server.serve(&mut tables, &mut recorder, wait).unwrap();
            busy = recorder.poll() > 0;
            if exited.is_none() && child.try_wait().unwrap().is_some() {
                exited = Some(started.elapsed().as_secs_f64());
            }
        }
        let _ = child.wait();
        ours.push(exited.unwrap());
        events = recorder.events();
    }
    let (base, heap, ours) = (median(base), median(heap), median(ours));
    println!("\nCPython JSON round trip, PYTHONMALLOC=malloc ({events} events recorded), wall s:");
    println!("  untraced {base:.2}, heaptrack {heap:.2}, in-process {ours:.2}");
    println!(
        "  added: heaptrack {:.2} s, in-process {:.2} s: {:.2}x heaptrack's",
        heap - base,
        ours - base,
        (ours - base) / (heap - base)
    );
}
