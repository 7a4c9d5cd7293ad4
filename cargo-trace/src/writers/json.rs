//! The profile as JSON, for scripts: every sample with all its values, locations with
//! their inline frames, mappings with build ids, the run's counters and metadata. The
//! schema is docs/json.md; addresses are hex strings (kernel addresses exceed the
//! integers JSON readers keep exactly).

use std::io::{self, Write};
use std::time::UNIX_EPOCH;

use serde_json::{json, Value};

use crate::profile::Profile;

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

pub fn to_json(profile: &Profile) -> Value {
    let metadata = &profile.metadata;
    let summary = &profile.summary;
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
            "losses": counters(&summary.losses),
            "in_execve": summary.in_exec,
            "not_the_targets": summary.not_the_targets,
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
        "samples": profile.samples.iter().map(|s| json!({
            "probe": s.probe,
            "pid": s.pid,
            "stack": s.stack,
            "truncated": s.truncated,
            "values": s.values,
        })).collect::<Vec<_>>(),
    })
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
    }
}
