//! What a uprobe with in-kernel unwinding costs, against same-run baselines.
//!
//! A C program (gcc -O2 -fomit-frame-pointer) calls a chain DEPTH functions
//! deep, then malloc(32)/free N times, and prints how long that loop took.
//! It runs with no probe, with the counting-only program on libc's malloc
//! (`on_uprobe_count`: the uprobe and BPF entry cost, no stack) and with the
//! unwinding program (`on_uprobe`), rounds interleaved, medians reported.
//! The kernel's BPF statistics give the programs' own run time per event;
//! two chain depths give the marginal cost of a frame.
//!
//! Prints figures only; asserts nothing about time. Needs root.
//! `cargo bench -p bpf-prog --bench uprobe [-- EVENTS]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bpf_prog::{Options, StackRef, TableId, Tracer, WalkError};
use common::{
    build_c, executable_mappings, register_process_with, scratch_dir, tracer_or_skip, Target,
};
use libbpf_rs::{Link, UprobeOpts};

const STORM_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define KEEP __attribute__((noipa))

volatile unsigned long sink;

KEEP void storm(long n)
{
	for (long i = 0; i < n; i++) {
		void *p = malloc(32);
		sink += (unsigned long)p;
		free(p);
	}
}

/* chain(depth) -> chain(depth - 1) -> ... -> storm, none a tail call */
KEEP int chain(int depth, long n)
{
	volatile char frame[48];
	frame[depth & 31] = (char)depth;
	if (depth <= 1)
		storm(n);
	else
		chain(depth - 1, n);
	return frame[depth & 31];
}

int main(int argc, char **argv)
{
	long n = atol(argv[1]);
	int depth = atoi(argv[2]);
	struct timespec start, end;
	char go;

	printf("ready\n");
	fflush(stdout);
	if (read(0, &go, 1) != 1)
		return 2;
	clock_gettime(CLOCK_MONOTONIC, &start);
	chain(depth, n);
	clock_gettime(CLOCK_MONOTONIC, &end);
	printf("%ld\n", (end.tv_sec - start.tv_sec) * 1000000000L + (end.tv_nsec - start.tv_nsec));
	return 0;
}
"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    NoProbe,
    CountOnly,
    Unwind,
}

struct Bench {
    tracer: Tracer,
    tables: HashMap<PathBuf, TableId>,
    binary: PathBuf,
    events: u64,
}

impl Bench {
    /// Runs the storm once; returns the loop's ns per malloc and, when
    /// unwinding, the frames of the malloc stack.
    fn run(&mut self, mode: Mode, depth: usize) -> (f64, Option<usize>) {
        let target = Target::spawn(&self.binary, &[self.events.to_string(), depth.to_string()]);
        let pid = target.pid();
        let libc = libc_path(pid);
        register_process_with(&mut self.tracer, &mut self.tables, pid, |_| false);
        let link: Option<Link> = match mode {
            Mode::NoProbe => None,
            Mode::CountOnly => Some(attach(self.tracer.uprobe_count_program(), pid, &libc)),
            Mode::Unwind => Some(attach(self.tracer.uprobe_program(), pid, &libc)),
        };
        let output = target.run_to_end();
        drop(link);
        let elapsed_ns: f64 = output.trim().parse().expect("fixture prints its loop time");
        let frames = (mode == Mode::Unwind)
            .then(|| self.storm_frames(pid))
            .flatten();
        self.tracer.remove_process(pid).expect("remove process");
        (elapsed_ns / self.events as f64, frames)
    }

    /// Frames of the most counted complete stack of `pid`.
    fn storm_frames(&self, pid: u32) -> Option<usize> {
        let counts = self.tracer.counts().expect("counts");
        let (key, _) = counts
            .iter()
            .filter(|(key, _)| key.pid == pid)
            .max_by_key(|(_, count)| count.events)?;
        let StackRef::Hash(hash) = key.stack else {
            return None;
        };
        let stack = self.tracer.stack(hash).ok()??;
        assert_eq!(
            stack.error,
            WalkError::Ok,
            "the storm's stack must be complete"
        );
        Some(stack.pcs.len())
    }
}

fn libc_path(pid: u32) -> PathBuf {
    executable_mappings(pid)
        .into_iter()
        .map(|m| m.path)
        .find(|path| path.to_string_lossy().contains("libc.so"))
        .expect("the fixture maps libc")
}

fn attach(program: &libbpf_rs::ProgramMut<'_>, pid: u32, libc: &Path) -> Link {
    program
        .attach_uprobe_with_opts(
            pid as i32,
            libc,
            0,
            UprobeOpts {
                cookie: 1,
                func_name: Some("malloc".to_string()),
                ..UprobeOpts::default()
            },
        )
        .expect("attach to malloc")
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let events: u64 = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(200_000);
    let options = Options {
        max_rows: 1 << 20,
        ..Options::default()
    };
    let Some(tracer) = tracer_or_skip("uprobe benchmark", &options) else {
        return;
    };
    let binary = build_c(&scratch_dir("bench-storm"), "storm", STORM_C, &[]);
    let mut bench = Bench {
        tracer,
        tables: HashMap::new(),
        binary,
        events,
    };
    println!(
        "bpf-prog uprobe benchmark: {events} malloc events per run, BPF object {}",
        bpf_prog::OBJECT_ORIGIN
    );

    // Table loading, once, outside the timed runs.
    let started = Instant::now();
    let target = Target::spawn(&bench.binary, &["1".to_string(), "1".to_string()]);
    register_process_with(&mut bench.tracer, &mut bench.tables, target.pid(), |_| {
        false
    });
    target.run_to_end();
    let usage = bench.tracer.table_usage();
    println!(
        "tables: {} objects, {} rows, {} pages, {} rules; compiled and loaded in {:.1} ms",
        usage.tables,
        usage.rows,
        usage.pages,
        usage.rules,
        started.elapsed().as_secs_f64() * 1e3
    );

    let stats = bpf_prog::enable_run_time_stats().expect("enable BPF run-time statistics");
    let rounds = 5;
    // (frames per stack, BPF ns per event) of the unwinding program, per depth
    let mut walks: Vec<(usize, f64)> = Vec::new();
    for depth in [10usize, 110] {
        let mut times: HashMap<&str, Vec<f64>> = HashMap::new();
        let mut frames = 0;
        let before = bench.tracer.program_stats().expect("program stats");
        for _ in 0..rounds {
            for mode in [Mode::NoProbe, Mode::CountOnly, Mode::Unwind] {
                let (ns, stack_frames) = bench.run(mode, depth);
                times.entry(mode_name(mode)).or_default().push(ns);
                if let Some(stack_frames) = stack_frames {
                    frames = stack_frames;
                }
            }
        }
        let after = bench.tracer.program_stats().expect("program stats");
        let bpf_ns = |program: &str| {
            let (a, b) = (after[program], before[program]);
            (a.run_time_ns - b.run_time_ns) as f64 / (a.run_count - b.run_count).max(1) as f64
        };
        let base = median(times.get_mut("no probe").unwrap());
        let count_only = median(times.get_mut("count only").unwrap());
        let unwind = median(times.get_mut("unwind").unwrap());
        let (bpf_count, bpf_unwind) = (bpf_ns("on_uprobe_count"), bpf_ns("on_uprobe"));
        println!("\nchain depth {depth} ({frames} frames per stack), median of {rounds} rounds:");
        println!("  loop without probe        {base:8.1} ns per malloc (baseline)");
        println!(
            "  uprobe, count only        {count_only:8.1} ns per malloc  (+{:.3} µs per event; BPF {bpf_count:.0} ns)",
            (count_only - base) / 1e3
        );
        println!(
            "  uprobe, full unwinding    {unwind:8.1} ns per malloc  (+{:.3} µs per event; BPF {bpf_unwind:.0} ns)",
            (unwind - base) / 1e3
        );
        println!(
            "  unwinding vs counting:    x{:.2} added cost; BPF walk {:.1} ns per frame ({:.0} ns over {frames} frames)",
            (unwind - base) / (count_only - base),
            (bpf_unwind - bpf_count) / frames.max(1) as f64,
            bpf_unwind - bpf_count,
        );
        walks.push((frames, bpf_unwind));
    }
    drop(stats);
    if let [(short_frames, short_ns), (long_frames, long_ns)] = walks[..] {
        println!(
            "\nmarginal BPF cost of a frame: {:.1} ns ({short_frames} -> {long_frames} frames: {short_ns:.0} -> {long_ns:.0} ns)",
            (long_ns - short_ns) / (long_frames - short_frames).max(1) as f64
        );
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::NoProbe => "no probe",
        Mode::CountOnly => "count only",
        Mode::Unwind => "unwind",
    }
}
