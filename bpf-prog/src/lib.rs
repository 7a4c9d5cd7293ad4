//! cargo-trace's BPF side: programs that walk user stacks inside the kernel
//! with unwind tables, every byte layout they share with userspace, and a
//! typed loader ([`Tracer`]).
//!
//! # What it does
//!
//! `src/bpf/trace.bpf.c` holds the event programs, listed once in
//! [`EventProgram`] (`on_uprobe`, `on_uretprobe`, `on_perf_event`,
//! `on_tracepoint`, `on_raw_tracepoint`, `on_kprobe`, `on_off_cpu`
//! (`src/bpf/offcpu.bpf.h`: at every context switch, a traced thread's stacks
//! taken as it leaves the CPU and counted with the nanoseconds it stayed
//! away as it comes back), `on_interval` (`src/bpf/interval.bpf.h`: a timer
//! on one CPU that counts for the target wherever it runs), and
//! `on_uprobe_count`, a uprobe that counts without walking, the benchmark's
//! baseline), and
//! three that follow a traced process's
//! children ([`Tracer::follow_forks`]): `on_fork` and `on_exec` on the
//! scheduler's raw tracepoints, and `on_start_main`, a uprobe on ld.so's
//! `_dl_debug_state` (and libc's `__libc_start_main`) that stops a traced
//! process whose link map just took new libraries, until userspace has
//! registered its mappings ([`Tracer::new_images`]). [`Options::programs`]
//! picks the event programs to load: the verifier's time is most of a
//! session's start. On every event each
//! walking program takes the user registers of the current thread (from the
//! probe context, or from `bpf_task_pt_regs` when a sample or tracepoint
//! fires in kernel mode), walks the stack exactly as `docs/walk.md` says
//! (`src/bpf/walk.bpf.h`; the userspace twin is `unwind_tables::walk`), stores
//! the stack once by hash and adds 1 to the counter of (probe, process, user
//! stack, kernel stack). An event program is two calls, `take_stacks` (walk
//! and store the stacks, return their keys) and `count_event` (add the event
//! and an amount under those keys), so a new one is a small function.
//!
//! # Stack storage
//!
//! The kernel keeps only what it must: the set of stacks it has sent
//! (`known_stacks`: key → check, 16 bytes a stack whatever its depth,
//! allocated on use) and a per-CPU direct-mapped cache of it. A new stack is
//! claimed in the set and sent once, its header and frames only, through the
//! `records` ring buffer; [`Tracer::drain_records`] appends what arrived to an
//! unlinked file (`spill.rs`: nothing is kept in memory per stack while the
//! target runs), which [`Tracer::stack`] and [`Tracer::kernel_stack`] index
//! and read (the session drains about every 20 ms). A
//! user frame is stored as its object's ELF address where the mapping holding
//! it was registered with an object id ([`Mapping::object`], [`Frame`]): a
//! stack is then one stack, under one key, in every process running that code,
//! wherever each was placed, and a program that starts many short processes
//! stores each of its stacks once. The counters stay in the kernel (`counts`,
//! allocated on use) while their processes run and [`Tracer::counts`] reads
//! them; [`Tracer::retire_processes`] moves those of processes that exited to
//! another such file, summed when read. Nothing can fill without saying so, and a full map
//! or ring buffer loses no event:
//! - ring buffer full for a new stack: the claim is withdrawn, so the next
//!   event with that stack sends it again; the event is counted under the
//!   stack's key all the same ([`Loss::StackRingFull`]), and a stack that
//!   never arrives is missing from [`Tracer::stack`];
//! - set of known stacks full: the stack is sent without a claim, each time
//!   it is met ([`Loss::KnownStacksFull`]);
//! - counts map full: the event goes through the ring buffer as a count
//!   record that [`Tracer::counts`] adds ([`Loss::CountMapFull`]); lost only
//!   if the ring buffer is full too ([`Loss::CountLost`]).
//!
//! [`Options::max_stacks`], [`Options::max_counts`] and
//! [`Options::record_ring_bytes`] raise each.
//!
//! The heap profiler's programs (`src/bpf/alloc.bpf.h`, the [`alloc_cookie`] and
//! readers in the `alloc` module): `on_alloc` at an allocating function's entry
//! (`on_resize` at a realloc's) walks the stack with the same `take_stacks` and keeps its
//! key and the size in the thread's task storage (nested allocator calls are told apart
//! by the stack pointer);
//! `on_alloc_return` tracks the block returned by (process, address) and counts it under
//! (stack, process, probe) with log2 size buckets; `on_free`
//! removes a block at the free's entry and counts its free, lifetime bucket and whether
//! it was a temporary.
//! Userspace reads [`Tracer::alloc_stats`], [`Tracer::alloc_processes`] and
//! [`Tracer::alloc_counters`] (what could not be paired or kept);
//! [`Tracer::retire_heap`] moves the statistics of processes that exited to the
//! tracer's own store and deletes their live blocks, as [`Tracer::retire_processes`]
//! does their counters, and the readers add that store to the kernel's maps.
//!
//! Every way a walk can stop is counted in `walk_ends`
//! ([`Tracer::walk_ends`], by [`WalkEnd`], the type both walkers share), and
//! the frames found before the stop are stored with it ([`Stack::end`]): a
//! partial stack is never dropped. What an event lost apart from its walk is
//! counted in `losses` ([`Tracer::losses`], by [`Loss`]). A hash collision
//! between distinct stacks is detected by a second, independent hash (the
//! check), counted, and the second stack is stored under the next key.
//! Kernel stacks (`bpf_get_stack`) are stored the same way, in the same set.
//!
//! Programs interrupt each other: a uprobe program runs preemptible with
//! interrupts on, so a perf event program (or another task's uprobe) may
//! walk in the middle of its walk. Each walk claims one of `CT_NEST_LEVELS`
//! levels of its CPU (an atomic bit mask), with its own scratch and page
//! slots; only level 0 reads and fills the rule cache.
//!
//! # What it does not do
//!
//! - Compile tables (the `unwind-tables` crate does), read `/proc`, ELF
//!   files or symbols: callers hand in [`unwind_tables::CompactTable`]s and
//!   [`Mapping`]s.
//! - Attach: [`Tracer::program`] returns the programs; the `probes`
//!   crate attaches them (the attach cookie becomes the probe id). A perf
//!   event fd given to `attach_perf_event*` belongs to the link afterwards:
//!   libbpf closes it when the link drops.
//! - Remove tables: they are loaded once per object and shared.
//! - Fill [`Count::amount`] but for `on_off_cpu` (nanoseconds off the CPU).
//!
//! # Data flow
//!
//! ```text
//! CompactTable --add_table--> rows / pages / rules (mmapped arrays, memcpy)
//!                             tables[id] = { where its rows, pages, rules start }
//! /proc maps   --set_mappings-> procs[tgid] = sorted { start, end, bias, table id }
//! filter_pid   --------------> pid_filter[tgid]   (perf events, tracepoints; uprobes
//!                                                with Options::filter_uprobes)
//! fork of a filtered tgid ---> pid_filter[child], procs[child] = procs[parent], parents[child]
//! exec of a filtered tgid ---> procs[tgid] deleted, stop, new_images <- tgid
//!
//! link map consistent (ld.so) -> stop, new_images <- tgid
//!
//! event -> user regs -> walk (bpf_loop, <= 512 frames) -> new? known_stacks[hash] = check,
//!                                                         records <- frames + walk end
//!       -> kernel stack (kernel-mode events)           -> new? known_stacks[khash] = check,
//!                                                         records <- frames
//!                                                      -> counts[{hash, khash, tgid, probe}] += 1
//!                                                      -> walk_ends[end] += 1
//! records --drain_records--> the tracer's store of stacks (and overflowing counts)
//! ```
//!
//! Per frame: the rule for the address from a per-CPU rule cache keyed by
//! (address, generation of the process's mappings: every [`Tracer::set_mappings`]
//! gets a new one) that holds it resolved, or, on a miss, the mapping holding
//! the pc (the previous frame's mapping is tried first, then a branch-free
//! binary search of the process's sorted mappings), the table's 64 KiB page
//! and a branch-free binary search of its rows (a merged push/pop row,
//! `CT_RULE_CFA_RSP_STEPS`, also takes the address's offset in it); then the
//! rule is applied with reads of the user stack served from a per-walk cache
//! of 4 KiB pages, each copied from just under the first address read in it
//! to its end (one `bpf_probe_read_user` costs ~90 ns on the machines
//! measured, as much as everything else in a frame), and read a word at a
//! time (an aligned load; misaligned addresses are read directly). The page
//! slots of a walk and the rule cache of a CPU are each one map element,
//! looked up once per walk. The walk's state and stack live in a per-CPU
//! map, which also keeps the verifier's work to one pass over the loop body.
//! `benches/uprobe.rs` measures the costs under a uprobe, `benches/walk.rs`
//! the walk alone (BPF_PROG_TEST_RUN on the benchmark's own stack).
//!
//! A thread that meets the same stack again (a hot uprobe, an allocation in a
//! loop) is not walked again: at level 0 a per-CPU walk memo (`memo.bpf.h`)
//! keeps, for recent walks that ended complete with their stack known, where
//! they started (process, mappings generation, rip, rsp, rbp if a rule used it)
//! and every word of user memory they read; an event that starts the same way
//! reads those words again in one `bpf_probe_read_user`, and if none changed
//! takes the walk's stack key, counted as a complete walk
//! ([`Tracer::memo_hits`] says how many were).
//!
//! # Layouts
//!
//! `src/bpf/cargo_trace.h` is the single definition of every map key and
//! value. [`layout`] mirrors each struct and constant and checks them at
//! compile time against the types libbpf-cargo generates from the object's
//! BTF, so the two sides cannot drift apart silently.
//!
//! # Building without clang
//!
//! `build.rs` compiles the C with the first clang it finds (`$BPF_CLANG`,
//! `clang`, `clang-19` … `clang-14`) through libbpf-cargo, against the
//! committed `src/bpf/vmlinux.h` (from `bpftool btf dump file
//! /sys/kernel/btf/vmlinux format c`; CO-RE relocates the few kernel fields
//! used). A machine without clang builds from the committed
//! `src/bpf/prebuilt/trace.bpf.o` instead, but only if the source hash
//! recorded beside it (`trace.bpf.o.source-hash`) matches the current sources;
//! otherwise the build fails and says how to refresh it
//! (`BPF_PROG_UPDATE_PREBUILT=1 cargo build -p bpf-prog` on a machine with
//! clang). The test `prebuilt_object_matches_the_sources` fails in CI when
//! someone changes the C or the header without refreshing the object, and
//! `prebuilt_object_loads` proves the committed object passes the verifier.
//! Hashes rather than bytes are compared because clang versions emit
//! different bytes for the same source. [`OBJECT_ORIGIN`] says which path a
//! build took; `BPF_PROG_USE_PREBUILT=1` forces the prebuilt one.
//!
//! # Requirements
//!
//! Linux 6.1 or later with BTF (`bpf_loop`, `bpf_task_pt_regs`, attach
//! cookies, non-preallocated hash maps in perf-event programs), and
//! CAP_BPF + CAP_PERFMON (or root). RLIMIT_MEMLOCK is not touched: kernels of
//! that age account BPF memory to the memory cgroup.

mod alloc;
mod error;
mod heap;
pub mod layout;
mod mappings;
mod programs;
mod records;
mod retired_heap;
mod spill;
mod sys;
mod tracer;

#[allow(clippy::all, clippy::pedantic, missing_docs, unsafe_op_in_unsafe_fn)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/trace.skel.rs"));
}

pub use error::{Error, Result, TableMap};
pub use heap::{
    alloc_cookie, AllocCounter, AllocKey, AllocKind, AllocOptions, AllocProcess, AllocStats,
    Estimated, ALLOC_BUCKETS,
};
pub use layout::{KSTACK_DEPTH, MAX_FRAMES, MAX_MAPPINGS, START_MAIN_COOKIE};
pub use mappings::{FileMapping, Mapping, TableId};
pub use programs::{kernel_has_btf_tracepoint, EventProgram};
pub use records::{Count, CountKey, Frame, Loss, ObjectId, Stack, StackRef, WalkCounters};
pub use sys::{enable_run_time_stats, ProgramStats};
pub use tracer::{monotonic_ns, LoadTimes, Options, StackStorage, TableUsage, Tracer};
/// How a walk ended: the one type both walkers use.
pub use unwind_tables::walk::WalkEnd;

/// Where the BPF object embedded in this build came from: "compiled with
/// clang-NN" or "prebuilt" (see the crate docs).
pub const OBJECT_ORIGIN: &str = env!("BPF_PROG_OBJECT_ORIGIN");

/// Hash of the BPF sources this build was made from.
pub const SOURCE_HASH: &str = env!("BPF_PROG_SOURCE_HASH");
