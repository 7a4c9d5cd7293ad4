//! In-process recording end to end, through the crate's own `Server`, `PlainTables` and
//! `Recorder`, on the fixtures of `tests/`: exact counts per site, the call chains, leaks
//! to the byte. No root and no BPF needed.

mod common;

use cargo_trace_tests::expected;
use cargo_trace_tests::fixtures::c_fixture;
use object::{Object, ObjectSection};
use preload::Options;
use unwind_tables::walk::WalkEnd;

#[test]
fn heap_storm_counts_every_pair_under_its_whole_chain() {
    let exe = c_fixture("heap_storm");
    let mut run = common::record(&exe, &["20000", "10"], Options::default());
    assert!(run.status.success(), "{}", run.stdout);
    let pid = run.pid;
    let stacks = run.stacks_through(pid, "storm");
    assert_eq!(
        stacks.len(),
        1,
        "one stack through storm: {:?}",
        stacks.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    let (chain, stats) = &stacks[0];
    assert_eq!(chain[0], "malloc", "{chain:?}");
    assert_eq!(chain[1], "storm", "{chain:?}");
    assert_eq!(
        chain.iter().filter(|n| *n == "descend").count(),
        11,
        "{chain:?}"
    );
    assert_eq!(
        chain.last().map(String::as_str),
        Some("_start"),
        "{chain:?}"
    );
    assert_eq!(stats.allocs, 20000);
    assert_eq!(stats.bytes, 20000 * 48);
    assert_eq!(stats.frees, 20000);
    assert_eq!(stats.live_bytes, 0);
    let counters = run.recorder.counters();
    assert_eq!(counters.unknown_frees, 0, "{counters:?}");
    assert!(counters.memo_hits > 19000, "{counters:?}");
    let stack = run
        .recorder
        .stacks()
        .iter()
        .find(|s| s.frames.len() == chain.len())
        .unwrap()
        .clone();
    assert_eq!(stack.end, WalkEnd::Complete);
    // the leaf frame is the BPF path's: the return address of the wrapper's call of the
    // site cargo_trace_allocated (the same instruction in both modes)
    let preload::Frame::InObject { object, address } = stack.frames[0] else {
        panic!(
            "the wrapper's frame is in the library: {:?}",
            stack.frames[0]
        );
    };
    let library = std::fs::read(run.tables.object_path(object).unwrap()).unwrap();
    let file = object::File::parse(&*library).unwrap();
    let text = file.section_by_name(".text").unwrap();
    let at = (address - text.address() + text.file_range().unwrap().0) as usize;
    assert_eq!(library[at - 5], 0xe8, "frame 0 follows a call");
}

/// For profiling by hand: `HEAP_STORM_PAIRS=20000000 cargo test -p preload --release
/// --test record storm_for_profiling -- --ignored --nocapture`.
#[test]
#[ignore]
fn storm_for_profiling() {
    let exe = c_fixture("heap_storm");
    let pairs = std::env::var("HEAP_STORM_PAIRS").unwrap_or_else(|_| "5000000".into());
    let depth = std::env::var("HEAP_STORM_DEPTH").unwrap_or_else(|_| "10".into());
    let run = common::record(&exe, &[&pairs, &depth], Options::default());
    println!("{}{:?}", run.stdout, run.recorder.counters());
}

/// The stats of every stack of `pid` whose chain has `function` right above the
/// library's wrappers, summed.
fn site_stats(run: &mut common::Run, pid: u32, function: &str) -> (u64, u64, u64, i64, usize) {
    let stacks = run.stacks_through(pid, function);
    let mut total = (0, 0, 0, 0, 0);
    for (chain, stats) in &stacks {
        let above = chain
            .iter()
            .position(|n| {
                !matches!(
                    n.as_str(),
                    "malloc"
                        | "calloc"
                        | "realloc"
                        | "resize"
                        | "reallocarray"
                        | "posix_memalign"
                        | "aligned_alloc"
                        | "memalign"
                        | "valloc"
                        | "pvalloc"
                        | "mmap"
                        | "mmap64"
                )
            })
            .unwrap_or(0);
        if chain.get(above).map(String::as_str) != Some(function) {
            continue;
        }
        total.0 += stats.allocs;
        total.1 += stats.bytes;
        total.2 += stats.frees;
        total.3 += stats.live_bytes;
        total.4 += 1;
    }
    total
}

/// Checks every `heap ...` line of the run's stdout against what was recorded for `pid`.
fn check_sites(run: &mut common::Run, pid: u32) {
    let sites = expected::parse_heap_sites(&run.stdout).expect("heap lines");
    assert!(!sites.is_empty(), "{}", run.stdout);
    for site in sites {
        let (allocs, bytes, frees, live, stacks) = site_stats(run, pid, &site.function);
        assert!(
            stacks >= 1 || site.allocs == 0,
            "{}: no stack recorded",
            site.function
        );
        assert_eq!(
            (allocs, bytes, frees),
            (site.allocs, site.bytes, site.frees),
            "{}: allocs, bytes, frees",
            site.function
        );
        if site.size > 0 {
            assert_eq!(
                live,
                (site.leaked * site.size) as i64,
                "{}: leaked bytes",
                site.function
            );
        }
    }
}

#[test]
fn alloc_c_counts_every_site_and_its_leaks_to_the_byte() {
    let exe = c_fixture("alloc_c");
    let mut run = common::record(&exe, &[], Options::default());
    assert!(run.status.success(), "{}", run.stdout);
    let pid = run.pid;
    check_sites(&mut run, pid);
    let counters = run.recorder.counters();
    assert_eq!(counters.unknown_frees, 0, "{counters:?}");
    assert_eq!(
        counters.nested_lost + counters.not_stored + counters.no_ring,
        0,
        "{counters:?}"
    );
    // anonymous mappings are kept apart
    let totals = run
        .recorder
        .processes()
        .into_iter()
        .find(|p| p.pid == pid)
        .unwrap();
    assert!(totals.mapped.allocs >= 1, "{totals:?}");
    let mapped: Vec<_> = run
        .recorder
        .stats()
        .into_iter()
        .filter(|(p, _, s)| *p == pid && s.mapped)
        .collect();
    assert!(!mapped.is_empty());
    for (_, id, _) in mapped {
        let stack = run.recorder.stack_of(id).clone();
        let chain = run.chain(&stack);
        assert!(chain[0] == "mmap" || chain[0] == "mmap64", "{chain:?}");
    }
}

/// A named allocator's session (`wrappers_pass`): the library connects, but its wrappers
/// record nothing, every call of the malloc API and of mmap passed through (only hooks
/// count then, and this source hooks nothing), and the program's own checks still hold.
#[test]
fn wrappers_that_pass_through_record_nothing() {
    let exe = c_fixture("alloc_c");
    let options = Options {
        wrappers_pass: true,
        ..Options::default()
    };
    let run = common::record(&exe, &[], options);
    assert!(run.status.success(), "{}", run.stdout);
    assert!(
        !expected::parse_heap_sites(&run.stdout).unwrap().is_empty(),
        "{}",
        run.stdout
    );
    assert!(run.recorder.images().contains(&run.pid), "connected");
    assert!(run.recorder.stats().is_empty());
    let totals = run.recorder.processes();
    assert!(
        totals
            .iter()
            .all(|p| p.allocs + p.frees + p.mapped.allocs + p.mapped.frees == 0),
        "{totals:?}"
    );
    assert_eq!(run.recorder.counters().unknown_frees, 0);
}

#[test]
fn frees_on_other_threads_and_reused_addresses_are_ordered_exactly() {
    let exe = c_fixture("free_log");
    for mode in ["cross", "thread", "exit"] {
        let mut run = common::record(&exe, &[mode], Options::default());
        assert!(run.status.success(), "{mode}: {}", run.stdout);
        let pid = run.pid;
        check_sites(&mut run, pid);
        let counters = run.recorder.counters();
        assert_eq!(
            (counters.unknown_frees, counters.reused),
            (0, 0),
            "{mode}: {counters:?}"
        );
    }
}

#[test]
fn a_process_that_execs_or_crashes_has_its_records_read() {
    let exe = c_fixture("free_log");
    for mode in ["exec", "crash"] {
        let mut run = common::record(&exe, &[mode], Options::default());
        let pid = run.pid;
        check_sites(&mut run, pid);
    }
}

#[test]
fn a_signal_handler_that_allocates_is_walked_through_the_signal_frame() {
    let exe = c_fixture("signals");
    let mut run = common::record(&exe, &["20"], Options::default());
    assert!(run.status.success(), "{}", run.stdout);
    let pid = run.pid;
    let stacks = run.stacks_through(pid, "on_signal");
    let allocs: u64 = stacks.iter().map(|(_, s)| s.allocs).sum();
    assert_eq!(
        allocs,
        200,
        "{:?}",
        stacks.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    for (chain, _) in &stacks {
        for name in ["malloc", "on_signal", "inner", "outer", "main", "_start"] {
            assert!(chain.iter().any(|n| n == name), "{name} in {chain:?}");
        }
    }
}

#[test]
fn forked_and_execd_children_record_on_their_own() {
    let exe = c_fixture("bound_children");
    let mut run = common::record(&exe, &["traced", "300"], Options::default());
    assert!(run.status.success(), "{}", run.stdout);
    let mut by_pid = std::collections::BTreeMap::new();
    for (pid, id, stats) in run.recorder.stats() {
        let stack = run.recorder.stack_of(id).clone();
        if run.chain(&stack).iter().any(|n| n == "work") {
            *by_pid.entry(pid).or_insert(0) += stats.allocs;
            assert_eq!(stats.frees, stats.allocs);
        }
    }
    // the main process (main thread and a thread), a forked child, an exec'd child
    assert_eq!(by_pid.get(&run.pid), Some(&600), "{by_pid:?}");
    assert_eq!(by_pid.len(), 3, "{by_pid:?}");
    assert!(
        by_pid.values().filter(|&&n| n == 300).count() == 2,
        "{by_pid:?}"
    );
}

#[test]
fn a_child_that_drops_ld_preload_is_not_recorded_and_runs() {
    let exe = c_fixture("heap_storm");
    let script = format!("env -u LD_PRELOAD {} 1000 3", exe.display());
    let mut run = common::record_with(
        std::process::Command::new("/bin/sh").args(["-c", &script]),
        Options::default(),
        |_, _| {},
    );
    assert!(run.status.success());
    assert!(
        run.stdout.contains("heap storm allocs 1000"),
        "{}",
        run.stdout
    );
    for (pid, id, _) in run.recorder.stats() {
        let stack = run.recorder.stack_of(id).clone();
        assert!(!run.chain(&stack).iter().any(|n| n == "storm"), "{pid}");
    }
}

#[test]
fn a_target_killed_mid_run_has_its_records_read() {
    let exe = c_fixture("heap_storm");
    let mut killed = false;
    let mut run = common::record_with(
        std::process::Command::new(&exe).args(["100000000", "5", "keep"]),
        Options::default(),
        |pid, recorder| {
            if !killed && recorder.events() > 200_000 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                killed = true;
            }
        },
    );
    assert!(killed && !run.status.success());
    let pid = run.pid;
    let stacks = run.stacks_through(pid, "storm");
    assert_eq!(stacks.len(), 1);
    let stats = &stacks[0].1;
    assert!(stats.allocs >= 200_000, "{stats:?}");
    assert_eq!(
        stats.live_bytes,
        48 * stats.allocs as i64,
        "every block leaked, to the byte"
    );
}

#[test]
fn the_target_runs_on_when_cargo_trace_goes_away() {
    let exe = c_fixture("heap_storm");
    let mut server = preload::Server::new().unwrap();
    let mut recorder = preload::Recorder::new(Options::default());
    let mut tables = preload::PlainTables::new();
    let child = std::process::Command::new(&exe)
        .args(["3000000", "10"])
        .envs(server.environment(None))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while recorder.events() < 100_000 && started.elapsed() < std::time::Duration::from_secs(30) {
        server
            .serve(
                &mut tables,
                &mut recorder,
                std::time::Duration::from_millis(1),
            )
            .unwrap();
        recorder.poll();
    }
    assert!(recorder.events() >= 100_000);
    drop(recorder);
    drop(server);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("heap storm allocs 3000000"), "{stdout}");
    // at full speed once alone: 3 M pairs well within this, waits for a consumer
    // that never comes would take far longer
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

const PLUGIN_SOURCE: &str = "#include <stdlib.h>\n\
    unsigned long plug_work(unsigned long i) {\n\
        void *p = malloc(4001 + (i & 1)); __asm__ volatile(\"\" : : \"r\"(p) : \"memory\"); free(p); return i; }\n";

/// A library dlopened after start (its mappings unknown to the library until it asks) is
/// walked exactly from its first allocation.
#[test]
fn a_dlopened_plugin_is_walked_from_its_first_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("plugin.c");
    std::fs::write(&source, PLUGIN_SOURCE).unwrap();
    let plugin = dir.path().join("libplug.so");
    let status = std::process::Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-o"])
        .arg(&plugin)
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success());
    let exe = c_fixture("dlopen_plugin");
    let plugin_arg = plugin.to_str().unwrap();
    let mut run = common::record(&exe, &[plugin_arg, "1500"], Options::default());
    assert!(run.status.success(), "{}", run.stdout);
    let pid = run.pid;
    let stacks = run.stacks_through(pid, "plug_work");
    let allocs: u64 = stacks.iter().map(|(_, s)| s.allocs).sum();
    assert_eq!(
        allocs,
        1500,
        "{:?}",
        stacks.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    for (chain, stats) in &stacks {
        assert_eq!(stats.frees, stats.allocs);
        assert_eq!(
            &chain[..3],
            ["malloc", "plug_work", "call_plugin"],
            "{chain:?}"
        );
        assert_eq!(
            chain.last().map(String::as_str),
            Some("_start"),
            "{chain:?}"
        );
    }
    let ends: Vec<_> = run
        .recorder
        .stats()
        .into_iter()
        .filter(|(p, _, _)| *p == pid)
        .map(|(_, id, _)| run.recorder.stack_of(id).end)
        .collect();
    assert!(ends.iter().all(|e| *e == WalkEnd::Complete), "{ends:?}");
    let counters = run.recorder.counters();
    assert!(counters.lookups >= 1, "{counters:?}");
    assert!(counters.memo_hits >= 1400, "{counters:?}");
}

/// Sampling 1 in 10: the sampled allocations are counted with what they stand for,
/// and the frees of the others are not unknown frees.
#[test]
fn sampling_counts_estimates_and_no_unknown_frees() {
    let exe = c_fixture("heap_storm");
    let options = Options {
        sample_every: 10,
        ..Options::default()
    };
    let mut run = common::record(&exe, &["100000", "3"], options);
    assert!(run.status.success());
    let pid = run.pid;
    let stacks = run.stacks_through(pid, "storm");
    assert_eq!(stacks.len(), 1);
    let stats = &stacks[0].1;
    assert!((8_000..12_000).contains(&stats.allocs), "{stats:?}");
    assert_eq!(stats.frees, stats.allocs);
    assert_eq!(stats.estimated.allocs, stats.allocs as f64 * 10.0);
    assert_eq!(stats.estimated.bytes, stats.bytes * 10);
    assert_eq!(run.recorder.counters().unknown_frees, 0);
}

/// A signal handler that maps memory while its thread is inside the recorder (a nested
/// level, published by the outer one) or anywhere else: every mapping is counted (or,
/// when the signal came inside the allocator's own call, counted as part of it), and
/// the interrupted loop's counts stay exact.
#[test]
fn signal_handlers_inside_the_recorder_are_recorded() {
    let exe = c_fixture("signal_storm");
    let mut run = common::record(&exe, &["300000"], Options::default());
    assert!(run.status.success(), "{}", run.stdout);
    let pid = run.pid;
    let sites = expected::parse_heap_sites(&run.stdout).unwrap();
    let handled = sites
        .iter()
        .find(|s| s.function == "on_signal")
        .unwrap()
        .allocs;
    let (allocs, _, frees, live, _) = site_stats(&mut run, pid, "site_loop");
    assert_eq!((allocs, frees, live), (300000, 300000, 0));
    let (maps, _, unmaps, live, _) = site_stats(&mut run, pid, "on_signal");
    let counters = run.recorder.counters();
    assert_eq!(maps, unmaps, "{counters:?}");
    assert_eq!(live, 0);
    assert_eq!(maps + counters.inside_calls / 2, handled, "{counters:?}");
    assert_eq!(counters.nested_lost, 0, "{counters:?}");
    assert_eq!(counters.unknown_frees, 0, "{counters:?}");
    eprintln!(
        "{handled} signals, {} events nested in the recorder",
        counters.nested_events
    );
}

/// Children started with posix_spawn and vfork share the parent's memory until they
/// exec: the parent's records stay exact.
#[test]
fn posix_spawn_and_vfork_children_leave_the_parents_records_alone() {
    let exe = c_fixture("spawner");
    let mut run = common::record(&exe, &["20"], Options::default());
    assert!(run.status.success(), "{}", run.stdout);
    let pid = run.pid;
    check_sites(&mut run, pid);
    let counters = run.recorder.counters();
    assert_eq!(
        (counters.unknown_frees, counters.reused),
        (0, 0),
        "{counters:?}"
    );
}

/// The library's memory is bounded, and the bound is in the region for the summary.
#[test]
fn the_librarys_memory_is_bounded_and_told() {
    let exe = c_fixture("heap_storm");
    let run = common::record(&exe, &["1000", "3"], Options::default());
    let memory = run.recorder.library_memory();
    assert_eq!(memory.len(), 1);
    let m = memory[0];
    assert_eq!(m.region_bound, preload::layout::region::BYTES as u64);
    assert!(
        m.region_used <= m.region_bound && m.region_used > 0,
        "{m:?}"
    );
    assert!(
        m.private_bytes > 0 && m.private_bytes <= m.private_bound,
        "{m:?}"
    );
    eprintln!("library memory: {m:?}");
}

/// The memo and the rule cache answer what a walk would: the same stacks and counts
/// with the memo on and off.
#[test]
fn the_memo_answers_what_a_walk_would() {
    let exe = c_fixture("alloc_c");
    let summary = |walk_memo: bool| {
        let mut run = common::record(
            &exe,
            &[],
            Options {
                walk_memo,
                ..Options::default()
            },
        );
        assert!(run.status.success());
        let pid = run.pid;
        let mut out: Vec<_> = run
            .recorder
            .stats()
            .into_iter()
            .filter(|(p, _, _)| *p == pid)
            .map(|(_, id, s)| {
                let stack = run.recorder.stack_of(id).clone();
                (
                    stack.frames.len(),
                    stack.end,
                    run.chain(&stack),
                    s.bytes / s.allocs.max(1),
                )
            })
            .collect();
        out.sort();
        (out, run.recorder.counters())
    };
    let (with_memo, counters) = summary(true);
    let (without, off) = summary(false);
    assert!(counters.memo_hits > 10, "{counters:?}");
    assert_eq!(off.memo_hits, 0, "{off:?}");
    assert_eq!(with_memo, without);
}

/// More threads than rings, one after the other: a thread that ended gives its ring
/// back once drained, and no event is lost.
#[test]
fn rings_of_ended_threads_are_reused() {
    let exe = c_fixture("many_threads");
    let mut run = common::record(&exe, &["400"], Options::default());
    assert!(run.status.success(), "{}", run.stdout);
    let pid = run.pid;
    check_sites(&mut run, pid);
    let counters = run.recorder.counters();
    assert_eq!(counters.no_ring, 0, "{counters:?}");
}

/// For profiling by hand: CPython's JSON round trip recorded (`--ignored --nocapture`).
#[test]
#[ignore]
fn python_for_profiling() {
    let python = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let python = String::from_utf8(python.stdout).unwrap();
    let script = "import json\nd = [{'a': i, 'b': str(i) * 3, 'c': [i, i + 1, {'x': i}]} for i in range(150000)]\ns = json.dumps(d)\nassert json.loads(s) == d\n";
    let started = std::time::Instant::now();
    let run = common::record_with(
        std::process::Command::new(python.trim())
            .args(["-c", script])
            .env("PYTHONMALLOC", "malloc"),
        Options::default(),
        |_, _| {},
    );
    println!("{:?} {:?}", started.elapsed(), run.recorder.counters());
    println!("{} stacks", run.recorder.stacks().len());
}

/// The session says the mappings changed: the library asks for them again before its
/// next walk, and goes on recording exactly.
#[test]
fn the_library_asks_again_when_told_the_mappings_changed() {
    let exe = c_fixture("heap_storm");
    let mut told = false;
    let mut run = common::record_with(
        std::process::Command::new(&exe).args(["3000000", "4"]),
        Options::default(),
        |pid, recorder| {
            if !told && recorder.events() > 10_000 {
                recorder.mappings_changed(pid);
                told = true;
            }
        },
    );
    assert!(told && run.status.success());
    let pid = run.pid;
    let stacks = run.stacks_through(pid, "storm");
    assert_eq!(stacks.iter().map(|(_, s)| s.allocs).sum::<u64>(), 3_000_000);
    let counters = run.recorder.counters();
    assert!(counters.lookups >= 1, "{counters:?}");
    assert_eq!(counters.unknown_frees, 0, "{counters:?}");
}
