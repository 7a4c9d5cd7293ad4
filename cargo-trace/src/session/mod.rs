//! One tracing session, from settings to files.
//!
//! [`run`] parses the probes, checks the outputs, and walks the three phases
//! ([`phases`]): `Prepared` (collectors loaded, target launched and held at its entry
//! point or found with `-p`, collectors attached), `Running` (the target runs; the
//! collectors are polled; SIGUSR1 writes every output as of then), `Finished`
//! (collectors stopped). What they collected is symbolized into one [`Profile`]
//! ([`profile_of`]), which the writers turn into files ([`outputs`]).
//!
//! Which collector counts what ([`crate::collect`]) is decided here, once: the BPF
//! collector takes every probe.

mod heap_watch;
mod outputs;
mod phases;
mod profile_of;
pub mod values;

use anyhow::{bail, Context, Result};
use profile::writers::{self, Format};

use crate::alloc::InProcess;
use crate::collect::bpf::BpfCollector;
use crate::collect::inprocess::InProcessCollector;
use crate::collect::Collector;
use crate::probe::{self, Probe, ProbeKind};
use crate::settings::{OutputPlan, Settings, TargetSpec};
use crate::tables::SharedTables;
use crate::timings::{self, Phase};
use phases::Prepared;

/// Runs the whole session and returns the exit code to leave with.
pub fn run(settings: Settings, plan: OutputPlan) -> Result<i32> {
    if settings.timings {
        timings::start();
    }
    let probes = probe::parse_all(&settings.probes)?;
    if plan.wants_heaptrack() && !probes.iter().any(Probe::is_heap) {
        bail!(
            "--heaptrack writes a heap profile: trace with the alloc probe (cargo trace alloc ...)"
        );
    }
    // Checked before anything runs: a bad path must not cost the run.
    let destinations = outputs::open(&plan)?;
    if let TargetSpec::Pid(pid) = settings.target {
        crate::process::check_attachable(pid)?;
    }
    let argv = command_line(&settings.target)?;
    let tables = SharedTables::new();
    let collectors = collectors(&settings, &probes, argv.as_deref(), &tables)?;
    let running =
        Prepared::new(&settings, probes, collectors, tables, argv)?.start(settings.quiet)?;
    let mut finished = running.wait(settings.duration, &settings.heap, &mut |profile| {
        // SIGUSR1: every output as of now; the session carries on.
        let argv = profile.metadata.command.as_deref();
        let written = outputs::write(&plan, &destinations, profile, argv);
        if let Some(line) = written.summary() {
            eprintln!(
                "{line} (as of {:.1} s, on SIGUSR1)",
                profile.metadata.duration.as_secs_f64()
            );
        }
    })?;
    let profile = finished.profile(&settings.heap)?;
    timings::done(Phase::Symbolize);
    let written = outputs::write(&plan, &destinations, &profile, finished.argv());
    if profile.heap.is_some() && plan.heap_report_to_stdout() {
        let mut stdout = std::io::stdout().lock();
        writers::heap_report::write(&profile, plan.order_by, &mut stdout)
            .context("writing the heap report")?;
    }
    timings::done(Phase::Write);
    eprintln!("{}", writers::summary::line(&profile));
    for note in writers::summary::notes(&profile) {
        eprintln!("{note}");
    }
    for line in finished.cost_report()? {
        eprintln!("cargo-trace: {line}");
    }
    if let Some(line) = written.summary() {
        eprintln!("{line}");
    }
    for pid in finished.untraced() {
        eprintln!("cargo-trace: process {pid} still running, untraced");
    }
    if plan.open {
        // The report if there is one, else the flamegraph, if it was written.
        let viewable = [Format::Html, Format::Svg]
            .into_iter()
            .filter_map(|wanted| destinations.iter().find(|(format, _)| *format == wanted))
            .map(|(_, destination)| destination.path())
            .find(|path| written.contains(path));
        if let Some(path) = viewable {
            if let Err(reason) = crate::open::open(path) {
                eprintln!("cargo-trace: {reason}");
            }
        }
    }
    let (code, fate) = finished.announce_exit();
    drop(finished);
    timings::done(Phase::Teardown);
    if let Some(report) = timings::report() {
        eprintln!("{report}");
    }
    written.check(&fate)?;
    Ok(code)
}

/// The collectors of the session's probes: a launched target's heap probe is recorded in
/// the process by the preloaded library where it can be (its allocator reached through
/// the library's wrappers, or hooked); the BPF collector takes every other probe, and the
/// heap probe where the library cannot record it (an attached process, `--no-preload`,
/// an allocator function that cannot be hooked: a note says so for an allocator named).
/// `argv`: the command launched; `None` with `-p`.
fn collectors(
    settings: &Settings,
    probes: &[Probe],
    argv: Option<&[String]>,
    tables: &SharedTables,
) -> Result<Vec<Box<dyn Collector>>> {
    let executable = argv.and_then(|argv| launched_executable(&argv[0]));
    let mut in_process = None;
    for (index, probe) in probes.iter().enumerate() {
        let (ProbeKind::Heap(alloc), Some(executable)) = (&probe.kind, &executable) else {
            continue;
        };
        match alloc.in_process(&settings.heap, executable) {
            InProcess::Recorded(named) => {
                in_process = Some((index, named));
                break;
            }
            InProcess::Bpf => {}
            InProcess::BpfNamed(why) if !settings.quiet => {
                eprintln!(
                    "cargo-trace: note: {} is probed with BPF: {why}",
                    probe.text
                );
            }
            InProcess::BpfNamed(_) => {}
        }
    }
    let mut collectors: Vec<Box<dyn Collector>> = Vec::new();
    let recorded_in_process = in_process.is_some();
    if let Some((probe, named)) = in_process {
        collectors.push(Box::new(InProcessCollector::start_serving(
            &settings.heap,
            probe,
            named,
            tables.clone(),
            settings.bpf_stats,
            settings.keep_exited,
        )?));
    }
    if !recorded_in_process || probes.iter().any(|probe| !probe.is_heap()) {
        collectors.push(Box::new(BpfCollector::load(
            settings,
            probes.to_vec(),
            !recorded_in_process,
            tables.clone(),
        )?));
    }
    Ok(collectors)
}

/// The executable a command runs, found as `execvp` finds it, and for a script its
/// interpreter (`#!`): what allocator the process starts with.
fn launched_executable(command: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = if command.contains('/') {
        std::path::PathBuf::from(command)
    } else {
        std::env::var_os("PATH")?
            .to_str()?
            .split(':')
            .map(|dir| std::path::Path::new(dir).join(command))
            .find(|path| {
                path.metadata()
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })?
    };
    let mut head = [0u8; 256];
    let read = std::fs::File::open(&path)
        .and_then(|mut file| std::io::Read::read(&mut file, &mut head))
        .ok()?;
    match head[..read].strip_prefix(b"#!") {
        Some(line) => {
            let line = line.split(|&b| b == b'\n').next()?;
            let interpreter = std::str::from_utf8(line).ok()?.split_whitespace().next()?;
            Some(std::path::PathBuf::from(interpreter))
        }
        None => Some(path),
    }
}

/// The command to launch: `-c` as split, or the binary cargo builds; `None` with `-p`.
fn command_line(target: &TargetSpec) -> Result<Option<Vec<String>>> {
    Ok(match target {
        TargetSpec::Command(argv) => Some(argv.clone()),
        TargetSpec::Cargo { build, args } => {
            let executable = crate::cargo::build(build)?;
            let mut argv = vec![executable.display().to_string()];
            argv.extend(args.iter().cloned());
            Some(argv)
        }
        TargetSpec::Pid(_) => None,
    })
}
