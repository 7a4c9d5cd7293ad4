//! The flamegraph SVG, drawn by inferno from the folded stacks.

use std::fmt::Write as _;
use std::io::{self, Write};

use super::{folded, Weighting};
use crate::Profile;

/// Writes the flamegraph of `profile` weighed as `weighting` says, titled `title`; the
/// count name is the weighing value's kind (`samples`, `events`, `bytes`, ...), or `ns`
/// for a time.
/// An empty profile is still a valid answer: a graph that says there were no events.
pub fn write(
    profile: &Profile,
    weighting: Weighting,
    title: &str,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = profile
        .value_types
        .get(weighting.value)
        .map_or_else(|| "samples".to_string(), count_name);
    // Colors from the frame names, not random: the same profile draws the same file.
    options.hash = true;
    let lines: Vec<String> = folded::fold(profile, weighting)
        .into_iter()
        .map(|(mut stack, weight)| {
            let _ = write!(stack, " {weight}");
            stack
        })
        .collect();
    // Sorted by their stacks already: inferno need not sort them again.
    options.no_sort = true;
    if lines.is_empty() {
        // inferno refuses empty input.
        options.title = format!("{title} (no events)");
        inferno::flamegraph::from_lines(&mut options, ["[no events] 1"], out)
    } else {
        inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
    }
}

/// What a box's weight is called: `ns` for nanoseconds (CPU or off-CPU time: which one
/// is the title's and the root's to say), else the value's kind.
fn count_name(value_type: &crate::ValueType) -> String {
    if value_type.unit == "nanoseconds" {
        "ns".to_string()
    } else {
        value_type.kind.clone()
    }
}
