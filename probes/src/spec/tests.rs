use super::*;

fn uprobe(target: Option<&str>, name: &str, offset: u64) -> ProbeSpec {
    ProbeSpec::Uprobe(UprobeSpec {
        retprobe: false,
        target: target.map(str::to_string),
        lang: None,
        location: UprobeLocation::Symbol {
            name: name.to_string(),
            offset,
        },
    })
}

fn err(spec: &str) -> String {
    parse(spec).unwrap_err().to_string()
}

/// Parses, checks the value, and checks that Display round-trips.
fn check(spec: &str, expected: ProbeSpec) {
    let parsed = parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(parsed, expected, "{spec}");
    let shown = parsed.to_string();
    assert_eq!(
        parse(&shown).as_ref(),
        Ok(&parsed),
        "{spec} displayed as {shown}"
    );
}

#[test]
fn uprobe_path_and_symbol() {
    check(
        "uprobe:/lib/x86_64-linux-gnu/libc.so.6:malloc",
        uprobe(Some("/lib/x86_64-linux-gnu/libc.so.6"), "malloc", 0),
    );
    check("u:./prog:main", uprobe(Some("./prog"), "main", 0));
    check("uprobe:libc:malloc", uprobe(Some("libc"), "malloc", 0));
    check(
        "uprobe:libc.so.6:free",
        uprobe(Some("libc.so.6"), "free", 0),
    );
    assert_eq!(
        parse("uprobe:libc:malloc").unwrap().to_string(),
        "uprobe:libc:malloc"
    );
}

#[test]
fn uprobe_offsets_and_addresses() {
    check("uprobe:./prog:main+4", uprobe(Some("./prog"), "main", 4));
    check(
        "uprobe:./prog:main+0x10",
        uprobe(Some("./prog"), "main", 16),
    );
    assert_eq!(
        parse("uprobe:./prog:main+16").unwrap().to_string(),
        "uprobe:./prog:main+0x10"
    );
    check(
        "uprobe:./prog:0x401136",
        ProbeSpec::Uprobe(UprobeSpec {
            retprobe: false,
            target: Some("./prog".into()),
            lang: None,
            location: UprobeLocation::Address(0x401136),
        }),
    );
    check(
        "uprobe:./prog:1234",
        ProbeSpec::Uprobe(UprobeSpec {
            retprobe: false,
            target: Some("./prog".into()),
            lang: None,
            location: UprobeLocation::Address(1234),
        }),
    );
    // `+0` is the entry.
    check("uprobe:./prog:main+0", uprobe(Some("./prog"), "main", 0));
}

#[test]
fn rust_and_cpp_paths_keep_their_double_colons() {
    check(
        "uprobe:./prog:myprog::parse",
        uprobe(Some("./prog"), "myprog::parse", 0),
    );
    check(
        "uprobe:./target/release/prog:myprog::cli::Args::parse+0x8",
        uprobe(Some("./target/release/prog"), "myprog::cli::Args::parse", 8),
    );
    check(
        "uprobe:./prog:<myprog::Foo as core::fmt::Debug>::fmt",
        uprobe(Some("./prog"), "<myprog::Foo as core::fmt::Debug>::fmt", 0),
    );
    check(
        "uprobe:./prog:ns::Klass::method(int, char const*)",
        uprobe(Some("./prog"), "ns::Klass::method(int, char const*)", 0),
    );
    // C++ operators: a `+` not followed by a digit is part of the name.
    check(
        "uprobe:./prog:ns::operator+",
        uprobe(Some("./prog"), "ns::operator+", 0),
    );
    check(
        "uprobe:./prog:ns::operator++0x4",
        uprobe(Some("./prog"), "ns::operator+", 4),
    );
    check(
        "uprobe:./prog:ns::Vec::operator[]",
        uprobe(Some("./prog"), "ns::Vec::operator[]", 0),
    );
}

#[test]
fn quoted_fields_as_in_bpftrace() {
    check(
        "uprobe:./prog:\"ns::f\"",
        uprobe(Some("./prog"), "ns::f", 0),
    );
    check(
        "uprobe:\"/tmp/dir:with:colons/prog\":main",
        uprobe(Some("/tmp/dir:with:colons/prog"), "main", 0),
    );
    assert_eq!(
        parse("uprobe:\"/tmp/a:b\":main").unwrap().to_string(),
        "uprobe:\"/tmp/a:b\":main"
    );
    check(
        r#"uprobe:./prog:"we\"ird""#,
        uprobe(Some("./prog"), "we\"ird", 0),
    );
    assert_eq!(
        err("uprobe:\"./prog:main"),
        "unterminated quote in 'uprobe:\"./prog:main'"
    );
}

#[test]
fn uprobe_without_binary_means_the_pid() {
    check("uprobe:malloc", uprobe(None, "malloc", 0));
    check("uprobe::malloc", uprobe(None, "malloc", 0));
    check("uprobe:myprog::parse", uprobe(None, "myprog::parse", 0));
    assert_eq!(
        parse("uprobe::myprog::parse").unwrap(),
        uprobe(None, "myprog::parse", 0)
    );
    assert!(err("uprobe:/bin/bash").starts_with("missing symbol in 'uprobe:/bin/bash'"));
    assert!(err("uprobe:./prog").starts_with("missing symbol"));
}

#[test]
fn uprobe_language_field() {
    let expected = ProbeSpec::Uprobe(UprobeSpec {
        retprobe: false,
        target: Some("./prog".into()),
        lang: Some(Lang::Cpp),
        location: UprobeLocation::Symbol {
            name: "ns::f".into(),
            offset: 0,
        },
    });
    check("uprobe:./prog:cpp:ns::f", expected);
    check(
        "uprobe::cpp:ns::f",
        ProbeSpec::Uprobe(UprobeSpec {
            retprobe: false,
            target: None,
            lang: Some(Lang::Cpp),
            location: UprobeLocation::Symbol {
                name: "ns::f".into(),
                offset: 0,
            },
        }),
    );
    let e = err("uprobe:./prog:myprog:parse");
    assert!(e.starts_with("unknown language 'myprog'"), "{e}");
    assert!(e.contains("myprog::parse"), "{e}");
}

#[test]
fn uretprobes() {
    let expected = ProbeSpec::Uprobe(UprobeSpec {
        retprobe: true,
        target: Some("libc".into()),
        lang: None,
        location: UprobeLocation::Symbol {
            name: "malloc".into(),
            offset: 0,
        },
    });
    check("uretprobe:libc:malloc", expected.clone());
    check("ur:libc:malloc", expected);
    assert_eq!(
        parse("ur:libc:malloc").unwrap().program_kind(),
        ProgramKind::Uretprobe
    );
    let e = err("uretprobe:libc:malloc+4");
    assert!(
        e.starts_with("an offset in a uretprobe in 'uretprobe:libc:malloc+4'"),
        "{e}"
    );
    check(
        "uretprobe:./prog:0x1000",
        ProbeSpec::Uprobe(UprobeSpec {
            retprobe: true,
            target: Some("./prog".into()),
            lang: None,
            location: UprobeLocation::Address(0x1000),
        }),
    );
}

#[test]
fn uprobe_wildcards_only_in_symbols() {
    check(
        "uprobe:./prog:myprog::*",
        uprobe(Some("./prog"), "myprog::*", 0),
    );
    check("uprobe:libc:mall*", uprobe(Some("libc"), "mall*", 0));
    assert_eq!(
        err("uprobe:/usr/lib/*:malloc"),
        "wildcards are not supported in the binary path of 'uprobe:/usr/lib/*:malloc'; \
         give one file"
    );
    assert!(err("uprobe:libc:mall*+4").starts_with("wildcards are not supported in the symbol"));
}

#[test]
fn uprobe_bad_fields() {
    assert!(err("uprobe:./prog:main+4x").starts_with("invalid offset '4x'"));
    assert!(err("uprobe:./prog:").starts_with("empty symbol in 'uprobe:./prog:'"));
    assert!(err("uprobe:./prog:+4").starts_with("empty symbol"));
    assert!(err("uprobe:a:b:c:d").starts_with("4 fields after the probe type"));
    assert!(err("uprobe").starts_with("no arguments in 'uprobe'"));
    let e = err("uprobe:a:b:c:d");
    assert!(
        e.contains("(expected uprobe:PATH:SYMBOL, uprobe:PATH:SYMBOL+OFFSET"),
        "{e}"
    );
}

#[test]
fn usdt() {
    check(
        "usdt:./prog:myprov:start",
        ProbeSpec::Usdt(UsdtSpec {
            target: Some("./prog".into()),
            provider: Some("myprov".into()),
            name: "start".into(),
        }),
    );
    check(
        "U:./prog:start",
        ProbeSpec::Usdt(UsdtSpec {
            target: Some("./prog".into()),
            provider: None,
            name: "start".into(),
        }),
    );
    check(
        "usdt:start",
        ProbeSpec::Usdt(UsdtSpec {
            target: None,
            provider: None,
            name: "start".into(),
        }),
    );
    check(
        "usdt::myprov:start",
        ProbeSpec::Usdt(UsdtSpec {
            target: None,
            provider: Some("myprov".into()),
            name: "start".into(),
        }),
    );
    check(
        "usdt:./prog:myprov:*",
        ProbeSpec::Usdt(UsdtSpec {
            target: Some("./prog".into()),
            provider: Some("myprov".into()),
            name: "*".into(),
        }),
    );
    assert_eq!(
        parse("usdt:./prog:p:n").unwrap().program_kind(),
        ProgramKind::Uprobe
    );
    assert!(err("usdt:./prog:\"\":n").starts_with("empty provider"));
    // `::` never separates: this is one field, a path without a probe name.
    assert!(err("usdt:./prog::n").starts_with("missing probe name"));
    assert!(err("usdt:a:b:c:d").starts_with("4 fields"));
}

#[test]
fn profile_and_interval() {
    check("profile:hz:99", ProbeSpec::Profile(Rate::Hz(99)));
    check("p:hz:997", ProbeSpec::Profile(Rate::Hz(997)));
    check("profile:s:1", ProbeSpec::Profile(Rate::Seconds(1)));
    check("profile:ms:10", ProbeSpec::Profile(Rate::Millis(10)));
    check("profile:us:250", ProbeSpec::Profile(Rate::Micros(250)));
    check("interval:s:1", ProbeSpec::Interval(Rate::Seconds(1)));
    check("i:ms:100", ProbeSpec::Interval(Rate::Millis(100)));
    check("interval:hz:2", ProbeSpec::Interval(Rate::Hz(2)));
    assert_eq!(parse("profile:hz:99").unwrap().to_string(), "profile:hz:99");
    assert_eq!(
        parse("profile:hz:99").unwrap().program_kind(),
        ProgramKind::PerfEvent
    );

    assert_eq!(
        err("profile:99"),
        "1 field after the probe type in 'profile:99' \
         (expected profile:hz:N, profile:s:N, profile:ms:N or profile:us:N)"
    );
    assert!(err("profile:hz:0").starts_with("a rate of 0 in 'profile:hz:0'"));
    assert!(err("profile:hz:fast").starts_with("invalid rate 'fast'"));
    assert!(err("profile:m:5").starts_with("unknown unit 'm'"));
    assert!(err("profile:hz:-1").starts_with("invalid rate '-1'"));
}

#[test]
fn rates_become_perf_sampling() {
    assert_eq!(Rate::Hz(99).sampling(), Sampling::Frequency(99));
    assert_eq!(Rate::Seconds(2).sampling(), Sampling::Period(2_000_000_000));
    assert_eq!(Rate::Millis(10).sampling(), Sampling::Period(10_000_000));
    assert_eq!(Rate::Micros(250).sampling(), Sampling::Period(250_000));
}

#[test]
fn tracepoints() {
    let sched_switch = ProbeSpec::Tracepoint {
        category: "sched".into(),
        name: "sched_switch".into(),
    };
    check("tracepoint:sched:sched_switch", sched_switch.clone());
    check("t:sched:sched_switch", sched_switch);
    check(
        "tracepoint:syscalls:sys_enter_*",
        ProbeSpec::Tracepoint {
            category: "syscalls".into(),
            name: "sys_enter_*".into(),
        },
    );
    assert!(err("tracepoint:sched_switch").starts_with("1 field after the probe type"));
    assert!(err("tracepoint:sched:").starts_with("empty tracepoint name"));
    assert!(err("tracepoint::x").starts_with("empty tracepoint category"));
}

#[test]
fn raw_tracepoints() {
    check(
        "rawtracepoint:sched_switch",
        ProbeSpec::RawTracepoint {
            module: None,
            name: "sched_switch".into(),
        },
    );
    check(
        "rt:vmlinux:sched_switch",
        ProbeSpec::RawTracepoint {
            module: Some("vmlinux".into()),
            name: "sched_switch".into(),
        },
    );
    assert!(err("rawtracepoint:sched_*").starts_with("wildcards are not supported"));
    assert_eq!(
        parse("rawtracepoint:x").unwrap().program_kind(),
        ProgramKind::RawTracepoint
    );
}

#[test]
fn kprobes() {
    let k = |retprobe, module: Option<&str>, function: &str, offset| {
        ProbeSpec::Kprobe(KprobeSpec {
            retprobe,
            module: module.map(str::to_string),
            function: function.to_string(),
            offset,
        })
    };
    check("kprobe:do_sys_openat2", k(false, None, "do_sys_openat2", 0));
    check(
        "k:do_sys_openat2+0x10",
        k(false, None, "do_sys_openat2", 16),
    );
    check(
        "kprobe:ext4:ext4_file_open",
        k(false, Some("ext4"), "ext4_file_open", 0),
    );
    check(
        "kretprobe:do_sys_openat2",
        k(true, None, "do_sys_openat2", 0),
    );
    check("kr:vfs_read", k(true, None, "vfs_read", 0));
    assert!(err("kretprobe:vfs_read+4").starts_with("an offset in a kretprobe"));
    assert!(err("kprobe:vfs_*").starts_with("wildcards are not supported in the kernel function"));
    assert!(err("kprobe:a:b:c").starts_with("3 fields"));
    assert_eq!(
        parse("kretprobe:vfs_read").unwrap().program_kind(),
        ProgramKind::Kretprobe
    );
}

#[test]
fn software_events_with_aliases_and_default_periods() {
    let sw = |event, period| ProbeSpec::Software { event, period };
    check("software:cpu-clock:1000", sw(SoftwareEvent::CpuClock, 1000));
    check("s:cpu:1000", sw(SoftwareEvent::CpuClock, 1000));
    check("software:cpu-clock", sw(SoftwareEvent::CpuClock, 1_000_000));
    check("software:task-clock", sw(SoftwareEvent::TaskClock, 1));
    check("software:page-faults", sw(SoftwareEvent::PageFaults, 100));
    check("software:faults:1", sw(SoftwareEvent::PageFaults, 1));
    check(
        "software:context-switches",
        sw(SoftwareEvent::ContextSwitches, 1000),
    );
    check("software:cs:10", sw(SoftwareEvent::ContextSwitches, 10));
    check(
        "software:cpu-migrations",
        sw(SoftwareEvent::CpuMigrations, 1),
    );
    check("software:minor-faults", sw(SoftwareEvent::MinorFaults, 100));
    check("software:major-faults", sw(SoftwareEvent::MajorFaults, 1));
    check(
        "software:alignment-faults",
        sw(SoftwareEvent::AlignmentFaults, 1),
    );
    check(
        "software:emulation-faults",
        sw(SoftwareEvent::EmulationFaults, 1),
    );
    check("software:dummy", sw(SoftwareEvent::Dummy, 1));
    check("software:bpf-output", sw(SoftwareEvent::BpfOutput, 1));
    assert_eq!(
        parse("s:faults").unwrap().to_string(),
        "software:page-faults:100"
    );
    let e = err("software:cpu-cycles");
    assert!(e.starts_with("unknown software event 'cpu-cycles' in 'software:cpu-cycles' (expected a software event: alignment-faults, "), "{e}");
    assert!(e.contains("cpu-clock (cpu)"), "{e}");
    assert!(err("software:cpu-clock:0").starts_with("a period of 0"));
    assert!(err("software:cpu-clock:often").starts_with("invalid period 'often'"));
    assert!(err("software:*").starts_with("wildcards are not supported in the event"));
}

#[test]
fn hardware_events_with_aliases_and_default_periods() {
    let hw = |event, period| ProbeSpec::Hardware { event, period };
    check(
        "hardware:cpu-cycles:1000000",
        hw(HardwareEvent::CpuCycles, 1_000_000),
    );
    check("h:cycles", hw(HardwareEvent::CpuCycles, 1_000_000));
    check(
        "hardware:instructions:100",
        hw(HardwareEvent::Instructions, 100),
    );
    check(
        "hardware:cache-misses",
        hw(HardwareEvent::CacheMisses, 1_000_000),
    );
    check(
        "hardware:cache-references",
        hw(HardwareEvent::CacheReferences, 1_000_000),
    );
    check(
        "hardware:branch-instructions",
        hw(HardwareEvent::BranchInstructions, 100_000),
    );
    check(
        "hardware:branches",
        hw(HardwareEvent::BranchInstructions, 100_000),
    );
    check(
        "hardware:branch-misses",
        hw(HardwareEvent::BranchMisses, 100_000),
    );
    check("hardware:bus-cycles", hw(HardwareEvent::BusCycles, 100_000));
    check(
        "hardware:ref-cycles",
        hw(HardwareEvent::RefCycles, 1_000_000),
    );
    check(
        "hardware:frontend-stalls",
        hw(HardwareEvent::FrontendStalls, 1_000_000),
    );
    check(
        "hardware:backend-stalls",
        hw(HardwareEvent::BackendStalls, 1_000_000),
    );
    let e = err("hardware:cpu-clock");
    assert!(e.starts_with("unknown hardware event 'cpu-clock'"), "{e}");
    assert!(e.contains("cpu-cycles (cycles)"), "{e}");
}

#[test]
fn event_configs_are_the_kernel_ids() {
    use perf_event_open_sys::bindings as b;
    assert_eq!(
        SoftwareEvent::CpuClock.config(),
        u64::from(b::PERF_COUNT_SW_CPU_CLOCK)
    );
    assert_eq!(
        SoftwareEvent::PageFaults.config(),
        u64::from(b::PERF_COUNT_SW_PAGE_FAULTS)
    );
    assert_eq!(
        HardwareEvent::CpuCycles.config(),
        u64::from(b::PERF_COUNT_HW_CPU_CYCLES)
    );
    assert_eq!(
        HardwareEvent::RefCycles.config(),
        u64::from(b::PERF_COUNT_HW_REF_CPU_CYCLES)
    );
    for e in SoftwareEvent::ALL {
        assert_eq!(SoftwareEvent::from_name(e.name()), Some(*e));
    }
    for e in HardwareEvent::ALL {
        assert_eq!(HardwareEvent::from_name(e.name()), Some(*e));
    }
}

#[test]
fn unknown_probe_types() {
    assert_eq!(
        err("uprobes:x:y"),
        "unknown probe type 'uprobes' in 'uprobes:x:y' (expected uprobe, uretprobe, usdt, \
         profile, interval, tracepoint, rawtracepoint, software, hardware, kprobe, kretprobe); \
         did you mean 'uprobe'?"
    );
    assert_eq!(
        err("bogus:x"),
        "unknown probe type 'bogus' in 'bogus:x' (expected uprobe, uretprobe, usdt, \
         profile, interval, tracepoint, rawtracepoint, software, hardware, kprobe, kretprobe)"
    );
    assert!(err("tracepiont:a:b").ends_with("did you mean 'tracepoint'?"));
    // Case matters, as in bpftrace: `U` is usdt but `UPROBE` is nothing.
    assert!(err("UPROBE:x:y").starts_with("unknown probe type 'UPROBE'"));
    assert!(err("u*:x:y").starts_with("wildcards are not supported in the probe type"));
    assert_eq!(err(""), ParseError::Empty.to_string());
    assert_eq!(err("   "), ParseError::Empty.to_string());
}

#[test]
fn bpftrace_types_that_are_not_supported() {
    let e = err("fentry:vfs_read");
    assert_eq!(
        e,
        "fentry probes are not supported in 'fentry:vfs_read'; BPF trampolines are not used; \
         try kprobe:FUNCTION where the kernel has kprobes, or a tracepoint"
    );
    assert!(err("kfunc:vfs_read").starts_with("kfunc probes are not supported"));
    assert!(err("BEGIN").starts_with("BEGIN probes are not supported"));
    assert!(err("watchpoint:0x1000:8:w").starts_with("watchpoint probes are not supported"));
    assert!(err("iter:task").starts_with("iter probes are not supported"));
}

#[test]
fn errors_are_one_line() {
    for spec in [
        "uprobes:x:y",
        "uprobe:a:b:c:d",
        "profile:99",
        "software:nope",
        "hardware:nope",
        "fentry:x",
        "uprobe:\"x",
        "uprobe:/usr/*:malloc",
    ] {
        let e = err(spec);
        assert!(!e.contains('\n'), "{spec}: {e}");
        assert!(e.contains(spec), "{spec}: {e}");
    }
}

#[test]
fn whitespace_around_is_ignored() {
    assert_eq!(
        parse("  profile:hz:99\n").unwrap(),
        ProbeSpec::Profile(Rate::Hz(99))
    );
}

#[test]
fn from_str_is_parse() {
    let spec: ProbeSpec = "t:sched:sched_switch".parse().unwrap();
    assert_eq!(spec.to_string(), "tracepoint:sched:sched_switch");
    assert!(spec.to_string().parse::<ProbeSpec>().is_ok());
    assert!(!spec.is_user());
    assert!(parse("u:libc:malloc").unwrap().is_user());
}

#[test]
fn display_quotes_only_what_needs_it() {
    assert!(!needs_quotes("myprog::parse"));
    assert!(!needs_quotes("/usr/lib/libc.so.6"));
    assert!(needs_quotes("a:b"));
    assert!(needs_quotes(":a"));
    assert!(needs_quotes("a::"));
    assert!(needs_quotes("a\"b"));
    // A run of three colons stays text, like `::`.
    assert!(!needs_quotes("a:::b"));
}

/// Every spec written by Display parses back to the same value, whatever the fields.
#[test]
fn display_round_trips_odd_fields() {
    let odd = [
        "a:b", ":a", "a::", "a\"b", "x\\y", "::", "a:::b", "plain", "ns::f",
    ];
    for target in odd {
        for name in odd {
            let spec = uprobe(Some(target), name, 0);
            let shown = spec.to_string();
            assert_eq!(
                parse(&shown),
                Ok(spec),
                "{target} / {name} shown as {shown}"
            );
        }
        let spec = ProbeSpec::Tracepoint {
            category: target.to_string(),
            name: "n".into(),
        };
        assert_eq!(parse(&spec.to_string()), Ok(spec));
    }
}

#[test]
fn comma_lists_split_between_probes_only() {
    assert_eq!(
        split_list(" uprobe:./p:f,uprobe:./p:g , t:sched:sched_switch").unwrap(),
        ["uprobe:./p:f", "uprobe:./p:g", "t:sched:sched_switch"]
    );
    // Commas inside C++ names, quotes, and before no probe type stay.
    for whole in [
        "uprobe:./p:cpp:ns::f(int, char)",
        "uprobe:./p:\"ns::f(int,uprobe:x)\"",
        "uprobe:./p:f<a,b>",
        "uprobe:./p,q:f",
    ] {
        assert_eq!(split_list(whole).unwrap(), [whole]);
    }
    let e = err("uprobe:./p:f,uprobe:./p:g");
    assert!(e.contains("a list of 2 probes"), "{e}");
}

#[test]
fn filters_and_actions_say_they_are_not_supported() {
    let e = err("uprobe:./p:f /pid == 1/");
    assert!(
        e.starts_with("filters are not supported ('/pid == 1/' in 'uprobe:./p:f /pid == 1/'): "),
        "{e}"
    );
    assert!(e.contains("-p"), "{e}");
    let e = split_list("uprobe:./p:f,uprobe:./p:g /comm == \"x\"/")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("filters are not supported"), "{e}");
    let e = err("profile:hz:99 { @[ustack] = count(); }");
    assert!(
        e.starts_with("actions are not supported ('{ @[ustack] = count(); }'"),
        "{e}"
    );
    // A path is no filter.
    assert!(parse("uprobe:/bin/bash:readline").is_ok());
    for spec in ["uprobe:./p:f /pid == 1/", "profile:hz:99 {x}"] {
        assert!(!err(spec).contains('\n'));
    }
}
