//! speedscope's file format (<https://www.speedscope.app/file-format-schema.json>), as
//! the speedscope app reads it.
//!
//! One "sampled" profile per process (per probe and process when the session had several
//! probes) and per value worth a view of its own, named for a person ("server (pid 42) —
//! bytes leaked"); the app switches between them (its profile menu, `n` and `p`). The
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

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use serde_json::json;

use super::Weighting;
use crate::heap::{self, Metric};
use crate::{Profile, Sample, ValueType, MERGED_PID};

/// One profile of the file: a value of one process's samples.
struct View<'a> {
    name: String,
    value_type: &'a ValueType,
    value: usize,
    /// The samples that weigh something.
    samples: Vec<&'a Sample>,
    total: i64,
}

/// Writes the file as it goes: a profile of 100 k stacks 300 frames deep is some 100 MB
/// of frame indexes per view.
pub fn write(profile: &Profile, weighting: Weighting, out: &mut dyn Write) -> io::Result<()> {
    let frames = Frames::of(profile);
    let mut views: Vec<View> = Vec::new();
    for ((probe, pid), mut samples) in groups(profile) {
        // In the order of their frames, so that the app's time-ordered view merges the
        // stacks that share a beginning, as a flamegraph does: in the order of the
        // profile, 100 k stacks 300 frames deep make a tree of 30 M nodes, which the app
        // cannot hold.
        samples.sort_by(|a, b| frames.stack(a).cmp(frames.stack(b)));
        for value in views_of(profile, &samples) {
            let value_type = &profile.value_types[value];
            let samples: Vec<&Sample> = samples
                .iter()
                .copied()
                .filter(|s| s.values[value] > 0)
                .collect();
            views.push(View {
                name: format!(
                    "{} — {}",
                    process_name(profile, probe, pid),
                    describe(value_type)
                ),
                value_type,
                value,
                total: samples.iter().map(|s| s.values[value]).sum(),
                samples,
            });
        }
    }
    // The view of the value the writers weigh by, of the process with the most.
    let opening = views
        .iter()
        .enumerate()
        .filter(|(_, view)| view.value == weighting.value)
        .max_by_key(|&(index, view)| (view.total, Reverse(index)))
        .map_or(0, |(index, _)| index);
    let name = match &profile.metadata.command {
        Some(command) => format!("{} ({})", command.join(" "), profile.probes.join(" ")),
        None => format!(
            "pid {} ({})",
            profile.metadata.pid,
            profile.probes.join(" ")
        ),
    };

    let mut out = io::BufWriter::new(out);
    let header = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "exporter": format!("cargo-trace {}", env!("CARGO_PKG_VERSION")),
        "name": name,
        "activeProfileIndex": opening,
        "shared": { "frames": frames.list },
    });
    // The header's fields, then the profiles written one number at a time.
    let mut header = serde_json::to_vec(&header)?;
    header.pop(); // its closing brace: the profiles follow
    out.write_all(&header)?;
    out.write_all(b",\"profiles\":[")?;
    for (index, view) in views.iter().enumerate() {
        if index > 0 {
            out.write_all(b",")?;
        }
        write!(out, "{{\"type\":\"sampled\",\"name\":")?;
        serde_json::to_writer(&mut out, &view.name)?;
        write!(
            out,
            ",\"unit\":\"{}\",\"startValue\":0,\"endValue\":{},\"samples\":[",
            unit(view.value_type),
            view.total
        )?;
        for (index, sample) in view.samples.iter().enumerate() {
            if index > 0 {
                out.write_all(b",")?;
            }
            frames.write_stack(&mut out, sample)?;
        }
        out.write_all(b"],\"weights\":[")?;
        for (index, sample) in view.samples.iter().enumerate() {
            if index > 0 {
                out.write_all(b",")?;
            }
            write_number(&mut out, sample.values[view.value] as u64)?;
        }
        out.write_all(b"]}")?;
    }
    if views.is_empty() {
        let empty = json!({
            "type": "sampled",
            "name": format!("{}: no events", profile.probes.join(" ")),
            "unit": "none",
            "startValue": 0,
            "endValue": 0,
            "samples": [],
            "weights": [],
        });
        serde_json::to_writer(&mut out, &empty)?;
    }
    out.write_all(b"]}\n")?;
    out.flush()
}

/// `n` in decimal, without `write!`'s formatting machinery: a big file holds hundreds of
/// millions of them.
fn write_number(out: &mut dyn Write, mut n: u64) -> io::Result<()> {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.write_all(&digits[start..])
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
fn views_of(profile: &Profile, samples: &[&Sample]) -> Vec<usize> {
    let mut totals = vec![0i128; profile.value_types.len()];
    for sample in samples {
        for (total, &value) in totals.iter_mut().zip(&sample.values) {
            // A view draws what weighs something (a sampled estimate can be below 0).
            *total += i128::from(value.max(0));
        }
    }
    let total = |value: usize| totals[value];
    let mut views: Vec<usize> = Vec::new();
    for (value, value_type) in profile.value_types.iter().enumerate() {
        let heap_value = heap::is_heap_value(&value_type.kind);
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
            !heap::is_heap_value(&profile.value_types[view].kind)
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

/// How the profiles name a process: by its program's file name when it is the target.
fn process_name(profile: &Profile, probe: usize, (rank, pid): (u8, u32)) -> String {
    let process = match (rank, &profile.metadata.command) {
        (0, Some(command)) => {
            let program = std::path::Path::new(&command[0]).file_name();
            let program = program.map_or(command[0].as_str(), |name| {
                name.to_str().unwrap_or(command[0].as_str())
            });
            format!("{program} (pid {pid})")
        }
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

/// The frames shared by the profiles, each once, and each location's frames by index.
struct Frames {
    list: Vec<serde_json::Value>,
    /// The frames of each location, outermost first.
    of_location: Vec<Vec<usize>>,
    /// `[truncated: REASON]` by reason.
    truncated: HashMap<String, usize>,
    /// `[no stack]`, when a sample has none.
    no_stack: Option<usize>,
}

impl Frames {
    fn of(profile: &Profile) -> Frames {
        let mut list = Vec::new();
        let mut ids: HashMap<(String, Option<String>, Option<u32>, bool), usize> = HashMap::new();
        let mut id = |name: &str, file: Option<&str>, line: Option<u32>, kernel: bool| {
            let key = (name.to_string(), file.map(str::to_string), line, kernel);
            *ids.entry(key).or_insert_with(|| {
                let name = if kernel {
                    format!("{name}_[k]")
                } else {
                    name.to_string()
                };
                let mut value = json!({ "name": name });
                if let Some(file) = file {
                    value["file"] = json!(file);
                }
                if let Some(line) = line {
                    value["line"] = json!(line);
                }
                list.push(value);
                list.len() - 1
            })
        };
        let mut truncated = HashMap::new();
        for reason in profile.samples.iter().filter_map(|s| s.truncated.as_ref()) {
            let frame = id(&format!("[truncated: {reason}]"), None, None, false);
            truncated.insert(reason.clone(), frame);
        }
        let no_stack = profile
            .samples
            .iter()
            .any(|s| s.stack.is_empty())
            .then(|| id("[no stack]", None, None, false));
        let of_location = profile
            .locations
            .iter()
            .map(|location| {
                location
                    .frames
                    .iter()
                    .rev()
                    .map(|f| id(&f.function, f.file.as_deref(), f.line, location.kernel))
                    .collect()
            })
            .collect();
        Frames {
            list,
            of_location,
            truncated,
            no_stack,
        }
    }

    /// The frames of a sample's stack, root first.
    fn stack<'a>(&'a self, sample: &'a Sample) -> impl Iterator<Item = usize> + 'a {
        let truncated = sample
            .truncated
            .as_deref()
            .map(|reason| self.truncated[reason]);
        let no_stack = (sample.stack.is_empty() && sample.truncated.is_none())
            .then(|| self.no_stack.expect("a frame for samples without a stack"));
        truncated
            .into_iter()
            .chain(
                sample
                    .stack
                    .iter()
                    .rev()
                    .flat_map(|&location| self.of_location[location].iter().copied()),
            )
            .chain(no_stack)
    }

    /// The frames of a sample's stack, root first, as a JSON array.
    fn write_stack(&self, out: &mut dyn Write, sample: &Sample) -> io::Result<()> {
        out.write_all(b"[")?;
        for (index, id) in self.stack(sample).enumerate() {
            if index > 0 {
                out.write_all(b",")?;
            }
            write_number(out, id as u64)?;
        }
        out.write_all(b"]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::{example, golden, leaky_example};

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
                named("demo (pid 42), uprobe:libc:malloc — events", 7, "none"),
                named("demo (pid 42), uprobe:libc:malloc — bytes", 571, "bytes"),
                named("demo (pid 42), profile:hz:99 — events", 4, "none"),
            ]
        );
        assert_eq!(file["activeProfileIndex"], 0);
        assert_eq!(
            file["name"],
            "./demo arg (uprobe:libc:malloc profile:hz:99)"
        );
        // The malloc probe's events: two weighed stacks (the zero-weight one is left out),
        // in the order of their frames.
        assert_eq!(file["profiles"][0]["weights"], json!([2, 5]));
        assert_eq!(stack(&file, 0, 0)[0], "[truncated: read fault]");
        assert_eq!(
            stack(&file, 0, 1),
            [
                "__libc_start_call_main",
                "demo::main",
                "demo::work",
                "demo::inlined_helper"
            ]
        );
        // Stacks that begin alike are next to each other, shorter first.
        assert_eq!(file["profiles"][1]["weights"], json!([64, 7, 500]));
        assert_eq!(stack(&file, 1, 1), ["__libc_start_call_main", "demo::main"]);
        assert_eq!(stack(&file, 2, 0), ["[no stack]"]);
        assert_eq!(stack(&file, 2, 1).last(), Some(&"do_syscall_64_[k]"));
    }

    /// A heap profile: each process's metrics, the process that started first, the one
    /// weighed by opening.
    #[test]
    fn a_heap_profile_per_process_and_metric() {
        let profile = leaky_example();
        let weighting = Weighting {
            value: profile.value_index(heap::ALLOC_SPACE).unwrap(),
            line_numbers: false,
        };
        let file = written(&profile, weighting, "heap-example.speedscope.json");
        let named = |name: &str, total, unit: &str| (name.to_string(), total, unit.to_string());
        assert_eq!(
            profiles(&file),
            [
                named("leaky (pid 42) — allocations", 1200, "none"),
                named("leaky (pid 42) — bytes allocated", 266_600, "bytes"),
                named("leaky (pid 42) — blocks leaked", 150, "none"),
                named("leaky (pid 42) — bytes leaked", 151_950, "bytes"),
                named("leaky (pid 42) — temporary allocations", 990, "none"),
                named("leaky (pid 42) — bytes live at the peak", 203_240, "bytes"),
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
