//! Attaching real BPF programs through the public API. Needs root (or CAP_BPF and
//! CAP_PERFMON) and clang to build the programs; CI has both. A test that cannot run
//! says why on stderr.

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use libbpf_rs::{MapCore, MapFlags, Object, ObjectBuilder, ProgramMut};
use probes::{
    attach_kprobe, attach_perf_event_per_cpu, attach_probe, attach_profile, attach_raw_tracepoint,
    attach_tracepoint, attach_uprobe, kprobe_support, parse, resolve_uprobe, AttachError, Error,
    HardwareEvent, PerfEventKind, ProbeSpec, Rate, Sampling,
};

/// One counter pair per program kind, in one global so it sits at offset 0 of .bss.
/// No headers: helper ids are the kernel's stable numbers.
const PROGRAM: &str = r#"
typedef unsigned long long u64;
#define SEC(name) __attribute__((section(name), used))
static u64 (*bpf_get_attach_cookie)(void *ctx) = (void *)174;

struct counter { u64 hits; u64 cookie; };
struct counters {
    struct counter uprobe, uretprobe, perf, tracepoint, raw_tp, kprobe;
} counters = {};

#define COUNT(which) \
    __sync_fetch_and_add(&counters.which.hits, 1); \
    counters.which.cookie = bpf_get_attach_cookie(ctx); \
    return 0;

SEC("uprobe") int on_uprobe(void *ctx) { COUNT(uprobe) }
SEC("uretprobe") int on_uretprobe(void *ctx) { COUNT(uretprobe) }
SEC("perf_event") int on_perf(void *ctx) { COUNT(perf) }
SEC("tracepoint") int on_tracepoint(void *ctx) { COUNT(tracepoint) }
SEC("raw_tp") int on_raw_tp(void *ctx) { COUNT(raw_tp) }
SEC("kprobe") int on_kprobe(void *ctx) { COUNT(kprobe) }
char LICENSE[] SEC("license") = "GPL";
"#;

const KINDS: [&str; 6] = [
    "uprobe",
    "uretprobe",
    "perf",
    "tracepoint",
    "raw_tp",
    "kprobe",
];

struct Loaded {
    object: Object,
    _dir: tempfile::TempDir,
}

/// Builds and loads the program object, or says why it cannot and returns `None`.
fn load(test: &str) -> Option<Loaded> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("probes-attach-{test}-"))
        .tempdir()
        .unwrap();
    let source = dir.path().join("prog.bpf.c");
    let object = dir.path().join("prog.bpf.o");
    fs::write(&source, PROGRAM).unwrap();
    // The compilers bpf-prog's build looks for, in its order.
    let compilers = std::env::var("BPF_CLANG")
        .into_iter()
        .chain(["clang".to_string()])
        .chain((14..=19).rev().map(|v| format!("clang-{v}")));
    let output = compilers
        .filter_map(|clang| {
            Command::new(clang)
                .args(["-O2", "-g", "-target", "bpf", "-c"])
                .arg(&source)
                .arg("-o")
                .arg(&object)
                .output()
                .ok()
        })
        .next();
    let Some(output) = output else {
        eprintln!("SKIP {test}: clang is needed to build the test BPF program (see .ci/setup.sh)");
        return None;
    };
    assert!(
        output.status.success(),
        "clang failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let open = ObjectBuilder::default().open_file(&object).unwrap();
    match open.load() {
        Ok(object) => Some(Loaded { object, _dir: dir }),
        Err(e) if e.kind() == libbpf_rs::ErrorKind::PermissionDenied => {
            eprintln!(
                "SKIP {test}: loading BPF programs is not permitted here ({e:#}); run as root"
            );
            None
        }
        Err(e) => panic!("loading the test BPF program failed: {e:#}"),
    }
}

impl Loaded {
    fn prog(&self, name: &str) -> ProgramMut<'_> {
        self.object
            .progs_mut()
            .find(|p| p.name() == name)
            .unwrap_or_else(|| panic!("no program {name}"))
    }

    /// (hits, last cookie) of a program kind.
    fn counter(&self, kind: &str) -> (u64, u64) {
        let bss = self
            .object
            .maps()
            .find(|m| m.name().to_string_lossy().ends_with(".bss"))
            .expect(".bss map");
        let value = bss
            .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
            .unwrap()
            .expect(".bss value");
        let index = KINDS.iter().position(|k| *k == kind).unwrap();
        let word = |i: usize| u64::from_ne_bytes(value[i * 8..i * 8 + 8].try_into().unwrap());
        (word(index * 2), word(index * 2 + 1))
    }
}

#[inline(never)]
fn probed_function(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

#[test]
fn uprobe_and_uretprobe_count_every_call_with_their_cookies() {
    let Some(loaded) = load("uprobe") else { return };
    let exe = std::env::current_exe().unwrap();
    let pid = std::process::id();
    let spec =
        |kind: &str| match parse(&format!("{kind}:{}:attach::probed_function", exe.display()))
            .unwrap()
        {
            ProbeSpec::Uprobe(u) => u,
            other => panic!("{other:?}"),
        };
    let targets = resolve_uprobe(&spec("uprobe"), Some(pid)).unwrap();
    assert_eq!(targets.len(), 1);
    let entry = attach_uprobe(
        &loaded.prog("on_uprobe"),
        &targets[0],
        Some(pid as i32),
        false,
        0xC0FFEE,
    )
    .unwrap();
    let exit = attach_uprobe(
        &loaded.prog("on_uretprobe"),
        &targets[0],
        Some(pid as i32),
        true,
        7,
    )
    .unwrap();
    for i in 0..25 {
        probed_function(i);
    }
    assert_eq!(loaded.counter("uprobe"), (25, 0xC0FFEE));
    assert_eq!(loaded.counter("uretprobe"), (25, 7));
    drop((entry, exit));
    probed_function(0);
    assert_eq!(loaded.counter("uprobe").0, 25, "dropping the link detaches");
}

#[test]
fn uprobe_on_libc_by_short_name_through_attach_probe() {
    let Some(loaded) = load("libc") else { return };
    let pid = std::process::id();
    let spec = parse("uprobe:libc:getpid").unwrap();
    let links = attach_probe(&loaded.prog("on_uprobe"), &spec, Some(pid), 42).unwrap();
    assert_eq!(links.len(), 1);
    for _ in 0..10 {
        // std's process::id() is libc's getpid().
        std::hint::black_box(std::process::id());
    }
    let (hits, cookie) = loaded.counter("uprobe");
    assert!(hits >= 10, "{hits} hits");
    assert_eq!(cookie, 42);
}

#[test]
fn a_program_of_the_wrong_kind_is_refused() {
    let Some(loaded) = load("wrong") else { return };
    let spec = parse(&format!(
        "uprobe:{}:attach::probed_function",
        std::env::current_exe().unwrap().display()
    ))
    .unwrap();
    let err = attach_probe(&loaded.prog("on_perf"), &spec, None, 1).unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("program 'on_perf' is of type PerfEvent, but uprobe "),
        "{message}"
    );
    assert!(
        message.ends_with("needs a uprobe program (SEC(\"uprobe\") or SEC(\"uretprobe\"))"),
        "{message}"
    );
}

fn spin(duration: Duration) {
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < duration {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
}

#[test]
fn profile_samples_every_cpu_with_the_cookie() {
    let Some(loaded) = load("profile") else {
        return;
    };
    let links = attach_profile(&loaded.prog("on_perf"), Rate::Hz(1000), 99).unwrap();
    assert_eq!(links.len(), probes::online_cpus().unwrap().len());
    spin(Duration::from_millis(300));
    let (hits, cookie) = loaded.counter("perf");
    assert!(hits > 50, "{hits} samples in 300 ms at 1000 Hz");
    assert_eq!(cookie, 99);
}

#[test]
fn software_events_by_spec() {
    let Some(loaded) = load("software") else {
        return;
    };
    let spec = parse("software:cpu-clock:100000").unwrap();
    let links = attach_probe(&loaded.prog("on_perf"), &spec, None, 5).unwrap();
    assert!(!links.is_empty());
    spin(Duration::from_millis(100));
    let (hits, cookie) = loaded.counter("perf");
    assert!(hits > 0);
    assert_eq!(cookie, 5);
}

#[test]
fn hardware_events_fail_with_one_clear_line_without_a_pmu() {
    let Some(loaded) = load("hardware") else {
        return;
    };
    let prog = loaded.prog("on_perf");
    let result = attach_perf_event_per_cpu(
        &prog,
        PerfEventKind::Hardware(HardwareEvent::CpuCycles),
        Sampling::Period(1_000_000),
        1,
    );
    match result {
        Ok(links) => {
            eprintln!(
                "SKIP the no-PMU error: this machine has hardware perf events \
                 ({} links attached)",
                links.len()
            );
        }
        Err(e) => {
            assert!(
                matches!(e, AttachError::HardwareUnavailable { .. }),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                "hardware perf events are not available on this machine (no PMU, e.g. in a VM); \
                 try software:cpu-clock or profile:hz"
            );
        }
    }
    // The same through a spec.
    if let Err(e) = attach_probe(&prog, &parse("hardware:cycles").unwrap(), None, 1) {
        assert!(
            matches!(e, Error::Attach(AttachError::HardwareUnavailable { .. })),
            "{e:?}"
        );
    }
}

#[test]
fn tracepoints_attach_and_missing_ones_are_named() {
    let Some(loaded) = load("tracepoint") else {
        return;
    };
    let prog = loaded.prog("on_tracepoint");
    let link = attach_tracepoint(&prog, "raw_syscalls", "sys_enter", 3).unwrap();
    for _ in 0..10 {
        let _ = fs::metadata("/");
    }
    let (hits, cookie) = loaded.counter("tracepoint");
    assert!(hits >= 10, "{hits}");
    assert_eq!(cookie, 3);
    drop(link);

    let err = attach_tracepoint(&prog, "sched", "foo", 3).unwrap_err();
    let root = probes::tracefs_root().unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "no tracepoint sched:foo; see {}/available_events",
            root.display()
        )
    );
    let err = attach_tracepoint(&prog, "sched", "sched_swich", 3).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("no tracepoint sched:sched_swich (did you mean sched:sched_switch?)"),
        "{err}"
    );

    // A pattern attaches each match.
    let links = attach_probe(&prog, &parse("t:raw_syscalls:sys_*").unwrap(), None, 3).unwrap();
    assert_eq!(links.len(), 2);
}

#[test]
fn raw_tracepoints_attach_with_cookies() {
    let Some(loaded) = load("raw_tp") else { return };
    let prog = loaded.prog("on_raw_tp");
    let _link = attach_raw_tracepoint(&prog, "sys_enter", 11).unwrap();
    for _ in 0..10 {
        let _ = fs::metadata("/");
    }
    let (hits, cookie) = loaded.counter("raw_tp");
    assert!(hits >= 10, "{hits}");
    assert_eq!(cookie, 11);
    let err = attach_raw_tracepoint(&prog, "no_such_tracepoint", 1).unwrap_err();
    assert!(
        matches!(err, AttachError::NoRawTracepoint { .. }),
        "{err:?}"
    );
}

#[test]
fn kprobes_fail_with_one_clear_line_where_the_kernel_has_none() {
    let Some(loaded) = load("kprobe") else { return };
    let ProbeSpec::Kprobe(spec) = parse("kprobe:do_sys_openat2").unwrap() else {
        unreachable!()
    };
    let prog = loaded.prog("on_kprobe");
    match kprobe_support() {
        Ok(()) => {
            eprintln!(
                "SKIP the no-kprobes error: this kernel has kprobes; checking that one attaches"
            );
            let _link = attach_kprobe(&prog, &spec, 8).unwrap();
            let _ = fs::File::open("/");
            assert_eq!(loaded.counter("kprobe").1, 8);
        }
        Err(_) => {
            let err = attach_kprobe(&prog, &spec, 8).unwrap_err();
            assert!(
                matches!(
                    err,
                    AttachError::KprobesUnavailable | AttachError::KprobeEventsUnavailable
                ),
                "{err:?}"
            );
            if matches!(err, AttachError::KprobesUnavailable) {
                assert_eq!(
                    err.to_string(),
                    "kprobes are not available on this kernel (CONFIG_KPROBES is not set); \
                     try a tracepoint"
                );
            }
            let err =
                attach_probe(&prog, &parse("kretprobe:vfs_read").unwrap(), None, 1).unwrap_err();
            assert!(err.to_string().starts_with("kprobe"), "{err}");
        }
    }
}

#[test]
fn interval_fires_on_one_cpu() {
    let Some(loaded) = load("interval") else {
        return;
    };
    let start = Instant::now();
    let link = probes::attach_interval(&loaded.prog("on_perf"), Rate::Millis(10), 4).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (hits, cookie) = loaded.counter("perf");
    let elapsed = start.elapsed();
    drop(link);
    // One event per 10 ms, not one per CPU per 10 ms.
    let expected = elapsed.as_millis() as u64 / 10;
    assert!(
        hits >= expected / 2 && hits <= expected + 2,
        "{hits} events in {elapsed:?} at 100 Hz"
    );
    assert_eq!(cookie, 4);
}

#[test]
fn detach_closes_every_link_of_a_pattern() {
    let Some(loaded) = load("detach") else { return };
    let prog = loaded.prog("on_tracepoint");
    let spec = parse("t:syscalls:sys_enter_*stat*").unwrap();
    let links = attach_probe(&prog, &spec, None, 4).unwrap();
    // Enough links for the threads to share them.
    assert!(links.len() >= 8, "{}", links.len());
    for _ in 0..10 {
        let _ = fs::metadata("/");
    }
    assert!(loaded.counter("tracepoint").0 >= 10);
    probes::detach(links, |_| {});
    let (before, _) = loaded.counter("tracepoint");
    for _ in 0..100 {
        let _ = fs::metadata("/");
    }
    assert_eq!(
        loaded.counter("tracepoint").0,
        before,
        "a link is still attached"
    );
}
