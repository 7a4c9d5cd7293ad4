//! The heap programs under sampling 1 in N: the count of calls kept for their return,
//! which lets the return of a call left out end without a helper call, and a resize's
//! own entry program; the heap statistics of processes that exited, retired from the
//! kernel's maps. Needs root (CAP_BPF, CAP_PERFMON) and gcc; without BPF it prints
//! why it is skipped.

mod common;

use std::collections::HashMap;

use bpf_prog::{alloc_cookie, AllocCounter, AllocKind, AllocOptions, AllocProcess, Options};
use common::{attach_to_function, build_c, executable_mappings, scratch_dir, serial};
use common::{tracer_or_skip, Target};

/// `resize` is probed as a realloc and calls glibc's realloc, probed too: a call that
/// sampling never leaves out at its entry, with a nested one. After 1000 of them, one
/// jumps out (its return never comes), then one more returns.
const RESIZE_C: &str = r#"
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define NOIPA __attribute__((noipa))
#define KEEP(p) __asm__ volatile("" : : "r"(p) : "memory")

static jmp_buf back;

NOIPA void *resize(void *block, size_t size, int jump)
{
	void *moved = realloc(block, size);
	if (jump)
		longjmp(back, 1);
	return moved;
}

/* A frame below main's: the call it leaves is deeper than main's next one. */
NOIPA static void jump_out(void)
{
	void *block = resize(NULL, 64, 1);
	KEEP(block);
}

int main(void)
{
	char go;
	printf("ready\n");
	fflush(stdout);
	if (read(0, &go, 1) != 1)
		return 2;
	for (int i = 0; i < 1000; i++)
		free(resize(malloc(48), 96, 0));
	if (!setjmp(back))
		jump_out();
	free(resize(NULL, 32, 0));
	return 0;
}
"#;

/// Under sampling 1 in 2, every call kept is popped again: by its return, or (the one
/// jumped out of) by the thread's next entry, from a frame above it. The count is back
/// to 0 after the run, and the returns of the kept calls were not taken for those of
/// calls left out: about half the 1001 outermost calls that returned are counted, and
/// none of the reallocs nested in them (a resize left out keeps its call all the same,
/// which its nested calls see).
#[test]
fn every_call_kept_is_popped_and_counted_once() {
    let _serial = serial();
    let options = Options {
        programs: AllocKind::Realloc
            .programs()
            .iter()
            .map(|&(program, _)| program)
            .collect(),
        alloc: AllocOptions {
            sample_every: 2,
            ..AllocOptions::default()
        },
        ..Options::default()
    };
    let Some(tracer) = tracer_or_skip("every_call_kept_is_popped", &options) else {
        return;
    };
    let binary = build_c(&scratch_dir("alloc-resize"), "resize", RESIZE_C, &[]);
    let target = Target::spawn(&binary, &[]);
    let pid = target.pid();
    let libc = executable_mappings(pid)
        .into_iter()
        .map(|m| m.path)
        .find(|path| path.to_string_lossy().contains("libc.so"))
        .expect("the fixture maps libc");
    let cookie = alloc_cookie(1, AllocKind::Realloc);
    let mut links = Vec::new();
    for (file, function) in [(&binary, "resize"), (&libc, "realloc")] {
        for &(program, retprobe) in AllocKind::Realloc.programs() {
            links.push(attach_to_function(
                tracer.program(program),
                pid,
                file,
                function,
                retprobe,
                cookie,
            ));
        }
    }
    target.run_to_end();

    assert_eq!(tracer.alloc_calls_kept(), 0, "calls still counted as kept");
    let allocs: u64 = tracer
        .alloc_processes()
        .expect("read the heap totals")
        .iter()
        .filter(|p| p.pid == pid)
        .map(|p| p.allocs)
        .sum();
    // Binomial(1001, 1/2): mean 500, standard deviation 16.
    assert!(
        (400..=600).contains(&allocs),
        "{allocs} allocations counted of 1001 sampled 1 in 2"
    );
}

/// Allocates 100 blocks of 1013 bytes, frees the first 30 and exits with 70 live.
const LEAK_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define KEEP(p) __asm__ volatile("" : : "r"(p) : "memory")

int main(void)
{
	static void *blocks[100];
	char go;
	printf("ready\n");
	fflush(stdout);
	if (read(0, &go, 1) != 1)
		return 2;
	for (int i = 0; i < 100; i++) {
		blocks[i] = malloc(1013);
		KEEP(blocks[i]);
	}
	for (int i = 0; i < 30; i++)
		free(blocks[i]);
	return 0;
}
"#;

/// Three runs of a process that leaks 70 blocks, each retired once it exited: the first
/// under its own pid, the others together under pid 0. The readers give what they gave
/// before each retirement, summed under pid 0 with the highest peak, and the kernel's
/// maps, sized for one run (its mappings are not registered: one stack a run), take
/// run after run: what a retired process held was released.
#[test]
fn retired_processes_leave_the_heap_maps_with_their_figures() {
    let _serial = serial();
    let programs = [AllocKind::SizeArg0, AllocKind::Free]
        .iter()
        .flat_map(|kind| kind.programs())
        .map(|&(program, _)| program)
        .collect();
    let options = Options {
        programs,
        alloc: AllocOptions {
            max_live_blocks: 120,
            max_stacks: 2,
            max_processes: 2,
            ..AllocOptions::default()
        },
        ..Options::default()
    };
    let Some(tracer) = tracer_or_skip("retired_processes_leave_the_heap_maps", &options) else {
        return;
    };
    let binary = build_c(&scratch_dir("alloc-retire"), "leak", LEAK_C, &[]);
    let mut merged: Vec<AllocProcess> = Vec::new();
    for run in 0..3 {
        let target = Target::spawn(&binary, &[]);
        let pid = target.pid();
        let libc = executable_mappings(pid)
            .into_iter()
            .map(|m| m.path)
            .find(|path| path.to_string_lossy().contains("libc.so"))
            .expect("the fixture maps libc");
        let mut links = Vec::new();
        for (kind, function) in [(AllocKind::SizeArg0, "malloc"), (AllocKind::Free, "free")] {
            for &(program, retprobe) in kind.programs() {
                links.push(attach_to_function(
                    tracer.program(program),
                    pid,
                    &libc,
                    function,
                    retprobe,
                    alloc_cookie(1, kind),
                ));
            }
        }
        target.run_to_end();
        drop(links);

        let process = |pid: u32| -> AllocProcess {
            let found: Vec<AllocProcess> = tracer
                .alloc_processes()
                .expect("read the heap totals")
                .into_iter()
                .filter(|p| p.pid == pid)
                .collect();
            assert_eq!(found.len(), 1, "pid {pid}: {found:?}");
            found[0]
        };
        let stats_of = |pid: u32| {
            let mut stats = tracer.alloc_stats().expect("read the heap statistics");
            stats.retain(|(key, _)| key.pid == pid);
            stats.sort_by_key(|(key, _)| *key);
            stats
        };
        let before = process(pid);
        let stats_before = stats_of(pid);
        // The 100 blocks and stdout's buffer; at the peak all of them live.
        assert!(before.allocs >= 100 && before.frees >= 30, "{before:?}");
        assert_eq!(before.peak_bytes, before.bytes as i64, "{before:?}");
        let to = if run == 0 { pid } else { 0 };
        let went = tracer
            .retire_heap(&HashMap::from([(pid, to)]))
            .expect("retire the process");
        let leaked = before.allocs - before.frees;
        assert!(went as u64 >= 2 + leaked, "{went} kernel entries went");
        if run == 0 {
            assert_eq!(process(pid), before);
            assert_eq!(stats_of(pid), stats_before);
            continue;
        }
        assert!(stats_of(pid).is_empty());
        merged.push(before);
        let total = process(0);
        let sum = |field: fn(&AllocProcess) -> u64| merged.iter().map(field).sum::<u64>();
        assert_eq!(total.allocs, sum(|p| p.allocs));
        assert_eq!(total.bytes, sum(|p| p.bytes));
        assert_eq!(total.frees, sum(|p| p.frees));
        assert_eq!(total.freed_bytes, sum(|p| p.freed_bytes));
        assert_eq!(
            total.live_bytes,
            merged.iter().map(|p| p.live_bytes).sum::<i64>()
        );
        let highest = merged.iter().map(|p| p.peak_bytes).max().unwrap();
        assert_eq!(total.peak_bytes, highest);
        let stacks = stats_of(0);
        let stacks_sum = |field: fn(&bpf_prog::AllocStats) -> i64| {
            stacks.iter().map(|(_, stats)| field(stats)).sum::<i64>()
        };
        assert_eq!(stacks_sum(|s| s.allocs as i64), total.allocs as i64);
        assert_eq!(stacks_sum(|s| s.live_bytes), total.live_bytes);
        // The stacks' bytes at the peak are those of the one process that reached it.
        assert_eq!(stacks_sum(|s| s.peak_bytes), highest);
    }
    let counters = tracer.alloc_counters().expect("read the heap counters");
    for full in [AllocCounter::LiveMapFull, AllocCounter::StatsMapFull] {
        assert_eq!(counters[full as usize], 0, "{full}");
    }
}
