//! In-process recording end to end, through the crate's own `Server`, `PlainTables` and
//! `Recorder`, on the fixtures of `tests/`: exact counts per site, the call chains, leaks
//! to the byte. No root and no BPF needed.

mod common;

use cargo_trace_tests::fixtures::c_fixture;
use preload::Options;
use unwind_tables::walk::WalkEnd;

#[test]
fn heap_storm_counts_every_pair_under_its_whole_chain() {
    let exe = c_fixture("heap_storm");
    let mut run = common::record(&exe, &["20000", "10"], Options::default());
    assert!(run.status.success(), "{}", run.stdout);
    let pid = run.pid;
    let stacks = run.stacks_through(pid, "storm");
    assert_eq!(stacks.len(), 1, "one stack through storm: {:?}", stacks.iter().map(|s| &s.0).collect::<Vec<_>>());
    let (chain, stats) = &stacks[0];
    assert_eq!(chain[0], "malloc", "{chain:?}");
    assert_eq!(chain[1], "storm", "{chain:?}");
    assert_eq!(chain.iter().filter(|n| *n == "descend").count(), 11, "{chain:?}");
    assert_eq!(chain.last().map(String::as_str), Some("_start"), "{chain:?}");
    assert_eq!(stats.allocs, 20000);
    assert_eq!(stats.bytes, 20000 * 48);
    assert_eq!(stats.frees, 20000);
    assert_eq!(stats.live_bytes, 0);
    let counters = run.recorder.counters();
    assert_eq!(counters.unknown_frees, 0, "{counters:?}");
    assert!(counters.memo_hits > 19000, "{counters:?}");
    let stack = run.recorder.stacks().iter().find(|s| s.frames.len() == chain.len()).unwrap();
    assert_eq!(stack.end, WalkEnd::Complete);
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
