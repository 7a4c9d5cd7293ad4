//! What the collectors counted, symbolized into one [`Profile`]: at the end, or while
//! the target runs (SIGUSR1).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use profile::{HeapPoint, HeapTotals, Metadata, Profile, Summary, TimelinePoint};

use super::values;
use crate::collect::Collected;
use crate::frame::ObjectId;
use crate::limits;
use crate::probe::Probe;
use crate::settings::HeapSettings;
use crate::symbolize::{ProfileBuilder, RawSample, SymbolMapping, Symbolizer};
use crate::tables::Coverage;
use crate::timings::{self, Phase};

/// What a profile is made of: the collectors' counts and what the session knows of the
/// processes.
pub struct Source<'a> {
    pub probes: &'a [Probe],
    pub collected: Vec<Collected>,
    pub symbol_mappings: HashMap<u32, Vec<SymbolMapping>>,
    pub object_mappings: HashMap<ObjectId, Vec<SymbolMapping>>,
    /// The objects' tables, and what did not fit where the session put them.
    pub coverage: Coverage,
    pub pid: u32,
    /// The launched target's entry point, where it was held by a breakpoint.
    pub entry: Option<u64>,
    pub argv: Option<Vec<String>>,
    pub executable: Option<String>,
    pub started_at: SystemTime,
    pub elapsed: Duration,
    pub timeline: Vec<TimelinePoint>,
    pub heap_timeline: Vec<HeapPoint>,
}

/// The counts, symbolized.
pub fn build(source: Source<'_>, heap_settings: &HeapSettings) -> Profile {
    let (mut value_types, period) = values::value_types(source.probes);
    let mut events = Vec::new();
    let mut heap = None;
    let mut summary = Summary {
        without_table: source.coverage.without_table.clone(),
        ..Summary::default()
    };
    // What did not fit in what the session filled, and the collectors' losses.
    let mut limits = source.coverage.limits.clone();
    let mut parents = HashMap::new();
    let mut allocators = Vec::new();
    for collected in source.collected {
        allocators.extend(collected.allocators);
        for warning in &collected.warnings {
            eprintln!("cargo-trace: warning: {warning}");
        }
        events.extend(collected.events);
        if collected.heap.is_some() {
            heap = collected.heap;
        }
        summary.failures.extend(collected.walks.failures);
        for (limit, count) in collected.losses {
            *limits.entry(limit).or_default() += count;
        }
        summary.in_exec += collected.in_exec;
        summary.no_user_stack.extend(collected.no_user_stack);
        summary.merged_processes += collected.merged_processes;
        parents.extend(collected.parents);
    }
    timings::done(Phase::Read);
    let mut raw = values::event_samples(events, source.probes);
    let heap: Option<HeapTotals> = heap.map(|heap| {
        values::add_heap_samples(
            heap,
            heap_settings,
            &mut value_types,
            &mut raw,
            source.started_at + source.elapsed,
        )
    });
    let mut symbolizer = Symbolizer::new();
    // A child that exited before its mappings were read ran with its parent's (fork
    // copies them): the target's are the best guess for it.
    symbolizer.set_fallback(source.pid);
    symbolizer.set_parents(parents);
    for (pid, mappings) in source.symbol_mappings {
        symbolizer.add_process(pid, mappings);
    }
    symbolizer.add_objects(source.object_mappings);
    if summary.merged_processes > 0 {
        // Runtime addresses of many processes: none of their mappings can name them.
        symbolizer.add_process(profile::MERGED_PID, Vec::new());
    }
    let held_at_entry = |sample: &RawSample, symbolizer: &mut Symbolizer| {
        source.entry.is_some_and(|entry| {
            sample.pid == source.pid
                && sample.user.len() == 1
                && symbolizer.runtime_address(sample.pid, sample.user[0]) == entry
                && sample
                    .kernel
                    .iter()
                    .any(|&pc| symbolizer.kernel(pc).function.ends_with("exc_int3"))
        })
    };
    // Counted in events: the values that count (a time is no count of events).
    let counts: Vec<usize> = (0..value_types.len())
        .filter(|&index| value_types[index].unit == "count")
        .collect();
    let mut not_the_targets = 0;
    let raw: Vec<RawSample> = raw
        .into_iter()
        .filter(|sample| {
            let own = held_at_entry(sample, &mut symbolizer);
            if own {
                not_the_targets += counts.iter().map(|&i| sample.values[i]).sum::<i64>();
            }
            !own
        })
        .collect();
    let mut builder = ProfileBuilder::new(&mut symbolizer, value_types);
    for sample in &raw {
        builder.add(sample);
    }
    summary.losses = limits::reported(&limits);
    summary.not_the_targets = u64::try_from(not_the_targets).unwrap_or(0);
    let metadata = Metadata {
        command: source.argv,
        pid: source.pid,
        executable: source.executable,
        started: Some(source.started_at),
        timeline: source.timeline,
        duration: source.elapsed,
        period,
    };
    let probes = source.probes.iter().map(|p| p.text.clone()).collect();
    let mut profile = builder.finish(probes, summary, metadata);
    profile.heap = heap.map(|heap| HeapTotals {
        timeline: source.heap_timeline,
        allocators,
        ..heap
    });
    profile
}
