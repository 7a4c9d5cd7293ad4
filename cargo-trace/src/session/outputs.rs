//! The files a session writes: checked and opened before anything runs, written at the
//! end (and on SIGUSR1), each on its own.

use anyhow::{Context, Result};
use profile::writers::{self, Format, Weighting};
use profile::Profile;

use crate::output::{self, Destination};
use crate::settings::OutputPlan;

/// The outputs the plan asks for, checked and opened: each with its format.
pub fn open(plan: &OutputPlan) -> Result<Vec<(Format, Destination)>> {
    let paths: Vec<(Option<&std::path::Path>, &'static str)> = plan
        .files
        .iter()
        .map(|(format, path)| (Some(path.as_path()), format.describe()))
        .collect();
    let opened = output::open_all(&paths)?;
    Ok(plan
        .files
        .iter()
        .zip(opened)
        .filter_map(|((format, _), destination)| Some((*format, destination?)))
        .collect())
}

/// Writes every output. One that fails does not keep the others from being written;
/// [`output::Written`] says what was written and what failed.
pub fn write(
    plan: &OutputPlan,
    outputs: &[(Format, Destination)],
    profile: &Profile,
    argv: Option<&[String]>,
) -> output::Written {
    let metric = profile.heap.as_ref().map(|_| plan.metric);
    let options = writers::Options {
        weighting: Weighting {
            value: metric
                .and_then(|metric| profile.value_index(metric.value_kind()))
                .unwrap_or(0),
            line_numbers: plan.line_numbers,
        },
        title: plan.title.clone().unwrap_or_else(|| {
            let title = default_title(&profile.probes, argv, profile.metadata.pid);
            match metric {
                Some(metric) => format!("{title} ({})", metric.describe()),
                None => title,
            }
        }),
        order_by: plan.order_by,
    };
    let mut written = output::Written::default();
    for (format, destination) in outputs {
        written.write(destination, || {
            let mut bytes = Vec::new();
            format
                .write(profile, &options, &mut bytes)
                .with_context(|| format!("rendering the {}", format.describe()))?;
            Ok(bytes)
        });
    }
    written
}

fn default_title(probes: &[String], argv: Option<&[String]>, pid: u32) -> String {
    let target = match argv {
        Some(argv) => shell_words::join(argv),
        None => format!("process {pid}"),
    };
    format!("{} — {target}", probes.join(" "))
}
