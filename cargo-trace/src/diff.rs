//! `cargo trace diff BEFORE AFTER`: the command line of a differential flamegraph of two
//! profiles (folded stacks or pprof files, as cargo-trace writes them); `profile::diff`
//! compares and draws them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Parser;
use profile::diff;

use crate::output::{self, Destination};

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
    let differential = diff::differential_lines(&before, &after, !cli.no_normalize)?;
    let title = cli
        .title
        .clone()
        .unwrap_or_else(|| format!("{} → {}", cli.before.display(), cli.after.display()));
    let svg = diff::draw(&differential, title)?;
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

/// The profile file at `path` as folded text.
fn read_profile(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(diff::fold(&path.display().to_string(), bytes)?)
}
