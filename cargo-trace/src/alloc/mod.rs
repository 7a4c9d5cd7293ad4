//! Heap profiling: the `alloc[:ALLOCATOR]` probe, its options, and the heap values of the
//! profile model.
//!
//! An `alloc` probe expands into uprobes on the allocator's functions ([`allocators`]):
//! each allocating function's entry and return, each freeing function's entry, all
//! with the probe's id in their cookies, so that it keeps its counts apart from the
//! session's other probes. The kernel aggregates per (stack, process, probe)
//! (`bpf-prog/src/bpf/alloc.bpf.h`); [`add_samples`] turns those statistics into samples
//! of the profile model with the heap's value types ([`value_types`]): counts, bytes,
//! what is left live at the end, what was live at the peak, temporaries, and the size
//! and lifetime histograms bucket by bucket. The writers (flamegraph, folded, pprof, the
//! text report, CSV) read only those samples and [`HeapTotals`]; nothing of them knows
//! where the events came from.

pub mod allocators;
pub mod live;
pub mod preload;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use bpf_prog::{alloc_cookie, AllocCounter, AllocKind, AllocOptions, EventProgram, Tracer};
use probes::{Attachment, Fire, UprobeTarget};

use crate::limits::{self, Limit};
use crate::symbolize::RawSample;
use allocators::Allocator;
use profile::heap::{Metric, OrderBy};
use profile::{HeapProcess, HeapTotals, SamplingMode, ValueType};

/// The programs an `alloc` probe attaches.
pub const PROGRAMS: [EventProgram; 5] = [
    EventProgram::AllocEntry,
    EventProgram::ResizeEntry,
    EventProgram::AllocReturn,
    EventProgram::Free,
    EventProgram::FreeArg1,
];

/// The programs of the preloaded library's sites ([`preload`]), loaded besides when the
/// target runs with it, and those that take a thread's logged frees at its exit and, where
/// the kernel has the tracepoint, at its exec.
pub fn preload_programs() -> Vec<EventProgram> {
    let mut programs = vec![
        EventProgram::PreloadAlloc,
        EventProgram::PreloadResize,
        EventProgram::PreloadResized,
        EventProgram::PreloadFreed,
        EventProgram::PreloadLog,
        EventProgram::ThreadExit,
    ];
    programs.extend(thread_exec_program());
    programs
}

/// [`EventProgram::ThreadExec`], if the kernel has its tracepoint (asked once).
fn thread_exec_program() -> Option<EventProgram> {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    HAS.get_or_init(|| bpf_prog::kernel_has_btf_tracepoint("sched_prepare_exec"))
        .then_some(EventProgram::ThreadExec)
}

/// Heap profiling's command-line options.
#[derive(Debug, Clone, clap::Args)]
pub struct AllocArgs {
    /// With `alloc`: what the flamegraph and folded stacks weigh.
    #[arg(long, value_enum, default_value_t = Metric::Bytes)]
    pub metric: Metric,

    /// With `alloc`: how the text report orders its top stacks.
    #[arg(long = "order-by", value_enum, default_value_t = OrderBy::Bytes)]
    pub order_by: OrderBy,

    /// With `alloc`: write the text report here instead of to stdout.
    #[arg(long = "report-text", value_name = "PATH")]
    pub report_text: Option<PathBuf>,

    /// With `alloc`: write one CSV row per stack, with every counter and histogram bucket.
    #[arg(long = "csv", value_name = "PATH")]
    pub csv: Option<PathBuf>,

    /// With `alloc`: write memory over time as CSV (every 100 ms: live bytes, allocation and
    /// free rates, resident memory).
    #[arg(long = "timeline", value_name = "PATH")]
    pub timeline: Option<PathBuf>,

    /// With `alloc`: write a heaptrack data file for heaptrack_gui and heaptrack_print,
    /// zstd-compressed if PATH ends in .zst, gzip if .gz, else plain text (as heaptrack
    /// reads it). Its event order and timestamps are synthesized from the totals.
    #[arg(long = "heaptrack", value_name = "PATH")]
    pub heaptrack: Option<PathBuf>,

    /// With `alloc`: the prefix of the allocator's functions (e.g. `je_`).
    #[arg(long = "alloc-prefix", value_name = "PREFIX")]
    pub alloc_prefix: Option<String>,

    /// With `alloc`: live blocks tracked at once; beyond, blocks are counted but not
    /// tracked (and said so).
    #[arg(long = "max-live-blocks", value_name = "N", default_value_t = AllocOptions::default().max_live_blocks)]
    pub max_live_blocks: u32,

    /// With `alloc`: distinct (stack, process) statistics the kernel keeps (about 950
    /// bytes each, as they appear; those of processes that exited leave it). Past it, the
    /// events of a new stack are not counted ("events uncounted (stats map full)" in the
    /// report).
    #[arg(long = "max-heap-stacks", value_name = "N", default_value_t = AllocOptions::default().max_stacks)]
    pub max_heap_stacks: u32,

    /// With `alloc`: print the top outstanding stacks every interval while the target
    /// runs (e.g. 5s, 500ms), on stderr.
    #[arg(long = "interval", value_name = "DURATION", value_parser = live::parse_interval)]
    pub interval: Option<Duration>,

    /// With `alloc`: count 1 in N allocating calls, at random; counts and bytes are
    /// scaled estimates.
    #[arg(
        long = "sample-every",
        value_name = "N",
        conflicts_with = "sample_bytes"
    )]
    pub sample_every: Option<u32>,

    /// With `alloc`: count about one allocation per SIZE bytes allocated (an allocation of
    /// s bytes with a chance of s/SIZE), e.g. 512K; bytes are unbiased estimates.
    #[arg(long = "sample-bytes", value_name = "SIZE", value_parser = parse_size)]
    pub sample_bytes: Option<u64>,

    /// With `alloc`: count only allocations of at least SIZE bytes (e.g. 64, 4K).
    #[arg(long = "min-size", value_name = "SIZE", value_parser = parse_size)]
    pub min_size: Option<u64>,

    /// With `alloc`: count only allocations of at most SIZE bytes (e.g. 1M).
    #[arg(long = "max-size", value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,

    /// With `alloc`: a block freed within this many milliseconds is a temporary.
    #[arg(long = "temporary-ms", value_name = "MS", default_value_t = 1.0)]
    pub temporary_ms: f64,

    /// With `alloc` on a launched target: probe libc's allocator functions themselves
    /// rather than run the target with cargo-trace's preloaded library (whose probe sites
    /// cost less per call, but which a process that drops LD_PRELOAD does not load).
    #[arg(long = "no-preload")]
    pub no_preload: bool,
}

impl AllocArgs {
    /// The BPF side's settings.
    pub fn options(&self) -> AllocOptions {
        AllocOptions {
            max_live_blocks: self.max_live_blocks,
            max_stacks: self.max_heap_stacks,
            temporary_ns: (self.temporary_ms.max(0.0) * 1e6) as u64,
            sample_every: self.sample_every.unwrap_or(0),
            sample_bytes: self.sample_bytes.unwrap_or(0),
            min_size: self.min_size.unwrap_or(0),
            max_size: self.max_size.unwrap_or(0),
            ..AllocOptions::default()
        }
    }
}

/// `512K`, `1M`, `64` (bytes); K, M and G are powers of 1024. At most 4 GiB.
fn parse_size(text: &str) -> Result<u64, String> {
    let (number, unit) = match text.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => {
            let unit = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("'{text}': the unit is K, M or G")),
            };
            (&text[..at], unit)
        }
        _ => (text, 1),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|size| (1..=1 << 32).contains(size))
        .ok_or_else(|| format!("'{text}' is not a size from 1 byte to 4G (e.g. 512K)"))
}

/// An `alloc[:ALLOCATOR]` probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocProbe {
    allocator: Allocator,
}

impl AllocProbe {
    /// The probe `text` names if it is an `alloc` probe, `None` if it is another kind.
    pub fn parse(text: &str) -> Option<Result<AllocProbe>> {
        let rest = match text.strip_prefix("alloc") {
            Some("") => None,
            Some(rest) => Some(rest.strip_prefix(':')?),
            None => return None,
        };
        Some(Allocator::parse(rest).map(|allocator| AllocProbe { allocator }))
    }

    /// Attaches the allocator's functions as found in process `pid`, firing where `fire`
    /// says, with probe id `probe_id`: each allocating function's entry and return, each
    /// freeing function's entry.
    /// Whether the probe would take the preloaded library's sites for libc's functions.
    pub fn wants_preload(&self, args: &AllocArgs) -> bool {
        matches!(self.allocator, Allocator::Auto | Allocator::Libc)
            && args.alloc_prefix.is_none()
            && !args.no_preload
    }

    /// `preload`: the preloaded library, if the target was launched with it; its sites
    /// are attached for libc's functions if process `pid` loaded it.
    pub fn attach(
        &self,
        tracer: &Tracer,
        args: &AllocArgs,
        pid: u32,
        fire: Fire<'_>,
        probe_id: u32,
        preload: Option<&preload::Preload>,
    ) -> Result<Vec<Attachment>> {
        let preload = preload
            .filter(|p| self.wants_preload(args) && p.mapped_in(pid))
            .map(preload::Preload::path);
        let functions =
            allocators::resolve(&self.allocator, args.alloc_prefix.as_deref(), pid, preload)?;
        // Functions of a kind share their programs and cookie: attached together (bound
        // to processes, they are one event of the kernel's, attached and detached at once).
        let mut by_kind: Vec<(AllocKind, Vec<UprobeTarget>)> = Vec::new();
        for function in &functions {
            match by_kind.iter_mut().find(|(kind, _)| *kind == function.kind) {
                Some((_, targets)) => targets.push(function.target.clone()),
                None => by_kind.push((function.kind, vec![function.target.clone()])),
            }
        }
        let mut links = Vec::new();
        if preload.is_some() {
            // Where threads' logged frees are told at their exit and exec: everywhere,
            // the programs ask only threads whose log a site registered.
            for program in std::iter::once(EventProgram::ThreadExit).chain(thread_exec_program()) {
                let link = tracer
                    .program(program)
                    .attach()
                    .with_context(|| format!("attaching {}", program.name()))?;
                links.push(Attachment::from(link));
            }
        }
        for (kind, targets) in &by_kind {
            let cookie = alloc_cookie(probe_id, *kind);
            for &(program, retprobe) in kind.programs() {
                let attached = probes::attach_uprobes_in(
                    tracer.program(program),
                    targets,
                    fire,
                    retprobe,
                    cookie,
                )
                .with_context(|| {
                    let names: Vec<&str> = targets.iter().map(|t| t.symbol.as_str()).collect();
                    format!("attaching {} to {}", program.name(), names.join(", "))
                })?;
                links.extend(attached);
            }
        }
        Ok(links)
    }
}

/// Adds the heap statistics of the kernel as samples: the heap value types go after
/// `value_types`' (the other probes'), whose values the heap samples leave 0, as the
/// others leave the heap's. Blocks still live are aged as of `stopped`, when tracing
/// stopped. Returns the heap totals.
pub fn add_samples(
    tracer: &Tracer,
    value_types: &mut Vec<ValueType>,
    samples: &mut Vec<RawSample>,
    options: &AllocOptions,
    stopped: SystemTime,
) -> Result<HeapTotals> {
    let before = value_types.len();
    let heap_types = profile::heap::value_types();
    for sample in samples.iter_mut() {
        sample.values.resize(before + heap_types.len(), 0);
    }
    value_types.extend(heap_types);

    let since_stop = SystemTime::now()
        .duration_since(stopped)
        .unwrap_or_default()
        .as_micros() as u64;
    let now_us = (bpf_prog::monotonic_ns() / 1000).saturating_sub(since_stop);
    let value = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    // What one sampled event stands for where every event weighs the same (1 in N);
    // with --sample-bytes, histograms, temporaries and peaks count the sampled blocks.
    let scale = i64::from(options.sample_every.max(1));
    let first_heap_sample = samples.len();
    for (key, stats) in tracer
        .alloc_stats()
        .context("reading the heap statistics")?
    {
        let (user, truncated) = crate::session::user_stack(tracer, key.stack)?;
        let live = stats.live_blocks();
        let age = value((live * now_us).saturating_sub(stats.live_birth_us));
        let mut values = vec![0; before];
        if options.sampling() {
            let estimated = &stats.estimated;
            let allocs = estimated.allocs.round() as i64;
            let frees = estimated.frees.round() as i64;
            values.extend([
                allocs,
                value(estimated.bytes),
                frees,
                value(estimated.freed_bytes),
                (allocs - frees - value(stats.untracked) * scale).max(0),
                value(estimated.bytes) - value(estimated.freed_bytes),
            ]);
        } else {
            values.extend([
                value(stats.allocs),
                value(stats.bytes),
                value(stats.frees),
                value(stats.freed_bytes),
                value(live),
                stats.live_bytes,
            ]);
        }
        values.extend([
            value(stats.temporaries) * scale,
            stats.peak_bytes * scale,
            age * scale,
            value(stats.untracked) * scale,
        ]);
        values.extend(stats.size_hist.iter().map(|&n| value(n) * scale));
        values.extend(stats.life_hist.iter().map(|&n| value(n) * scale));
        samples.push(RawSample {
            probe: key.probe_id as usize,
            pid: key.pid,
            user,
            truncated,
            kernel: Vec::new(),
            values,
        });
    }

    let counters = tracer
        .alloc_counters()
        .context("reading the heap counters")?;
    let mut processes: Vec<HeapProcess> = tracer
        .alloc_processes()
        .context("reading the heap totals")?
        .into_iter()
        .map(|p| HeapProcess {
            probe: p.probe_id as usize,
            pid: p.pid,
            allocs: p.allocs,
            bytes: p.bytes,
            frees: p.frees,
            freed_bytes: p.freed_bytes,
            live_bytes: p.live_bytes,
            peak_bytes: p.peak_bytes * scale,
            unknown_frees: p.unknown_frees,
        })
        .collect();
    if options.sampling() {
        // The process's totals from its stacks' estimates.
        for process in &mut processes {
            let mut totals = [0i64; 4];
            for sample in samples[first_heap_sample..]
                .iter()
                .filter(|s| s.pid == process.pid && s.probe == process.probe)
            {
                for (total, value) in totals.iter_mut().zip(&sample.values[before..before + 4]) {
                    *total += value;
                }
            }
            let [allocs, bytes, frees, freed_bytes] = totals.map(|v| v.max(0) as u64);
            *process = HeapProcess {
                allocs,
                bytes,
                frees,
                freed_bytes,
                live_bytes: bytes as i64 - freed_bytes as i64,
                ..process.clone()
            };
        }
    }
    Ok(HeapTotals {
        processes,
        lost: limits::reported(
            &AllocCounter::ALL
                .iter()
                .map(|c| (Limit::Heap(*c), counters[*c as usize]))
                .collect(),
        ),
        temporary_threshold: Duration::from_nanos(options.temporary_ns),
        sampling: sampling_note(options),
        sampling_mode: if options.sample_every > 1 {
            Some(SamplingMode::EveryNth(options.sample_every))
        } else if options.sample_bytes > 0 {
            Some(SamplingMode::PerBytes(options.sample_bytes))
        } else {
            None
        },
        size_filter: size_filter_note(options),
        timeline: Vec::new(),
    })
}

/// How a sampled profile's figures came to be, for the report.
fn sampling_note(options: &AllocOptions) -> Option<String> {
    if options.sample_every > 1 {
        Some(format!(
            "1 in {} allocating calls counted, at random: every figure is an estimate (×{})",
            options.sample_every, options.sample_every
        ))
    } else if options.sample_bytes > 0 {
        Some(format!(
            "an allocation of s bytes counted with a chance of s/{}: allocations, frees and \
             bytes are unbiased estimates; temporaries, peaks and histograms count the \
             sampled blocks only",
            options.sample_bytes
        ))
    } else {
        None
    }
}

/// Which sizes were counted, when not all were.
fn size_filter_note(options: &AllocOptions) -> Option<String> {
    match (options.min_size, options.max_size) {
        (0, 0) => None,
        (min, 0) => Some(format!("allocations of {min} bytes or more")),
        (min, max) => Some(format!("allocations of {min} to {max} bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("64"), Ok(64));
        assert!(parse_size("0").is_err());
        assert!(parse_size("5G").is_err());
        assert!(parse_size("3X").is_err());
    }

    #[test]
    fn alloc_probes_parse() {
        assert_eq!(
            AllocProbe::parse("alloc").unwrap().unwrap().allocator,
            Allocator::Auto
        );
        assert_eq!(
            AllocProbe::parse("alloc:jemalloc")
                .unwrap()
                .unwrap()
                .allocator,
            Allocator::Jemalloc
        );
        assert!(AllocProbe::parse("allocate").is_none());
        assert!(AllocProbe::parse("uprobe:libc:malloc").is_none());
        assert!(AllocProbe::parse("alloc:nonsense").unwrap().is_err());
    }
}
