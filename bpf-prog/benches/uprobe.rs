//! What a uprobe with in-kernel unwinding costs, against same-run baselines.
//!
//! A C program (gcc -O2 -fomit-frame-pointer) calls a chain DEPTH functions
//! deep, then malloc(32)/free N times, and prints how long that loop took.
//! It runs with no probe, with the counting-only program on libc's malloc
//! (`on_uprobe_count`: the uprobe and BPF entry cost, no stack) and with the
//! unwinding program (`on_uprobe`), rounds interleaved, medians reported.
//! Two more ways give the kernel's share of a heap profiler's malloc/free
//! pair, the counting program doing next to nothing: on malloc's entry and
//! its return (a uretprobe), and on those and free's entry (past free's
//! leading NULL test, as `cargo trace alloc` probes it: a probe on that
//! `test` would be single-stepped).
//! The kernel's BPF statistics give the programs' own run time per event;
//! two chain depths give the marginal cost of a frame.
//!
//! Prints figures only; asserts nothing about time. Needs root.
//! `cargo bench -p bpf-prog --bench uprobe [-- EVENTS]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use bpf_prog::{EventProgram, Options, ProgramStats, StackRef, TableId, Tracer, WalkEnd};
use common::{
    attach_to_function, build_c, executable_mappings, register_process_with, scratch_dir,
    tracer_or_skip, Figure, Target,
};
use libbpf_rs::Link;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mode {
    NoProbe,
    CountOnly,
    /// Counting at malloc's entry and return.
    CountReturn,
    /// Counting at malloc's entry and return and free's entry.
    CountPair,
    Unwind,
}

struct Bench {
    tracer: Tracer,
    tables: HashMap<PathBuf, TableId>,
    binary: PathBuf,
    events: u64,
}

impl Bench {
    /// Runs the storm once; returns the loop's ns per malloc, the probe's BPF
    /// run time per event (0 without a probe) and, when unwinding, the frames
    /// of the malloc stack.
    fn run(&mut self, mode: Mode, depth: usize) -> (f64, f64, Option<usize>) {
        let target = Target::spawn(&self.binary, &[self.events.to_string(), depth.to_string()]);
        let pid = target.pid();
        let libc = libc_path(pid);
        register_process_with(&mut self.tracer, &mut self.tables, pid, |_| false);
        let before = self.tracer.program_stats().expect("program stats");
        let count = self.tracer.program(EventProgram::UprobeCount);
        let mut links: Vec<Link> = Vec::new();
        match mode {
            Mode::NoProbe => {}
            Mode::CountOnly | Mode::CountReturn | Mode::CountPair => {
                links.push(attach_to_function(count, pid, &libc, "malloc", false, 1));
                if mode != Mode::CountOnly {
                    links.push(attach_to_function(count, pid, &libc, "malloc", true, 1));
                }
                if mode == Mode::CountPair {
                    links.push(attach_past_null_test(count, pid, &libc, "free"));
                }
            }
            Mode::Unwind => links.push(attach_to_function(
                self.tracer.program(EventProgram::Uprobe),
                pid,
                &libc,
                "malloc",
                false,
                1,
            )),
        };
        let output = target.run_to_end();
        drop(links);
        let after = self.tracer.program_stats().expect("program stats");
        let bpf_ns = match mode {
            Mode::NoProbe => 0.0,
            Mode::CountOnly | Mode::CountReturn | Mode::CountPair => {
                bpf_ns_per_run(&before, &after, "on_uprobe_count")
            }
            Mode::Unwind => bpf_ns_per_run(&before, &after, "on_uprobe"),
        };
        let elapsed_ns: f64 = output.trim().parse().expect("fixture prints its loop time");
        let frames = (mode == Mode::Unwind)
            .then(|| self.storm_frames(pid))
            .flatten();
        self.tracer.remove_process(pid).expect("remove process");
        (elapsed_ns / self.events as f64, bpf_ns, frames)
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
            stack.end,
            WalkEnd::Complete,
            "the storm's stack must be complete"
        );
        Some(stack.pcs.len())
    }
}

/// BPF run time per run of `program` between two readings of the statistics.
fn bpf_ns_per_run(
    before: &HashMap<&str, ProgramStats>,
    after: &HashMap<&str, ProgramStats>,
    program: &str,
) -> f64 {
    let (a, b) = (after[program], before[program]);
    (a.run_time_ns - b.run_time_ns) as f64 / (a.run_count - b.run_count).max(1) as f64
}

/// Attaches `program` to `function` of `binary` past its leading `test %rdi,%rdi; je`
/// (as `cargo trace alloc` probes free; glibc's free starts so), else at its entry.
fn attach_past_null_test(
    program: &libbpf_rs::ProgramMut<'_>,
    pid: u32,
    binary: &std::path::Path,
    function: &str,
) -> Link {
    use object::{Object, ObjectSection, ObjectSymbol};

    let data = std::fs::read(binary).expect("read the library");
    let file = object::File::parse(&*data).expect("parse the library");
    let symbol = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok(function))
        .expect("the library exports the function");
    let section = file
        .section_by_index(symbol.section_index().expect("a defined symbol"))
        .expect("its section");
    let start = (symbol.address() - section.address()) as usize;
    let code = &section.data().expect("section data")[start..start + 9];
    let skip = match code {
        [0x48, 0x85, 0xff, 0x74, ..] => 5,
        [0x48, 0x85, 0xff, 0x0f, 0x84, ..] => 9,
        _ => 0,
    };
    program
        .attach_uprobe_with_opts(
            pid as i32,
            binary,
            skip,
            libbpf_rs::UprobeOpts {
                cookie: 1,
                func_name: Some(function.to_string()),
                ..libbpf_rs::UprobeOpts::default()
            },
        )
        .unwrap_or_else(|e| panic!("attach to {function}+{skip}: {e}"))
}

fn libc_path(pid: u32) -> PathBuf {
    executable_mappings(pid)
        .into_iter()
        .map(|m| m.path)
        .find(|path| path.to_string_lossy().contains("libc.so"))
        .expect("the fixture maps libc")
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
    // Rounds are interleaved (no probe, counting, unwinding; both depths) so
    // that load from other tenants of the machine falls on all alike; the
    // minimum over rounds is the figure least disturbed by it.
    let rounds = 7;
    let depths = [10usize, 110];
    let mut samples: HashMap<(usize, Mode), Vec<(f64, f64)>> = HashMap::new();
    let mut frames: HashMap<usize, usize> = HashMap::new();
    for _ in 0..rounds {
        for depth in depths {
            for mode in [
                Mode::NoProbe,
                Mode::CountOnly,
                Mode::CountReturn,
                Mode::CountPair,
                Mode::Unwind,
            ] {
                let (ns, bpf_ns, stack_frames) = bench.run(mode, depth);
                samples.entry((depth, mode)).or_default().push((ns, bpf_ns));
                if let Some(stack_frames) = stack_frames {
                    frames.insert(depth, stack_frames);
                }
            }
        }
    }
    drop(stats);
    let figure = |depth: usize, mode: Mode, pick: fn((f64, f64)) -> f64| {
        let values: Vec<f64> = samples[&(depth, mode)].iter().map(|s| pick(*s)).collect();
        Figure::of(values)
    };
    for depth in depths {
        let frames = frames.get(&depth).copied().unwrap_or(0);
        let base = figure(depth, Mode::NoProbe, |s| s.0);
        let count_only = figure(depth, Mode::CountOnly, |s| s.0);
        let unwind = figure(depth, Mode::Unwind, |s| s.0);
        let bpf_count = figure(depth, Mode::CountOnly, |s| s.1);
        let bpf_unwind = figure(depth, Mode::Unwind, |s| s.1);
        println!("\nchain depth {depth} ({frames} frames per stack), median [minimum] of {rounds} rounds:");
        println!(
            "  loop without probe        {:8.1} ns per malloc (baseline)",
            base.median
        );
        println!(
            "  uprobe, count only        {:8.1} ns per malloc  (+{:.3} µs per event; BPF {:.0} [{:.0}] ns)",
            count_only.median,
            (count_only.median - base.median) / 1e3,
            bpf_count.median,
            bpf_count.min,
        );
        for (mode, name) in [
            (Mode::CountReturn, "malloc entry+return, count"),
            (Mode::CountPair, "  + free entry (a pair)"),
        ] {
            let way = figure(depth, mode, |s| s.0);
            println!(
                "  {name:<26}{:8.1} ns per malloc  (+{:.3} µs per pair: the kernel's floor)",
                way.median,
                (way.median - base.median) / 1e3,
            );
        }
        println!(
            "  uprobe, full unwinding    {:8.1} ns per malloc  (+{:.3} µs per event; BPF {:.0} [{:.0}] ns)",
            unwind.median,
            (unwind.median - base.median) / 1e3,
            bpf_unwind.median,
            bpf_unwind.min,
        );
        println!(
            "  unwinding vs counting:    x{:.2} added cost; BPF walk {:.1} ns per frame ({:.0} ns over {frames} frames)",
            (unwind.median - base.median) / (count_only.median - base.median),
            (bpf_unwind.median - bpf_count.median) / frames.max(1) as f64,
            bpf_unwind.median - bpf_count.median,
        );
    }
    let (short, long) = (depths[0], depths[1]);
    let (short_frames, long_frames) = (frames[&short], frames[&long]);
    let short_bpf = figure(short, Mode::Unwind, |s| s.1);
    let long_bpf = figure(long, Mode::Unwind, |s| s.1);
    let per_frame = |short_ns: f64, long_ns: f64| {
        (long_ns - short_ns) / (long_frames - short_frames).max(1) as f64
    };
    println!(
        "\nmarginal BPF cost of a frame: {:.1} ns median, {:.1} ns minimum ({short_frames} -> {long_frames} frames: {:.0} -> {:.0} ns median, {:.0} -> {:.0} ns minimum)",
        per_frame(short_bpf.median, long_bpf.median),
        per_frame(short_bpf.min, long_bpf.min),
        short_bpf.median,
        long_bpf.median,
        short_bpf.min,
        long_bpf.min,
    );
}
