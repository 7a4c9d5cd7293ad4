//! The stack storage when its ring buffer is full: no event may be lost, and every event
//! counted under a stack that never arrived must be owned up to.
//!
//! Needs root (CAP_BPF, CAP_PERFMON) and gcc; without BPF it prints why it is skipped.

mod common;

use std::collections::HashSet;

use bpf_prog::{EventProgram, Loss, Options, StackRef, WalkEnd};
use common::{executable_mappings, register_process, serial, tracer_or_skip, Target};

/// The `paths` fixture's 2^8 paths (each taken twice) into a ring buffer of one page that
/// nobody drains while they run: it fills after a few stacks. Every event is counted all
/// the same, and the events counted under stacks that never arrived are exactly those the
/// loss counter reports (each of them failed to send its stack, or met it unsent).
#[test]
fn a_full_ring_buffer_loses_no_event_and_says_which_stacks_are_missing() {
    let _serial = serial();
    let options = Options {
        max_rows: 1 << 20,
        record_ring_bytes: 4096,
        programs: [EventProgram::Uprobe].into(),
        ..Options::default()
    };
    let Some(mut tracer) = tracer_or_skip("a_full_ring_buffer_loses_no_event", &options) else {
        return;
    };
    let bits = 8;
    let paths = cargo_trace_tests::fixtures::c_fixture("paths");
    let target = Target::spawn(&paths, &[bits.to_string(), "wait".to_string()]);
    let pid = target.pid();
    register_process(&mut tracer, pid, |_| false);
    let libc = executable_mappings(pid)
        .into_iter()
        .map(|m| m.path)
        .find(|path| path.to_string_lossy().contains("libc.so"))
        .expect("the fixture maps libc");
    let _link = common::attach_to_function(
        tracer.program(EventProgram::Uprobe),
        pid,
        &libc,
        "malloc",
        false,
        1,
    );
    target.start().wait_for_exit();

    let counts = tracer.counts().expect("read the counts");
    let losses = tracer.losses().expect("read the losses");
    let events: u64 = counts.iter().map(|(_, count)| count.events).sum();
    assert!(events >= 2 << bits, "{events} events");
    assert_eq!(tracer.walk_ends().unwrap().get(WalkEnd::Complete), events);
    let mut received = HashSet::new();
    let mut missing_events = 0;
    for (key, count) in &counts {
        let StackRef::Hash(hash) = key.stack else {
            panic!("an event without its stack key: {key:?}");
        };
        match tracer.stack(hash).expect("read a stack") {
            Some(stack) => {
                assert!(stack.is_complete());
                received.insert(hash);
            }
            None => missing_events += count.events,
        }
    }
    println!(
        "{events} events, {} stacks received, {missing_events} events under stacks that \
         never arrived; losses {losses:?}",
        received.len()
    );
    assert!(missing_events > 0, "the ring buffer never filled");
    assert!(!received.is_empty(), "no stack fitted in the ring buffer");
    assert_eq!(losses[Loss::StackRingFull as usize], missing_events);
    for loss in [Loss::CountLost, Loss::StackNotStored, Loss::KnownStacksFull] {
        assert_eq!(losses[loss as usize], 0, "{loss}");
    }
}
