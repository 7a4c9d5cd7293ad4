//! End-to-end walks: a C program built without frame pointers runs under the
//! BPF programs, and the stacks they store are checked frame by frame
//! against the program's known call chain, named through its ELF symtab.
//!
//! Needs root (CAP_BPF, CAP_PERFMON) and gcc; without BPF each test prints
//! why it is skipped.

mod common;

use bpf_prog::{CountKey, EventProgram, Options, Stack, StackRef, Tracer, WalkEnd};
use common::{
    assert_complete, chain_below, chain_fixture as fixture, register_process,
    register_process_by_object, serial, tracer_or_skip, Symbols, Target,
};
use libbpf_rs::UprobeOpts;

fn options() -> Options {
    Options {
        max_rows: 1 << 20,
        ..Options::default()
    }
}

const PROBE_ID: u32 = 7;

/// Attaches `on_uprobe` (or `on_uretprobe`) to `function` of `binary` in `pid`.
fn attach(
    tracer: &Tracer,
    pid: u32,
    binary: &std::path::Path,
    function: &str,
    ret: bool,
) -> libbpf_rs::Link {
    let program = if ret {
        tracer.program(EventProgram::Uretprobe)
    } else {
        tracer.program(EventProgram::Uprobe)
    };
    common::attach_to_function(program, pid, binary, function, ret, PROBE_ID.into())
}

/// The counts of `pid`, and the one stack they all share.
fn only_stack(tracer: &Tracer, pid: u32) -> (u64, CountKey, Stack) {
    let counts: Vec<_> = tracer
        .counts()
        .expect("read counts")
        .into_iter()
        .filter(|(key, _)| key.pid == pid)
        .collect();
    assert_eq!(counts.len(), 1, "one distinct stack expected: {counts:?}");
    let (key, count) = counts[0];
    assert_eq!(key.probe_id, PROBE_ID);
    assert_eq!(key.kernel_stack, None, "a uprobe has no kernel stack");
    let StackRef::Hash(hash) = key.stack else {
        panic!("stack not stored: {key:?}");
    };
    let stack = tracer
        .stack(hash)
        .expect("read stack")
        .expect("stack stored");
    (count.events, key, stack)
}

#[test]
fn uprobe_stack_is_walked_to_start() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("uprobe_stack_is_walked_to_start", &options()) else {
        return;
    };
    let binary = fixture();
    let depth = 40;
    let calls = 250;
    let target = Target::spawn(&binary, &[calls.to_string(), depth.to_string()]);
    let pid = target.pid();
    let mappings = register_process(&mut tracer, pid, |_| false);
    let _link = attach(&tracer, pid, &binary, "leaf", false);
    target.run_to_end();

    let (events, _, stack) = only_stack(&tracer, pid);
    assert_eq!(events, calls as u64);
    // leaf, c3, c2, c1, rec x 40, main, 2 in libc, _start
    assert_eq!(stack.pcs.len(), 4 + depth + 1 + 2 + 1);
    assert_complete(&stack, &mappings, &chain_below("leaf", depth), &binary);
    let ends = tracer.walk_ends().expect("walk ends");
    assert_eq!(ends.get(WalkEnd::Complete), calls as u64);
    assert_eq!(ends.total(), calls as u64, "{ends:?}");
}

/// Two processes of one program, each placed at its own addresses: with the objects
/// registered under ids, the walker stores every frame as its object's address, so both
/// meet one stack, stored once under one key, that each process's mappings turn back
/// into its own runtime addresses.
#[test]
fn frames_stored_by_object_make_one_stack_for_every_process() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("frames_stored_by_object", &options()) else {
        return;
    };
    let randomized = std::fs::read_to_string("/proc/sys/kernel/randomize_va_space")
        .is_ok_and(|value| value.trim() != "0");
    if !randomized {
        eprintln!("skipping frames_stored_by_object: address-space randomization is off");
        return;
    }
    let binary = fixture();
    let (depth, calls) = (12, 30);
    let args = [calls.to_string(), depth.to_string()];
    let (first, second) = (Target::spawn(&binary, &args), Target::spawn(&binary, &args));
    let mut tables = std::collections::HashMap::new();
    let mut registered = Vec::new();
    let mut links = Vec::new();
    for target in [&first, &second] {
        let pid = target.pid();
        registered.push((
            pid,
            register_process_by_object(&mut tracer, &mut tables, pid, |_| false),
        ));
        links.push(attach(&tracer, pid, &binary, "leaf", false));
    }
    let starts: Vec<u64> = registered
        .iter()
        .map(|(_, (files, _))| files.iter().find(|f| f.path == binary).unwrap().start)
        .collect();
    assert_ne!(starts[0], starts[1], "the two processes share one layout");
    first.run_to_end();
    second.run_to_end();

    let mut keys = Vec::new();
    for (pid, (files, mappings)) in &registered {
        let (events, key, stack) = only_stack(&tracer, *pid);
        assert_eq!(events, calls as u64);
        assert!(
            stack
                .frames()
                .all(|frame| matches!(frame, bpf_prog::Frame::InObject { .. })),
            "a frame stored at its runtime address: {:x?}",
            stack.pcs
        );
        let runtime = Stack {
            pcs: stack.runtime_pcs(mappings),
            end: stack.end,
        };
        assert_complete(&runtime, files, &chain_below("leaf", depth), &binary);
        keys.push(key.stack);
    }
    assert_eq!(keys[0], keys[1], "one stack, stored once");
    assert_eq!(tracer.stack_storage().unwrap().stacks, 1);
}

#[test]
fn uretprobe_stack_starts_at_the_return_site() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("uretprobe_stack_starts_at_the_return_site", &options())
    else {
        return;
    };
    let binary = fixture();
    let depth = 3;
    let calls = 100;
    let target = Target::spawn(&binary, &[calls.to_string(), depth.to_string()]);
    let pid = target.pid();
    let mappings = register_process(&mut tracer, pid, |_| false);
    let _link = attach(&tracer, pid, &binary, "leaf", true);
    target.run_to_end();

    let (events, _, stack) = only_stack(&tracer, pid);
    assert_eq!(events, calls as u64);
    // Frame 0 is the return address in c3, exact: name it at pc, not pc - 1.
    // Symbols::frames looks up frame 0 at pc, which is what BPF did.
    assert_complete(&stack, &mappings, &chain_below("c3", depth), &binary);
}

#[test]
fn depth_cap_keeps_the_first_512_frames() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("depth_cap_keeps_the_first_512_frames", &options())
    else {
        return;
    };
    let binary = fixture();
    let depth = 600;
    let target = Target::spawn(&binary, &["3".to_string(), depth.to_string()]);
    let pid = target.pid();
    let mappings = register_process(&mut tracer, pid, |_| false);
    let _link = attach(&tracer, pid, &binary, "leaf", false);
    target.run_to_end();

    let (events, _, stack) = only_stack(&tracer, pid);
    assert_eq!(events, 3);
    assert_eq!(stack.end, WalkEnd::DepthCap);
    assert_eq!(stack.pcs.len(), bpf_prog::MAX_FRAMES);
    let names = Symbols::default().frames(&mappings, &stack.pcs);
    assert_eq!(&names[..4], ["leaf", "c3", "c2", "c1"]);
    assert!(names[4..].iter().all(|name| name == "rec"), "{names:?}");
    assert_eq!(tracer.walk_ends().unwrap().get(WalkEnd::DepthCap), 3);
}

#[test]
fn unregistered_process_counts_no_proc_and_keeps_the_pc() {
    let _serial = serial();
    let Some(tracer) = tracer_or_skip("unregistered_process_counts_no_proc", &options()) else {
        return;
    };
    let binary = fixture();
    let target = Target::spawn(&binary, &["20".to_string(), "2".to_string()]);
    let pid = target.pid();
    let mappings = common::executable_mappings(pid);
    let _link = attach(&tracer, pid, &binary, "leaf", false);
    target.run_to_end();

    let (events, _, stack) = only_stack(&tracer, pid);
    assert_eq!(events, 20);
    assert_eq!(stack.end, WalkEnd::NoProcess);
    assert_eq!(Symbols::default().frames(&mappings, &stack.pcs), ["leaf"]);
    let ends = tracer.walk_ends().unwrap();
    assert_eq!(ends.get(WalkEnd::NoProcess), 20);
    assert_eq!(ends.get(WalkEnd::Complete), 0);
}

#[test]
fn missing_mapping_stops_the_walk_and_keeps_the_frames_found() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("missing_mapping_stops_the_walk", &options()) else {
        return;
    };
    let binary = fixture();
    let depth = 5;
    let target = Target::spawn(&binary, &["30".to_string(), depth.to_string()]);
    let pid = target.pid();
    let all = common::executable_mappings(pid);
    // Register the program but not libc: the walk must stop at main's caller.
    register_process(&mut tracer, pid, |file| file.path != binary);
    let _link = attach(&tracer, pid, &binary, "leaf", false);
    target.run_to_end();

    let (events, _, stack) = only_stack(&tracer, pid);
    assert_eq!(events, 30);
    assert_eq!(stack.end, WalkEnd::NoMapping);
    let expected = chain_below("leaf", depth);
    let names = Symbols::default().frames(&all, &stack.pcs);
    // The chain up to main, then the return address into libc that has no mapping.
    assert_eq!(names.len(), expected.len() + 1, "{names:?}");
    assert_eq!(&names[..expected.len()], expected);
    let last = *stack.pcs.last().unwrap();
    let file = all
        .iter()
        .find(|m| m.start < last && last <= m.end)
        .expect("mapped");
    assert!(file.path.to_string_lossy().contains("libc"), "{names:?}");
    assert_eq!(tracer.walk_ends().unwrap().get(WalkEnd::NoMapping), 30);
}

/// A pc in a file the process maps but whose mapping is not registered (ld.so runs a
/// library's code before the library joins the link map, when its mappings are
/// registered): the walker finds the kernel's VMA of the pc, and there the file userspace
/// loaded for another process, and walks on with its table, storing its frames by object.
#[test]
fn a_known_file_not_registered_for_the_process_is_walked_through_its_vma() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("a_known_file_not_registered", &options()) else {
        return;
    };
    let binary = fixture();
    let depth = 5;
    let target = Target::spawn(&binary, &["30".to_string(), depth.to_string()]);
    let pid = target.pid();
    let mut tables = std::collections::HashMap::new();
    // The program registered, libc known only as a file.
    let (_, mut mappings) =
        register_process_by_object(&mut tracer, &mut tables, pid, |file| file.path != binary);
    let all = common::executable_mappings(pid);
    let entries = process_image::executable_mappings(pid).expect("maps");
    for file in all.iter().filter(|file| file.path != binary) {
        let table = tracer
            .add_table(
                &unwind_tables::compile_file(&file.path)
                    .expect("compile")
                    .table,
            )
            .expect("add table");
        let mapping = bpf_prog::Mapping {
            start: file.start,
            end: file.end,
            bias: file.bias,
            table: Some(table),
            object: bpf_prog::ObjectId::new(table.index() + 1),
        };
        let entry = entries
            .iter()
            .find(|e| e.start == file.start)
            .expect("entry");
        let at = bpf_prog::FileMapping {
            dev: entry.kernel_dev().expect("major:minor"),
            inode: entry.inode,
            offset: entry.offset,
        };
        assert!(tracer.add_file_mapping(at, &mapping).expect("add file"));
        mappings.push(mapping);
    }
    let _link = attach(&tracer, pid, &binary, "leaf", false);
    target.run_to_end();

    let (events, _, stack) = only_stack(&tracer, pid);
    assert_eq!(events, 30);
    assert!(
        stack
            .frames()
            .all(|frame| matches!(frame, bpf_prog::Frame::InObject { .. })),
        "{:x?}",
        stack.pcs
    );
    let runtime = Stack {
        pcs: stack.runtime_pcs(&mappings),
        end: stack.end,
    };
    assert_complete(&runtime, &all, &chain_below("leaf", depth), &binary);
    assert_eq!(tracer.walk_ends().unwrap().get(WalkEnd::Complete), 30);
}

/// Uprobes at the start of every merged push/pop row of the fixture's chain and at each of
/// its steps: the CFA at each depends on the pc's offset in the row, which the BPF program
/// takes from its search or from its rule cache (every probe fires once per call, so all
/// but the first hit are cache hits). Each must give the one complete stack.
#[test]
fn pcs_inside_push_pop_rows_walk_complete_stacks() {
    use unwind_tables::rule::STEP_WINDOW;
    use unwind_tables::{Cfa, Rule};

    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("pcs_inside_push_pop_rows", &options()) else {
        return;
    };
    let binary = fixture();
    let table = unwind_tables::compile_file(&binary).expect("compile").table;
    let mut symbols = Symbols::default();
    let mut probes: Vec<(u64, u32, String)> = Vec::new(); // ELF address, row offset, function
    for (start, rule) in table.iter() {
        let Rule::Frame {
            cfa: Cfa::RspSteps { pushes, pops, .. },
            ..
        } = rule
        else {
            continue;
        };
        let steps = (0..STEP_WINDOW).filter(|k| (pushes | pops) & (1 << k) != 0);
        for offset in std::iter::once(0).chain(steps.map(|k| k + 1)) {
            let address = start + u64::from(offset);
            match symbols.name(&binary, address) {
                Some(name) if ["leaf", "c3", "c2", "c1", "rec"].contains(&name.as_str()) => {
                    probes.push((address, offset, name));
                }
                _ => {}
            }
        }
    }
    assert!(
        probes.iter().any(|p| p.1 > 0) && probes.iter().any(|p| p.1 == 0),
        "the fixture has no push/pop rows to probe: {probes:?}"
    );

    let depth = 2;
    let calls = 5;
    let target = Target::spawn(&binary, &[calls.to_string(), depth.to_string()]);
    let pid = target.pid();
    let mappings = register_process(&mut tracer, pid, |_| false);
    let data = std::fs::read(&binary).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let _links: Vec<_> = probes
        .iter()
        .enumerate()
        .map(|(id, &(address, _, _))| {
            use object::{Object, ObjectSegment};
            let segment = elf
                .segments()
                .find(|s| s.address() <= address && address < s.address() + s.size())
                .expect("a segment holds the probe");
            let file_offset = address - segment.address() + segment.file_range().0;
            tracer
                .program(EventProgram::Uprobe)
                .attach_uprobe_with_opts(
                    pid as i32,
                    &binary,
                    file_offset as usize,
                    UprobeOpts {
                        cookie: id as u64,
                        ..UprobeOpts::default()
                    },
                )
                .unwrap_or_else(|e| panic!("attach at {address:#x}: {e}"))
        })
        .collect();
    target.run_to_end();

    let counts = tracer.counts().expect("read counts");
    for (id, (address, offset, function)) in probes.iter().enumerate() {
        let here: Vec<_> = counts
            .iter()
            .filter(|(key, _)| key.pid == pid && key.probe_id == id as u32)
            .collect();
        let events: u64 = here.iter().map(|(_, count)| count.events).sum();
        let context = format!("{function} at {address:#x}, row offset {offset}");
        for (key, _) in &here {
            let StackRef::Hash(hash) = key.stack else {
                panic!("{context}: stack not stored");
            };
            let stack = tracer.stack(hash).unwrap().expect("stored");
            if function == "rec" {
                // rec(depth) .. rec(0): one stack per depth.
                let names = Symbols::default().frames(&mappings, &stack.pcs);
                let recs = names.iter().take_while(|name| *name == "rec").count();
                assert!((1..=depth + 1).contains(&recs), "{context}: {names:?}");
                let mut expected = vec!["rec".to_string(); recs];
                expected.push("main".to_string());
                assert_complete(&stack, &mappings, &expected, &binary);
            } else {
                assert_complete(&stack, &mappings, &chain_below(function, depth), &binary);
            }
        }
        if function == "rec" {
            // Its prologue runs at every depth, its epilogue only where it does not
            // tail-call c1.
            assert!(events >= calls as u64, "{context}: {events} events");
        } else {
            assert_eq!(here.len(), 1, "{context}: one stack for every call");
            assert_eq!(events, calls as u64, "{context}");
        }
    }
    println!("{} probes in push/pop rows: {probes:x?}", probes.len());
}

/// The program's rule cache outlives processes: an entry answers only for the set of
/// mappings it was found in (its generation). Two runs of the fixture at the same addresses
/// (no ASLR), on the same CPU: the first registered whole fills the cache; the second,
/// registered without libc, must stop where libc begins rather than follow the first run's
/// rules.
#[test]
fn rule_cache_entries_answer_only_for_their_own_mappings() {
    let _serial = serial();
    let Some(mut tracer) = tracer_or_skip("rule_cache_generations", &options()) else {
        return;
    };
    let binary = fixture();
    let depth = 3;
    let mut run = |register_libc: bool| {
        // The cache is per CPU: both runs on CPU 0.
        let args: Vec<String> = ["-c", "0", "setarch", "-R"]
            .map(String::from)
            .into_iter()
            .chain([binary.display().to_string(), "10".into(), depth.to_string()])
            .collect();
        let target = Target::spawn(std::path::Path::new("taskset"), &args);
        let pid = target.pid();
        let all = common::executable_mappings(pid);
        register_process(&mut tracer, pid, |file| {
            !register_libc && file.path != binary
        });
        let link = attach(&tracer, pid, &binary, "leaf", false);
        target.run_to_end();
        drop(link);
        let (events, _, stack) = only_stack(&tracer, pid);
        assert_eq!(events, 10);
        let addresses: Vec<_> = all.iter().map(|m| (m.start, m.path.clone())).collect();
        (stack, addresses)
    };
    let (whole, first_addresses) = run(true);
    assert_eq!(whole.end, WalkEnd::Complete);
    // Without ASLR the layout is the same run after run, but for an occasional page of
    // difference in where libc lands (seen under a loaded machine): only a second run at
    // the first's addresses tests the cache, so one at others is run again.
    let mut tries = 0;
    let (partial, second_addresses) = loop {
        let (partial, addresses) = run(false);
        tries += 1;
        if addresses == first_addresses || tries == 5 {
            break (partial, addresses);
        }
        eprintln!("run {tries} mapped elsewhere: {addresses:x?}; running it again");
    };
    assert_eq!(first_addresses, second_addresses, "ASLR was not off");
    assert_eq!(partial.end, WalkEnd::NoMapping);
    assert_eq!(partial.pcs, whole.pcs[..partial.pcs.len()]);
    assert_eq!(partial.pcs.len(), chain_below("leaf", depth).len() + 1);
}

/// The walk memo answers only for the words it read: `leaf` of `memo_chains` is entered
/// with the same rip and rsp through chains that differ in one word of the stack (the
/// return address into `via_a` or `via_b`, or three frames up into `outer_x` or
/// `outer_y`), in rounds that switch between them. Each chain must keep its own count,
/// exactly, while the memo answers most events: a memo that answered for a word it did not
/// check would move events to the chain it remembered. Built without frame pointers
/// (rsp-based rules; rbp is the compiler's) and with them (rbp-based rules: the thread's
/// rbp is part of the memo's key).
#[test]
fn memo_answers_only_for_unchanged_words() {
    let _serial = serial();
    for flags in [&[][..], &["-fno-omit-frame-pointer"][..]] {
        let Some(mut tracer) = tracer_or_skip("memo_answers_only_for_unchanged_words", &options())
        else {
            return;
        };
        let binary = cargo_trace_tests::fixtures::build(
            cargo_trace_tests::fixtures::Lang::C,
            "memo_chains",
            flags,
        )
        .expect("build memo_chains");
        let (rounds, a, b, x, y) = (60u64, 3, 2, 2, 1);
        let args = [rounds, a, b, x, y].map(|n| n.to_string());
        let target = Target::spawn(&binary, &args);
        let pid = target.pid();
        let mappings = register_process(&mut tracer, pid, |_| false);
        let _link = attach(&tracer, pid, &binary, "leaf", false);
        target.run_to_end();

        let mut by_chain = std::collections::BTreeMap::new();
        let mut symbols = Symbols::default();
        for (key, count) in tracer.counts().expect("read counts") {
            if key.pid != pid {
                continue;
            }
            let StackRef::Hash(hash) = key.stack else {
                panic!("stack not stored: {key:?}");
            };
            let stack = tracer
                .stack(hash)
                .expect("read stack")
                .expect("stack stored");
            let names = symbols.frames(&mappings, &stack.pcs);
            assert_eq!(stack.end, WalkEnd::Complete, "{flags:?}: {names:?}");
            let chain = names[..names.iter().position(|n| n == "main").expect("main")].join(" ");
            *by_chain.entry(chain).or_insert(0) += count.events;
        }
        let expected: std::collections::BTreeMap<String, u64> = [
            ("leaf via_a run", rounds * a),
            ("leaf via_b run", rounds * b),
            ("leaf via_a mid outer_x run", rounds * x),
            ("leaf via_a mid outer_y run", rounds * y),
        ]
        .into_iter()
        .map(|(chain, count)| (chain.to_string(), count))
        .collect();
        assert_eq!(by_chain, expected, "{flags:?}");

        let events = rounds * (a + b + x + y);
        let ends = tracer.walk_ends().expect("walk ends");
        assert_eq!(ends.get(WalkEnd::Complete), events, "{flags:?}: {ends:?}");
        assert_eq!(ends.total(), events, "{flags:?}: {ends:?}");
        // Each chain is walked once per CPU it runs on, and again only where a round
        // switches chains faster than the memo's ways hold them: most events are answers.
        let hits = tracer.memo_hits().expect("memo hits");
        println!("{flags:?}: {hits} of {events} walks answered by the memo");
        assert!(hits * 2 >= events, "{flags:?}: {hits} of {events} answered");
    }
}
