//! speedscope's file format (<https://www.speedscope.app/file-format-schema.json>), as
//! the speedscope app reads it.
//!
//! One "sampled" profile per process (per probe and process when the session had several
//! probes) and per value worth a view of its own, named for a person ("./server (pid 42)
//! — bytes leaked"); the app switches between them (its profile menu, `n` and `p`). The
//! values worth a view: a heap profile's metrics (allocations, bytes allocated, blocks and
//! bytes leaked, temporaries, bytes at the peak), not its histogram buckets; of the other
//! values, one of each set that are multiples of each other (a clock's samples and CPU
//! time: the time, which the app shows in its unit); none that is 0 in the process. The
//! profile of the value the writers weigh by opens first, for the process with the most.
//! The model keeps no threads apart, so neither does the file.
//!
//! Frames are shared between the profiles. Root frames that are not code appear as in
//! the folded output (`[truncated: REASON]`, `[no stack]`); kernel frames carry
//! inferno's `_[k]` suffix.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use serde_json::json;

use super::Weighting;
use crate::heap::{self, Metric};
use crate::{Profile, Sample, ValueType, MERGED_PID};

pub fn write(profile: &Profile, weighting: Weighting, out: &mut dyn Write) -> io::Result<()> {
    let mut frames = Frames::default();
    let mut profiles = Vec::new();
    let mut opening: Option<(i64, usize)> = None;
    for ((probe, pid), samples) in groups(profile) {
        for value in views(profile, &samples) {
            let mut stacks: Vec<Vec<usize>> = Vec::new();
            let mut weights: Vec<i64> = Vec::new();
            for sample in samples.iter().filter(|s| s.values[value] != 0) {
                stacks.push(frames.stack(profile, sample));
                weights.push(sample.values[value]);
            }
            let total: i64 = weights.iter().sum();
            if value == weighting.value && opening.is_none_or(|(most, _)| total > most) {
                opening = Some((total, profiles.len()));
            }
            let value_type = &profile.value_types[value];
            profiles.push(json!({
                "type": "sampled",
                "name": format!(
                    "{} — {}",
                    process_name(profile, probe, pid),
                    describe(value_type)
                ),
                "unit": unit(value_type),
                "startValue": 0,
                "endValue": total,
                "samples": stacks,
                "weights": weights,
            }));
        }
    }
    if profiles.is_empty() {
        profiles.push(json!({
            "type": "sampled",
            "name": format!("{}: no events", profile.probes.join(" ")),
            "unit": "none",
            "startValue": 0,
            "endValue": 0,
            "samples": [],
            "weights": [],
        }));
    }
    let name = match &profile.metadata.command {
        Some(command) => format!("{} ({})", command.join(" "), profile.probes.join(" ")),
        None => format!(
            "pid {} ({})",
            profile.metadata.pid,
            profile.probes.join(" ")
        ),
    };
    let document = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "exporter": format!("cargo-trace {}", env!("CARGO_PKG_VERSION")),
        "name": name,
        "activeProfileIndex": opening.map_or(0, |(_, index)| index),
        "shared": { "frames": frames.list },
        "profiles": profiles,
    });
    serde_json::to_writer(&mut *out, &document)?;
    writeln!(out)
}

/// The samples by probe and process: the probes in their order, the target's process
/// first, then the others by pid, the exited processes added up last.
fn groups(profile: &Profile) -> BTreeMap<(usize, (u8, u32)), Vec<&Sample>> {
    let mut groups: BTreeMap<(usize, (u8, u32)), Vec<&Sample>> = BTreeMap::new();
    for sample in &profile.samples {
        let rank = if sample.pid == profile.metadata.pid {
            0
        } else if sample.pid == MERGED_PID && profile.summary.merged_processes > 0 {
            2
        } else {
            1
        };
        groups
            .entry((sample.probe, (rank, sample.pid)))
            .or_default()
            .push(sample);
    }
    groups
}

/// The values of `samples` worth a view, in the order of the profile's values.
fn views(profile: &Profile, samples: &[&Sample]) -> Vec<usize> {
    let mut totals = vec![0i128; profile.value_types.len()];
    for sample in samples {
        for (total, &value) in totals.iter_mut().zip(&sample.values) {
            *total += i128::from(value);
        }
    }
    let total = |value: usize| totals[value];
    let heap_kinds: Vec<String> = heap::value_types().into_iter().map(|t| t.kind).collect();
    let mut views: Vec<usize> = Vec::new();
    for (value, value_type) in profile.value_types.iter().enumerate() {
        let heap_value = heap_kinds.contains(&value_type.kind);
        if (heap_value && Metric::of_kind(&value_type.kind).is_none()) || total(value) == 0 {
            continue;
        }
        if heap_value {
            views.push(value);
            continue;
        }
        // One of the values that are multiples of each other: the first, or one the app
        // shows in a unit where the first has none.
        let multiple = views.iter().position(|&view| {
            !heap_kinds.contains(&profile.value_types[view].kind)
                && samples.iter().all(|s| {
                    i128::from(s.values[value]) * total(view)
                        == i128::from(s.values[view]) * total(value)
                })
        });
        match multiple {
            None => views.push(value),
            Some(position) => {
                if unit(&profile.value_types[views[position]]) == "none"
                    && unit(value_type) != "none"
                {
                    views[position] = value;
                }
            }
        }
    }
    views
}

/// How the profiles name a process: by its command when it is the target.
fn process_name(profile: &Profile, probe: usize, (rank, pid): (u8, u32)) -> String {
    let process = match (rank, &profile.metadata.command) {
        (0, Some(command)) => format!("{} (pid {pid})", command[0]),
        (2, _) => "exited processes, added up".to_string(),
        _ => format!("pid {pid}"),
    };
    if profile.probes.len() > 1 {
        format!("{process}, {}", profile.probes[probe])
    } else {
        process
    }
}

/// A value's name for a person.
fn describe(value_type: &ValueType) -> String {
    if let Some(metric) = Metric::of_kind(&value_type.kind) {
        return metric.describe().to_string();
    }
    match value_type.kind.as_str() {
        "cpu" => "CPU time".to_string(),
        "off-cpu" => "time off the CPU".to_string(),
        "blocks" => "times off the CPU".to_string(),
        "time" => "time on and off the CPU".to_string(),
        kind => kind.to_string(),
    }
}

/// The app's unit of a value.
fn unit(value_type: &ValueType) -> &'static str {
    match value_type.unit.as_str() {
        "nanoseconds" => "nanoseconds",
        "microseconds" => "microseconds",
        "bytes" => "bytes",
        _ => "none",
    }
}

/// The frames shared by the profiles, each once.
#[derive(Default)]
struct Frames {
    list: Vec<serde_json::Value>,
    ids: HashMap<(String, Option<String>, Option<u32>), usize>,
}

impl Frames {
    fn id(&mut self, name: String, file: Option<String>, line: Option<u32>) -> usize {
        let key = (name, file, line);
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.list.len();
        let (name, file, line) = key.clone();
        let mut value = json!({ "name": name });
        if let Some(file) = file {
            value["file"] = json!(file);
        }
        if let Some(line) = line {
            value["line"] = json!(line);
        }
        self.list.push(value);
        self.ids.insert(key, id);
        id
    }

    /// The frames of a sample's stack, root first.
    fn stack(&mut self, profile: &Profile, sample: &Sample) -> Vec<usize> {
        let mut stack = Vec::new();
        if let Some(reason) = &sample.truncated {
            stack.push(self.id(format!("[truncated: {reason}]"), None, None));
        }
        for &id in sample.stack.iter().rev() {
            let location = &profile.locations[id];
            for f in location.frames.iter().rev() {
                let name = if location.kernel {
                    format!("{}_[k]", f.function)
                } else {
                    f.function.clone()
                };
                stack.push(self.id(name, f.file.clone(), f.line));
            }
        }
        if stack.is_empty() {
            stack.push(self.id("[no stack]".to_string(), None, None));
        }
        stack
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::{example, golden, heap_example};

    fn written(profile: &Profile, weighting: Weighting, name: &str) -> serde_json::Value {
        let mut out = Vec::new();
        write(profile, weighting, &mut out).unwrap();
        golden(name, &out);
        serde_json::from_slice(&out).unwrap()
    }

    /// The profiles' names, `endValue`s and units.
    fn profiles(file: &serde_json::Value) -> Vec<(String, i64, String)> {
        file["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_string(),
                    p["endValue"].as_i64().unwrap(),
                    p["unit"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// The frame names of sample `index` of profile `profile`, root first.
    fn stack(file: &serde_json::Value, profile: usize, index: usize) -> Vec<&str> {
        let frames = file["shared"]["frames"].as_array().unwrap();
        file["profiles"][profile]["samples"][index]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| {
                frames[id.as_u64().unwrap() as usize]["name"]
                    .as_str()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn the_example_as_speedscope() {
        let file = written(&example(), Weighting::default(), "example.speedscope.json");
        let named = |name: &str, total, unit: &str| (name.to_string(), total, unit.to_string());
        // Each probe's values apart, the values that are 0 left out.
        assert_eq!(
            profiles(&file),
            [
                named("./demo (pid 42), uprobe:libc:malloc — events", 7, "none"),
                named("./demo (pid 42), uprobe:libc:malloc — bytes", 571, "bytes"),
                named("./demo (pid 42), profile:hz:99 — events", 4, "none"),
            ]
        );
        assert_eq!(file["activeProfileIndex"], 0);
        assert_eq!(
            file["name"],
            "./demo arg (uprobe:libc:malloc profile:hz:99)"
        );
        // The malloc probe's events: two weighed stacks (the zero-weight one is left out).
        assert_eq!(file["profiles"][0]["weights"], json!([5, 2]));
        assert_eq!(
            stack(&file, 0, 0),
            [
                "__libc_start_call_main",
                "demo::main",
                "demo::work",
                "demo::inlined_helper"
            ]
        );
        assert_eq!(stack(&file, 0, 1)[0], "[truncated: read fault]");
        assert_eq!(stack(&file, 2, 1), ["[no stack]"]);
        assert_eq!(stack(&file, 2, 0).last(), Some(&"do_syscall_64_[k]"));
    }

    /// A heap profile: each process's metrics, the process that started first, the one
    /// weighed by opening.
    #[test]
    fn a_heap_profile_per_process_and_metric() {
        let profile = heap_example();
        let weighting = Weighting {
            value: profile.value_index(heap::ALLOC_SPACE).unwrap(),
            line_numbers: false,
        };
        let file = written(&profile, weighting, "heap-example.speedscope.json");
        let named = |name: &str, total, unit: &str| (name.to_string(), total, unit.to_string());
        assert_eq!(
            profiles(&file),
            [
                named("./leaky (pid 42) — allocations", 1200, "none"),
                named("./leaky (pid 42) — bytes allocated", 266_600, "bytes"),
                named("./leaky (pid 42) — blocks leaked", 150, "none"),
                named("./leaky (pid 42) — bytes leaked", 151_950, "bytes"),
                named("./leaky (pid 42) — temporary allocations", 990, "none"),
                named(
                    "./leaky (pid 42) — bytes live at the peak",
                    203_240,
                    "bytes"
                ),
                named("pid 43 — allocations", 12, "none"),
                named("pid 43 — bytes allocated", 8352, "bytes"),
                named("pid 43 — blocks leaked", 2, "none"),
                named("pid 43 — bytes leaked", 8192, "bytes"),
                named("pid 43 — bytes live at the peak", 8352, "bytes"),
            ]
        );
        assert_eq!(file["activeProfileIndex"], 1);
        // What leaked: the leaking site's stack only.
        assert_eq!(file["profiles"][3]["weights"], json!([151_950]));
        assert_eq!(
            stack(&file, 3, 0),
            ["__libc_start_call_main", "main", "leak_site", "malloc"]
        );
    }

    /// A clock's samples and the CPU time they stand for are one view, in time.
    #[test]
    fn values_that_are_multiples_are_one_view() {
        let mut profile = example();
        profile.probes.truncate(1);
        profile.value_types = vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ];
        for sample in &mut profile.samples {
            sample.probe = 0;
            sample.values = vec![sample.values[0], sample.values[0] * 10_101_010];
        }
        profile.metadata.command = None;
        let mut out = Vec::new();
        write(&profile, Weighting::default(), &mut out).unwrap();
        let file: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            profiles(&file),
            [(
                "pid 42 — CPU time".to_string(),
                11 * 10_101_010,
                "nanoseconds".to_string()
            )]
        );
        assert_eq!(file["name"], "pid 42 (uprobe:libc:malloc)");
    }

    #[test]
    fn a_profile_without_samples_is_one_empty_profile() {
        let mut profile = example();
        profile.samples.clear();
        let mut out = Vec::new();
        write(&profile, Weighting::default(), &mut out).unwrap();
        let file: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            profiles(&file),
            [(
                "uprobe:libc:malloc profile:hz:99: no events".to_string(),
                0,
                "none".to_string()
            )]
        );
    }
}
