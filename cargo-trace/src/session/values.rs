//! What the samples of a session weigh: the value columns of the events' probes (clock
//! samples and CPU time, time off the CPU, events), and the heap's values, each turned
//! from what the collectors counted into the samples the profile builder takes.

use std::time::SystemTime;

use profile::{HeapTotals, SamplingMode, ValueType};

use crate::collect::{EventCount, HeapCollected};
use crate::probe::{Probe, Weight};
use crate::settings::HeapSettings;
use crate::symbolize::RawSample;

/// A value of the session's samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    /// Clock samples.
    Samples,
    /// The CPU time clock samples stand for.
    Cpu,
    /// Nanoseconds off the CPU.
    OffCpu,
    /// Stays off the CPU.
    Blocks,
    /// Each probe's own time: CPU time of clock samples, time off the CPU of the
    /// others, under their probes' roots; the flamegraph of a run that has both.
    Time,
    /// Events of any probe, under this name.
    Events(&'static str),
}

impl Column {
    fn value_type(self) -> ValueType {
        match self {
            Column::Samples => ValueType::new("samples", "count"),
            Column::Cpu => ValueType::new("cpu", "nanoseconds"),
            Column::OffCpu => ValueType::new("off-cpu", "nanoseconds"),
            Column::Blocks => ValueType::new("blocks", "count"),
            Column::Time => ValueType::new("time", "nanoseconds"),
            Column::Events(name) => ValueType::new(name, "count"),
        }
    }

    /// The value of `events` events of a probe that weighs `weight`, with the amount
    /// its program added.
    fn value(self, weight: Weight, events: i64, amount: i64) -> i64 {
        match (self, weight) {
            (Column::Samples, Weight::Clock(_)) | (Column::Blocks, Weight::OffCpu) => events,
            (Column::Cpu | Column::Time, Weight::Clock(period)) => events.saturating_mul(period),
            (Column::OffCpu | Column::Time, Weight::OffCpu) => amount,
            (Column::Events(_), _) => events,
            _ => 0,
        }
    }
}

/// What the samples of a session weigh: clock samples count samples and the CPU time
/// they stand for, off-CPU probes the nanoseconds off the CPU and the blocks; a run with
/// both keeps them in their own values, after one of each probe's own time for the
/// flamegraph. Other probes count what their program calls its events ("samples" of
/// other perf events, "events"), "events" when the probes' names differ, beside the
/// time off the CPU if an off-CPU probe is among them.
fn columns(weights: &[Weight]) -> Vec<Column> {
    let clock = |w: &Weight| matches!(w, Weight::Clock(_));
    let off_cpu = |w: &Weight| *w == Weight::OffCpu;
    if weights.iter().all(clock) {
        return vec![Column::Samples, Column::Cpu];
    }
    if weights.iter().all(off_cpu) {
        return vec![Column::OffCpu, Column::Blocks];
    }
    if weights.iter().all(|w| clock(w) || off_cpu(w)) {
        return vec![
            Column::Time,
            Column::Cpu,
            Column::OffCpu,
            Column::Samples,
            Column::Blocks,
        ];
    }
    let mut names = weights.iter().map(|w| match w {
        Weight::Clock(_) => "samples",
        Weight::OffCpu => "blocks",
        Weight::Events(name) => name,
    });
    let first = names.next().unwrap_or("events");
    let name = if names.all(|name| name == first) {
        first
    } else {
        "events"
    };
    let mut columns = vec![Column::Events(name)];
    if weights.iter().any(off_cpu) {
        columns.push(Column::OffCpu);
    }
    columns
}

/// The session's value types, and for a clock-only run the CPU time of a sample.
pub fn value_types(probes: &[Probe]) -> (Vec<ValueType>, Option<(ValueType, i64)>) {
    let weights: Vec<Weight> = probes.iter().filter_map(Probe::weight).collect();
    if weights.is_empty() {
        return (Vec::new(), None);
    }
    let columns = columns(&weights);
    let types = columns.iter().map(|c| c.value_type()).collect();
    let period = match columns.as_slice() {
        [Column::Samples, Column::Cpu] => weights
            .iter()
            .filter_map(|w| match w {
                Weight::Clock(period) => Some(*period),
                _ => None,
            })
            .max()
            .map(|period| (Column::Cpu.value_type(), period)),
        _ => None,
    };
    (types, period)
}

/// The events' samples, with the values [`value_types`] lists.
pub fn event_samples(events: Vec<EventCount>, probes: &[Probe]) -> Vec<RawSample> {
    // Per probe, in the probes' order (a heap probe has none: its counts are its own).
    let weights: Vec<Option<Weight>> = probes.iter().map(Probe::weight).collect();
    let columns = columns(&weights.iter().flatten().copied().collect::<Vec<_>>());
    events
        .into_iter()
        .map(|count| {
            let weight = weights
                .get(count.probe)
                .copied()
                .flatten()
                .unwrap_or(Weight::Events("events"));
            let events = i64::try_from(count.events).unwrap_or(i64::MAX);
            let amount = i64::try_from(count.amount).unwrap_or(i64::MAX);
            RawSample {
                probe: count.probe,
                pid: count.pid,
                user: count.user.frames,
                truncated: count.user.truncated,
                kernel: count.kernel,
                values: columns
                    .iter()
                    .map(|column| column.value(weight, events, amount))
                    .collect(),
            }
        })
        .collect()
}

/// Adds the heap's samples: the heap value types go after `value_types`' (the other
/// probes'), whose values the heap samples leave 0, as the others leave the heap's.
/// Blocks still live are aged as of `stopped`, when tracing stopped. Returns the heap
/// totals.
pub fn add_heap_samples(
    heap: HeapCollected,
    settings: &HeapSettings,
    value_types: &mut Vec<ValueType>,
    samples: &mut Vec<RawSample>,
    stopped: SystemTime,
) -> HeapTotals {
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
    let now_us = (heap.now_ns / 1000).saturating_sub(since_stop);
    let value = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    // What one sampled event stands for where every event weighs the same (1 in N);
    // with --sample-bytes, histograms, temporaries and peaks count the sampled blocks.
    let scale = i64::from(settings.sample_every.max(1));
    let first_heap_sample = samples.len();
    for count in heap.stacks {
        let stats = &count.stats;
        let live = stats.live_blocks;
        let age = value((live * now_us).saturating_sub(stats.live_birth_us));
        let mut values = vec![0; before];
        match &stats.estimated {
            Some(estimated) => {
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
            }
            None => values.extend([
                value(stats.allocs),
                value(stats.bytes),
                value(stats.frees),
                value(stats.freed_bytes),
                value(live),
                stats.live_bytes,
            ]),
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
            probe: count.probe,
            pid: count.pid,
            user: count.user.frames,
            truncated: count.user.truncated,
            kernel: Vec::new(),
            values,
        });
    }

    let mut processes = heap.processes;
    for process in &mut processes {
        process.peak_bytes *= scale;
    }
    if settings.sampling() {
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
            process.allocs = allocs;
            process.bytes = bytes;
            process.frees = frees;
            process.freed_bytes = freed_bytes;
            process.live_bytes = bytes as i64 - freed_bytes as i64;
        }
    }
    HeapTotals {
        processes,
        lost: heap.lost,
        temporary_threshold: settings.temporary,
        sampling: sampling_note(settings),
        sampling_mode: if settings.sample_every > 1 {
            Some(SamplingMode::EveryNth(settings.sample_every))
        } else if settings.sample_bytes > 0 {
            Some(SamplingMode::PerBytes(settings.sample_bytes))
        } else {
            None
        },
        size_filter: size_filter_note(settings),
        timeline: Vec::new(),
        mapped: heap.mapped,
        in_process: heap.in_process,
        allocators: Vec::new(),
    }
}

/// How a sampled profile's figures came to be, for the report.
fn sampling_note(settings: &HeapSettings) -> Option<String> {
    if settings.sample_every > 1 {
        Some(format!(
            "1 in {} allocating calls counted, at random: every figure is an estimate (×{})",
            settings.sample_every, settings.sample_every
        ))
    } else if settings.sample_bytes > 0 {
        Some(format!(
            "an allocation of s bytes counted with a chance of s/{}: allocations, frees and \
             bytes are unbiased estimates; temporaries, peaks and histograms count the \
             sampled blocks only",
            settings.sample_bytes
        ))
    } else {
        None
    }
}

/// Which sizes were counted, when not all were.
fn size_filter_note(settings: &HeapSettings) -> Option<String> {
    match (settings.min_size, settings.max_size) {
        (0, 0) => None,
        (min, 0) => Some(format!("allocations of {min} bytes or more")),
        (min, max) => Some(format!("allocations of {min} to {max} bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(columns: &[Column], weight: Weight, events: i64, amount: i64) -> Vec<i64> {
        columns
            .iter()
            .map(|column| column.value(weight, events, amount))
            .collect()
    }

    #[test]
    fn off_cpu_weighs_nanoseconds_first() {
        let columns = columns(&[Weight::OffCpu]);
        assert_eq!(columns, [Column::OffCpu, Column::Blocks]);
        assert_eq!(values(&columns, Weight::OffCpu, 3, 30_000), [30_000, 3]);
    }

    #[test]
    fn profile_and_off_cpu_keep_their_values_apart() {
        let clock = Weight::Clock(1_000);
        let columns = columns(&[clock, Weight::OffCpu]);
        let kinds: Vec<String> = columns.iter().map(|c| c.value_type().kind).collect();
        assert_eq!(kinds, ["time", "cpu", "off-cpu", "samples", "blocks"]);
        // Clock samples: 5 of them; the off-CPU amount is not theirs.
        assert_eq!(values(&columns, clock, 5, 0), [5_000, 5_000, 0, 5, 0]);
        assert_eq!(
            values(&columns, Weight::OffCpu, 2, 70_000),
            [70_000, 0, 70_000, 0, 2]
        );
    }

    #[test]
    fn events_of_other_probes_stay_counts() {
        assert_eq!(
            columns(&[Weight::Clock(10)]),
            [Column::Samples, Column::Cpu]
        );
        assert_eq!(
            columns(&[Weight::Events("events"), Weight::Events("events")]),
            [Column::Events("events")]
        );
        assert_eq!(
            columns(&[Weight::Events("events"), Weight::OffCpu]),
            [Column::Events("events"), Column::OffCpu]
        );
    }
}
