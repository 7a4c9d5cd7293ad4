//! Perf samples and tracepoints: user stacks taken from `bpf_task_pt_regs`
//! when the event fires in kernel mode, kernel stacks, the pid filter, and the
//! interval timer's span.
//!
//! Needs root (CAP_BPF, CAP_PERFMON) and gcc; without BPF each test prints
//! why it is skipped.

mod common;

use std::os::raw::c_int;
use std::time::{Duration, Instant};

use bpf_prog::{EventProgram, Loss, Options, StackRef, Tracer, WalkEnd};
use common::{
    assert_complete, chain_below, chain_fixture, register_process, serial, tracer_or_skip, Symbols,
    Target,
};
use libbpf_rs::{PerfEventOpts, TracepointCategory, TracepointOpts};
use perf_event_open_sys as perf;

const PROBE_ID: u32 = 11;

fn options() -> Options {
    Options {
        max_rows: 1 << 20,
        ..Options::default()
    }
}

/// A cpu-clock sampling event on thread `pid`. The fd goes to the link
/// that attaches a program to it: libbpf closes it when the link is dropped.
fn cpu_clock(pid: u32, frequency: u64) -> c_int {
    let mut attr = perf::bindings::perf_event_attr {
        type_: perf::bindings::PERF_TYPE_SOFTWARE,
        size: size_of::<perf::bindings::perf_event_attr>() as u32,
        config: perf::bindings::PERF_COUNT_SW_CPU_CLOCK.into(),
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_freq = frequency;
    attr.set_freq(1);
    // SAFETY: `attr` is a valid, fully initialized perf_event_attr whose
    // `size` says so; the call only reads it.
    let fd = unsafe { perf::perf_event_open(&mut attr, pid as c_int, -1, -1, 0) };
    assert!(
        fd >= 0,
        "perf_event_open: {}",
        std::io::Error::last_os_error()
    );
    fd
}

/// A cpu-clock timer on `cpu` that fires every `period_ns` whatever runs there, as
/// `interval` probes are.
fn cpu_clock_timer(cpu: c_int, period_ns: u64) -> c_int {
    let mut attr = perf::bindings::perf_event_attr {
        type_: perf::bindings::PERF_TYPE_SOFTWARE,
        size: size_of::<perf::bindings::perf_event_attr>() as u32,
        config: perf::bindings::PERF_COUNT_SW_CPU_CLOCK.into(),
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = period_ns;
    // SAFETY: `attr` is a valid, fully initialized perf_event_attr whose
    // `size` says so; the call only reads it.
    let fd = unsafe { perf::perf_event_open(&mut attr, -1, cpu, -1, 0) };
    assert!(
        fd >= 0,
        "perf_event_open: {}",
        std::io::Error::last_os_error()
    );
    fd
}

#[test]
fn cpu_clock_samples_walk_user_stacks_in_both_modes() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("cpu_clock_samples_walk_user_stacks", &options()) else {
        return;
    };
    let binary = chain_fixture();
    let target = Target::spawn(&binary, &["1000000".to_string(), "6".to_string()]);
    let pid = target.pid();
    let mappings = register_process(&mut tracer, pid, |_| false);
    tracer.filter_pid(pid).unwrap();
    let event = cpu_clock(pid, 2000);
    let _link = tracer
        .program(EventProgram::PerfEvent)
        .attach_perf_event_with_opts(
            event,
            PerfEventOpts {
                cookie: PROBE_ID.into(),
                ..PerfEventOpts::default()
            },
        )
        .expect("attach perf event");
    target.run_to_end();

    let counts = tracer.counts().unwrap();
    assert!(
        counts.iter().all(|(key, _)| key.pid == pid),
        "pid filter let others in"
    );
    let mut symbols = Symbols::default();
    let (mut total, mut complete, mut in_kernel) = (0u64, 0u64, 0u64);
    for (key, count) in &counts {
        assert_eq!(key.probe_id, PROBE_ID);
        total += count.events;
        if let Some(id) = key.kernel_stack {
            in_kernel += count.events;
            assert!(
                !tracer.kernel_stack(id).unwrap().is_empty(),
                "empty kernel stack"
            );
        }
        let StackRef::Hash(hash) = key.stack else {
            panic!("sample without a stored user stack: {key:?}");
        };
        let stack = tracer.stack(hash).unwrap().expect("stored");
        let names = symbols.frames(&mappings, &stack.pcs);
        if stack.end == WalkEnd::Complete {
            complete += count.events;
            assert_eq!(
                names.last().map(String::as_str),
                Some("_start"),
                "{names:?}"
            );
            // Through main, or through exit() once main has returned.
            assert!(
                names.iter().any(|name| name == "main" || name == "exit"),
                "{names:?}"
            );
        } else {
            eprintln!("{} partial: {} {names:?}", count.events, stack.end);
        }
    }
    eprintln!("{total} samples, {complete} complete, {in_kernel} in kernel mode");
    assert!(total >= 50, "too few samples: {total}");
    assert!(
        in_kernel > 0,
        "no sample in kernel mode: the bpf_task_pt_regs path is untested"
    );
    assert!(in_kernel < total, "no sample in user mode");
    // Lazy binding's first call runs ld.so code whose CFI is marked
    // unsupported; nothing else may stop a walk.
    assert!(
        complete * 100 >= total * 99,
        "{complete} of {total} complete"
    );
}

#[test]
fn syscall_tracepoint_walks_from_the_saved_user_registers() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("syscall_tracepoint_walks", &options()) else {
        return;
    };
    let binary = chain_fixture();
    let depth = 4;
    let calls = 500;
    let target = Target::spawn(&binary, &[calls.to_string(), depth.to_string()]);
    let pid = target.pid();
    let mappings = register_process(&mut tracer, pid, |_| false);
    tracer.filter_pid(pid).unwrap();
    let _link = tracer
        .program(EventProgram::Tracepoint)
        .attach_tracepoint_with_opts(
            TracepointCategory::Syscalls,
            "sys_enter_getppid",
            TracepointOpts {
                cookie: PROBE_ID.into(),
                ..TracepointOpts::default()
            },
        )
        .expect("attach tracepoint");
    target.run_to_end();

    let counts = tracer.counts().unwrap();
    assert_eq!(
        counts.len(),
        1,
        "one (stack, kernel stack) pair: {counts:?}"
    );
    let (key, count) = counts[0];
    assert_eq!(
        (key.pid, key.probe_id, count.events),
        (pid, PROBE_ID, calls as u64)
    );
    let kernel = tracer
        .kernel_stack(key.kernel_stack.expect("kernel stack"))
        .unwrap();
    assert!(!kernel.is_empty());
    let StackRef::Hash(hash) = key.stack else {
        panic!("no user stack: {key:?}");
    };
    let stack = tracer.stack(hash).unwrap().expect("stored");
    // Frame 0 is in libc's syscall(), just after the syscall instruction.
    let names = Symbols::default().frames(&mappings, &stack.pcs);
    assert_eq!(names[0], "syscall", "{names:?}");
    let mut expected = vec!["syscall".to_string()];
    expected.extend(chain_below("leaf", depth));
    assert_complete(&stack, &mappings, &expected, &binary);
}

#[test]
fn pid_filter_keeps_other_processes_out() {
    let _serial = serial();
    let Some(tracer) = tracer_or_skip("pid_filter_keeps_other_processes_out", &options()) else {
        return;
    };
    let binary = chain_fixture();
    let target = Target::spawn(&binary, &["200".to_string(), "1".to_string()]);
    let pid = target.pid();
    // Filtered in, then out again: nothing may be counted.
    tracer.filter_pid(pid).unwrap();
    tracer.unfilter_pid(pid).unwrap();
    let _link = tracer
        .program(EventProgram::Tracepoint)
        .attach_tracepoint_with_opts(
            TracepointCategory::Syscalls,
            "sys_enter_getppid",
            TracepointOpts {
                cookie: PROBE_ID.into(),
                ..TracepointOpts::default()
            },
        )
        .expect("attach tracepoint");
    target.run_to_end();
    assert!(tracer.counts().unwrap().is_empty());
    assert_eq!(tracer.walk_ends().unwrap().total(), 0);
    assert_eq!(tracer.losses().unwrap(), [0; Loss::COUNT]);
}

/// A process that never ends by itself, killed when the test is done or fails.
struct Spinner(std::process::Child);

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The interval program counts only while a target is set: the session sets it as the
/// target is let run and clears it as tracing ends, while the timer runs from the attach,
/// with the target held at its entry, to the detach. A firing outside that span would
/// be counted against a duration that leaves it out, a traced process's on the timer's
/// CPU as much as the target's elsewhere.
#[test]
fn interval_counts_only_while_a_target_is_set() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("interval_counts_only_while_a_target_is_set", &options())
    else {
        return;
    };
    const TIMER_CPU: c_int = 0;
    // A traced process that runs on the timer's CPU: its firings are samples.
    let cpu = TIMER_CPU.to_string();
    let spinner = Spinner(
        std::process::Command::new("taskset")
            .args(["-c", &cpu, "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("run taskset"),
    );
    let traced = spinner.0.id();
    tracer.filter_pid(traced).unwrap();
    let firings = |tracer: &Tracer| -> u64 {
        let counts = tracer.counts().unwrap();
        counts.iter().map(|(_, count)| count.events).sum()
    };
    let period = Duration::from_millis(1);
    let span = Duration::from_millis(100);
    let _link = tracer
        .program(EventProgram::Interval)
        .attach_perf_event_with_opts(
            cpu_clock_timer(TIMER_CPU, period.as_nanos() as u64),
            PerfEventOpts {
                cookie: PROBE_ID.into(),
                ..PerfEventOpts::default()
            },
        )
        .expect("attach the interval timer");
    std::thread::sleep(span);
    let before = firings(&tracer);

    let target = std::process::id();
    let started = Instant::now();
    tracer.set_interval_target(Some(target));
    std::thread::sleep(span);
    tracer.set_interval_target(None);
    let periods = started.elapsed().as_secs_f64() / period.as_secs_f64();
    // A firing that read the target just before it was cleared lands within microseconds.
    std::thread::sleep(Duration::from_millis(5));
    let during = firings(&tracer);
    let counts = tracer.counts().unwrap();
    let elsewhere = tracer.losses().unwrap()[Loss::TargetElsewhere as usize];
    std::thread::sleep(span);
    let after = firings(&tracer);
    drop(spinner);

    assert_eq!(before, 0, "counted before a target was set");
    assert!(
        during > 0 && during as f64 <= periods + 2.0,
        "{during} firings in {periods:.1} periods of the timer"
    );
    assert!(
        counts
            .iter()
            .all(|(key, _)| key.pid == traced || (key.pid == target && key.stack == StackRef::None)),
        "firings counted for another process, or with stacks for the target: {counts:?}"
    );
    let samples: u64 = counts
        .iter()
        .filter(|(key, _)| key.pid == traced)
        .map(|(_, count)| count.events)
        .sum();
    assert!(
        samples > 0,
        "no firing while the traced process ran on the timer's CPU"
    );
    assert_eq!(elsewhere, during - samples);
    assert_eq!(after, during, "counted after the target was cleared");
}
