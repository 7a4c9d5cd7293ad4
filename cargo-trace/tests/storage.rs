//! End to end: the stack storage under many distinct stacks. The `paths` fixture takes
//! 2^N distinct call paths to malloc, each twice; under `uprobe:libc:malloc` every one
//! of those events must be counted, under its own whole stack: with no loss of any kind
//! at 2^16 paths, and exactly as well when the kernel's maps are too small for them.

mod common;

use bpf_prog::{Loss, WalkEnd};
use cargo_trace_tests::fixtures;
use common::{bpf_available, quoted, trace};

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
    assert_summary_lacks(&run, &Loss::ALL);
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
    for loss in [Loss::CountMapFull, Loss::KnownStacksFull] {
        assert!(
            run.stderr.contains(loss.name()),
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

/// Runs the fixture with 2^`bits` paths under `uprobe:libc:malloc` and checks that every
/// path is counted twice under its own complete stack, and each class of paths (by bits
/// set) exactly twice its binomial count.
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
    run
}
