//! What the in-kernel walk costs by itself, per event and per frame, with no
//! trap around it.
//!
//! The raw tracepoint program walks the user stack saved at the current
//! task's kernel entry, as it does for any event taken in kernel mode. Run
//! with BPF_PROG_TEST_RUN from this process, that is this process's own
//! stack, at the test-run syscall: the benchmark recurses DEPTH frames (each
//! holding locals, like real code) and runs the program there many times,
//! and the kernel's BPF statistics time each run. The same code path as a
//! uprobe or a perf sample (rule cache, page copies, hashing, counting),
//! without the exception entry and exit whose cost varies with the
//! machine's other tenants: the figure to compare walker changes by. Every
//! run after the first repeats a walk, which the walk memo answers: the
//! rounds run once with the memo off (the walker's cost) and once with it on.
//!
//! Prints figures only; asserts nothing about time. Needs root.
//! `cargo bench -p bpf-prog --bench walk [-- RUNS]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use bpf_prog::{EventProgram, Options, ProgramStats, StackRef, Tracer, WalkEnd};
use common::{register_process, tracer_or_skip, Figure};
use libbpf_rs::ProgramInput;

/// Runs the program `runs` times from `depth` frames below the caller and
/// returns the BPF run time per run, in ns. Sets `frame_bytes` to the size of
/// a frame of the recursion (`above`: the caller's locals, 0 at the top).
#[inline(never)]
fn at_depth(tracer: &Tracer, depth: usize, runs: u64, frame_bytes: &mut u64, above: u64) -> f64 {
    // Locals kept live across the call, so that frames have a size like
    // that of small real functions (and of the uprobe benchmark's chain).
    let mut locals = [depth as u8; 32];
    black_box(&mut locals);
    let here = locals.as_ptr() as u64;
    if above != 0 {
        *frame_bytes = above - here;
    }
    let ns = if depth == 0 {
        test_runs(tracer, runs)
    } else {
        at_depth(tracer, depth - 1, runs, frame_bytes, here)
    };
    black_box(&locals);
    ns
}

#[inline(never)]
fn test_runs(tracer: &Tracer, runs: u64) -> f64 {
    let program = tracer.program(EventProgram::RawTracepoint);
    let before = stats(tracer);
    for _ in 0..runs {
        program
            .test_run(ProgramInput::default())
            .expect("BPF_PROG_TEST_RUN of the raw tracepoint program");
    }
    let after = stats(tracer);
    (after.run_time_ns - before.run_time_ns) as f64
        / (after.run_count - before.run_count).max(1) as f64
}

fn stats(tracer: &Tracer) -> ProgramStats {
    tracer.program_stats().expect("program stats")["on_raw_tracepoint"]
}

/// The distinct frame counts of this process's counted stacks, shortest
/// first; every stack must be complete.
fn walked_frames(tracer: &Tracer, pid: u32) -> Vec<usize> {
    let mut frames: Vec<usize> = tracer
        .counts()
        .expect("counts")
        .iter()
        .filter(|(key, _)| key.pid == pid)
        .map(|(key, _)| {
            let StackRef::Hash(hash) = key.stack else {
                panic!("a run has no user stack: {key:?}");
            };
            let stack = tracer
                .stack(hash)
                .expect("read stack")
                .expect("stored stack");
            assert_eq!(
                stack.end,
                WalkEnd::Complete,
                "the walk must be complete: {:?} {:x?}",
                stack.end,
                stack.pcs
            );
            stack.pcs.len()
        })
        .collect();
    frames.sort();
    frames.dedup();
    frames
}

fn main() {
    let runs: u64 = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(20_000);
    println!(
        "bpf-prog walk benchmark: {runs} test runs per round, BPF object {}",
        bpf_prog::OBJECT_ORIGIN
    );
    let _stats = bpf_prog::enable_run_time_stats().expect("enable BPF run-time statistics");
    println!("every run walked (the walk memo off):");
    measure(runs, false);
    println!("the walk memo on (every run after the first answered by it):");
    measure(runs, true);
}

/// Runs the rounds with a tracer of its own, the walk memo on or off, and prints the
/// figures.
fn measure(runs: u64, walk_memo: bool) {
    let options = Options {
        kernel_stacks: false,
        walk_memo,
        programs: [EventProgram::RawTracepoint].into(),
        ..Options::default()
    };
    let Some(mut tracer) = tracer_or_skip("walk benchmark", &options) else {
        return;
    };
    let pid = std::process::id();
    register_process(&mut tracer, pid, |_| false);
    tracer.filter_pid(pid).expect("filter pid");

    let depths = [10usize, 110];
    let rounds = 9;
    let mut per_run: Vec<Vec<f64>> = vec![Vec::new(); depths.len()];
    let mut frame_bytes = 0;
    for _ in 0..rounds {
        for (i, &depth) in depths.iter().enumerate() {
            per_run[i].push(at_depth(&tracer, depth, runs, &mut frame_bytes, 0));
        }
    }
    let frames = walked_frames(&tracer, pid);
    assert_eq!(
        frames.len(),
        depths.len(),
        "one length per depth: {frames:?}"
    );
    let figures: Vec<Figure> = per_run.into_iter().map(Figure::of).collect();
    for ((depth, frames), figure) in depths.iter().zip(&frames).zip(&figures) {
        println!(
            "recursion {depth:3} deep ({frames:3} frames): BPF {:6.0} ns per walk median, {:6.0} ns minimum of {rounds} rounds",
            figure.median, figure.min
        );
    }
    let frames_added = (frames[1] - frames[0]).max(1) as f64;
    println!(
        "marginal BPF cost of a frame ({frame_bytes} bytes each): {:.1} ns median, {:.1} ns minimum",
        (figures[1].median - figures[0].median) / frames_added,
        (figures[1].min - figures[0].min) / frames_added,
    );
    let hits = tracer.memo_hits().expect("memo hits");
    let walks = tracer.walk_ends().expect("walk ends").total();
    println!("walks answered by the memo: {hits} of {walks}");
}
