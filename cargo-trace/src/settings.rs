//! What a session is asked to do, as plain data: the command line becomes these once
//! (`cli.rs`), and nothing below the top of the program reads the command line itself.

use std::path::PathBuf;
use std::time::Duration;

use profile::heap::{Metric, OrderBy};
use profile::writers::Format;

use crate::cargo::CargoBuild;

/// A session's settings: what to trace, for how long, and the capacities of what is
/// counted.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The probes as the user wrote them (comma lists not yet split).
    pub probes: Vec<String>,
    pub target: TargetSpec,
    /// Stop tracing after this long.
    pub duration: Option<Duration>,
    /// Trace the processes the target starts too.
    pub follow_forks: bool,
    /// Accept uprobes at addresses nothing can check.
    pub unsafe_addresses: bool,
    /// Count what the BPF programs cost and report it.
    pub bpf_stats: bool,
    /// Report where the session's time went (`--timings`).
    pub timings: bool,
    /// No progress line.
    pub quiet: bool,
    /// Exited processes whose counts stay apart, each under its own pid.
    pub keep_exited: usize,
    /// With `offcpu`: stays off the CPU shorter than this are not counted.
    pub min_block_ns: u64,
    pub capacities: Capacities,
    pub heap: HeapSettings,
}

/// What to trace.
#[derive(Clone, Debug)]
pub enum TargetSpec {
    /// A command to launch.
    Command(Vec<String>),
    /// The executable cargo builds, launched with these arguments.
    Cargo {
        build: CargoBuild,
        args: Vec<String>,
    },
    /// A running process.
    Pid(u32),
}

/// The sizes of what the collectors fill, each raised by a command-line option
/// (`limits.rs` names which).
#[derive(Clone, Copy, Debug)]
pub struct Capacities {
    pub max_stacks: u32,
    pub max_counts: u32,
    pub max_processes: u32,
    pub max_files: u32,
    pub max_off_cpu_threads: u32,
    pub max_table_rows: u32,
    pub max_table_pages: u32,
    pub max_table_rules: u32,
    pub max_tables: u32,
    pub ring_buffer_bytes: u32,
}

/// Heap profiling's settings (with an `alloc` probe).
#[derive(Clone, Debug, Default)]
pub struct HeapSettings {
    /// The prefix of the allocator's functions (`je_`).
    pub alloc_prefix: Option<String>,
    /// Live blocks tracked at once.
    /// `None`: the path's own default.
    pub max_live_blocks: Option<u32>,
    /// Distinct (stack, process) statistics kept.
    pub max_stacks: u32,
    /// Blocks freed sooner than this are temporaries.
    pub temporary: Duration,
    /// Count 1 in N allocating calls (0: all).
    pub sample_every: u32,
    /// Count about one allocation per this many bytes (0: all).
    pub sample_bytes: u64,
    /// Count only allocations of at least / at most this many bytes (0: no bound).
    pub min_size: u64,
    pub max_size: u64,
    /// Print the top outstanding stacks this often while the target runs.
    pub interval: Option<Duration>,
    /// A launched target runs with the preloaded library (`--no-preload` turns it off).
    pub preload: bool,
    /// Anonymous mmap counted as heap blocks (`--mmap`); else shown apart.
    pub count_mmap: bool,
}

impl HeapSettings {
    /// Whether some allocating calls are left out (sampling).
    pub fn sampling(&self) -> bool {
        self.sample_every > 1 || self.sample_bytes > 0
    }
}

/// What to write, and how the writers weigh and name things.
#[derive(Clone, Debug)]
pub struct OutputPlan {
    /// Every file to write, in the order they are written.
    pub files: Vec<(Format, PathBuf)>,
    /// With a heap profile: what the flamegraph weighs.
    pub metric: Metric,
    /// With a heap profile: the text report's order.
    pub order_by: OrderBy,
    /// The flamegraph's title (default: the probes and the command).
    pub title: Option<String>,
    /// Frames named `function (file:line)`.
    pub line_numbers: bool,
    /// Open the report (or the flamegraph) when the run ends.
    pub open: bool,
}

impl OutputPlan {
    /// Whether the heap's text report goes to stdout (no file was asked for it).
    pub fn heap_report_to_stdout(&self) -> bool {
        !self
            .files
            .iter()
            .any(|(format, _)| *format == Format::HeapReport)
    }

    /// Whether a heap profile's file is asked for (the heaptrack format).
    pub fn wants_heaptrack(&self) -> bool {
        self.files
            .iter()
            .any(|(format, _)| matches!(format, Format::Heaptrack(_)))
    }
}
