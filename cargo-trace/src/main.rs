//! `cargo trace`: run or attach to a program, probe it with eBPF, unwind its
//! stacks in the kernel from .eh_frame tables, and write a flamegraph.
//!
//! Flow: [`cli`] → (optionally [`cargo`] builds the target) → [`launch`] stops
//! it at its entry point → [`session`] compiles and loads unwind tables for
//! every executable mapping ([`tables`]), attaches the probes, follows
//! the children ([`children`]), lets the target run and reads the kernel's
//! aggregates → [`symbolize`] into a [`profile::Profile`] → [`profile::writers`].
//! docs/architecture.md has the whole picture.

mod alloc;
mod cargo;
mod cli;
mod collect;
mod diff;
mod elf_symbols;
mod frame;
mod guard;
mod invoker;
mod launch;
mod limits;
mod open;
mod output;
mod probe;
mod process;
mod progress;
mod session;
mod settings;
mod signals;
mod symbolize;
mod tables;
mod timings;
mod wake;

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Cargo runs a subcommand as `cargo-trace trace ARGS`.
    if args.get(1).is_some_and(|word| word == "trace") {
        args.remove(1);
    }
    if diff::is_diff(&args) {
        return finish(diff::run(args));
    }
    let cli = match cli::Cli::from_args(args) {
        Ok(cli) => cli,
        Err(error) if error.use_stderr() => {
            eprintln!("{}", cli::error_line(&error));
            return ExitCode::from(2);
        }
        // --help, --version.
        Err(error) => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
    };
    probes::libbpf_log(cli.verbose);
    match cli.settings() {
        Ok((settings, plan)) => finish(session::run(settings, plan)),
        Err(error) => finish(Err(anyhow::anyhow!(error))),
    }
}

/// The exit code of a run: the one it chose, or 2 after an error, said in one line.
fn finish(result: anyhow::Result<i32>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(error) => match error.downcast::<clap::Error>() {
            Ok(error) if !error.use_stderr() => {
                let _ = error.print();
                ExitCode::SUCCESS
            }
            Ok(error) => {
                eprintln!("{}", cli::error_line(&error));
                ExitCode::from(2)
            }
            Err(error) => {
                eprintln!("cargo-trace: error: {error:#}");
                ExitCode::from(2)
            }
        },
    }
}
