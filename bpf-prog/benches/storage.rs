//! The stack storage under many distinct stacks: the `paths` fixture (tests/fixtures)
//! takes 2^BITS distinct call paths to malloc, each twice, under `on_uprobe` on libc's
//! malloc, while the benchmark drains the records ring buffer every 20 ms as a session
//! does. For 2^16 and 2^20 paths it reports the events per second sustained, checks that
//! none was lost (every event counted, every stack received, no loss counter moved), and
//! reports the kernel memory per stored stack, against the same run untraced (rounds
//! interleaved).
//!
//! Prints figures only; asserts nothing about time. Needs root.
//! `cargo bench -p bpf-prog --bench storage [-- ROUNDS]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bpf_prog::{EventProgram, Loss, Options, StackRef, WalkEnd};
use common::{
    attach_to_function, executable_mappings, register_process, tracer_or_skip, Figure, Target,
};

/// How often the records ring buffer is drained, as the session's wait loop does.
const DRAIN_INTERVAL: Duration = Duration::from_millis(20);

fn options() -> Options {
    Options {
        max_rows: 1 << 20,
        programs: [EventProgram::Uprobe].into(),
        ..Options::default()
    }
}

/// What one traced run gave.
struct Traced {
    seconds: f64,
    events: u64,
    stacks: usize,
    frames: usize,
    kernel_bytes: u64,
    /// The same map empty (its bucket array, sized by its capacity).
    empty_bytes: u64,
}

/// Runs the fixture once untraced; returns its wall time from go to exit.
fn untraced(paths: &Path, bits: u32) -> f64 {
    let target = Target::spawn(paths, &[bits.to_string(), "wait".to_string()]);
    let started = Instant::now();
    target.start().wait_for_exit();
    started.elapsed().as_secs_f64()
}

/// Runs the fixture once under a fresh tracer; checks that nothing was lost.
fn traced(paths: &Path, bits: u32) -> Traced {
    let Some(mut tracer) = tracer_or_skip("storage benchmark", &options()) else {
        std::process::exit(0);
    };
    let target = Target::spawn(paths, &[bits.to_string(), "wait".to_string()]);
    let pid = target.pid();
    register_process(&mut tracer, pid, |_| false);
    let empty_bytes = tracer
        .stack_storage()
        .expect("storage figures")
        .kernel_bytes;
    let _link = attach_to_function(
        tracer.program(EventProgram::Uprobe),
        pid,
        &libc_path(pid),
        "malloc",
        false,
        1,
    );
    let started = Instant::now();
    let mut running = target.start();
    while !running.exited() {
        tracer.drain_records().expect("drain the records");
        std::thread::sleep(DRAIN_INTERVAL);
    }
    let seconds = started.elapsed().as_secs_f64();

    let mallocs = 2u64 << bits;
    let counts = tracer.counts().expect("read the counts");
    let events: u64 = counts.iter().map(|(_, count)| count.events).sum();
    let losses = tracer.losses().expect("read the losses");
    let ends = tracer.walk_ends().expect("read the walk ends");
    assert_eq!(losses, [0; Loss::COUNT], "losses: {:?}", Loss::ALL);
    assert_eq!(ends.get(WalkEnd::Complete), events, "walks: {ends:?}");
    assert!(events >= mallocs, "{events} events of {mallocs} mallocs");
    for (key, _) in &counts {
        let StackRef::Hash(hash) = key.stack else {
            panic!("an event without its stack: {key:?}");
        };
        assert!(
            tracer.stack(hash).expect("read a stack").is_some(),
            "a stack never arrived"
        );
    }
    let storage = tracer.stack_storage().expect("read the storage figures");
    assert!(storage.stacks >= 1 << bits, "{} stacks", storage.stacks);
    Traced {
        seconds,
        events,
        stacks: storage.stacks,
        frames: storage.frames,
        kernel_bytes: storage.kernel_bytes,
        empty_bytes,
    }
}

fn libc_path(pid: u32) -> PathBuf {
    executable_mappings(pid)
        .into_iter()
        .map(|m| m.path)
        .find(|path| path.to_string_lossy().contains("libc.so"))
        .expect("the fixture maps libc")
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(3);
    let paths = cargo_trace_tests::fixtures::c_fixture("paths");
    let defaults = options();
    println!(
        "bpf-prog storage benchmark: {rounds} rounds, records ring buffer {} MiB drained every \
         {} ms, BPF object {}",
        defaults.record_ring_bytes >> 20,
        DRAIN_INTERVAL.as_millis(),
        bpf_prog::OBJECT_ORIGIN
    );
    for bits in [16u32, 20] {
        let mut baseline = Vec::new();
        let mut runs = Vec::new();
        for _ in 0..rounds {
            baseline.push(untraced(&paths, bits));
            runs.push(traced(&paths, bits));
        }
        let last = runs.last().expect("at least one round");
        let rates = Figure::of(runs.iter().map(|r| r.events as f64 / r.seconds).collect());
        let added = Figure::of(
            runs.iter()
                .zip(&baseline)
                .map(|(run, base)| (run.seconds - base) / run.events as f64 * 1e9)
                .collect(),
        );
        let base = Figure::of(baseline.clone());
        println!(
            "\n2^{bits} paths ({} mallocs, {} distinct stacks of {:.1} frames), median [best] of \
             {rounds} rounds, no event or stack lost in any:",
            last.events,
            last.stacks,
            last.frames as f64 / last.stacks as f64
        );
        println!(
            "  traced: {:.0} [{:.0}] events per second sustained, +{:.2} [{:.2}] µs per event",
            rates.median,
            rates.max,
            added.median / 1e3,
            added.min / 1e3
        );
        println!(
            "  untraced: {:.1} [{:.1}] ms for the whole run",
            base.median * 1e3,
            base.min * 1e3
        );
        println!(
            "  kernel memory per stored stack: {:.1} bytes, {:.1} of them its element \
             (known_stacks: {} bytes for {} stacks, {} bytes empty); the previous design \
             kept a 4,112-byte ct_stack per stack (4 KiB of frames)",
            last.kernel_bytes as f64 / last.stacks as f64,
            (last.kernel_bytes - last.empty_bytes) as f64 / last.stacks as f64,
            last.kernel_bytes,
            last.stacks,
            last.empty_bytes
        );
    }
}
