//! End to end: the stack storage under many distinct stacks. The `paths` fixture takes
//! 2^N distinct call paths to malloc, each twice; under `uprobe:libc:malloc` every one
//! of those events must be counted, under its own whole stack: with no loss of any kind
//! at 2^16 paths, and exactly as well when the kernel's maps are too small for them; and
//! so with two sessions side by side on the same probe, each counting its own target
//! only. A shell loop of short processes and an interpreter's start-up (python3 through
//! a shell wrapper, many processes and tens of thousands of distinct stacks) lose no
//! event either.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

use bpf_prog::{Loss, WalkEnd};
use cargo_trace_tests::fixtures;
use common::{binary, bpf_available, quoted, trace, Run, Scratch};

/// Binomial coefficient: paths with `k` of their `n` bits set.
fn choose(n: u64, k: u64) -> u64 {
    (0..k).fold(1, |acc, i| acc * (n - i) / (i + 1))
}

#[test]
fn every_one_of_65536_malloc_paths_is_counted_under_its_whole_stack() {
    if !bpf_available("paths") {
        return;
    }
    let run = trace_paths(16, &[]);
    // No walk failure and no loss of any kind (a full map or ring buffer says so here).
    run.assert_every_walk_complete();
    assert_summary_lacks(&run, &real_losses());
}

/// With a counts map and a set of known stacks far smaller than the paths, the summary
/// says both filled, and every count and stack is exact all the same: the counts that did
/// not fit came through the ring buffer, and the stacks were sent again.
#[test]
fn full_kernel_maps_say_so_and_lose_nothing() {
    if !bpf_available("paths_small_maps") {
        return;
    }
    let run = trace_paths(10, &["--max-counts", "64", "--max-stacks", "64"]);
    for (loss, option) in [
        (Loss::CountMapFull, "--max-counts"),
        (Loss::KnownStacksFull, "--max-stacks"),
    ] {
        assert!(
            summary_limit(&run, loss.name(), option) > 0,
            "no {loss:?}: {}",
            run.stderr
        );
    }
    // Every walk complete (said apart from the losses, whatever the summary's wording).
    for end in [
        WalkEnd::NoProcess,
        WalkEnd::NoMapping,
        WalkEnd::NoRow,
        WalkEnd::ReadFault,
        WalkEnd::DepthCap,
        WalkEnd::BadReturnAddress,
        WalkEnd::Unsupported(unwind_tables::UnsupportedReason::BadCfi),
    ] {
        assert!(!run.stderr.contains(end.name()), "{end}: {}", run.stderr);
    }
    assert_summary_lacks(
        &run,
        &[Loss::CountLost, Loss::StackRingFull, Loss::StackNotStored],
    );
}

/// A table map too small for libc's table: the run says which object has no table and
/// the option that raises the map, walks through libc end "no row", and every event is
/// still counted, each under the part of its stack walked before libc.
#[test]
fn full_table_maps_say_which_object_and_what_to_raise() {
    if !bpf_available("table map full") {
        return;
    }
    let run = trace_levels("table-rows", &["--max-table-rows", "0"]);
    let note = run
        .stderr
        .lines()
        .find(|line| line.contains("no unwind table for") && line.contains("libc.so.6"))
        .unwrap_or_else(|| panic!("no note for libc: {}", run.stderr));
    assert!(
        note.contains("rows map is full") && note.ends_with("(raise --max-table-rows)"),
        "{note}"
    );
    // Counted in the summary too: the objects left without a table.
    assert!(
        summary_limit(&run, "table rows full", "--max-table-rows") >= 1,
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains(&format!("{} 1000", WalkEnd::NoRow.name())),
        "{}",
        run.stderr
    );
    let folded = run.folded();
    assert_eq!(folded.total(), 1000, "{}", run.stderr);
    assert_eq!(folded.count_with("level1"), 1000, "{}", run.stderr);
    let roomy = trace_levels("table-rows", &[]);
    assert!(
        !roomy.stderr.contains("no unwind table for"),
        "{}",
        roomy.stderr
    );
    assert_eq!(
        roomy.folded().count_with("_start"),
        1000,
        "{}",
        roomy.stderr
    );
}

/// A map of files for the walker with room for one file mapping, under a target that
/// maps three files (its executable, ld.so, libc): the summary counts the mappings left
/// out with the option that raises the map, and every event is counted all the same,
/// each under its whole stack (the target's own mappings are registered before it runs).
#[test]
fn a_full_file_map_says_so_with_its_option_and_loses_no_event() {
    if !bpf_available("file map full") {
        return;
    }
    let run = trace_levels("file-map", &["--max-files", "1"]);
    let left_out = summary_limit(&run, "file map full", "--max-files");
    assert!(left_out >= 2, "{}", run.stderr);
    assert!(!run.stderr.contains("was not told"), "{}", run.stderr);
    let folded = run.folded();
    assert_eq!(run.summary_events(), 1000, "{}", run.stderr);
    assert_eq!(folded.total(), 1000, "{}", run.stderr);
    assert_eq!(folded.count_with("_start"), 1000, "{}", run.stderr);
    run.assert_every_walk_complete();
    let roomy = trace_levels("file-map", &[]);
    assert!(!roomy.stderr.contains("file map full"), "{}", roomy.stderr);
    assert_eq!(roomy.folded().total(), 1000, "{}", roomy.stderr);
}

/// A process with more executable mappings than the walker holds for one: the summary
/// counts it (no option raises the cap: it is the BPF program's), and every event is
/// counted all the same.
#[test]
fn a_process_past_the_mapping_cap_says_so_and_loses_no_event() {
    if !bpf_available("mapping cap") {
        return;
    }
    let path = fixtures::c_fixture("many_mappings");
    let mappings = bpf_prog::MAX_MAPPINGS + 100;
    let run = trace(
        "many-mappings",
        &[&format!("uprobe:{}:work", path.display())],
        &format!("{} {mappings}", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    assert_eq!(run.stdout, format!("mappings {mappings} calls 1000\n"));
    let summary = run
        .stderr
        .lines()
        .find(|line| line.contains(" events, "))
        .unwrap_or_else(|| panic!("no summary line: {}", run.stderr));
    let cap = format!("processes past {} mappings 1", bpf_prog::MAX_MAPPINGS);
    assert!(summary.contains(&cap), "{summary}");
    assert_eq!(run.summary_events(), 1000, "{summary}");
    assert_eq!(run.folded().count_with("work"), 1000, "{summary}");
}

/// The `levels` fixture's 1000 chains under a uprobe on `level3`, run to its end.
fn trace_levels(name: &str, extra: &[&str]) -> Run {
    let levels = fixtures::c_fixture("levels");
    let probe = format!("uprobe:{}:level3", levels.display());
    let command = format!("{} 1000", quoted(&levels));
    let run = trace(name, &[&probe], &command, extra);
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    assert_eq!(run.stdout, "calls 1000 sum 6000\n");
    run
}

/// Every loss but the events that had no user stack to walk (inside execve, exiting
/// processes, kernel threads, interval firings elsewhere): those are counted as what
/// they are, and lose nothing.
fn real_losses() -> Vec<Loss> {
    Loss::ALL
        .iter()
        .copied()
        .filter(|loss| {
            !matches!(
                loss,
                Loss::InExec | Loss::Exiting | Loss::KernelThread | Loss::TargetElsewhere
            )
        })
        .collect()
}

/// The count of limit `name` in the run's summary line, which must name `option` as what
/// raises it (`file map full 2 (--max-files)`).
fn summary_limit(run: &Run, name: &str, option: &str) -> u64 {
    let summary = run
        .stderr
        .lines()
        .find(|line| line.contains(" events, "))
        .unwrap_or_else(|| panic!("no summary line: {}", run.stderr));
    summary
        .split_once(&format!("{name} "))
        .and_then(|(_, rest)| rest.split_once(&format!(" ({option})")))
        .and_then(|(count, _)| count.parse().ok())
        .unwrap_or_else(|| panic!("no {name} with {option} in: {summary}"))
}

/// None of `losses` is named in the run's summary.
fn assert_summary_lacks(run: &common::Run, losses: &[Loss]) {
    for loss in losses {
        assert!(
            !run.stderr.contains(loss.name()),
            "{loss:?}: {}",
            run.stderr
        );
    }
}

/// Runs the fixture with 2^`bits` paths under `uprobe:libc:malloc` and checks it
/// ([`assert_paths_counted`]).
fn trace_paths(bits: usize, extra: &[&str]) -> common::Run {
    let paths = fixtures::c_fixture("paths");
    let mut args = vec!["--no-svg"];
    args.extend(extra);
    let run = trace(
        "paths",
        &["uprobe:libc:malloc"],
        &format!("{} {bits}", quoted(&paths)),
        &args,
    );
    assert_paths_counted(bits, &run);
    run
}

/// Every path of the `paths` fixture's run with 2^`bits` paths is counted twice under
/// its own complete stack, each class of paths (by bits set) exactly twice its binomial
/// count, and the summary's events are the folded file's.
fn assert_paths_counted(bits: usize, run: &Run) {
    assert!(run.status.success(), "{}", run.stderr);
    assert!(
        run.stdout
            .contains(&format!("paths {} mallocs {}", 1 << bits, 2 << bits)),
        "{}",
        run.stdout
    );
    let folded = run.folded();
    assert_eq!(run.summary_events(), folded.total(), "{}", run.stderr);

    let mut per_path = vec![0u64; 1 << bits];
    let mut per_class = vec![0u64; bits + 1];
    for (frames, count) in &folded.stacks {
        let Some(main) = frames.iter().position(|f| f == "main") else {
            continue; // libc's start-up
        };
        // `descend` is inlined in main and in both path functions: its frames stand
        // between theirs.
        let mut below = frames[main + 1..]
            .iter()
            .map(String::as_str)
            .filter(|f| *f != "descend")
            .peekable();
        let mut chain = Vec::new();
        while let Some(frame) = below.next_if(|f| *f == "path_zero" || *f == "path_one") {
            chain.push(frame);
        }
        if chain.is_empty() {
            continue; // main's own mallocs (stdout's buffer)
        }
        assert_eq!(frames[0], "_start", "incomplete stack: {frames:?}");
        assert_eq!(chain.len(), bits, "{frames:?}");
        let leaf: Vec<&str> = below.collect();
        assert!(
            !leaf.is_empty() && leaf.iter().all(|f| f.contains("malloc")),
            "the chain must end in malloc: {frames:?}"
        );
        // Outermost first: the frame at level k + 1 was chosen by bit k.
        let path = chain
            .iter()
            .enumerate()
            .filter(|(_, f)| **f == "path_one")
            .fold(0usize, |path, (bit, _)| path | 1 << bit);
        per_path[path] += count;
        per_class[path.count_ones() as usize] += count;
    }
    let wrong: Vec<(usize, u64)> = per_path
        .iter()
        .enumerate()
        .filter(|(_, count)| **count != 2)
        .map(|(path, count)| (path, *count))
        .take(10)
        .collect();
    assert!(wrong.is_empty(), "paths not counted twice: {wrong:?}");
    for (ones, count) in per_class.iter().enumerate() {
        assert_eq!(
            *count,
            2 * choose(bits as u64, ones as u64),
            "paths with {ones} bits set"
        );
    }
}

/// Two sessions probe libc's malloc at once, each on its own run of the `paths` fixture:
/// both fixtures take their paths at the same time (they wait for the word on stdin),
/// and each session counts exactly its own target's, none of the other's (an event
/// counted by the wrong session would count a path four times in it).
#[test]
fn two_sessions_side_by_side_count_only_their_own_targets_events() {
    if !bpf_available("two sessions") {
        return;
    }
    const BITS: usize = 14;
    let paths = fixtures::c_fixture("paths");
    let start = |name: &str| {
        let scratch = Scratch::new(name);
        let folded_path = scratch.path("out.folded");
        let mut child = Command::new(binary())
            .args(["uprobe:libc:malloc", "--no-svg", "-q", "-c"])
            .arg(format!("{} {BITS} wait", quoted(&paths)))
            .arg("--folded")
            .arg(&folded_path)
            .current_dir(scratch.dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        stdout.read_line(&mut ready).unwrap();
        assert_eq!(ready, "ready\n");
        (child, stdout, scratch, folded_path)
    };
    let sessions = [start("side-a"), start("side-b")];
    // Both targets are registered and waiting: go.
    let mut sessions: Vec<_> = sessions
        .into_iter()
        .map(|(mut child, stdout, scratch, folded_path)| {
            child.stdin.take().unwrap().write_all(b"g").unwrap();
            (child, stdout, scratch, folded_path)
        })
        .collect();
    for (child, mut stdout, scratch, folded_path) in sessions.drain(..) {
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        let output = child.wait_with_output().unwrap();
        let run = Run {
            status: output.status,
            stdout: rest,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            svg: scratch.path("out.svg"),
            folded_path,
            scratch,
        };
        eprintln!("{}", run.stderr.trim_end());
        assert_paths_counted(BITS, &run);
        run.assert_every_walk_complete();
        assert_summary_lacks(&run, &real_losses());
    }
}

/// Nothing was lost to the stack storage or any other limit: the summary has no
/// losses (events inside execve, kernel stack only, are no loss), and every event it
/// counts is in the folded file, walks that failed included (counted by reason).
fn assert_no_event_lost(run: &Run) {
    assert!(run.status.success(), "{}", run.stderr);
    let losses: Vec<Loss> = real_losses().into_iter().collect();
    assert_summary_lacks(run, &losses);
    let summary = run
        .stderr
        .lines()
        .find(|line| line.contains(" events, "))
        .unwrap();
    for word in ["losses and limits", "stack map", "ring"] {
        assert!(!summary.contains(word), "{summary}");
    }
    let folded = run.folded().total();
    assert_eq!(run.summary_events(), folded, "{}", run.stderr);
    let failed: u64 = summary
        .split_once("walk failures: ")
        .map(|(_, failures)| {
            failures
                .split(';')
                .next()
                .unwrap()
                .split(", ")
                .map(|failure| failure.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
                .sum()
        })
        .unwrap_or(0);
    assert!(failed <= folded, "{summary}");
}

/// 100 short processes (each an exec, ld.so, libc's start-up and `ls`'s mallocs) under
/// malloc's uprobe and a fast profile: hundreds of processes' distinct stacks, none lost.
#[test]
fn a_shell_loop_of_short_processes_loses_no_event() {
    if !bpf_available("shell loop") {
        return;
    }
    let run = trace(
        "shell-loop",
        &["uprobe:libc:malloc", "profile:hz:999"],
        "sh -c 'for i in $(seq 100); do ls / >/dev/null; done'",
        &["--no-svg"],
    );
    assert_no_event_lost(&run);
    // Each ls maps and mallocs: thousands of events at the least.
    assert!(run.summary_events() >= 100 * 10, "{}", run.stderr);
}

/// python3's start-up through a shell wrapper that runs a few tools first, as version
/// managers' shims do (the pyenv case lost 9,752 of 49,614 events to a full
/// stack map): tens of thousands of malloc events in many processes, none lost.
#[test]
fn an_interpreter_started_through_a_shell_wrapper_loses_no_event() {
    if !bpf_available("python wrapper") {
        return;
    }
    let scratch = Scratch::new("python-wrapper");
    let wrapper = scratch.path("python-shim");
    std::fs::write(
        &wrapper,
        "#!/bin/bash\n\
         set -e\n\
         name=$(basename \"$0\")\n\
         dir=$(dirname \"$(readlink -f \"$0\")\")\n\
         real=$(command -v python3)\n\
         test -n \"$name\" -a -d \"$dir\"\n\
         exec env PYTHONDONTWRITEBYTECODE=1 \"$real\" \"$@\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = trace(
        "python",
        &["uprobe:libc:malloc"],
        &format!(
            "{} -c 'import json, re; print(json.dumps([\"started\"]))'",
            quoted(&wrapper)
        ),
        &["--no-svg"],
    );
    assert!(run.stdout.contains("[\"started\"]"), "{}", run.stdout);
    assert_no_event_lost(&run);
    assert!(run.summary_events() >= 10_000, "{}", run.stderr);
}

/// A loop of short children past `--keep-exited`: the counts of the later ones leave
/// the kernel and add up under pid 0, none lost, and since every child runs the same
/// code at its own addresses, its stacks are the others' (stored by object): pid 0 has
/// each stack once, counted once per child.
#[test]
fn exited_processes_past_keep_exited_add_up_under_pid_0() {
    if !bpf_available("keep-exited") {
        return;
    }
    const RUNS: u64 = 6;
    // recurse(64) .. recurse(1): 64 calls a run, each under a stack of its own depth.
    const CALLS: u64 = 64;
    let path = fixtures::c_fixture("chains_c");
    let scratch = Scratch::new("keep-exited-json");
    let json_path = scratch.path("out.json");
    // Each child lives long enough for the session to see it exit (it looks every
    // 200 ms): the sleeps are children too.
    let run = trace(
        "keep-exited",
        &[&format!("uprobe:{}:recurse", path.display())],
        &format!(
            "sh -c 'for i in $(seq {RUNS}); do {} >/dev/null; sleep 0.3; done'",
            quoted(&path)
        ),
        &[
            "--keep-exited",
            "2",
            "--no-svg",
            "--json",
            json_path.to_str().unwrap(),
        ],
    );
    assert!(run.status.success(), "{}", run.stderr);
    run.assert_every_walk_complete();
    assert_eq!(run.summary_events(), RUNS * CALLS, "{}", run.stderr);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let merged = json["summary"]["merged_processes"].as_u64().unwrap();
    // 2 × RUNS children exit; the last one or two may still be running when the
    // target ends.
    assert!(
        merged >= 2 * RUNS - 2 - 2,
        "{merged} merged: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!(
            "{merged} exited processes counted together as pid 0"
        )),
        "{}",
        run.stderr
    );
    let samples = json["samples"].as_array().unwrap();
    let of_pid = |pid: u64| -> Vec<&serde_json::Value> {
        samples
            .iter()
            .filter(|s| s["pid"].as_u64() == Some(pid))
            .collect()
    };
    let pids: std::collections::BTreeSet<u64> =
        samples.iter().map(|s| s["pid"].as_u64().unwrap()).collect();
    assert!(pids.contains(&0), "nothing under pid 0: {pids:?}");
    // pid 0, the two kept apart, and children whose exit was not seen yet.
    assert!(pids.len() <= 1 + 2 + 2, "{pids:?}");
    for pid in pids {
        let samples = of_pid(pid);
        let events: Vec<u64> = samples
            .iter()
            .map(|s| s["values"][0].as_u64().unwrap())
            .collect();
        assert_eq!(samples.len() as u64, CALLS, "pid {pid}: {events:?}");
        // Every stack of the pid counted as often as its children ran.
        let runs = events[0];
        assert!(
            runs >= 1 && events.iter().all(|&n| n == runs),
            "pid {pid}: {events:?}"
        );
        if pid != 0 {
            assert_eq!(runs, 1, "pid {pid} is one process");
        }
    }
}
