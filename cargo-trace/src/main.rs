//! `cargo trace`: run or attach to a program, probe it with eBPF, unwind its
//! stacks in the kernel from .eh_frame tables, and write a flamegraph.
//!
//! Flow: [`cli`] → (optionally [`cargo`] builds the target) → [`launch`] stops
//! it at its entry point → [`session`] compiles and loads unwind tables for
//! every executable mapping ([`tables`]), attaches the probes, follows
//! the children ([`children`]), lets the target run and reads the kernel's
//! aggregates → [`symbolize`] into a [`profile::Profile`] → [`writers`].
//! docs/architecture.md has the whole picture.

mod alloc;
mod cargo;
mod children;
mod cli;
mod elf_symbols;
mod guard;
mod launch;
mod profile;
mod session;
mod signals;
mod symbolize;
mod tables;
mod writers;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse_from_env();
    match session::run(&cli) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(error) => {
            eprintln!("cargo-trace: error: {error:#}");
            ExitCode::from(2)
        }
    }
}
