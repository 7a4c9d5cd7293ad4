//! Folded stacks (`outer;...;inner COUNT`), the format of the original stackcollapse
//! scripts and inferno's input.

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::Weighting;
use crate::profile::{Profile, Sample};
use crate::symbolize::Frame;

/// The profile's stacks folded: `root;...;leaf` → weight, merged over identical lines
/// (processes are not told apart). With more than one probe, each stack is rooted at its
/// probe, so the probes' weights stay apart; a stack whose walk ended early is rooted at
/// `[truncated: REASON]` under it. Kernel frames carry inferno's `_[k]` suffix.
pub fn fold(profile: &Profile, weighting: Weighting) -> BTreeMap<String, i64> {
    let mut lines = BTreeMap::new();
    for sample in &profile.samples {
        let weight = sample.values[weighting.value];
        if weight == 0 {
            continue;
        }
        let frames = frames(profile, sample, weighting.line_numbers);
        *lines.entry(frames.join(";")).or_insert(0) += weight;
    }
    lines
}

/// The frames of one sample's line, root first: its probe (when there are several), why
/// it was truncated, its stack (`[no stack]` if that is all empty).
pub fn frames(profile: &Profile, sample: &Sample, line_numbers: bool) -> Vec<String> {
    let mut frames: Vec<String> = Vec::new();
    if profile.probes.len() > 1 {
        frames.push(profile.probes[sample.probe].replace(';', ":"));
    }
    if let Some(reason) = &sample.truncated {
        // Without a frame, the reason is what the sample is (e.g. an interval firing
        // while the target ran elsewhere), not where its stack stopped.
        frames.push(if sample.stack.is_empty() {
            format!("[{reason}]")
        } else {
            format!("[truncated: {reason}]")
        });
    }
    for &id in sample.stack.iter().rev() {
        let location = &profile.locations[id];
        for frame in location.frames.iter().rev() {
            let name = frame_name(frame, line_numbers);
            frames.push(if location.kernel {
                format!("{name}_[k]")
            } else {
                name
            });
        }
    }
    if frames.is_empty() {
        frames.push("[no stack]".to_string());
    }
    frames
}

/// Writes [`fold`]'s lines, one per distinct stack, sorted.
pub fn write(profile: &Profile, weighting: Weighting, out: &mut dyn Write) -> io::Result<()> {
    for (stack, weight) in fold(profile, weighting) {
        writeln!(out, "{stack} {weight}")?;
    }
    Ok(())
}

/// A frame as folded output shows it: `;` would split it, so it becomes `:` as in the
/// original stackcollapse scripts.
fn frame_name(frame: &Frame, line_numbers: bool) -> String {
    let name = match (&frame.file, frame.line, line_numbers) {
        (Some(file), Some(line), true) => format!("{} ({file}:{line})", frame.function),
        _ => frame.function.clone(),
    };
    name.replace(';', ":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semicolons_in_names_do_not_split_frames() {
        let frame = Frame {
            function: "<[u8; 32] as Debug>::fmt".into(),
            file: None,
            line: None,
        };
        assert_eq!(frame_name(&frame, false), "<[u8: 32] as Debug>::fmt");
        let located = Frame {
            file: Some("src/lib.rs".into()),
            line: Some(7),
            ..frame
        };
        assert_eq!(
            frame_name(&located, true),
            "<[u8: 32] as Debug>::fmt (src/lib.rs:7)"
        );
    }
}
