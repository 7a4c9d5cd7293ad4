//! Folded stacks (`outer;...;inner COUNT`), the format of the original stackcollapse
//! scripts and inferno's input.

use std::collections::HashMap;
use std::io::{self, Write};

use super::Weighting;
use crate::Frame;
use crate::{Profile, Sample};

/// The profile's stacks folded: `root;...;leaf` → weight, merged over identical lines
/// (processes are not told apart), sorted by line. With more than one probe, each stack
/// is rooted at its probe, so the probes' weights stay apart; a stack whose walk ended
/// early is rooted at `[truncated: REASON]` under it. Kernel frames carry inferno's
/// `_[k]` suffix.
pub fn fold(profile: &Profile, weighting: Weighting) -> Vec<(String, i64)> {
    let mut lines = Lines::new(profile, weighting.line_numbers);
    // Merged first by their segments, which are short to hash, then by their text: two
    // different cuts of a line into segments (a location of two inlined frames, or two
    // locations of one frame each) make the same line.
    let mut merged: HashMap<Vec<u32>, i64> = HashMap::new();
    let mut key = Vec::new();
    for sample in &profile.samples {
        let weight = sample.values[weighting.value];
        if weight == 0 {
            continue;
        }
        lines.segments_of(sample, &mut key);
        match merged.get_mut(key.as_slice()) {
            Some(total) => *total += weight,
            None => {
                merged.insert(key.clone(), weight);
            }
        }
    }
    let mut sorted: Vec<(String, i64)> = merged
        .into_iter()
        .map(|(key, weight)| (lines.text(&key), weight))
        .collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    sorted.dedup_by(|line, kept| {
        let same = line.0 == kept.0;
        if same {
            kept.1 += line.1;
        }
        same
    });
    sorted
}

/// Makes samples' lines from segments, each named once: a location's frames, a probe, a
/// reason a stack was cut short. A location is in many stacks.
pub struct Lines<'a> {
    profile: &'a Profile,
    line_numbers: bool,
    /// Each location's segment (its frames as a line shows them, root first,
    /// `;`-joined), once named; `NO_SEGMENT` for a location without frames.
    located: Vec<Option<u32>>,
    /// The segments by id, and their ids.
    texts: Vec<String>,
    ids: HashMap<String, u32>,
    /// Each probe's segment, when lines are rooted at their probe.
    probes: Vec<Option<u32>>,
}

/// A location without frames adds nothing to a line.
const NO_SEGMENT: u32 = u32::MAX;

impl<'a> Lines<'a> {
    pub fn new(profile: &'a Profile, line_numbers: bool) -> Lines<'a> {
        Lines {
            profile,
            line_numbers,
            located: vec![None; profile.locations.len()],
            texts: Vec::new(),
            ids: HashMap::new(),
            probes: vec![None; profile.probes.len()],
        }
    }

    /// One sample's line, root first: its probe (when there are several), why it was
    /// truncated, its stack (`[no stack]` if that is all empty).
    pub fn line(&mut self, sample: &Sample) -> String {
        let mut key = Vec::new();
        self.segments_of(sample, &mut key);
        self.text(&key)
    }

    /// The line of `segments`.
    fn text(&self, segments: &[u32]) -> String {
        let mut line = String::new();
        for &id in segments {
            if !line.is_empty() {
                line.push(';');
            }
            line.push_str(&self.texts[id as usize]);
        }
        line
    }

    /// The segments of one sample's line, into `key`.
    fn segments_of(&mut self, sample: &Sample, key: &mut Vec<u32>) {
        let profile = self.profile;
        key.clear();
        if profile.probes.len() > 1 {
            let id = match self.probes[sample.probe] {
                Some(id) => id,
                None => {
                    let id = self.segment(&profile.probes[sample.probe].replace(';', ":"));
                    self.probes[sample.probe] = Some(id);
                    id
                }
            };
            key.push(id);
        }
        if let Some(reason) = &sample.truncated {
            // Without a frame, the reason is what the sample is (e.g. an interval firing
            // while the target ran elsewhere), not where its stack stopped.
            key.push(self.segment(&if sample.stack.is_empty() {
                format!("[{reason}]")
            } else {
                format!("[truncated: {reason}]")
            }));
        }
        for &location in sample.stack.iter().rev() {
            let id = match self.located[location] {
                Some(id) => id,
                None => {
                    let id = self.name_location(location);
                    self.located[location] = Some(id);
                    id
                }
            };
            if id != NO_SEGMENT {
                key.push(id);
            }
        }
        if key.is_empty() {
            key.push(self.segment("[no stack]"));
        }
    }

    fn name_location(&mut self, id: usize) -> u32 {
        let location = &self.profile.locations[id];
        if location.frames.is_empty() {
            return NO_SEGMENT;
        }
        let names: Vec<String> = location
            .frames
            .iter()
            .rev()
            .map(|frame| {
                let name = frame_name(frame, self.line_numbers);
                if location.kernel {
                    format!("{name}_[k]")
                } else {
                    name
                }
            })
            .collect();
        self.segment(&names.join(";"))
    }

    fn segment(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let id = u32::try_from(self.texts.len()).expect("fewer than 2^32 segments");
        self.texts.push(text.to_string());
        self.ids.insert(text.to_string(), id);
        id
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
    use crate::Location;

    #[test]
    fn lines_cut_into_locations_differently_are_one_line() {
        let mut profile = crate::writers::tests::example();
        profile.probes.truncate(1);
        // Location 0 holds `demo::work` with `demo::inlined_helper` inlined in it; these
        // two hold them one each.
        let leaf = profile.locations[0].clone();
        let single = |function: &str| Location {
            frames: vec![Frame {
                function: function.into(),
                file: None,
                line: None,
            }],
            ..leaf.clone()
        };
        profile.locations.push(single("demo::inlined_helper"));
        profile.locations.push(single("demo::work"));
        let sample = |stack: Vec<usize>, events| Sample {
            probe: 0,
            pid: 1,
            stack,
            truncated: None,
            values: vec![events, 0],
        };
        profile.samples = vec![
            sample(vec![0, 1, 2], 5),
            sample(vec![5, 6, 1, 2], 7),
            sample(vec![1, 2], 1),
            sample(vec![0, 1, 2], 2),
        ];
        let line = "__libc_start_call_main;demo::main;demo::work;demo::inlined_helper";
        assert_eq!(
            fold(&profile, Weighting::default()),
            [
                ("__libc_start_call_main;demo::main".to_string(), 1),
                (line.to_string(), 14),
            ]
        );
        assert_eq!(Lines::new(&profile, false).line(&profile.samples[1]), line);
    }

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
