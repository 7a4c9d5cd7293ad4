//! The profile as JSON, for scripts: every sample with all its values, locations with
//! their inline frames, mappings with build ids, the run's counters and metadata. The
//! schema is docs/json.md; addresses are hex strings (kernel addresses exceed the
//! integers JSON readers keep exactly).

use std::io::{self, Write};
use std::time::UNIX_EPOCH;

use serde_json::{json, Value};

use crate::{AllocatorCounted, HeapTotals, Lost, Profile, SamplingMode};

/// The schema's version: bumped when a field changes meaning or goes away.
pub const VERSION: u32 = 1;

pub fn write(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer(&mut *out, &to_json(profile))?;
    writeln!(out)
}

fn hex(address: u64) -> String {
    format!("{address:#x}")
}

/// Named counters as a JSON object, in their order.
fn counters(named: &[(String, u64)]) -> serde_json::Map<String, Value> {
    named
        .iter()
        .map(|(name, count)| (name.clone(), json!(count)))
        .collect()
}

/// Losses as a JSON object of counts, in their order, and the options that raise each
/// limit among them (name → array of options; the losses no option changes left out).
fn losses(lost: &[Lost]) -> (Value, Value) {
    let counts: serde_json::Map<String, Value> = lost
        .iter()
        .map(|lost| (lost.what.clone(), json!(lost.count)))
        .collect();
    let raised_by: serde_json::Map<String, Value> = lost
        .iter()
        .filter(|lost| !lost.raised_by.is_empty())
        .map(|lost| (lost.what.clone(), json!(lost.raised_by)))
        .collect();
    (Value::Object(counts), Value::Object(raised_by))
}

pub fn to_json(profile: &Profile) -> Value {
    let metadata = &profile.metadata;
    let summary = &profile.summary;
    let (lost, raised_by) = losses(&summary.losses);
    let totals: Vec<i64> = (0..profile.value_types.len())
        .map(|index| profile.total(index))
        .collect();
    json!({
        "format": "cargo-trace-profile",
        "version": VERSION,
        "command": metadata.command,
        "pid": metadata.pid,
        "executable": metadata.executable,
        "start_unix_ns": metadata
            .started
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as u64),
        "duration_ns": metadata.duration.as_nanos() as u64,
        "period": metadata.period.as_ref().map(|(kind, value)| json!({
            "type": kind.kind,
            "unit": kind.unit,
            "value": value,
        })),
        "timeline": metadata.timeline.iter().map(|p| json!({
            "at_ns": p.at.as_nanos() as u64,
            "walks": p.walks,
        })).collect::<Vec<_>>(),
        "probes": profile.probes,
        "value_types": profile.value_types.iter().map(|t| json!({
            "type": t.kind,
            "unit": t.unit,
        })).collect::<Vec<_>>(),
        "summary": {
            "totals": totals,
            "distinct_stacks": profile.samples.len(),
            "processes": profile.processes(),
            "walk_failures": counters(&summary.failures),
            "losses": lost,
            "raised_by": raised_by,
            "in_execve": summary.in_exec,
            "no_user_stack": counters(&summary.no_user_stack),
            "not_the_targets": summary.not_the_targets,
            "merged_processes": summary.merged_processes,
            "without_unwind_table": summary.without_table.iter().map(|(object, reason)| json!({
                "object": object,
                "reason": reason,
            })).collect::<Vec<_>>(),
        },
        "mappings": profile.mappings.iter().map(|m| json!({
            "start": hex(m.start),
            "end": hex(m.end),
            "file_offset": hex(m.file_offset),
            "path": m.path,
            "build_id": m.build_id,
        })).collect::<Vec<_>>(),
        "locations": profile.locations.iter().map(|l| json!({
            "address": hex(l.address),
            "mapping": l.mapping,
            "kernel": l.kernel,
            "frames": l.frames.iter().map(|f| json!({
                "function": f.function,
                "file": f.file,
                "line": f.line,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "heap": heap(profile),
        "samples": profile.samples.iter().map(|s| json!({
            "probe": s.probe,
            "pid": s.pid,
            "stack": s.stack,
            "truncated": s.truncated,
            "values": s.values,
        })).collect::<Vec<_>>(),
    })
}

/// The heap profile's totals as the text report states them, per process, the
/// events lost, sampling and the timeline; `null` without a heap profile.
fn heap(profile: &Profile) -> Value {
    let (Some(heap), Some(sums)) = (&profile.heap, profile.heap_sums()) else {
        return Value::Null;
    };
    let sampling = heap.sampling_mode.map(|mode| {
        let (mode, value) = match mode {
            SamplingMode::EveryNth(n) => ("every", u64::from(n)),
            SamplingMode::PerBytes(bytes) => ("bytes", bytes),
        };
        json!({"mode": mode, "value": value, "note": heap.sampling})
    });
    let (lost, raised_by) = losses(&heap.lost);
    json!({
        "allocations": sums.allocs,
        "bytes_allocated": sums.bytes,
        "frees": sums.frees,
        "bytes_freed": sums.freed_bytes,
        "peak_live_bytes": sums.peak_bytes,
        "leaked_blocks": sums.leaked_blocks,
        "leaked_bytes": sums.leaked_bytes,
        "temporaries": sums.temporaries,
        "temporary_threshold_ns": heap.temporary_threshold.as_nanos() as u64,
        "unknown_frees": sums.unknown_frees,
        "sampling": sampling,
        "size_filter": heap.size_filter,
        "lost": lost,
        "raised_by": raised_by,
        "mapped": heap.mapped.as_ref().map(|mapped| {
            let total = mapped.total();
            json!({
                "counted": mapped.counted,
                "mappings": total.maps,
                "bytes": total.bytes,
                "unmappings": total.unmaps,
                "bytes_unmapped": total.unmapped_bytes,
                "live_bytes": total.live_bytes,
                "processes": mapped.processes.iter().map(|p| json!({
                    "pid": p.pid,
                    "mappings": p.maps,
                    "bytes": p.bytes,
                    "unmappings": p.unmaps,
                    "bytes_unmapped": p.unmapped_bytes,
                    "live_bytes": p.live_bytes,
                })).collect::<Vec<_>>(),
            })
        }),
        "in_process": heap.in_process.as_ref().map(|memory| json!({
            "processes": memory.processes,
            "region_used_bytes": memory.region_used,
            "region_bytes": memory.region_bound,
            "own_bytes": memory.private_bytes,
            "own_bound_bytes": memory.private_bound,
        })),
        "processes": heap.processes.iter().map(|p| json!({
            "probe": p.probe,
            "pid": p.pid,
            "allocators": allocators_of(heap, p.pid),
            "allocations": p.allocs,
            "bytes_allocated": p.bytes,
            "frees": p.frees,
            "bytes_freed": p.freed_bytes,
            "live_bytes": p.live_bytes,
            "peak_live_bytes": p.peak_bytes,
            "unknown_frees": p.unknown_frees,
        })).collect::<Vec<_>>(),
        "allocators": heap.allocators.iter().map(|entry| json!({
            "pid": entry.pid,
            "executable": entry.executable,
            "processes": entry.processes,
            "allocators": entry.allocators.iter().map(allocator).collect::<Vec<_>>(),
            "missed": entry.missed.as_ref().map(|missed| json!({
                "reason": missed.reason,
                "count": missed.count,
            })),
        })).collect::<Vec<_>>(),
        "timeline": heap.timeline.iter().map(|p| json!({
            "at_ns": p.at.as_nanos() as u64,
            "live_bytes": p.live_bytes,
            "allocations": p.allocs,
            "frees": p.frees,
            "rss_bytes": p.rss_bytes,
        })).collect::<Vec<_>>(),
    })
}

fn allocator(counted: &AllocatorCounted) -> Value {
    json!({
        "name": counted.name,
        "prefix": counted.prefix,
        "object": counted.object,
        "counted_by": counted.counted_by.name(),
        "text": counted.to_string(),
    })
}

/// The allocators counted in process `pid` (under pid 0, in every executable's processes
/// counted together), each once.
fn allocators_of(heap: &HeapTotals, pid: u32) -> Vec<Value> {
    let mut counted: Vec<&AllocatorCounted> = heap
        .allocators
        .iter()
        .filter(|entry| entry.pid == pid)
        .flat_map(|entry| &entry.allocators)
        .collect();
    counted.sort();
    counted.dedup();
    counted.into_iter().map(allocator).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::{example, golden};

    #[test]
    fn the_example_as_json() {
        let profile = example();
        let mut out = Vec::new();
        write(&profile, &mut out).unwrap();
        golden("example.json", &out);
        let value: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["version"], 1);
        assert_eq!(value["summary"]["totals"], json!([11, 571]));
        assert_eq!(value["summary"]["walk_failures"]["read fault"], 2);
        assert_eq!(value["samples"][1]["truncated"], "read fault");
        assert_eq!(value["locations"][4]["address"], "0xffffffff81000000");
        assert_eq!(
            value["locations"][0]["frames"][0]["function"],
            "demo::inlined_helper"
        );
        assert_eq!(value["mappings"][0]["build_id"], "0123abcd");
        assert_eq!(value["heap"], Value::Null);
    }

    #[test]
    fn heap_totals_are_the_reports() {
        use crate::{HeapProcess, HeapTotals};
        let mut profile = example();
        // A heap profile of two processes: the totals sum them, the peak is the highest.
        profile.value_types = crate::heap::value_types();
        let width = profile.value_types.len();
        for (i, sample) in profile.samples.iter_mut().enumerate() {
            sample.values = vec![0; width];
            sample.values[profile_index(crate::heap::LEAKED_BLOCKS)] = i as i64;
            sample.values[profile_index(crate::heap::TEMPORARIES)] = 2;
        }
        // The blocks the full live map left untracked.
        profile.samples[0].values[profile_index(crate::heap::UNTRACKED)] = 4;
        let process = |pid, allocs, peak_bytes| HeapProcess {
            probe: 0,
            pid,
            allocs,
            bytes: allocs * 100,
            frees: allocs - 1,
            freed_bytes: (allocs - 1) * 100,
            live_bytes: 100,
            peak_bytes,
            unknown_frees: 3,
        };
        profile.heap = Some(HeapTotals {
            processes: vec![process(42, 10, 700), process(43, 5, 900)],
            lost: vec![crate::writers::tests::lost(
                "blocks untracked (live map full)",
                4,
                &["--max-live-blocks"],
            )],
            temporary_threshold: std::time::Duration::from_millis(1),
            sampling: Some("1 in 3".into()),
            sampling_mode: Some(SamplingMode::EveryNth(3)),
            ..HeapTotals::default()
        });
        let heap = &to_json(&profile)["heap"];
        assert_eq!(heap["allocations"], 15);
        assert_eq!(heap["bytes_allocated"], 1500);
        assert_eq!(heap["frees"], 13);
        assert_eq!(heap["bytes_freed"], 1300);
        assert_eq!(heap["peak_live_bytes"], 900);
        assert_eq!(heap["leaked_blocks"], 1 + 2 + 3 + 4);
        assert_eq!(heap["leaked_bytes"], 200);
        assert_eq!(heap["temporaries"], 10);
        assert_eq!(heap["temporary_threshold_ns"], 1_000_000);
        assert_eq!(heap["unknown_frees"], 6);
        assert_eq!(heap["sampling"]["mode"], "every");
        assert_eq!(heap["sampling"]["value"], 3);
        assert_eq!(heap["lost"]["blocks untracked (live map full)"], 4);
        assert_eq!(
            heap["raised_by"]["blocks untracked (live map full)"],
            json!(["--max-live-blocks"])
        );
        assert_eq!(heap["processes"][1]["peak_live_bytes"], 900);
        let mut report = Vec::new();
        crate::writers::heap_report::write(&profile, crate::heap::OrderBy::Bytes, &mut report)
            .unwrap();
        let report = String::from_utf8(report).unwrap();
        assert!(
            report.contains("allocations 15 (1500 B (1.5 KiB)), frees 13 (1300 B (1.3 KiB))")
                && report.contains(
                    "peak 900 B live; leaked 10 blocks (200 B) at the end; \
                     temporaries 10 (freed within 1ms); unknown frees 6"
                )
                && report.contains(
                    "note: blocks untracked (live map full): 4 (--max-live-blocks)\n\
                     note: untracked blocks are counted as allocated, never as freed or leaked\n"
                ),
            "{report}"
        );
    }

    fn profile_index(kind: &str) -> usize {
        crate::heap::value_types()
            .iter()
            .position(|t| t.kind == kind)
            .unwrap()
    }
}
