//! The profile model: what a session measured, symbolized, before any output sees it.
//!
//! The model follows pprof's: samples carry several values (one per [`ValueType`]), and
//! point to [`Location`]s (an address in a [`Mapping`], expanded into its inline
//! [`Frame`]s); the run's counters and metadata sit beside them.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::heap;

/// The pid under which the counts of exited processes are added up, once a session keeps
/// no more of them apart ([`Summary::merged_processes`] says how many).
pub const MERGED_PID: u32 = 0;

/// One frame of a symbolized stack (an address may expand into several, inlined ones).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl Frame {
    /// A frame known by its function's name only.
    pub fn named(function: String) -> Self {
        Frame {
            function,
            file: None,
            line: None,
        }
    }
}

/// What a value of a sample measures, as pprof's `ValueType`: e.g. `samples`/`count`,
/// `cpu`/`nanoseconds`, `events`/`count`, `bytes`/`bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueType {
    pub kind: String,
    pub unit: String,
}

impl ValueType {
    pub fn new(kind: &str, unit: &str) -> ValueType {
        ValueType {
            kind: kind.to_string(),
            unit: unit.to_string(),
        }
    }

    /// What the value measures, as a person names it ("CPU time", "bytes allocated",
    /// "leaked blocks"), for reports; a kind this list does not know is shown as it is,
    /// its underscores as spaces.
    pub fn describe(&self) -> String {
        let known = match self.kind.as_str() {
            "samples" => "samples",
            "cpu" => "CPU time",
            "off-cpu" => "time off the CPU",
            "blocks" => "stays off the CPU",
            "time" => "time on and off the CPU",
            "events" => "events",
            heap::ALLOCS => "allocations",
            heap::ALLOC_SPACE => "bytes allocated",
            heap::FREES => "frees",
            heap::FREED_SPACE => "bytes freed",
            heap::LEAKED_BLOCKS => "leaked blocks",
            heap::LEAKED_BYTES => "leaked bytes",
            heap::TEMPORARIES => "temporary allocations",
            heap::PEAK_BYTES => "bytes live at the peak",
            heap::LEAKED_AGE => "ages of the leaked blocks (sum)",
            heap::UNTRACKED => "untracked blocks",
            kind => {
                if let Some(k) = kind.strip_prefix(heap::SIZE_BUCKET) {
                    return format!("allocations in size bucket {k}");
                }
                if let Some(k) = kind.strip_prefix(heap::LIFETIME_BUCKET) {
                    return format!("frees in lifetime bucket {k}");
                }
                return kind.replace('_', " ");
            }
        };
        known.to_string()
    }
}

/// Index into [`Profile::locations`].
pub type LocationId = usize;
/// Index into [`Profile::mappings`].
pub type MappingId = usize;

/// An object mapped into a traced process, as it was mapped.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// Runtime address range `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub file_offset: u64,
    /// The file as the process mapped it (`[vdso]`, `[anon]` for memory without a file).
    pub path: String,
    /// The GNU build id, hex encoded, when the object has one.
    pub build_id: Option<String>,
}

/// One address of a stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The address as found: the pc of the event, or a return address as read from the
    /// stack (its call instruction is just before it).
    pub address: u64,
    /// The mapping holding a user address; `None` for kernel addresses and addresses no
    /// known mapping holds.
    pub mapping: Option<MappingId>,
    /// The functions at the address, innermost (inlined) first, as pprof orders them;
    /// never empty (an unknown address has one frame naming what is known of it).
    pub frames: Vec<Frame>,
    pub kernel: bool,
}

/// One aggregated stack of one probe in one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Index into [`Profile::probes`].
    pub probe: usize,
    pub pid: u32,
    /// Innermost first: kernel locations (if any), then user locations.
    pub stack: Vec<LocationId>,
    /// Why the user stack ends early, if it does (e.g. "read fault"): the frames found
    /// before the stop are kept.
    pub truncated: Option<String>,
    /// One value per [`Profile::value_types`].
    pub values: Vec<i64>,
}

/// The counters of a run that are not samples: stack walks that failed, events
/// without a stack, and whatever else lost information, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Walks that ended before the end of the stack, by reason, in the walker's order;
    /// only the reasons that happened.
    pub failures: Vec<(String, u64)>,
    /// Events that lost something else, and limits hit (a full map or ring buffer), by
    /// name, with the options that raise each limit; only those that happened.
    pub losses: Vec<Lost>,
    /// Events counted with their kernel stack only because no user stack was left to
    /// walk (inside execve).
    pub in_exec: u64,
    /// Events counted with no user stack to walk, by what they are ("process exiting",
    /// "kernel thread", "not on the interval timer's CPU"); only those that happened.
    pub no_user_stack: Vec<(String, u64)>,
    /// Objects without an unwind table, by name, with the reason.
    pub without_table: Vec<(String, String)>,
    /// Events left out because they are cargo-trace's own doing, not the target's:
    /// samples of the launched target returning from the breakpoint that held it at
    /// its entry point.
    pub not_the_targets: u64,
    /// Processes that exited, past `--keep-exited`, whose counts are added up under
    /// pid 0 rather than kept under their own pids.
    pub merged_processes: u64,
}

/// A count of what lost information (events, objects, mappings), or of a limit met,
/// with the command-line options that raise the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    /// Its name in reports, e.g. "known stacks full".
    pub what: String,
    pub count: u64,
    /// Options any one of which raises the limit (`--max-stacks`); none for a count that
    /// no option changes (a hash collision).
    pub raised_by: &'static [&'static str],
}

impl Lost {
    /// The count, and the options that raise the limit if any: `5 (--max-stacks)`,
    /// `2 (--max-counts or --ring-buffer-mib)`, `1`.
    pub fn count_and_options(&self) -> String {
        if self.raised_by.is_empty() {
            self.count.to_string()
        } else {
            format!("{} ({})", self.count, self.raised_by.join(" or "))
        }
    }
}

/// `known stacks full 5 (--max-stacks)`, `hash collision 1`.
impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.what, self.count_and_options())
    }
}

/// Where the profile came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    /// The command traced, or `None` for an attached process.
    pub command: Option<Vec<String>>,
    /// The target's pid.
    pub pid: u32,
    /// The target's executable as it was started (`/proc/PID/exe`).
    pub executable: Option<String>,
    /// When tracing started (the target was let run).
    pub started: Option<SystemTime>,
    /// How long tracing ran.
    pub duration: Duration,
    /// For sampling profiles: the value type and amount one sample stands for
    /// (e.g. `cpu`/`nanoseconds`, 10,101,010 at 99 Hz).
    pub period: Option<(ValueType, i64)>,
    /// Stack walks counted so far, at moments of the run (every 200 ms or so): the
    /// events over time.
    pub timeline: Vec<TimelinePoint>,
}

/// The run's count of stack walks at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelinePoint {
    /// Since tracing started.
    pub at: Duration,
    pub walks: u64,
}

/// A symbolized profile: the one input of every writer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// What each of a sample's values measures; the first is the default weight.
    pub value_types: Vec<ValueType>,
    /// The probes as the user wrote them.
    pub probes: Vec<String>,
    pub samples: Vec<Sample>,
    pub locations: Vec<Location>,
    pub mappings: Vec<Mapping>,
    pub summary: Summary,
    pub metadata: Metadata,
    /// Heap profiling's totals, when the session profiled the heap.
    pub heap: Option<HeapTotals>,
}

/// What a heap profile knows beside its samples: each process's totals, and what could
/// not be paired or kept. Its samples carry the heap value types ([`heap::value_types`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapTotals {
    pub processes: Vec<HeapProcess>,
    /// Events the heap programs could not pair or keep, by name (e.g. "unknown frees"),
    /// with the options that raise each limit; only those that happened.
    pub lost: Vec<Lost>,
    /// Blocks freed sooner than this after their allocation are temporaries.
    pub temporary_threshold: Duration,
    /// How sampling made the figures estimates, when events were sampled.
    pub sampling: Option<String>,
    /// Which sampling, when events were sampled.
    pub sampling_mode: Option<SamplingMode>,
    /// Which allocations were counted, when a size filter left some out (their frees
    /// are then not counted as unknown).
    pub size_filter: Option<String>,
    /// Memory over time, while the target ran, from the start of tracing.
    pub timeline: Vec<HeapPoint>,
    /// Anonymous memory the processes mapped themselves (mmap), apart from their heap
    /// blocks; `None` where it was not told apart.
    pub mapped: Option<MappedMemory>,
    /// What recording in the processes cost them in memory, where it was recorded there.
    pub in_process: Option<RecorderMemory>,
    /// Which allocators were counted in which process, and how: one entry per process
    /// kept apart, and one per executable for the processes counted together under
    /// [`MERGED_PID`]. Empty where the collector did not say.
    pub allocators: Vec<ProcessAllocators>,
}

/// The memory the preloaded library took in the processes it recorded in: a shared
/// region, used as touched up to its bound, and memory of its own (thread states,
/// mapping sets), bounded too. The figures of the process that used the most.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecorderMemory {
    /// Processes recorded in.
    pub processes: u32,
    /// Of the shared region: used at the end, and its size.
    pub region_used: u64,
    pub region_bound: u64,
    /// Its other memory at the end, and the most it can take.
    pub private_bytes: u64,
    pub private_bound: u64,
}

impl RecorderMemory {
    /// One line: "in 3 processes, at most 6.0 MiB of a 324 MiB shared region and 252 KiB
    /// of 46 MiB of its own in any one".
    pub fn describe(&self) -> String {
        let b = |n: u64| crate::units::bytes(n as i64);
        format!(
            "in {} process{}, at most {} of a {} shared region (touched as used) and {} of \
             its own memory (at most {}) in any one",
            self.processes,
            if self.processes == 1 { "" } else { "es" },
            b(self.region_used),
            b(self.region_bound),
            b(self.private_bytes),
            b(self.private_bound),
        )
    }
}

/// The allocators counted in one process (or, under [`MERGED_PID`], in the exited
/// processes of one executable counted together), and what was missed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessAllocators {
    pub pid: u32,
    /// The process's executable (the last it exec'd), where it is known.
    pub executable: Option<String>,
    /// How many processes the entry stands for: 1, or those merged under pid 0.
    pub processes: u64,
    pub allocators: Vec<AllocatorCounted>,
    /// What of its heap was not counted, and why; `None` when nothing was missed.
    pub missed: Option<AllocatorsMissed>,
}

/// One allocator whose calls were counted, and how they were seen.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocatorCounted {
    /// `libc`, `jemalloc`, `mimalloc`, or `malloc` (an allocator known only by the
    /// malloc API it defines).
    pub name: String,
    /// The prefix of its functions' names (`_rjem_`, `je_`), if they have one.
    pub prefix: Option<String>,
    /// The object that carries it, as the process mapped it.
    pub object: String,
    pub counted_by: CountedBy,
}

/// How an allocator's calls reach the profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CountedBy {
    /// Probes on the allocator's own functions (uprobes).
    Functions,
    /// Wrappers of its functions in a library the process was started with.
    Wrappers,
    /// Hooks placed in the process on the allocator's functions.
    Hooks,
}

impl CountedBy {
    /// `by its functions`, as the reports say it after the allocator's name.
    pub fn describe(self) -> &'static str {
        match self {
            CountedBy::Functions => "by its functions",
            CountedBy::Wrappers => "by the preloaded library's wrappers",
            CountedBy::Hooks => "by hooks in the process",
        }
    }

    /// Its name in the JSON output.
    pub fn name(self) -> &'static str {
        match self {
            CountedBy::Functions => "functions",
            CountedBy::Wrappers => "wrappers",
            CountedBy::Hooks => "hooks",
        }
    }
}

impl AllocatorCounted {
    /// `libc`, `jemalloc (_rjem_) in /path/exe`: the allocator, its prefix, and the
    /// object carrying it where it is not libc.
    pub fn label(&self) -> String {
        let mut label = self.name.clone();
        if let Some(prefix) = &self.prefix {
            label.push_str(&format!(" ({prefix})"));
        }
        if self.name != "libc" {
            label.push_str(&format!(" in {}", self.object));
        }
        label
    }
}

/// `jemalloc (_rjem_) in /path/exe by its functions`.
impl fmt::Display for AllocatorCounted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.label(), self.counted_by.describe())
    }
}

/// What a process's allocators missed: an allocator that could not be probed, or that
/// the process called before it was.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocatorsMissed {
    /// Why, for people: "jemalloc in /x probed only after the process had run".
    pub reason: String,
    /// The count it missed, as far as it is known: the frees of blocks the process
    /// allocated while nothing counted them (their allocations are missing).
    pub count: u64,
}

impl ProcessAllocators {
    /// `pid 42 (/path/exe)`, or `3 exited processes of /path/exe`.
    pub fn who(&self) -> String {
        let executable = self.executable.as_deref().unwrap_or("?");
        if self.pid == MERGED_PID && self.processes != 1 {
            format!("{} exited processes of {executable}", self.processes)
        } else {
            format!("process {} ({executable})", self.pid)
        }
    }

    /// `libc by its functions, jemalloc (_rjem_) in /x by its functions`, or `none
    /// found`.
    pub fn describe(&self) -> String {
        if self.allocators.is_empty() {
            return "no allocator found".to_string();
        }
        let listed: Vec<String> = self.allocators.iter().map(ToString::to_string).collect();
        listed.join(", ")
    }

    /// The warning a miss deserves: `process 42 (/x): 120 frees of blocks allocated
    /// while not counted: jemalloc ... probed only after the process had run`.
    pub fn warning(&self) -> Option<String> {
        let missed = self.missed.as_ref()?;
        Some(format!(
            "{}: {}; {} frees of blocks allocated while nothing counted them",
            self.who(),
            missed.reason,
            missed.count
        ))
    }
}

/// Anonymous memory mapped by the program itself (mmap, munmap), apart from its heap
/// blocks. heaptrack never counts it as heap, nor bytehound by default: a heap profile
/// that counts it does not compare with theirs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MappedMemory {
    /// Whether the mappings are counted as heap blocks too (`--mmap`): in the samples
    /// and the processes' heap totals.
    pub counted: bool,
    pub processes: Vec<MappedProcess>,
}

/// The mappings of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MappedProcess {
    pub pid: u32,
    /// Mappings made, and their bytes.
    pub maps: u64,
    pub bytes: u64,
    /// Mappings unmapped, and their bytes.
    pub unmaps: u64,
    pub unmapped_bytes: u64,
    /// Bytes still mapped at the end.
    pub live_bytes: i64,
}

impl MappedMemory {
    /// The processes' figures summed.
    pub fn total(&self) -> MappedProcess {
        let mut total = MappedProcess::default();
        for p in &self.processes {
            total.maps += p.maps;
            total.bytes += p.bytes;
            total.unmaps += p.unmaps;
            total.unmapped_bytes += p.unmapped_bytes;
            total.live_bytes += p.live_bytes;
        }
        total
    }

    /// One line for people: `3 mappings of 24.0 MiB, 8.0 MiB still mapped at the end`.
    pub fn describe(&self) -> String {
        let total = self.total();
        format!(
            "{} mappings of {}, {} still mapped at the end",
            total.maps,
            crate::units::bytes(total.bytes as i64),
            crate::units::bytes(total.live_bytes),
        )
    }
}

/// How allocating calls were sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplingMode {
    /// 1 in N calls, at random: every figure is scaled by N.
    EveryNth(u32),
    /// An allocation of s bytes with a chance of s / N.
    PerBytes(u64),
}

/// The heap figures of a profile over all its processes, as the text report states
/// them (and the JSON output carries them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapSums {
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    /// The highest of the processes' peaks of live bytes.
    pub peak_bytes: i64,
    pub leaked_blocks: i64,
    /// The processes' live bytes at the end.
    pub leaked_bytes: i64,
    pub temporaries: i64,
    pub unknown_frees: u64,
}

/// The heap of the traced processes at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapPoint {
    /// Since tracing started.
    pub at: Duration,
    /// Bytes of tracked blocks live.
    pub live_bytes: i64,
    /// Allocations and frees counted so far (the rates are their differences).
    pub allocs: u64,
    pub frees: u64,
    /// Resident memory of the processes (`/proc/PID/statm`).
    pub rss_bytes: u64,
}

/// The heap totals of one process (and probe).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapProcess {
    pub probe: usize,
    pub pid: u32,
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    /// Bytes live when the profile was taken, and at most during the run.
    pub live_bytes: i64,
    pub peak_bytes: i64,
    /// Frees of addresses no tracked block held: never subtracted from a stack.
    pub unknown_frees: u64,
}

impl Profile {
    /// The sum of value `index` over every sample.
    pub fn total(&self, index: usize) -> i64 {
        self.samples.iter().map(|s| s.values[index]).sum()
    }

    /// The index of the value type of kind `kind`.
    pub fn value_index(&self, kind: &str) -> Option<usize> {
        self.value_types.iter().position(|t| t.kind == kind)
    }

    /// The heap's figures summed over processes and stacks, if it is a heap profile.
    pub fn heap_sums(&self) -> Option<HeapSums> {
        let heap = self.heap.as_ref()?;
        let over_samples = |kind: &str| -> i64 {
            self.value_index(kind).map_or(0, |index| {
                self.samples.iter().map(|s| s.values[index]).sum()
            })
        };
        let processes = &heap.processes;
        Some(HeapSums {
            allocs: processes.iter().map(|p| p.allocs).sum(),
            bytes: processes.iter().map(|p| p.bytes).sum(),
            frees: processes.iter().map(|p| p.frees).sum(),
            freed_bytes: processes.iter().map(|p| p.freed_bytes).sum(),
            peak_bytes: processes.iter().map(|p| p.peak_bytes).max().unwrap_or(0),
            leaked_blocks: over_samples(heap::LEAKED_BLOCKS),
            leaked_bytes: processes.iter().map(|p| p.live_bytes).sum(),
            temporaries: over_samples(heap::TEMPORARIES),
            unknown_frees: processes.iter().map(|p| p.unknown_frees).sum(),
        })
    }

    /// Processes with at least one sample.
    pub fn processes(&self) -> usize {
        let pids: std::collections::BTreeSet<u32> = self
            .samples
            .iter()
            .map(|s| s.pid)
            .filter(|&pid| pid != MERGED_PID || self.summary.merged_processes == 0)
            .collect();
        pids.len() + usize::try_from(self.summary.merged_processes).unwrap_or(usize::MAX)
    }
}
