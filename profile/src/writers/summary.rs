//! The closing line of a run: events, distinct stacks, processes, time, and every way
//! an event lost information.

use std::fmt::Write as _;

use crate::Profile;

/// `cargo-trace: N events, M distinct stacks[ from P processes] in T s; ...`: the total
/// of the count values (events, samples, blocks), the distinct stacks (probe, process and frames), and either
/// that every walk reached the end of the stack or each failure with its count; then each
/// loss and limit met, with the options that raise it.
pub fn line(profile: &Profile) -> String {
    // Events are the count values (a value in nanoseconds is no count of events); a
    // run's count values never count one event twice.
    let events: i64 = (0..profile.value_types.len())
        .filter(|&index| profile.value_types[index].unit == "count")
        .map(|index| profile.total(index))
        .sum();
    let mut line = format!(
        "cargo-trace: {events} events, {} distinct stacks",
        profile.samples.len()
    );
    let processes = profile.processes();
    if processes > 1 {
        let _ = write!(line, " from {processes} processes");
    }
    let _ = write!(line, " in {:.2} s", profile.metadata.duration.as_secs_f64());
    let failures = &profile.summary.failures;
    if failures.is_empty() {
        line.push_str("; every stack walk reached the end of the stack");
    } else {
        line.push_str("; walk failures: ");
        let listed: Vec<String> = failures
            .iter()
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect();
        line.push_str(&listed.join(", "));
    }
    let losses = &profile.summary.losses;
    if !losses.is_empty() {
        line.push_str("; losses and limits: ");
        let listed: Vec<String> = losses.iter().map(ToString::to_string).collect();
        line.push_str(&listed.join(", "));
    }
    let no_user_stack = &profile.summary.no_user_stack;
    if !no_user_stack.is_empty() {
        let total: u64 = no_user_stack.iter().map(|(_, count)| count).sum();
        let listed: Vec<String> = no_user_stack
            .iter()
            .map(|(what, count)| format!("{what} {count}"))
            .collect();
        let _ = write!(
            line,
            "; {total} with no user stack to walk: {}",
            listed.join(", ")
        );
    }
    let in_exec = profile.summary.in_exec;
    if in_exec > 0 {
        let _ = write!(
            line,
            "; {in_exec} in execve with no user stack left to walk (kernel stack only)"
        );
    }
    let merged = profile.summary.merged_processes;
    if merged > 0 {
        let _ = write!(
            line,
            "; {merged} exited processes counted together as pid 0 (--keep-exited raises \
             the processes kept apart)"
        );
    }
    if let Some(heap) = &profile.heap {
        if let Some(allocators) = allocators_counted(&heap.allocators) {
            let _ = write!(line, "; allocators: {allocators}");
        }
    }
    let own = profile.summary.not_the_targets;
    if own > 0 {
        let _ = write!(
            line,
            "; {own} taken in cargo-trace's entry breakpoint, not counted"
        );
    }
    line
}

/// Each allocator counted, with the processes it was counted in where there are
/// several: `libc by its functions (3 processes), jemalloc (_rjem_) in /x by its
/// functions (1 process)`; `None` where the collectors did not say.
fn allocators_counted(entries: &[crate::ProcessAllocators]) -> Option<String> {
    let mut counted: Vec<(&crate::AllocatorCounted, u64)> = Vec::new();
    for entry in entries {
        for allocator in &entry.allocators {
            match counted.iter_mut().find(|(a, _)| *a == allocator) {
                Some((_, processes)) => *processes += entry.processes,
                None => counted.push((allocator, entry.processes)),
            }
        }
    }
    if counted.is_empty() {
        return None;
    }
    let several = entries.iter().map(|e| e.processes).sum::<u64>() > 1;
    let listed: Vec<String> = counted
        .iter()
        .map(|(allocator, processes)| match (several, processes) {
            (false, _) => allocator.to_string(),
            (true, 1) => format!("{allocator} (1 process)"),
            (true, n) => format!("{allocator} ({n} processes)"),
        })
        .collect();
    Some(listed.join(", "))
}

/// One note per object without an unwind table (not for `[anon]`-like pseudo objects).
pub fn notes(profile: &Profile) -> Vec<String> {
    let mut notes: Vec<String> = profile
        .summary
        .without_table
        .iter()
        .filter(|(name, _)| !name.starts_with('['))
        .map(|(name, reason)| format!("cargo-trace: note: no unwind table for {name}: {reason}"))
        .collect();
    let mapped = profile.heap.as_ref().and_then(|heap| heap.mapped.as_ref());
    if let Some(mapped) = mapped.filter(|m| m.total().maps > 0) {
        notes.push(format!(
            "cargo-trace: note: mapped memory (anonymous mmap) {}: {}",
            if mapped.counted {
                "counted as heap blocks"
            } else {
                "apart from the heap (--mmap counts it)"
            },
            mapped.describe()
        ));
    }
    if let Some(memory) = profile
        .heap
        .as_ref()
        .and_then(|heap| heap.in_process.as_ref())
    {
        notes.push(format!(
            "cargo-trace: note: recorded in the process by the preloaded library: its memory {}",
            memory.describe()
        ));
    }
    notes
}
