//! Loading, and the typed errors of the table and mapping API. Needs root
//! (CAP_BPF); without BPF each test prints why it is skipped.

mod common;

use bpf_prog::{AllocOptions, Error, EventProgram, Loss, Mapping, Options, TableMap, Tracer};
use common::tracer_or_skip;
use unwind_tables::{Cfa, CompactRow, CompactTable, PageSpan, RbpRule, Rule};

fn small() -> Options {
    Options {
        max_rows: 2048,
        max_pages: 8,
        max_rules: 16,
        max_tables: 3,
        ..Options::default()
    }
}

/// Two pages of three rows each, four rules.
fn table() -> CompactTable {
    let frame = |offset| Rule::Frame {
        cfa: Cfa::Rsp(offset),
        rbp: RbpRule::Same,
    };
    CompactTable {
        first_page: 1,
        pages: vec![
            PageSpan {
                first_row: 0,
                nrows: 3,
            },
            PageSpan {
                first_row: 3,
                nrows: 3,
            },
        ],
        rows: [
            (0x10, 0),
            (0x20, 1),
            (0x40, 2),
            (0x0, 3),
            (0x8, 0),
            (0x100, 1),
        ]
        .iter()
        .map(|&(addr_lo, rule)| CompactRow { addr_lo, rule })
        .collect(),
        rules: vec![frame(8), frame(16), Rule::End, Rule::Gap],
    }
}

#[test]
fn every_program_passes_the_verifier() {
    let Some(tracer) = tracer_or_skip("every_program_passes_the_verifier", &Options::default())
    else {
        return;
    };
    let stats = tracer.program_stats().expect("program info");
    for name in [
        "on_uprobe",
        "on_uretprobe",
        "on_uprobe_count",
        "on_perf_event",
        "on_tracepoint",
    ] {
        let verified = stats[name].verified_insns;
        println!("{name}: the verifier processed {verified} instructions");
        assert!(verified > 0, "{name} was not verified");
    }
    assert_eq!(tracer.walk_ends().unwrap().total(), 0);
    assert_eq!(tracer.losses().unwrap(), [0; Loss::COUNT]);
    assert!(tracer.counts().unwrap().is_empty());
    assert_eq!(tracer.stack(12345).unwrap(), None);
    assert!(tracer.kernel_stack(3).unwrap().is_empty());
}

/// The heap programs' load-time settings prune their paths differently: every program
/// loads under each (with and without the pid filter, exact, sampled either way, and
/// with a size range).
#[test]
fn every_heap_setting_passes_the_verifier() {
    let settings = [
        AllocOptions::default(),
        AllocOptions {
            sample_every: 1000,
            ..AllocOptions::default()
        },
        AllocOptions {
            sample_bytes: 4096,
            ..AllocOptions::default()
        },
        AllocOptions {
            min_size: 64,
            max_size: 1 << 20,
            ..AllocOptions::default()
        },
    ];
    for filter_uprobes in [false, true] {
        for alloc in &settings {
            let options = Options {
                filter_uprobes,
                alloc: alloc.clone(),
                ..Options::default()
            };
            let name = "every_heap_setting_passes_the_verifier";
            let Some(tracer) = tracer_or_skip(name, &options) else {
                return;
            };
            let stats = tracer.program_stats().expect("program info");
            for name in [
                "on_preload_alloc",
                "on_preload_resize",
                "on_alloc",
                "on_free",
            ] {
                assert!(
                    stats[name].verified_insns > 0,
                    "{name} (filter {filter_uprobes}, {alloc:?})"
                );
            }
        }
    }
}

#[test]
fn full_table_maps_are_reported_by_name() {
    let Some(mut tracer) = tracer_or_skip("full_table_maps_are_reported_by_name", &small()) else {
        return;
    };
    // 8 pages: 4 tables of 2 pages would fit, but max_tables is 3.
    for _ in 0..3 {
        tracer.add_table(&table()).expect("fits");
    }
    let usage = tracer.table_usage();
    assert_eq!(
        (usage.tables, usage.rows, usage.pages, usage.rules),
        (3, 18, 6, 12)
    );
    match tracer.add_table(&table()) {
        Err(Error::MapFull {
            map: TableMap::Tables,
            needed: 1,
            free: 0,
        }) => {}
        other => panic!("expected the tables map to be full: {other:?}"),
    }

    let Some(mut tracer) = tracer_or_skip("full_table_maps_are_reported_by_name", &small()) else {
        return;
    };
    let mut many_rules = table();
    many_rules.rules.extend(std::iter::repeat_n(Rule::End, 13));
    let error = tracer.add_table(&many_rules).unwrap_err();
    assert!(
        matches!(
            error,
            Error::MapFull {
                map: TableMap::Rules,
                needed: 17,
                free: 16
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("rules map is full"), "{error}");
    // Nothing was written: a table that fits still goes in from the start.
    let id = tracer.add_table(&table()).unwrap();
    assert_eq!(id.index(), 0);
}

#[test]
fn invalid_tables_and_mappings_are_rejected() {
    let Some(mut tracer) = tracer_or_skip("invalid_tables_and_mappings_are_rejected", &small())
    else {
        return;
    };
    let mut bad = table();
    bad.rows[1].rule = 9;
    assert!(matches!(tracer.add_table(&bad), Err(Error::BadTable(_))));
    let mut bad = table();
    bad.pages[1].first_row = 2;
    assert!(matches!(tracer.add_table(&bad), Err(Error::BadTable(_))));

    let id = tracer.add_table(&table()).unwrap();
    let mapping = |start, end| Mapping {
        start,
        end,
        bias: 0,
        table: Some(id),
        object: None,
    };
    tracer
        .set_mappings(42, &[mapping(0x3000, 0x4000), mapping(0x1000, 0x2000)])
        .expect("unsorted but disjoint is fine");
    assert!(matches!(
        tracer.set_mappings(42, &[mapping(0x1000, 0x3000), mapping(0x2000, 0x4000)]),
        Err(Error::BadMapping { pid: 42, .. })
    ));
    // [vsyscall]: the kernel half would break the program's signed compares.
    assert!(matches!(
        tracer.set_mappings(42, &[mapping(0xffff_ffff_ff60_0000, 0xffff_ffff_ff60_1000)]),
        Err(Error::BadMapping { .. })
    ));
    assert!(matches!(
        tracer.set_mappings(42, &[mapping(0x1000, 0x1000)]),
        Err(Error::BadMapping { .. })
    ));
    let too_many: Vec<Mapping> = (0..=bpf_prog::MAX_MAPPINGS as u64)
        .map(|i| mapping(i * 0x1000, i * 0x1000 + 0x800))
        .collect();
    assert!(matches!(
        tracer.set_mappings(42, &too_many),
        Err(Error::TooManyMappings { count: 513, .. })
    ));
    let mut foreign = mapping(0x1000, 0x2000);
    foreign.table = None;
    tracer
        .set_mappings(43, &[foreign])
        .expect("a mapping without a table");
    tracer.remove_process(43).unwrap();
    tracer
        .remove_process(43)
        .expect("removing twice is not an error");
}

#[test]
fn prebuilt_object_matches_the_sources() {
    let recorded = include_str!("../src/bpf/prebuilt/trace.bpf.o.source-hash").trim();
    assert_eq!(
        recorded,
        bpf_prog::SOURCE_HASH,
        "src/bpf/prebuilt/trace.bpf.o is stale: refresh it with \
         `BPF_PROG_UPDATE_PREBUILT=1 cargo build -p bpf-prog` and commit it"
    );
}

#[test]
fn prebuilt_object_loads() {
    let object = include_bytes!("../src/bpf/prebuilt/trace.bpf.o");
    let open = libbpf_rs::ObjectBuilder::default()
        .open_memory(object)
        .expect("open the prebuilt object");
    let mut programs: Vec<String> = open
        .progs()
        .map(|p| p.name().to_string_lossy().into_owned())
        .collect();
    programs.sort();
    // The program table's event programs and the three that follow children.
    let mut expected: Vec<String> = bpf_prog::EventProgram::ALL
        .iter()
        .map(|p| p.name().to_string())
        .chain(["on_exec", "on_fork", "on_start_main"].map(String::from))
        .collect();
    expected.sort();
    assert_eq!(programs, expected);
    match open.load() {
        Ok(_) => {}
        Err(error) if error.kind() == libbpf_rs::ErrorKind::PermissionDenied => {
            eprintln!("SKIPPED prebuilt_object_loads: BPF is not available ({error})");
        }
        Err(error) => panic!("the prebuilt object does not load: {error}"),
    }
}

/// This process traced with one mapping of a table, and its forks and execs followed:
/// its pid, the mapping, and the links of the programs that follow it.
fn follow_this_process(tracer: &mut Tracer) -> (u32, Mapping, Vec<libbpf_rs::Link>) {
    let id = tracer.add_table(&table()).unwrap();
    let me = std::process::id();
    let mapping = Mapping {
        start: 0x1000,
        end: 0x2000,
        bias: 0,
        table: Some(id),
        object: None,
    };
    tracer.set_mappings(me, &[mapping]).unwrap();
    tracer.filter_pid(me).unwrap();
    let links = tracer
        .follow_forks()
        .expect("attach the fork and exec programs");
    (me, mapping, links)
}

#[test]
fn forks_of_filtered_processes_are_followed_and_execs_drop_their_mappings() {
    let Some(mut tracer) = tracer_or_skip("follow forks", &small()) else {
        return;
    };
    let (me, mapping, _links) = follow_this_process(&mut tracer);

    // A fork without exec runs with its parent's mappings.
    // SAFETY: the child only sleeps and exits through async-signal-safe calls.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        // SAFETY: as above.
        unsafe {
            libc::usleep(300_000);
            libc::_exit(0);
        }
    }
    let child = child as u32;
    assert!(tracer.filtered_pids().contains(&child));
    assert!(
        tracer.has_mappings(child),
        "the fork copies its parent's mappings"
    );
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(child as i32, &mut status, 0) };

    // A fork that execs: followed, its old mappings dropped, and stopped until
    // the new image's are registered.
    let stopped = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = std::rc::Rc::clone(&stopped);
    let ring = tracer
        .new_images(move |pid| sink.borrow_mut().push(pid))
        .unwrap();
    let mut exec = std::process::Command::new("true").spawn().unwrap();
    let pid = exec.id();
    for _ in 0..100 {
        if !stopped.borrow().is_empty() {
            break;
        }
        ring.poll(std::time::Duration::from_millis(50)).unwrap();
    }
    assert_eq!(*stopped.borrow(), [pid], "the exec is reported");
    assert!(tracer.filtered_pids().contains(&pid));
    assert!(!tracer.has_mappings(pid), "exec drops the mappings");
    // The stop is delivered on the way back to user space.
    let state = || cargo_trace_tests::process::process_state(pid);
    for _ in 0..100 {
        if state() == Some('T') {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(state(), Some('T'), "stopped after the exec");
    tracer.set_mappings(pid, &[mapping]).unwrap();
    // SAFETY: continuing our own child.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    assert!(exec.wait().unwrap().success());

    // Other processes' forks are not followed.
    tracer.unfilter_pid(me).unwrap();
    let mut other = std::process::Command::new("true").spawn().unwrap();
    let other_pid = other.id();
    other.wait().unwrap();
    assert!(!tracer.filtered_pids().contains(&other_pid));
}

/// A child the pid filter has no room for is not followed, and one the map of mappings
/// has no room for walks without them: each is counted, not silent.
#[test]
fn full_pid_filter_and_process_map_are_counted() {
    let options = Options {
        max_procs: 1,
        ..small()
    };
    let Some(mut tracer) = tracer_or_skip("full_pid_filter_and_process_map", &options) else {
        return;
    };
    let (_, _, _links) = follow_this_process(&mut tracer);
    let fork_and_wait = || {
        // SAFETY: the child exits at once through an async-signal-safe call.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        child as u32
    };

    // The filter has room: the child is followed, but the map of mappings has none.
    let child = fork_and_wait();
    assert!(tracer.filtered_pids().contains(&child));
    assert!(!tracer.has_mappings(child));
    let losses = tracer.losses().unwrap();
    assert!(losses[Loss::ProcsFull as usize] >= 1, "{losses:?}");
    assert_eq!(losses[Loss::PidFilterFull as usize], 0, "{losses:?}");

    // Filled up: the next child is not followed.
    let unused_pids = (1..=small().max_filtered_pids).map(|n| u32::MAX - n);
    let added = unused_pids
        .take_while(|&pid| tracer.filter_pid(pid).is_ok())
        .count();
    assert!(
        added < small().max_filtered_pids as usize,
        "the filter never filled"
    );
    let child = fork_and_wait();
    assert!(!tracer.filtered_pids().contains(&child));
    let losses = tracer.losses().unwrap();
    assert!(losses[Loss::PidFilterFull as usize] >= 1, "{losses:?}");
}

/// Only the event programs asked for are loaded (and verified); the others cannot attach,
/// and the statistics list the loaded ones only.
#[test]
fn only_the_programs_asked_for_are_loaded() {
    let options = Options {
        programs: [EventProgram::PerfEvent].into(),
        ..small()
    };
    let Some(tracer) = tracer_or_skip("only_the_programs_asked_for", &options) else {
        return;
    };
    let stats = tracer.program_stats().unwrap();
    assert!(stats.contains_key("on_perf_event"));
    assert!(
        stats.contains_key("on_fork"),
        "children are always followed"
    );
    assert!(!stats.contains_key("on_uprobe") && !stats.contains_key("on_tracepoint"));
    assert!(tracer
        .program(EventProgram::Tracepoint)
        .attach_tracepoint(libbpf_rs::TracepointCategory::Syscalls, "sys_enter_getpid")
        .is_err());
}
