//! `cargo trace offcpu`: each stack weighed by the nanoseconds its thread spent off the
//! CPU, checked against what the `offcpu` fixture measured of its own blocking (a
//! sleep, a pipe read, a contended mutex, each in a function of its own).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use cargo_trace_tests::expected::{self, Blocked};
use cargo_trace_tests::fixtures;
use common::{bpf_available, quoted, trace, Folded, Run};

/// How far the traced time off the CPU of a function may be from the fixture's own
/// measure of it.
const TOLERANCE: f64 = 0.05;
/// The fixture's functions that block, each with the time it measured.
const FUNCTIONS: [&str; 3] = [
    "offcpu::sleep_here",
    "offcpu::read_pipe_here",
    "offcpu::wait_mutex_here",
];

/// The kernel function each of them waits in. The comparison takes the stays off the CPU
/// in that wait: the fixture times its blocking calls only, and a preemption of its own
/// code between two calls (a loaded machine's, tens of milliseconds now and then) is off
/// the CPU in the function too, but outside the fixture's measure.
const WAITS: [&[&str]; 3] = [
    &["do_nanosleep"],
    &["anon_pipe_read", "pipe_read"],
    &["futex_wait"],
];

/// Whether a stack (folded frames, kernel ones suffixed `_[k]`, or JSON function names)
/// is a stay of blocking function `index` in its wait.
fn waits_in(frames: &[String], index: usize) -> bool {
    frames.iter().any(|f| f == FUNCTIONS[index])
        && frames
            .iter()
            .any(|f| WAITS[index].contains(&f.trim_end_matches("_[k]")))
}

fn measured(blocked: Blocked) -> [f64; 3] {
    [blocked.sleep, blocked.pipe, blocked.mutex]
}

/// Every stack through one of the blocking functions is whole: from `_start` through
/// `offcpu::main` to the kernel's scheduler (`schedule` when it blocked,
/// `preempt_schedule_irq` when it was preempted running its own code, both through
/// `__schedule`).
fn assert_complete_stacks(folded: &Folded) {
    for (frames, _) in &folded.stacks {
        if !FUNCTIONS
            .iter()
            .any(|f| frames.iter().any(|frame| frame == f))
        {
            continue;
        }
        assert!(
            !frames.iter().any(|f| f.starts_with("[truncated")),
            "truncated stack: {frames:?}"
        );
        let user: Vec<&String> = frames.iter().filter(|f| !f.ends_with("_[k]")).collect();
        assert_eq!(user[0], "_start", "stack does not reach _start: {frames:?}");
        assert!(
            frames.iter().any(|f| f == "offcpu::main"),
            "stack does not reach main: {frames:?}"
        );
        assert!(
            frames
                .iter()
                .any(|f| f.contains("schedule") && f.ends_with("_[k]")),
            "no scheduler frame in the kernel stack: {frames:?}"
        );
    }
}

/// Each function's traced off-CPU nanoseconds in its wait (`weight_of` the function's
/// index) against the fixture's seconds.
fn assert_matches_fixture(weight_of: impl Fn(usize) -> u64, blocked: Blocked) {
    for (index, (function, seconds)) in FUNCTIONS.iter().zip(measured(blocked)).enumerate() {
        let traced = weight_of(index) as f64 / 1e9;
        let ratio = traced / seconds;
        eprintln!("{function}: traced {traced:.6} s off the CPU, measured {seconds:.6} s: ratio {ratio:.4}");
        assert!(
            (ratio - 1.0).abs() <= TOLERANCE,
            "{function}: traced {traced:.6} s off the CPU, the fixture measured {seconds:.6} s"
        );
    }
}

/// Only the walks through the fixture's functions must be complete: a new thread
/// switched out on its way out of `clone3`, before its first instruction, has the
/// return point of `clone3` and a fresh stack that holds no frame (a walk that ends
/// early, seen now and then on a loaded machine), and a shell's children may start
/// walks in ld.so before their libraries are registered.
fn check_off_cpu_run(run: &Run) {
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let blocked = expected::parse_offcpu(&run.stdout).expect("blocked line");
    let folded = run.folded();
    assert_matches_fixture(
        |index| {
            folded
                .stacks
                .iter()
                .filter(|(frames, _)| waits_in(frames, index))
                .map(|(_, count)| count)
                .sum()
        },
        blocked,
    );
    assert_complete_stacks(&folded);
    let svg = std::fs::read_to_string(&run.svg).expect("svg written");
    assert!(svg.contains(" ns, "), "the flamegraph does not count in ns");
}

#[test]
fn off_cpu_time_of_each_blocking_function_is_what_it_measured() {
    if !bpf_available("offcpu") {
        return;
    }
    let path = fixtures::rust_fixture("offcpu");
    let run = trace("offcpu", &["offcpu"], &quoted(&path), &[]);
    check_off_cpu_run(&run);
}

#[test]
fn off_cpu_time_of_a_child_process_is_what_it_measured() {
    if !bpf_available("offcpu child") {
        return;
    }
    let path = fixtures::rust_fixture("offcpu");
    // The shell forks the fixture (`; true` keeps it from exec'ing in place).
    let command = format!("sh -c '{}; true'", path.display());
    let run = trace("offcpu-child", &["offcpu"], &command, &[]);
    check_off_cpu_run(&run);
}

#[test]
fn min_block_leaves_out_shorter_stays_off_the_cpu() {
    if !bpf_available("offcpu min block") {
        return;
    }
    let path = fixtures::rust_fixture("offcpu");
    // The fixture blocks about 10 ms at a time (longer only when the machine is busy):
    // with a 50 ms threshold every stay counted is at least that long, so no sample
    // weighs less than 50 ms a block, and most of the fixture's 60 stays are left out.
    let long = trace(
        "offcpu-min-block",
        &["offcpu"],
        &quoted(&path),
        &["--min-block", "50ms", "--json", "out.json"],
    );
    assert!(long.status.success(), "cargo-trace failed: {}", long.stderr);
    let text = std::fs::read_to_string(long.scratch.path("out.json")).expect("json written");
    let profile: serde_json::Value = serde_json::from_str(&text).expect("json parses");
    let [off_cpu, blocks] = ["off-cpu", "blocks"].map(|kind| value_index(&profile, kind));
    let mut counted = 0;
    for sample in profile["samples"].as_array().unwrap() {
        let ns = sample["values"][off_cpu].as_i64().unwrap();
        let stays = sample["values"][blocks].as_i64().unwrap();
        assert!(
            ns >= stays * 50_000_000,
            "{stays} stays of {ns} ns in all counted with --min-block 50ms"
        );
        counted += stays;
    }
    assert!(
        counted < 30,
        "{counted} stays of 50 ms or more where the fixture blocks 60 times for 10 ms"
    );
    let short = trace(
        "offcpu-min-block",
        &["offcpu"],
        &quoted(&path),
        &["--min-block", "5000"],
    );
    check_off_cpu_run(&short);
}

/// With room for one thread off the CPU: the sleeps, when the fixture has one thread,
/// are all counted; when its main thread and feeder thread are both off the CPU, the
/// stays that found no room are counted as lost, in the summary.
#[test]
fn a_full_off_cpu_map_says_so_and_counts_what_fit() {
    if !bpf_available("offcpu map full") {
        return;
    }
    let path = fixtures::rust_fixture("offcpu");
    let run = trace(
        "offcpu-full",
        &["offcpu"],
        &quoted(&path),
        &["--max-off-cpu-threads", "1"],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let lost = bpf_prog::Loss::OffCpuFull.name();
    assert!(
        run.stderr.contains(&format!("{lost} ")),
        "no '{lost}' in the summary: {}",
        run.stderr
    );
    let blocked = expected::parse_offcpu(&run.stdout).expect("blocked line");
    let folded = run.folded();
    let in_sleep: u64 = folded
        .stacks
        .iter()
        .filter(|(frames, _)| waits_in(frames, 0))
        .map(|(_, count)| count)
        .sum();
    let traced = in_sleep as f64 / 1e9;
    let ratio = traced / blocked.sleep;
    assert!(
        (ratio - 1.0).abs() <= TOLERANCE,
        "sleep_here: traced {traced:.6} s, measured {:.6} s: {}",
        blocked.sleep,
        run.stderr
    );
}

#[test]
fn off_cpu_attaches_to_a_running_process() {
    if !bpf_available("offcpu -p") {
        return;
    }
    let path = fixtures::rust_fixture("offcpu");
    // 400 sleeps of 10 ms first: the session starts (BPF load, tables: a second or
    // more on a loaded machine) and stops within them.
    let mut child = Command::new(&path)
        .args(["400", "10"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start the fixture");
    std::thread::sleep(Duration::from_millis(100));
    let scratch = common::Scratch::new("offcpu-pid");
    let folded_path = scratch.path("out.folded");
    let output = Command::new(common::binary())
        .arg("offcpu")
        .args(["-p", &child.id().to_string(), "-d", "0.4", "--no-svg"])
        .arg("--folded")
        .arg(&folded_path)
        .current_dir(scratch.dir())
        .output()
        .expect("run cargo-trace");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let _ = child.kill();
    let _ = child.wait();
    assert!(output.status.success(), "cargo-trace failed: {stderr}");
    let folded = Folded::read(&folded_path);
    assert!(
        folded.count_with("offcpu::sleep_here") > 0,
        "no time off the CPU in sleep_here: {stderr}"
    );
    assert_complete_stacks(&folded);
}

/// Index of the value type named `kind` in a JSON profile.
fn value_index(profile: &serde_json::Value, kind: &str) -> usize {
    profile["value_types"]
        .as_array()
        .expect("value_types")
        .iter()
        .position(|t| t["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} value in {}", profile["value_types"]))
}

#[test]
fn profile_and_off_cpu_in_one_run_keep_their_weights_apart() {
    if !bpf_available("profile and offcpu") {
        return;
    }
    let offcpu = fixtures::rust_fixture("offcpu");
    let cpu_split = fixtures::rust_fixture("cpu_split");
    let command = format!("sh -c '{} 0.3; {}'", cpu_split.display(), offcpu.display());
    let run = trace(
        "offcpu-profile",
        &["profile:hz:999", "offcpu"],
        &command,
        &["--json", "out.json"],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let text = std::fs::read_to_string(run.scratch.path("out.json")).expect("json written");
    let profile: serde_json::Value = serde_json::from_str(&text).expect("json parses");
    let [time, cpu, off_cpu, samples, blocks] =
        ["time", "cpu", "off-cpu", "samples", "blocks"].map(|kind| value_index(&profile, kind));
    let value =
        |sample: &serde_json::Value, index: usize| sample["values"][index].as_i64().unwrap();
    let functions_of = |sample: &serde_json::Value| -> Vec<String> {
        sample["stack"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|id| {
                profile["locations"][id.as_u64().unwrap() as usize]["frames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|frame| frame["function"].as_str().unwrap().to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut off_cpu_of = [0u64; 3];
    let (mut profile_samples, mut off_cpu_blocks) = (0, 0);
    for sample in profile["samples"].as_array().unwrap() {
        match sample["probe"].as_u64().unwrap() {
            0 => {
                assert!(value(sample, samples) > 0 && value(sample, cpu) > 0);
                assert_eq!(value(sample, off_cpu), 0, "a profile sample off the CPU");
                assert_eq!(
                    value(sample, blocks),
                    0,
                    "a profile sample counted as a block"
                );
                assert_eq!(value(sample, time), value(sample, cpu));
                profile_samples += value(sample, samples);
            }
            1 => {
                assert!(value(sample, blocks) > 0);
                assert_eq!(value(sample, samples), 0, "a block counted as a sample");
                assert_eq!(value(sample, cpu), 0, "a block weighed as CPU time");
                assert_eq!(value(sample, time), value(sample, off_cpu));
                off_cpu_blocks += value(sample, blocks);
                let functions = functions_of(sample);
                for (index, total) in off_cpu_of.iter_mut().enumerate() {
                    if waits_in(&functions, index) {
                        *total += value(sample, off_cpu) as u64;
                    }
                }
            }
            probe => panic!("sample of probe {probe}"),
        }
    }
    // 0.3 s of CPU at 999 Hz.
    assert!(
        profile_samples >= 150,
        "only {profile_samples} profile samples"
    );
    assert!(off_cpu_blocks >= 60, "only {off_cpu_blocks} blocks");
    let blocked = expected::parse_offcpu(&run.stdout).expect("blocked line");
    assert_matches_fixture(|index| off_cpu_of[index], blocked);
}
