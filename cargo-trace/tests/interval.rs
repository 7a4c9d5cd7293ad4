//! `interval:*`: one timer on one CPU that counts N firings a period for the target
//! while it lives, whatever CPU the target runs on.

mod common;

use cargo_trace_tests::fixtures;
use common::{bpf_available, trace, Run};

/// The timer's CPU: the first online one (as bpftrace, and `probes::attach_interval`).
fn first_online_cpu() -> u32 {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online CPUs");
    online
        .trim()
        .split([',', '-'])
        .next()
        .and_then(|cpu| cpu.parse().ok())
        .unwrap_or_else(|| panic!("bad CPU list {online:?}"))
}

/// Another online CPU than `cpu`, if the machine has one.
fn other_cpu(cpu: u32) -> Option<u32> {
    let count = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    (0..count.max(2)).find(|&other| {
        other != cpu
            && std::path::Path::new(&format!("/sys/devices/system/cpu/cpu{other}")).exists()
    })
}

/// The T of the summary's `... in T s`.
fn traced_seconds(run: &Run) -> f64 {
    let line = run
        .stderr
        .lines()
        .find(|line| line.contains(" events, "))
        .unwrap_or_else(|| panic!("no summary line in:\n{}", run.stderr));
    line.split(" in ")
        .nth(1)
        .and_then(|rest| rest.split(" s").next())
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {line:?}"))
}

#[test]
fn interval_counts_the_target_on_another_cpu_than_the_timer() {
    if !bpf_available("interval on another CPU") {
        return;
    }
    let timer_cpu = first_online_cpu();
    let Some(target_cpu) = other_cpu(timer_cpu) else {
        eprintln!("skipping interval on another CPU: the machine has one CPU");
        return;
    };
    let path = fixtures::rust_fixture("cpu_split");
    // taskset execs the fixture in place: the target runs on target_cpu only.
    let command = format!("taskset -c {target_cpu} {} 1", path.display());
    let run = trace("interval", &["interval:ms:20"], &command, &[]);
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let firings = run.summary_events() as f64;
    // The timer runs from the attach, which a loaded machine can leave a second and
    // more before the target is let run, to the detach, but counts only from the
    // target's start to the end of tracing: T's span.
    let expected = traced_seconds(&run) / 0.020;
    eprintln!("{firings} firings, {expected:.1} periods of 20 ms while the target lived");
    assert!(
        (firings - expected).abs() <= 0.15 * expected + 3.0,
        "{firings} firings of interval:ms:20 in {expected:.1} periods"
    );
    assert_eq!(run.folded().total() as f64, firings);
    // Off the timer's CPU the target has no stack to show: its firings say so.
    let folded = run.folded();
    assert!(
        folded.count_with("[not on the interval timer's CPU]") as f64 >= 0.9 * firings,
        "firings while the target ran elsewhere are not named: {:?}",
        folded.stacks
    );
}

#[test]
fn interval_walks_the_target_on_the_timers_cpu() {
    if !bpf_available("interval on the timer's CPU") {
        return;
    }
    let timer_cpu = first_online_cpu();
    let path = fixtures::rust_fixture("cpu_split");
    let command = format!("taskset -c {timer_cpu} {} 1", path.display());
    let run = trace("interval-same-cpu", &["interval:ms:20"], &command, &[]);
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let firings = run.summary_events() as f64;
    let expected = traced_seconds(&run) / 0.020;
    assert!(
        (firings - expected).abs() <= 0.15 * expected + 3.0,
        "{firings} firings of interval:ms:20 in {expected:.1} periods"
    );
    let folded = run.folded();
    let with_main = folded.count_with("cpu_split::main");
    assert!(
        with_main > 0,
        "no firing walked the target's stack: {:?}",
        folded.stacks
    );
    for (frames, _) in &folded.stacks {
        if frames.iter().any(|f| f == "cpu_split::main") {
            assert_eq!(
                frames[0], "_start",
                "stack does not reach _start: {frames:?}"
            );
        }
    }
}
