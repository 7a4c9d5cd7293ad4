//! One tracing session: target, tables, probes, aggregates, outputs.
use anyhow::Result;

use crate::cli::Cli;

pub fn run(_cli: &Cli) -> Result<i32> {
    anyhow::bail!("not wired yet")
}
