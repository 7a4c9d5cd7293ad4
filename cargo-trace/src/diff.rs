//! `cargo trace diff BEFORE AFTER`: a differential flamegraph of two profiles (folded
//! stacks or pprof files, as cargo-trace writes them), drawn by inferno. Frames are
//! sized by AFTER and colored by the change from BEFORE: red grew, blue shrank. When the
//! totals differ, BEFORE is scaled to AFTER's total first (`--no-normalize` keeps the
//! raw counts), so that a longer run does not paint everything red.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Parser;
use prost::Message;

use crate::output::{self, Destination};
use crate::writers::pprof::proto;

/// Compare two profiles: a differential flamegraph of AFTER against BEFORE.
#[derive(Debug, Parser)]
#[command(name = "cargo-trace diff", bin_name = "cargo trace diff")]
pub struct DiffCli {
    /// The earlier profile: folded stacks (--folded) or pprof (--pprof).
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The later profile, in either format.
    #[arg(value_name = "AFTER")]
    pub after: PathBuf,
    /// Where to write the differential flamegraph.
    #[arg(
        short = 'o',
        long = "output",
        value_name = "PATH",
        default_value = "diff.svg"
    )]
    pub output: PathBuf,
    /// Also write the differential folded stacks (`stack BEFORE AFTER`).
    #[arg(long = "folded", value_name = "PATH")]
    pub folded: Option<PathBuf>,
    /// Keep BEFORE's counts as they are, even when the totals differ.
    #[arg(long = "no-normalize")]
    pub no_normalize: bool,
    /// Title of the flamegraph.
    #[arg(long = "title", value_name = "TEXT")]
    pub title: Option<String>,
}

/// Whether `args` (as the binary got them, cargo's `trace` word dropped) ask for a diff.
pub fn is_diff(args: &[OsString]) -> bool {
    args.get(1).is_some_and(|word| word == "diff")
}

pub fn run(args: Vec<OsString>) -> Result<i32> {
    let mut args = args;
    args.remove(1);
    let cli = DiffCli::try_parse_from(args)?;
    let mut outputs = vec![(Some(cli.output.as_path()), "differential flamegraph")];
    if let Some(folded) = &cli.folded {
        outputs.push((Some(folded.as_path()), "differential folded stacks"));
    }
    let destinations: Vec<Destination> =
        output::open_all(&outputs)?.into_iter().flatten().collect();
    let before = read_profile(&cli.before)?;
    let after = read_profile(&cli.after)?;
    let differential = differential_lines(&before, &after, !cli.no_normalize)?;

    let mut options = inferno::flamegraph::Options::default();
    options.title = cli
        .title
        .clone()
        .unwrap_or_else(|| format!("{} → {}", cli.before.display(), cli.after.display()));
    options.hash = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(
        &mut options,
        differential.lines().filter(|line| !line.is_empty()),
        &mut svg,
    )
    .context("drawing the differential flamegraph")?;
    let mut written = output::Written::default();
    written.write(&destinations[0], || Ok(svg));
    if let Some(destination) = destinations.get(1) {
        written.write(destination, || Ok(differential.into_bytes()));
    }
    if let Some(line) = written.summary() {
        eprintln!("{line}");
    }
    written.check("nothing was traced")?;
    Ok(0)
}

/// inferno's differential folded lines (`stack BEFORE AFTER`) of two folded texts.
pub fn differential_lines(before: &str, after: &str, normalize: bool) -> Result<String> {
    let options = inferno::differential::Options {
        normalize,
        strip_hex: false,
    };
    let mut out = Vec::new();
    inferno::differential::from_readers(options, before.as_bytes(), after.as_bytes(), &mut out)
        .context("comparing the profiles")?;
    Ok(String::from_utf8(out).expect("inferno writes the names it read"))
}

/// A profile file as folded text: folded stacks as they are, a (gzipped) pprof file
/// folded by its first value.
fn read_profile(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&*bytes)
            .read_to_end(&mut raw)
            .with_context(|| format!("decompressing {}", path.display()))?;
        let profile = proto::Profile::decode(&*raw)
            .with_context(|| format!("{} is not a pprof profile", path.display()))?;
        return Ok(fold_pprof(&profile));
    }
    let text = String::from_utf8(bytes)
        .with_context(|| format!("{} is neither folded stacks nor pprof", path.display()))?;
    for line in text.lines().filter(|line| !line.is_empty()) {
        let count = line.rsplit_once(' ').map(|(_, count)| count);
        if count.is_none_or(|count| count.parse::<u64>().is_err()) {
            bail!(
                "{} is neither folded stacks nor pprof (line {line:?})",
                path.display()
            );
        }
    }
    Ok(text)
}

/// pprof samples folded by their first value, root first, inline frames expanded.
fn fold_pprof(profile: &proto::Profile) -> String {
    let text = |index: i64| {
        profile
            .string_table
            .get(usize::try_from(index).unwrap_or(usize::MAX))
            .map_or("", String::as_str)
    };
    let functions: BTreeMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, text(f.name)))
        .collect();
    let kernel_mappings: Vec<u64> = profile
        .mapping
        .iter()
        .filter(|m| text(m.filename) == "[kernel.kallsyms]")
        .map(|m| m.id)
        .collect();
    let locations: BTreeMap<u64, &proto::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    let mut lines: BTreeMap<String, i64> = BTreeMap::new();
    for sample in &profile.sample {
        let Some(&weight) = sample.value.first() else {
            continue;
        };
        let mut frames: Vec<String> = Vec::new();
        for id in sample.location_id.iter().rev() {
            let Some(location) = locations.get(id) else {
                continue;
            };
            let kernel = kernel_mappings.contains(&location.mapping_id);
            for line in location.line.iter().rev() {
                let name = functions
                    .get(&line.function_id)
                    .copied()
                    .unwrap_or("[unknown]");
                let name = name.replace(';', ":");
                frames.push(if kernel { format!("{name}_[k]") } else { name });
            }
        }
        if frames.is_empty() || weight == 0 {
            continue;
        }
        *lines.entry(frames.join(";")).or_default() += weight;
    }
    lines
        .into_iter()
        .map(|(stack, weight)| format!("{stack} {weight}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::{pprof, tests::example, Weighting};

    #[test]
    fn a_pprof_file_folds_as_the_folded_writer_does() {
        let profile = example();
        let mut folded = Vec::new();
        crate::writers::folded::write(&profile, Weighting::default(), &mut folded).unwrap();
        let decoded = pprof::encode(&profile);
        assert_eq!(fold_pprof(&decoded), String::from_utf8(folded).unwrap());
    }

    #[test]
    fn the_grown_stack_gets_the_larger_after_count() {
        let before = "main;hot 200\nmain;cold 100\n";
        let after = "main;hot 100\nmain;cold 200\n";
        let lines = differential_lines(before, after, true).unwrap();
        assert!(lines.contains("main;cold 100 200"), "{lines}");
        assert!(lines.contains("main;hot 200 100"), "{lines}");
        // Normalized: BEFORE is scaled to AFTER's total.
        let doubled = differential_lines(before, "main;hot 400\nmain;cold 200\n", true).unwrap();
        assert!(doubled.contains("main;hot 400 400"), "{doubled}");
    }

    #[test]
    fn bad_input_is_refused_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad");
        std::fs::write(&path, "not a profile\n").unwrap();
        let error = read_profile(&path).unwrap_err().to_string();
        assert!(error.contains("neither folded stacks nor pprof"), "{error}");
    }
}
