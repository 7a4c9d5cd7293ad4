//! The one list of event programs: for each, its kind, its program in the skeleton, the
//! name its statistics go by, and what its events are called. [`Tracer::load`] loads the
//! kinds [`Options::programs`] names, [`Tracer::program`] hands them out to attach, and
//! [`Tracer::program_stats`] reports them. Adding a probe kind is one line here (and the
//! probe spec's mapping onto it).
//!
//! [`Tracer::load`]: crate::Tracer::load
//! [`Tracer::program`]: crate::Tracer::program
//! [`Tracer::program_stats`]: crate::Tracer::program_stats
//! [`Options::programs`]: crate::Options::programs

use libbpf_rs::{OpenProgramMut, ProgramMut};

use crate::skel::{OpenTraceProgs, TraceProgs};

macro_rules! event_programs {
    ($($(#[doc = $doc:literal])* $kind:ident => $program:ident, $count_name:literal;)*) => {
        /// An event program of the BPF object (see the crate docs for what each does).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum EventProgram {
            $($(#[doc = $doc])* $kind,)*
        }

        impl EventProgram {
            /// Every event program.
            pub const ALL: &'static [EventProgram] = &[$(EventProgram::$kind),*];

            /// The program's name in the object, as its statistics go by.
            pub fn name(self) -> &'static str {
                match self {
                    $(EventProgram::$kind => stringify!($program),)*
                }
            }

            /// What one of its events is called in reports: "samples" for perf events,
            /// "events" for the others.
            pub fn count_name(self) -> &'static str {
                match self {
                    $(EventProgram::$kind => $count_name,)*
                }
            }

            pub(crate) fn of<'a, 'obj>(self, progs: &'a TraceProgs<'obj>) -> &'a ProgramMut<'obj> {
                match self {
                    $(EventProgram::$kind => &progs.$program,)*
                }
            }

            pub(crate) fn of_open<'a, 'obj>(
                self,
                progs: &'a mut OpenTraceProgs<'obj>,
            ) -> &'a mut OpenProgramMut<'obj> {
                match self {
                    $(EventProgram::$kind => &mut progs.$program,)*
                }
            }
        }
    };
}

event_programs! {
    /// A uprobe (`attach_uprobe_with_opts`); the cookie becomes the probe id of its counts.
    Uprobe => on_uprobe, "events";
    /// A uretprobe (`retprobe: true`): the stack from the return site.
    Uretprobe => on_uretprobe, "events";
    /// A uprobe that only counts, without a stack: the benchmarks' baseline.
    UprobeCount => on_uprobe_count, "events";
    /// Perf events (`attach_perf_event_with_opts`), e.g. a software cpu-clock event per CPU.
    PerfEvent => on_perf_event, "samples";
    /// A tracepoint (`attach_tracepoint_with_opts`).
    Tracepoint => on_tracepoint, "events";
    /// A kprobe or kretprobe (`attach_kprobe_with_opts`).
    Kprobe => on_kprobe, "events";
    /// A raw tracepoint (`attach_raw_tracepoint_with_opts`).
    RawTracepoint => on_raw_tracepoint, "events";
    /// An allocating function's entry (heap profiling, `alloc.bpf.h`): the stack and size
    /// kept for its return. The cookie is [`alloc_cookie`](crate::alloc_cookie)'s; which
    /// functions take which entry program, [`AllocKind::programs`](crate::AllocKind::programs).
    AllocEntry => on_alloc, "allocations";
    /// The entry of a function that resizes a block (realloc): as `AllocEntry`, and the old
    /// block freed, even in a call that sampling leaves out.
    ResizeEntry => on_resize, "allocations";
    /// An allocating function's return: the block tracked and counted.
    AllocReturn => on_alloc_return, "allocations";
    /// A freeing function's entry: the block's free counted.
    Free => on_free, "frees";
    /// The same, past instructions that copied the address to the second argument register.
    FreeArg1 => on_free_arg1, "frees";
    /// The preloaded library's site after an allocation (`cargo_trace_allocated`): the
    /// call's entry and return at once, the stack walked from the library's wrapper.
    PreloadAlloc => on_preload_alloc, "allocations";
    /// The preloaded library's site before a realloc (`cargo_trace_resizing`): as
    /// `ResizeEntry`.
    PreloadResize => on_preload_resize, "allocations";
    /// The preloaded library's site after a realloc (`cargo_trace_resized`): as
    /// `AllocReturn`.
    PreloadResized => on_preload_resized, "allocations";
    /// The preloaded library's site for a thread's full log of frees (`cargo_trace_freed`):
    /// the frees counted.
    PreloadFreed => on_preload_freed, "logs";
    /// The preloaded library's site that says where a thread logs its frees
    /// (`cargo_trace_log`), for its exit.
    PreloadLog => on_preload_log, "threads";
    /// The `sched_process_exit` BTF tracepoint: a thread's logged frees counted at its exit.
    ThreadExit => on_thread_exit, "exits";
    /// The `sched_prepare_exec` BTF tracepoint: a thread's logged frees counted before its
    /// exec replaces the memory they are in.
    ThreadExec => on_thread_exec, "execs";
    /// Off-CPU time, on the `sched_switch` raw tracepoint: an event is a traced thread's
    /// stay off the CPU, its amount the nanoseconds it lasted
    /// ([`Options::off_cpu_min_block_ns`](crate::Options::off_cpu_min_block_ns) and more).
    OffCpu => on_off_cpu, "blocks";
    /// An `interval` timer (one cpu-clock perf event): a firing while a traced process
    /// runs on its CPU is a sample with stacks, any other is counted for the target set
    /// with [`Tracer::set_interval_target`](crate::Tracer::set_interval_target), without
    /// stacks; none is counted while no target is set.
    Interval => on_interval, "firings";
}

/// The programs that follow children, loaded whatever [`Options::programs`] says, by name
/// (for [`Tracer::program_stats`](crate::Tracer::program_stats)).
///
/// [`Options::programs`]: crate::Options::programs
pub(crate) fn child_programs<'a, 'obj>(
    progs: &'a TraceProgs<'obj>,
) -> [(&'static str, &'a ProgramMut<'obj>); 3] {
    [
        ("on_fork", &progs.on_fork),
        ("on_exec", &progs.on_exec),
        ("on_start_main", &progs.on_start_main),
    ]
}

/// Whether the running kernel has the BTF tracepoint `name` (a `tp_btf/` program of
/// `name` can be loaded): `sched_prepare_exec` came with Linux 6.10.
pub fn kernel_has_btf_tracepoint(name: &str) -> bool {
    libbpf_rs::btf::Btf::from_vmlinux().is_ok_and(|btf| {
        btf.type_by_name::<libbpf_rs::btf::BtfType<'_>>(&format!("btf_trace_{name}"))
            .is_some()
    })
}
