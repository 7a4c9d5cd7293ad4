//! Folded stacks (`outer;...;inner COUNT`), the format of the original stackcollapse
//! scripts and inferno's input.

use std::collections::HashMap;
use std::io::{self, Write};

use super::Weighting;
use crate::profile::{Profile, Sample};
use crate::symbolize::Frame;

/// The profile's stacks folded: `root;...;leaf` → weight, merged over identical lines
/// (processes are not told apart), sorted by line. With more than one probe, each stack
/// is rooted at its probe, so the probes' weights stay apart; a stack whose walk ended
/// early is rooted at `[truncated: REASON]` under it. Kernel frames carry inferno's
/// `_[k]` suffix.
pub fn fold(profile: &Profile, weighting: Weighting) -> Vec<(String, i64)> {
    let mut lines = Lines::new(profile, weighting.line_numbers);
    let mut merged: HashMap<String, i64> = HashMap::new();
    for sample in &profile.samples {
        let weight = sample.values[weighting.value];
        if weight == 0 {
            continue;
        }
        *merged.entry(lines.line(sample)).or_insert(0) += weight;
    }
    let mut sorted: Vec<(String, i64)> = merged.into_iter().collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    sorted
}

/// Makes samples' lines, naming each location once: a location is in many stacks.
pub struct Lines<'a> {
    profile: &'a Profile,
    line_numbers: bool,
    /// Each location's frames as a line shows them, root first, `;`-joined.
    named: Vec<Option<String>>,
}

impl<'a> Lines<'a> {
    pub fn new(profile: &'a Profile, line_numbers: bool) -> Lines<'a> {
        Lines {
            profile,
            line_numbers,
            named: vec![None; profile.locations.len()],
        }
    }

    /// One sample's line, root first: its probe (when there are several), why it was
    /// truncated, its stack (`[no stack]` if that is all empty).
    pub fn line(&mut self, sample: &Sample) -> String {
        let profile = self.profile;
        let mut line = String::new();
        let push = |line: &mut String, frames: &str| {
            if !line.is_empty() {
                line.push(';');
            }
            line.push_str(frames);
        };
        if profile.probes.len() > 1 {
            push(&mut line, &profile.probes[sample.probe].replace(';', ":"));
        }
        if let Some(reason) = &sample.truncated {
            // Without a frame, the reason is what the sample is (e.g. an interval firing
            // while the target ran elsewhere), not where its stack stopped.
            if sample.stack.is_empty() {
                push(&mut line, &format!("[{reason}]"));
            } else {
                push(&mut line, &format!("[truncated: {reason}]"));
            }
        }
        for &id in sample.stack.iter().rev() {
            let line_numbers = self.line_numbers;
            let named = self.named[id].get_or_insert_with(|| {
                let location = &profile.locations[id];
                let names: Vec<String> = location
                    .frames
                    .iter()
                    .rev()
                    .map(|frame| {
                        let name = frame_name(frame, line_numbers);
                        if location.kernel {
                            format!("{name}_[k]")
                        } else {
                            name
                        }
                    })
                    .collect();
                names.join(";")
            });
            // A location without frames adds none.
            if !named.is_empty() {
                push(&mut line, named);
            }
        }
        if line.is_empty() {
            line.push_str("[no stack]");
        }
        line
    }
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
