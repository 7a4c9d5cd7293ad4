//! How stacks are collected: the one interface between a session and a collector.
//!
//! A collector watches the traced processes and counts what happens in them with the
//! stacks it happened under: the BPF programs ([`bpf::BpfCollector`]: every probe kind,
//! stacks walked in the kernel) and, for a launched target's heap, the preloaded library
//! that records allocations in the process itself. The session drives each through
//! [`Collector`] — it never sees a BPF map or a shared-memory ring — and symbolizes
//! what each hands over ([`Collected`]) into one profile: frames are typed values
//! ([`UserFrame`]: an object's ELF address, or a runtime address), never encoded words,
//! so a new collector plugs in without touching the symbolizer, the phases or the
//! writers.
//!
//! Lifecycle, in the session's phases:
//!
//! ```text
//! Prepared: Collector::new ... (loads, may give the target's environment)
//!           target launched, held at its entry (or attached with -p)
//!           attach(target)                          tables registered, probes attached
//! Running:  start(); poll() at every wake-up (wake_fd)  new processes, stacks, mappings
//!           collected(Snapshot) on SIGUSR1; heap_now() for the timeline
//! Finished: end(); stop()                           nothing fires any more
//!           collected(Final)
//! ```

pub mod bpf;
mod execs;
pub mod inprocess;

use std::collections::HashMap;

use profile::{HeapProcess, Lost};

pub use crate::frame::UserFrame;

/// A user stack, innermost first: `frames[0]` is where the event happened, the others
/// are return addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserStack {
    pub frames: Vec<UserFrame>,
    /// Why the stack ends before its end, if it does ("read fault", "stack lost: ..."):
    /// the frames found before the stop are kept.
    pub truncated: Option<String>,
}

/// Events of one probe in one process under one pair of stacks.
#[derive(Clone, Debug)]
pub struct EventCount {
    /// Index into the session's probes.
    pub probe: usize,
    pub pid: u32,
    pub user: UserStack,
    /// Kernel addresses, innermost first (events in kernel mode).
    pub kernel: Vec<u64>,
    pub events: u64,
    /// What the events weigh beside their number (nanoseconds off the CPU).
    pub amount: u64,
}

/// The heap's figures of one stack in one process, as the heap probes count them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeapStats {
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    /// Blocks freed sooner than the temporary threshold after their allocation.
    pub temporaries: u64,
    /// Blocks counted but not tracked (no room): never freed or leaked.
    pub untracked: u64,
    /// Blocks and bytes live now (at the end: leaked).
    pub live_blocks: u64,
    pub live_bytes: i64,
    /// The sum of the live blocks' birth times, in microseconds of CLOCK_MONOTONIC.
    pub live_birth_us: u64,
    /// This stack's live bytes when its process's live bytes peaked.
    pub peak_bytes: i64,
    /// Allocations by size and frees by lifetime in nanoseconds: bucket k counts
    /// values of bit length k ([`profile::heap::BUCKETS`]).
    pub size_hist: Vec<u64>,
    pub life_hist: Vec<u64>,
    /// Under sampling, what the counted events stand for.
    pub estimated: Option<Estimated>,
}

/// Unbiased estimates of a sampled stack's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimated {
    pub allocs: f64,
    pub bytes: u64,
    pub frees: f64,
    pub freed_bytes: u64,
}

/// One stack's heap figures.
#[derive(Clone, Debug)]
pub struct HeapCount {
    pub probe: usize,
    pub pid: u32,
    pub user: UserStack,
    pub stats: HeapStats,
}

/// What a collector counted of the heap.
#[derive(Clone, Debug, Default)]
pub struct HeapCollected {
    pub stacks: Vec<HeapCount>,
    /// Each process's totals (peaks as counted: unscaled by sampling).
    pub processes: Vec<HeapProcess>,
    /// What could not be paired or kept, with the options that raise each limit.
    pub lost: Vec<Lost>,
    /// The clock the live blocks' birth times are on, now (CLOCK_MONOTONIC ns).
    pub now_ns: u64,
    /// Anonymous memory mapped apart from the heap blocks, where it was told apart.
    pub mapped: Option<profile::MappedMemory>,
    /// The preloaded library's memory, where it recorded in the processes.
    pub in_process: Option<profile::RecorderMemory>,
}

/// How the stack walks of a collector ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walks {
    /// Walks that ended before the end of the stack, by reason, in the walker's order.
    pub failures: Vec<(String, u64)>,
    /// Every walk.
    pub total: u64,
    /// Walks answered by a memo of an earlier one.
    pub memo_hits: u64,
}

/// Everything a collector counted, at the end or as of now.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub events: Vec<EventCount>,
    pub heap: Option<HeapCollected>,
    pub walks: Walks,
    /// Limits met and information lost, by kind (the summary names the options that
    /// raise each).
    pub losses: crate::limits::Counts,
    /// Events counted with their kernel stack only: inside execve, no user stack left.
    pub in_exec: u64,
    /// Events with no user stack to walk, by what they are.
    pub no_user_stack: Vec<(String, u64)>,
    /// Exited processes counted together under [`profile::MERGED_PID`].
    pub merged_processes: u64,
    /// Each followed child's parent.
    pub parents: HashMap<u32, u32>,
    /// Warnings to print once, before the summary.
    pub warnings: Vec<String>,
    /// Which allocators the heap probes counted in which process, and what they missed.
    pub allocators: Vec<profile::ProcessAllocators>,
}

/// Whether [`Collector::collected`] is the end of tracing or a look while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    Final,
    Snapshot,
}

/// The target as the session holds it while collectors attach.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub pid: u32,
    /// Launched by the session (held at its entry point), rather than attached with `-p`.
    pub launched: bool,
}

/// The heap of the traced processes right now, for the timeline and the live view.
#[derive(Clone, Debug, Default)]
pub struct HeapNow {
    pub live_bytes: i64,
    pub allocs: u64,
    pub frees: u64,
    pub pids: Vec<u32>,
}

/// What the session asks of a way of collecting stacks. Every collector registers the
/// processes' code through the session's tables (`tables::SharedTables`, given when it
/// is made), so that every collector gives an object the same id and the symbolizer
/// reads every collector's frames alike.
pub trait Collector {
    /// Variables the launched target's environment needs (e.g. `LD_PRELOAD`).
    fn environment(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        Vec::new()
    }

    /// The target is held at its entry point (or found, with `-p`): register what
    /// collecting needs, attach.
    fn attach(&mut self, target: Target) -> anyhow::Result<()>;

    /// Tracing starts: the target is let run now.
    fn start(&mut self) -> anyhow::Result<()>;

    /// What to wake the running phase up on, besides the target's end and a timeout: a
    /// descriptor readable when this collector has work.
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// One wake-up of the running phase: take what arrived (new processes, stacks,
    /// mappings), without waiting.
    fn poll(&mut self);

    /// The span ends: what counts per unit of the session's time (an interval's
    /// firings) counts no more. What was attached stays until [`Collector::stop`].
    fn end(&mut self) {}

    /// Tracing stops: nothing is counted any more, what was held is let go.
    fn stop(&mut self);

    /// Everything counted (at the end, or as of now for a snapshot).
    fn collected(&mut self, when: When) -> anyhow::Result<Collected>;

    /// Stack walks so far and the processes traced now, for the progress line and the
    /// events over time.
    fn walks_so_far(&self) -> Option<(u64, u64)>;

    /// Processes traced now.
    fn processes(&self) -> usize;

    /// Traced processes other than the target still running (at the end).
    fn still_running(&self, target: u32) -> Vec<u32>;

    /// The heap right now, if this collector counts it.
    fn heap_now(&self) -> Option<HeapNow> {
        None
    }

    /// The heap's top live stacks now, for the live view (`--interval`).
    fn heap_live(&self) -> anyhow::Result<Vec<HeapCount>> {
        Ok(Vec::new())
    }

    /// Lines to print at the end about what the collector cost (`--bpf-stats`).
    fn cost_report(&self) -> anyhow::Result<Vec<String>> {
        Ok(Vec::new())
    }
}
