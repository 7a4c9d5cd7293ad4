//! End to end: the stack storage under many distinct stacks. The `paths` fixture takes
//! 2^16 distinct call paths to malloc, each twice; under `uprobe:libc:malloc` every one
//! of those events must be counted, under its own whole stack, with no loss of any kind.

mod common;

use cargo_trace_tests::fixtures;
use common::{bpf_available, quoted, trace};

/// The fixture's path bits: 2^BITS distinct stacks, 2^(BITS + 1) mallocs.
const BITS: usize = 16;

/// Binomial coefficient: paths with `k` of their `n` bits set.
fn choose(n: u64, k: u64) -> u64 {
    (0..k).fold(1, |acc, i| acc * (n - i) / (i + 1))
}

#[test]
fn every_one_of_65536_malloc_paths_is_counted_under_its_whole_stack() {
    if !bpf_available("paths") {
        return;
    }
    let paths = fixtures::c_fixture("paths");
    let run = trace(
        "paths",
        &["uprobe:libc:malloc"],
        &format!("{} {BITS}", quoted(&paths)),
        &["--no-svg"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert!(
        run.stdout
            .contains(&format!("paths {} mallocs {}", 1 << BITS, 2 << BITS)),
        "{}",
        run.stdout
    );
    // No walk failure and no loss of any kind (a full map or ring buffer says so here).
    run.assert_every_walk_complete();
    let folded = run.folded();
    assert_eq!(run.summary_events(), folded.total(), "{}", run.stderr);

    let mut per_path = vec![0u64; 1 << BITS];
    let mut per_class = [0u64; BITS + 1];
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
        assert_eq!(chain.len(), BITS, "{frames:?}");
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
            2 * choose(BITS as u64, ones as u64),
            "paths with {ones} bits set"
        );
    }
}
