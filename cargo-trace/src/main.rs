//! `cargo trace`: run or attach to a program, probe it with eBPF, unwind its
//! stacks in the kernel from .eh_frame tables, and write a flamegraph.
//!
//! Flow: [`cli`] → (optionally [`cargo`] builds the target) → [`launch`] stops
//! it at its entry point → [`session`] compiles and loads unwind tables for
//! every executable mapping ([`maps`]), attaches the probes, lets the target
//! run and reads the kernel's aggregates → [`symbolize`] → [`report`].

mod cargo;
mod cli;
mod elf_symbols;
mod guard;
mod launch;
mod maps;
mod report;
mod session;
mod signals;
mod symbolize;
mod tables;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse_from_env();
    probes::libbpf_log(cli.verbose);
    match session::run(&cli) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(error) => {
            eprintln!("cargo-trace: error: {error:#}");
            ExitCode::from(2)
        }
    }
}
