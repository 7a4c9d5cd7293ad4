//! The heap programs under sampling 1 in N: the count of calls kept for their return,
//! which lets the return of a call left out end without a helper call, and a resize's
//! own entry program. Needs root (CAP_BPF, CAP_PERFMON) and gcc; without BPF it prints
//! why it is skipped.

mod common;

use bpf_prog::{alloc_cookie, AllocKind, AllocOptions, Options};
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
