//! speedscope's file format (<https://www.speedscope.app/file-format-schema.json>): one
//! "sampled" profile per probe, weighed by the chosen value, frames shared between them.
//! Root frames that are not code appear as in the folded output (`[truncated: REASON]`,
//! `[no stack]`); kernel frames carry inferno's `_[k]` suffix.

use std::collections::HashMap;
use std::io::{self, Write};

use serde_json::json;

use super::Weighting;
use crate::Profile;

pub fn write(profile: &Profile, weighting: Weighting, out: &mut dyn Write) -> io::Result<()> {
    let mut frames: Vec<serde_json::Value> = Vec::new();
    let mut frame_ids: HashMap<(String, Option<String>, Option<u32>), usize> = HashMap::new();
    let mut frame = |name: String, file: Option<String>, line: Option<u32>| {
        let key = (name, file, line);
        if let Some(&id) = frame_ids.get(&key) {
            return id;
        }
        let id = frames.len();
        let (name, file, line) = key.clone();
        let mut value = json!({ "name": name });
        if let Some(file) = file {
            value["file"] = json!(file);
        }
        if let Some(line) = line {
            value["line"] = json!(line);
        }
        frames.push(value);
        frame_ids.insert(key, id);
        id
    };
    let unit = match profile
        .value_types
        .get(weighting.value)
        .map(|t| t.unit.as_str())
    {
        Some("nanoseconds") => "nanoseconds",
        Some("bytes") => "bytes",
        _ => "none",
    };
    let mut profiles = Vec::new();
    for (probe, name) in profile.probes.iter().enumerate() {
        let mut samples: Vec<Vec<usize>> = Vec::new();
        let mut weights: Vec<i64> = Vec::new();
        for sample in profile.samples.iter().filter(|s| s.probe == probe) {
            let weight = sample.values[weighting.value];
            if weight == 0 {
                continue;
            }
            // Root first.
            let mut stack = Vec::new();
            if let Some(reason) = &sample.truncated {
                stack.push(frame(format!("[truncated: {reason}]"), None, None));
            }
            for &id in sample.stack.iter().rev() {
                let location = &profile.locations[id];
                for f in location.frames.iter().rev() {
                    let name = if location.kernel {
                        format!("{}_[k]", f.function)
                    } else {
                        f.function.clone()
                    };
                    stack.push(frame(name, f.file.clone(), f.line));
                }
            }
            if stack.is_empty() {
                stack.push(frame("[no stack]".to_string(), None, None));
            }
            samples.push(stack);
            weights.push(weight);
        }
        let total: i64 = weights.iter().sum();
        profiles.push(json!({
            "type": "sampled",
            "name": name,
            "unit": unit,
            "startValue": 0,
            "endValue": total,
            "samples": samples,
            "weights": weights,
        }));
    }
    let document = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "exporter": format!("cargo-trace {}", env!("CARGO_PKG_VERSION")),
        "name": profile.probes.join(" "),
        "activeProfileIndex": 0,
        "shared": { "frames": frames },
        "profiles": profiles,
    });
    serde_json::to_writer(&mut *out, &document)?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::{example, golden};

    #[test]
    fn the_example_as_speedscope() {
        let profile = example();
        let mut out = Vec::new();
        write(&profile, Weighting::default(), &mut out).unwrap();
        golden("example.speedscope.json", &out);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let profiles = value["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 2);
        // The malloc probe: two weighed stacks (the zero-weight one is left out).
        assert_eq!(profiles[0]["weights"], json!([5, 2]));
        assert_eq!(profiles[0]["endValue"], 7);
        let frames = value["shared"]["frames"].as_array().unwrap();
        let first: Vec<&str> = profiles[0]["samples"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| {
                frames[id.as_u64().unwrap() as usize]["name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            first,
            [
                "__libc_start_call_main",
                "demo::main",
                "demo::work",
                "demo::inlined_helper"
            ]
        );
        let truncated = profiles[0]["samples"][1][0].as_u64().unwrap() as usize;
        assert_eq!(frames[truncated]["name"], "[truncated: read fault]");
    }
}
