//! The profile model: what a session measured, symbolized, before any output sees it.
//!
//! Every writer (folded stacks, the SVG flamegraph, and the formats that follow) reads a
//! [`Profile`] and nothing else, so a new format is a new writer and not a change to the
//! session. The model follows pprof's: samples carry several values (one per
//! [`ValueType`]), and point to [`Location`]s (an address in a [`Mapping`], expanded into
//! its inline [`Frame`]s); the run's counters and metadata sit beside them.
//!
//! [`ProfileBuilder`] turns raw stacks (addresses per process, as the kernel counted them)
//! into a profile, symbolizing each distinct address once.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::symbolize::{Frame, Symbolizer};

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
/// not be paired or kept. Its samples carry the heap value types (see
/// `crate::alloc::value_types`).
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
            leaked_blocks: over_samples(crate::alloc::LEAKED_BLOCKS),
            leaked_bytes: processes.iter().map(|p| p.live_bytes).sum(),
            temporaries: over_samples(crate::alloc::TEMPORARIES),
            unknown_frees: processes.iter().map(|p| p.unknown_frees).sum(),
        })
    }

    /// Processes with at least one sample.
    pub fn processes(&self) -> usize {
        let pids: std::collections::BTreeSet<u32> = self
            .samples
            .iter()
            .map(|s| s.pid)
            .filter(|&pid| pid != crate::exited::MERGED_PID || self.summary.merged_processes == 0)
            .collect();
        pids.len() + usize::try_from(self.summary.merged_processes).unwrap_or(usize::MAX)
    }
}

/// A stack as the kernel counted it, before symbolization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSample {
    pub probe: usize,
    pub pid: u32,
    /// User frames as the walker stored them ([`bpf_prog::Frame`]), innermost first;
    /// `user[0]` is the pc of the event, the others return addresses.
    pub user: Vec<u64>,
    pub truncated: Option<String>,
    /// Kernel addresses, innermost first.
    pub kernel: Vec<u64>,
    pub values: Vec<i64>,
}

/// What the symbolizer knows of a user mapping, for [`Profile::mappings`].
#[derive(Clone, Debug)]
pub struct MappingSource {
    pub mapping: Mapping,
    /// The file to read its build id from, if any.
    pub object: Option<PathBuf>,
}

/// Builds a [`Profile`] from raw samples, symbolizing each distinct address once.
pub struct ProfileBuilder<'a> {
    symbolizer: &'a mut Symbolizer,
    profile: Profile,
    /// (pid, frame as stored, is return address) → location; pid 0 for the frames
    /// stored as objects' addresses, the same in every process.
    user_locations: HashMap<(u32, u64, bool), LocationId>,
    kernel_locations: HashMap<u64, LocationId>,
    kernel_frames: HashMap<u64, Frame>,
    mappings: HashMap<Mapping, MappingId>,
    build_ids: HashMap<PathBuf, Option<String>>,
    /// Identical symbolized stacks of one probe and process are merged.
    merged: HashMap<(usize, u32, Vec<LocationId>, Option<String>), usize>,
}

impl<'a> ProfileBuilder<'a> {
    pub fn new(symbolizer: &'a mut Symbolizer, value_types: Vec<ValueType>) -> Self {
        ProfileBuilder {
            symbolizer,
            profile: Profile {
                value_types,
                ..Profile::default()
            },
            user_locations: HashMap::new(),
            kernel_locations: HashMap::new(),
            kernel_frames: HashMap::new(),
            mappings: HashMap::new(),
            build_ids: HashMap::new(),
            merged: HashMap::new(),
        }
    }

    /// Adds one raw sample; one with the same locations, probe, process and truncation as
    /// an earlier one is added to it.
    pub fn add(&mut self, raw: &RawSample) {
        assert_eq!(raw.values.len(), self.profile.value_types.len());
        let mut stack = Vec::with_capacity(raw.kernel.len() + raw.user.len());
        // The BPF program and the code that runs it are not the traced code: kernel
        // stacks start at the first frame outside that machinery.
        let mut in_machinery = true;
        for &address in &raw.kernel {
            if let Some(location) = self.kernel_location(address, &mut in_machinery) {
                stack.push(location);
            }
        }
        for (depth, &address) in raw.user.iter().enumerate() {
            stack.push(self.user_location(raw.pid, address, depth > 0));
        }
        let key = (raw.probe, raw.pid, stack, raw.truncated.clone());
        match self.merged.get(&key) {
            Some(&index) => {
                let sample = &mut self.profile.samples[index];
                for (total, value) in sample.values.iter_mut().zip(&raw.values) {
                    *total += value;
                }
            }
            None => {
                self.merged.insert(key.clone(), self.profile.samples.len());
                let (probe, pid, stack, truncated) = key;
                self.profile.samples.push(Sample {
                    probe,
                    pid,
                    stack,
                    truncated,
                    values: raw.values.clone(),
                });
            }
        }
    }

    /// The profile, with the probes, summary and metadata given.
    pub fn finish(self, probes: Vec<String>, summary: Summary, metadata: Metadata) -> Profile {
        Profile {
            probes,
            summary,
            metadata,
            ..self.profile
        }
    }

    fn kernel_location(&mut self, address: u64, in_machinery: &mut bool) -> Option<LocationId> {
        let frame = match self.kernel_frames.get(&address) {
            Some(frame) => frame.clone(),
            None => {
                let frame = self.symbolizer.kernel(address);
                self.kernel_frames.insert(address, frame.clone());
                frame
            }
        };
        if *in_machinery && is_bpf_machinery(&frame.function) {
            return None;
        }
        *in_machinery = false;
        if let Some(&id) = self.kernel_locations.get(&address) {
            return Some(id);
        }
        let id = self.push_location(Location {
            address,
            mapping: None,
            frames: vec![frame],
            kernel: true,
        });
        self.kernel_locations.insert(address, id);
        Some(id)
    }

    fn user_location(&mut self, pid: u32, frame: u64, is_return_address: bool) -> LocationId {
        // A frame stored as an object's address is one location for every process.
        let owner = if Symbolizer::is_process_independent(frame) {
            0
        } else {
            pid
        };
        let key = (owner, frame, is_return_address);
        if let Some(&id) = self.user_locations.get(&key) {
            return id;
        }
        let mut frames = self.symbolizer.user(pid, frame, is_return_address);
        // The symbolizer lists the outermost inline frame first.
        frames.reverse();
        let mapping = self
            .symbolizer
            .mapping_source(pid, frame)
            .map(|source| self.mapping_id(source));
        let id = self.push_location(Location {
            address: self.symbolizer.runtime_address(pid, frame),
            mapping,
            frames,
            kernel: false,
        });
        self.user_locations.insert(key, id);
        id
    }

    fn mapping_id(&mut self, source: MappingSource) -> MappingId {
        if let Some(&id) = self.mappings.get(&source.mapping) {
            return id;
        }
        let mut mapping = source.mapping;
        mapping.build_id = match source.object {
            Some(path) => self
                .build_ids
                .entry(path.clone())
                .or_insert_with(|| build_id_of(&path))
                .clone(),
            None => None,
        };
        let id = self.profile.mappings.len();
        self.profile.mappings.push(mapping.clone());
        self.mappings.insert(mapping, id);
        id
    }

    fn push_location(&mut self, location: Location) -> LocationId {
        self.profile.locations.push(location);
        self.profile.locations.len() - 1
    }
}

/// Kernel frames of the BPF program itself and of the code that runs it.
fn is_bpf_machinery(name: &str) -> bool {
    name.starts_with("bpf_prog_")
        || name.starts_with("bpf_trace_run")
        || name.starts_with("__bpf_trace_")
        || name.starts_with("bpf_get_stack")
}

/// The hex GNU build id of the ELF file at `path`.
fn build_id_of(path: &std::path::Path) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private map of a file we only read.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    process_image::build_id(&object::File::parse(&*map).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_stacks_merge_and_kernel_machinery_is_dropped() {
        let mut symbolizer = Symbolizer::new();
        let mut builder =
            ProfileBuilder::new(&mut symbolizer, vec![ValueType::new("events", "count")]);
        let raw = RawSample {
            probe: 0,
            pid: 1,
            user: vec![0x1000, 0x2000],
            truncated: None,
            kernel: vec![],
            values: vec![2],
        };
        builder.add(&raw);
        builder.add(&RawSample {
            values: vec![3],
            ..raw.clone()
        });
        builder.add(&RawSample {
            truncated: Some("read fault".into()),
            ..raw
        });
        let profile = builder.finish(vec!["p".into()], Summary::default(), Metadata::default());
        assert_eq!(profile.samples.len(), 2);
        assert_eq!(profile.samples[0].values, [5]);
        assert_eq!(profile.samples[0].stack, [0, 1]);
        assert_eq!(profile.locations.len(), 2);
        assert_eq!(profile.total(0), 7);
        assert_eq!(profile.locations[1].frames[0].function, "[unknown] 0x2000");
    }

    #[test]
    fn machinery_is_skipped_only_at_the_innermost_end() {
        assert!(is_bpf_machinery("bpf_prog_6deef7357e7b4530_on_tracepoint"));
        assert!(is_bpf_machinery("bpf_trace_run2"));
        assert!(!is_bpf_machinery("do_syscall_64"));
    }
}
