//! One tracing session, in three phases that are three types:
//!
//! - [`Prepared`]: the probes are parsed and checked, the BPF programs loaded (the
//!   verifier ran), the target started and held at its entry point (or found, with
//!   `-p`), its tables registered and the probes attached. Nothing of `main` has run.
//! - [`Running`]: the target runs at full speed; new mappings (dlopen, children's
//!   execs) are registered as they appear.
//! - [`Finished`]: tracing stopped; links, child stops and the guard are torn down
//!   (by `Drop`, whatever path leaves the phase). What the kernel counted becomes a
//!   [`Profile`], which the writers turn into files.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use bpf_prog::{AllocOptions, EventProgram, Loss, Options, StackRef, Tracer};
use probes::{Attachment, Fire, ProbeSpec, ProgramKind, Rate, UprobeGroup};

use crate::alloc::live::HeapWatch;
use crate::alloc::preload::{self, Preload};
use crate::alloc::{AllocArgs, AllocProbe};
use crate::children::Children;
use crate::cli::Cli;
use crate::exited::{ExitedProcesses, MERGED_PID};
use crate::guard::Guard;
use crate::launch::{self, Exit};
use crate::limits::{self, Limit};
use crate::output::{self, Destination};
use crate::process;
use crate::profile::{
    HeapPoint, HeapTotals, Metadata, Profile, ProfileBuilder, RawSample, Summary, TimelinePoint,
    ValueType,
};
use crate::progress::{self, Progress};
use crate::signals;
use crate::symbolize::{SymbolMapping, Symbolizer};
use crate::tables::{Coverage, ProcessTables};
use crate::timings::{self, Phase};
use crate::wake::Wakeup;
use crate::writers::{self, Format, Weighting};

/// Events that had no user stack to walk, by what they are: not walks, and not losses.
const NO_USER_STACK: [Loss; 3] = [Loss::Exiting, Loss::KernelThread, Loss::TargetElsewhere];

/// How often the target's mappings are re-read (libraries opened with dlopen).
const REFRESH_INTERVAL: Duration = Duration::from_millis(200);
/// How often the wait loop looks at the target.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Runs the whole session for `cli` and returns the exit code to leave with.
pub fn run(cli: &Cli) -> Result<i32> {
    if cli.timings {
        timings::start();
    }
    let probes = parse_probes(&cli.probes)?;
    if cli.alloc.heaptrack.is_some() && !probes.iter().any(|p| p.event_spec().is_none()) {
        bail!(
            "--heaptrack writes a heap profile: trace with the alloc probe (cargo trace alloc ...)"
        );
    }
    // Checked before anything runs: a bad path must not cost the run.
    let outputs = open_outputs(cli)?;
    let running = Prepared::new(cli, probes)?.start(cli.bpf_stats, cli.quiet)?;
    let mut finished = running.wait(cli.duration, &cli.alloc, &mut |profile| {
        // SIGUSR1: every output as of now; the session carries on.
        let argv = profile.metadata.command.as_deref();
        let written = write_outputs(cli, &outputs, profile, argv);
        if let Some(line) = written.summary() {
            eprintln!(
                "{line} (as of {:.1} s, on SIGUSR1)",
                profile.metadata.duration.as_secs_f64()
            );
        }
    })?;
    let profile = finished.profile(&cli.alloc)?;
    timings::done(Phase::Symbolize);
    let written = write_outputs(cli, &outputs, &profile, finished.argv.as_deref());
    if profile.heap.is_some() && cli.alloc.report_text.is_none() {
        let mut stdout = std::io::stdout().lock();
        writers::heap_report::write(&profile, cli.alloc.order_by, &mut stdout)
            .context("writing the heap report")?;
    }
    timings::done(Phase::Write);
    eprintln!("{}", writers::summary::line(&profile));
    for note in writers::summary::notes(&profile) {
        eprintln!("{note}");
    }
    finished.report_program_stats()?;
    if let Some(line) = written.summary() {
        eprintln!("{line}");
    }
    for pid in &finished.untraced {
        eprintln!("cargo-trace: process {pid} still running, untraced");
    }
    if cli.open {
        // The report if there is one, else the flamegraph, if it was written.
        let viewable = [Format::Html, Format::Svg]
            .into_iter()
            .filter_map(|wanted| outputs.iter().find(|(format, _)| *format == wanted))
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

/// A probe as the user wrote it and as parsed.
struct Probe {
    text: String,
    kind: ProbeKind,
}

enum ProbeKind {
    /// A probe of bpftrace's grammar: one event program.
    Event(ProbeSpec),
    /// Heap profiling: an allocator's functions.
    Alloc(AllocProbe),
}

impl Probe {
    fn event_spec(&self) -> Option<&ProbeSpec> {
        match &self.kind {
            ProbeKind::Event(spec) => Some(spec),
            ProbeKind::Alloc(_) => None,
        }
    }
}

/// The process being traced, and its children if they are followed.
enum Target {
    Launched(launch::Running),
    Attached(u32),
}

/// What every phase holds: the loaded programs, the registered tables and what they
/// are attached to. Dropping it detaches everything and resumes any child held stopped.
struct Traced {
    probes: Vec<Probe>,
    /// The command launched; `None` with `-p`.
    argv: Option<Vec<String>>,
    pid: u32,
    /// The launched target's entry point, where it was held by a breakpoint.
    entry: Option<u64>,
    /// The target's executable (`/proc/PID/exe`).
    executable: Option<String>,
    /// Links and children before the tracer: they reference its programs.
    links: Vec<Attachment>,
    /// Probes on a library no traced process maps yet (one to be dlopened): attached
    /// when one maps it.
    pending: Pending,
    children: Option<Children>,
    tables: ProcessTables,
    /// Processes that exited: their counters moved out of the kernel.
    exited: ExitedProcesses,
    tracer: Tracer,
    /// Resumes the processes held stopped, should cargo-trace die without doing so.
    guard: Guard,
    /// The heap profiler's preloaded library, when the target was launched with it, and
    /// the processes that ran without it.
    preload: Option<(Preload, preload::Missing)>,
    /// What deletes the session's bound uprobes' tracefs events (control file, command).
    uprobe_removal: Option<(std::path::PathBuf, String)>,
}

/// Phase 1: everything attached, the target held at its entry point.
struct Prepared {
    traced: Traced,
    /// With `alloc`: the heap timeline, and the top outstanding stacks with `--interval`.
    heap: Option<HeapWatch>,
    /// The launched target, stopped under ptrace; `None` with `-p`.
    stopped: Option<launch::Stopped>,
}

impl Prepared {
    pub fn new(cli: &Cli, probes: Vec<Probe>) -> Result<Prepared> {
        if let Some(pid) = cli.pid {
            process::check_attachable(pid)?;
        }
        let argv = match cli.pid {
            Some(_) => None,
            None => Some(command_line(cli)?),
        };
        let follow = !cli.no_follow_forks;
        let preload = match &argv {
            Some(_) if wants_preload(&probes, &cli.alloc) => Some(Preload::write()?),
            _ => None,
        };
        let alloc_probes = probes.iter().filter(|p| p.event_spec().is_none()).count();
        let alloc_probes = u32::try_from(alloc_probes.max(1)).unwrap_or(u32::MAX);
        let options = Options {
            // The kernel fires bound uprobes in the traced processes only; the program
            // still keeps the processes it follows (those past a full pid filter are
            // not).
            filter_uprobes: follow,
            programs: programs_for(&probes, preload.is_some()),
            // The heap's totals are per process and alloc probe.
            alloc: AllocOptions {
                max_processes: cli.max_processes.saturating_mul(alloc_probes),
                ..cli.alloc.options()
            },
            max_stacks: cli.max_stacks,
            max_counts: cli.max_counts,
            max_rows: cli.max_table_rows,
            max_pages: cli.max_table_pages,
            max_rules: cli.max_table_rules,
            max_tables: cli.max_tables,
            record_ring_bytes: cli.ring_buffer_mib << 20,
            max_procs: cli.max_processes,
            max_filtered_pids: cli.max_processes,
            max_files: cli.max_files,
            off_cpu_min_block_ns: cli.min_block_ns,
            max_off_cpu_threads: cli.max_off_cpu_threads,
            ..Options::default()
        };
        let mut tracer = Tracer::load(&options).map_err(|error| {
            let needs_root = error.is_permission_denied();
            let error = anyhow::Error::new(error);
            if needs_root {
                error.context("loading BPF programs needs root (or CAP_BPF and CAP_PERFMON)")
            } else {
                error
            }
        })?;
        timings::done_split(Phase::Load, Phase::Verify, tracer.load_times().verify);
        // After the load, which says first when there are no privileges for any of it.
        let scope = UprobeScope::new(follow);
        let uprobe_removal = scope.removal();
        // Before anything can be stopped: resumes what is, should cargo-trace die.
        let guard = Guard::spawn(tracer.pid_filter_fd(), scope.removal())
            .context("starting the guard process")?;
        timings::done(Phase::Guard);
        let mut tables = ProcessTables::new();

        let (pid, stopped) = match (&argv, cli.pid) {
            (Some(argv), _) => {
                let env = match &preload {
                    Some(preload) => preload.environment(
                        std::env::var_os("LD_PRELOAD"),
                        !cli.alloc.options().sampling(),
                    ),
                    None => Vec::new(),
                };
                let stopped = launch::start(argv, &env)?;
                (stopped.pid(), Some(stopped))
            }
            (None, Some(pid)) => (pid, None),
            (None, None) => unreachable!("either a command or a pid"),
        };
        signals::install(stopped.as_ref().map(|s| s.pid()))?;
        timings::done(Phase::Launch);

        tables.sync(&mut tracer, pid)?;
        tracer
            .filter_pid(pid)
            .context("adding the target to the event filter")?;
        timings::done(Phase::Tables);
        let attach = AttachPlan {
            scope,
            unsafe_addresses: cli.unsafe_addresses,
        };
        let (links, pending) =
            attach_all(&tracer, &probes, &cli.alloc, pid, &attach, preload.as_ref())?;
        let children = if follow {
            let target = [pid];
            let fire = attach.scope.fire(pid, &target);
            Some(Children::follow(&tracer, pid, stopped.is_none(), fire)?)
        } else {
            None
        };
        let heap = probes
            .iter()
            .any(|p| p.event_spec().is_none())
            .then(|| HeapWatch::new(cli.alloc.interval));
        timings::done(Phase::Attach);
        Ok(Prepared {
            heap,
            traced: Traced {
                probes,
                argv,
                pid,
                entry: stopped.as_ref().map(launch::Stopped::entry),
                executable: std::fs::read_link(format!("/proc/{pid}/exe"))
                    .ok()
                    .map(|path| path.display().to_string()),
                links,
                pending,
                children,
                tables,
                exited: ExitedProcesses::new(cli.keep_exited, pid),
                tracer,
                guard,
                preload: preload.map(|preload| (preload, preload::Missing::default())),
                uprobe_removal,
            },
            stopped,
        })
    }

    /// Lets the target run. `bpf_stats`: count the programs' run time (a clock read per
    /// run, so only when asked for). `quiet`: no progress line.
    pub fn start(mut self, bpf_stats: bool, quiet: bool) -> Result<Running> {
        let stats = if bpf_stats {
            Some(bpf_prog::enable_run_time_stats().context("enabling BPF run-time statistics")?)
        } else {
            None
        };
        // The session's span, the duration it reports, starts here, and an interval
        // counts from here: not while the probes were attached with the target held
        // at its entry (a second and more on a loaded machine).
        let started = Instant::now();
        let started_at = SystemTime::now();
        self.traced
            .tracer
            .set_interval_target(Some(self.traced.pid));
        self.traced.tracer.start_free_logs();
        let target = match self.stopped {
            Some(stopped) => Target::Launched(stopped.resume()?),
            None => Target::Attached(self.traced.pid),
        };
        let progress = Progress::start(quiet);
        if let Target::Attached(pid) = target {
            // An attached process runs until Ctrl-C: say that tracing has begun.
            progress.say(&format!(
                "cargo-trace: tracing process {pid}; Ctrl-C stops tracing (the process runs on)"
            ));
        }
        Ok(Running {
            wakeup: Wakeup::new(self.traced.pid),
            traced: self.traced,
            heap: self.heap,
            target,
            progress,
            processes: 1,
            timeline: Vec::new(),
            started,
            started_at,
            stats,
        })
    }
}

/// Phase 2: the target runs.
struct Running {
    traced: Traced,
    heap: Option<HeapWatch>,
    target: Target,
    /// Stack walks so far, read at every refresh.
    timeline: Vec<TimelinePoint>,
    progress: Progress,
    /// Processes traced at the last refresh.
    processes: usize,
    started: Instant,
    started_at: SystemTime,
    stats: Option<std::os::fd::OwnedFd>,
    /// Ends the loop's sleeps when the target exits.
    wakeup: Wakeup,
}

impl Running {
    /// Runs until the target exits (launch mode) or disappears or a stop is asked for
    /// (attach mode), or `duration` passes, registering new mappings as they appear.
    /// On SIGUSR1, `on_snapshot` gets the profile as of then.
    pub fn wait(
        mut self,
        duration: Option<Duration>,
        alloc: &AllocArgs,
        on_snapshot: &mut dyn FnMut(&Profile),
    ) -> Result<Finished> {
        let deadline = duration.map(|duration| self.started + duration);
        let exit = self.wait_for_end(deadline, alloc, on_snapshot)?;
        timings::done(Phase::Run);
        if let Some(warning) = self.traced.preload.as_ref().and_then(|(_, m)| m.warning()) {
            eprintln!("cargo-trace: warning: {warning}");
        }
        // The span ends: an interval counts no more, though its timer runs until the
        // links are detached below (which can take seconds with many probes).
        self.traced.tracer.set_interval_target(None);
        let elapsed = self.started.elapsed();
        self.note_walks();
        let untraced = process::still_running(self.traced.tracer.filtered_pids(), self.traced.pid);
        let Running {
            traced,
            target,
            stats,
            started_at,
            timeline,
            progress,
            heap,
            ..
        } = self;
        let heap_timeline = heap
            .map(|heap| heap.finish(&traced.tracer))
            .unwrap_or_default();
        // Cleared before anything else is printed.
        drop(progress);
        let Traced {
            probes,
            argv,
            pid,
            entry,
            executable,
            mut links,
            pending: _,
            mut children,
            tables,
            exited,
            mut tracer,
            guard,
            preload,
            uprobe_removal,
        } = traced;
        // Teardown in order: no child stops any more, every child held stopped is
        // resumed; only then is the guard told it has nothing to do. The links are
        // released in the background: the release of each waits for the kernel's grace
        // periods (~20-100 ms a link here, one after the other), and nothing needs it
        // done. Until it is, their programs may still count (nothing reads it) but stop
        // no process.
        tracer.end_following();
        links.extend(
            children
                .as_mut()
                .map(Children::take_links)
                .unwrap_or_default(),
        );
        probes::detach_in_background(
            links,
            uprobe_removal
                .as_ref()
                .map(|(control, command)| (control.as_path(), command.as_str())),
        );
        drop(children);
        guard.dismiss();
        timings::done(Phase::Teardown);
        Ok(Finished {
            probes,
            argv,
            pid,
            entry,
            executable,
            tables,
            exited,
            tracer,
            target,
            exit,
            started_at,
            timeline,
            elapsed,
            stats,
            untraced,
            heap_timeline,
            _preload: preload.map(|(preload, _)| preload),
        })
    }

    /// Adds the stack walks counted so far to the timeline and the progress line.
    fn note_walks(&mut self) {
        if let Ok(walks) = self.traced.tracer.walk_ends() {
            let at = self.started.elapsed();
            let point = TimelinePoint {
                at,
                walks: walks.total(),
            };
            self.timeline.push(point);
            self.progress.update(progress::Status {
                elapsed: at,
                events: point.walks,
                failed: walks.failures().map(|(_, count)| count).sum(),
                processes: self.processes,
            });
        }
    }

    /// `None`: the target is still running.
    fn wait_for_end(
        &mut self,
        deadline: Option<Instant>,
        alloc: &AllocArgs,
        on_snapshot: &mut dyn FnMut(&Profile),
    ) -> Result<Option<Exit>> {
        let mut last_refresh = Instant::now();
        let mut waiting_notice = signals::WaitingNotice::default();
        loop {
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Ok(None);
            }
            match &self.target {
                Target::Launched(running) => {
                    if let Some(exit) = running.try_wait()? {
                        return Ok(Some(exit));
                    }
                    if let Some(line) = waiting_notice.tell_if_waiting(running.pid()) {
                        self.progress.say(&line);
                    }
                }
                Target::Attached(pid) => {
                    if signals::stop_requested() || !process::alive(*pid) {
                        return Ok(None);
                    }
                }
            }
            let traced = &mut self.traced;
            // New stacks reach userspace through a ring buffer: drained at every wake-up
            // so that a burst of them finds it empty. A failure here loses nothing: the
            // records stay for the next drain.
            let _ = traced.tracer.drain_records();
            match &traced.children {
                // Wakes up as soon as a child stops at its start, or the target ends.
                Some(children) => {
                    self.wakeup.wait(Some(children.reports_fd()), POLL_INTERVAL);
                    children.take_reports();
                    let (links, pending, probes, preload) = (
                        &mut traced.links,
                        &mut traced.pending,
                        &traced.probes,
                        &mut traced.preload,
                    );
                    children.register_started(
                        &mut traced.tracer,
                        &mut traced.tables,
                        |tracer, pid| {
                            pending.attach_in(tracer, probes, pid, links);
                            if let Some((preload, missing)) = preload {
                                missing.check(preload, pid);
                            }
                        },
                    );
                }
                None => self.wakeup.wait(None, POLL_INTERVAL),
            }
            // Not at every wake-up: a child that execs reports itself (above), and one
            // that only forked walks with its parent's mappings meanwhile; reading the
            // whole filter map is a system call per process.
            if last_refresh.elapsed() >= REFRESH_INTERVAL {
                last_refresh = Instant::now();
                self.processes =
                    track_processes(&mut traced.tracer, &mut traced.tables, &mut traced.exited);
                if !traced.pending.is_empty() {
                    for pid in traced.tracer.filtered_pids() {
                        traced.pending.attach_in(
                            &traced.tracer,
                            &traced.probes,
                            pid,
                            &mut traced.links,
                        );
                    }
                }
                self.note_walks();
            }
            let traced = &self.traced;
            if let Some(heap) = &mut self.heap {
                heap.tick(&traced.tracer, &traced.tables);
            }
            if signals::snapshot_requested() {
                // Every exited process under the pid it is counted under, as at the end.
                self.traced.exited.retire(&self.traced.tracer, true);
                match build_profile(self.snapshot_source(), alloc) {
                    Ok(profile) => on_snapshot(&profile),
                    Err(error) => eprintln!("cargo-trace: error: on SIGUSR1: {error:#}"),
                }
            }
        }
    }

    /// What the profile is made of as of now, for SIGUSR1.
    fn snapshot_source(&self) -> ProfileSource<'_> {
        let traced = &self.traced;
        ProfileSource {
            tracer: &traced.tracer,
            probes: &traced.probes,
            symbol_mappings: traced.tables.symbol_mappings().clone(),
            object_mappings: traced.tables.object_mappings().clone(),
            merged_processes: traced.exited.merged(),
            coverage: traced.tables.coverage.clone(),
            pid: traced.pid,
            entry: traced.entry,
            argv: traced.argv.clone(),
            executable: traced.executable.clone(),
            started_at: self.started_at,
            elapsed: self.started.elapsed(),
            timeline: self.timeline.clone(),
            heap_timeline: self
                .heap
                .as_ref()
                .map(|heap| heap.timeline().to_vec())
                .unwrap_or_default(),
        }
    }
}

/// Phase 3: tracing stopped, everything detached; the counts wait to be read.
struct Finished {
    probes: Vec<Probe>,
    argv: Option<Vec<String>>,
    pid: u32,
    entry: Option<u64>,
    executable: Option<String>,
    tables: ProcessTables,
    exited: ExitedProcesses,
    tracer: Tracer,
    target: Target,
    /// `None`: the target still runs (attached, or stopped after a duration).
    exit: Option<Exit>,
    started_at: SystemTime,
    timeline: Vec<TimelinePoint>,
    elapsed: Duration,
    stats: Option<std::os::fd::OwnedFd>,
    /// Traced processes other than the target still running at the end (daemons).
    untraced: Vec<u32>,
    /// With `alloc`: memory over time.
    heap_timeline: Vec<HeapPoint>,
    /// The preloaded library, whose file symbolizes the wrappers' frames: removed last.
    _preload: Option<Preload>,
}

impl Finished {
    /// The kernel's counts, symbolized.
    pub fn profile(&mut self, alloc: &AllocArgs) -> Result<Profile> {
        // Every exited process under the pid it is counted under.
        self.exited.retire(&self.tracer, true);
        build_profile(
            ProfileSource {
                tracer: &self.tracer,
                probes: &self.probes,
                symbol_mappings: self.tables.take_symbol_mappings(),
                object_mappings: self.tables.object_mappings().clone(),
                merged_processes: self.exited.merged(),
                coverage: self.tables.coverage.clone(),
                pid: self.pid,
                entry: self.entry,
                argv: self.argv.clone(),
                executable: self.executable.clone(),
                started_at: self.started_at,
                elapsed: self.elapsed,
                timeline: self.timeline.clone(),
                heap_timeline: std::mem::take(&mut self.heap_timeline),
            },
            alloc,
        )
    }

    /// With `--bpf-stats`: each program's runs and nanoseconds per run, and how many of
    /// the stack walks the walk memo answered.
    fn report_program_stats(&self) -> Result<()> {
        if self.stats.is_none() {
            return Ok(());
        }
        let stats = self
            .tracer
            .program_stats()
            .context("reading BPF statistics")?;
        let mut programs: Vec<_> = stats.iter().filter(|(_, s)| s.run_count > 0).collect();
        programs.sort_by_key(|(name, _)| *name);
        for (name, s) in programs {
            eprintln!(
                "cargo-trace: bpf {name}: {} runs, {} ns per run",
                s.run_count,
                s.run_time_ns / s.run_count
            );
        }
        let walks = self
            .tracer
            .walk_ends()
            .context("reading the walk counters")?
            .total();
        let answered = self
            .tracer
            .memo_hits()
            .context("reading the walk memo's counter")?;
        eprintln!("cargo-trace: walk memo: {answered} of {walks} walks answered");
        Ok(())
    }

    /// Says how the target ended when that is news, and returns the exit code to pass
    /// on (the target's, 128 + signal if it was killed, 0 when it still runs) with the
    /// target's fate in words, for a failure message that must not hide it.
    fn announce_exit(&self) -> (i32, String) {
        match self.exit {
            Some(exit) => {
                if let Exit::Signal(signal) = exit {
                    eprintln!(
                        "cargo-trace: the target was killed by {}",
                        signal_name(signal)
                    );
                }
                (
                    exit.code(),
                    format!("the target exited with code {}", exit.code()),
                )
            }
            None => match &self.target {
                Target::Launched(running) => {
                    eprintln!(
                        "cargo-trace: stopped tracing after the duration; process {} runs on",
                        running.pid()
                    );
                    (0, format!("process {} runs on", running.pid()))
                }
                Target::Attached(pid) if !process::alive(*pid) => {
                    eprintln!("cargo-trace: process {pid} exited");
                    (0, format!("process {pid} exited"))
                }
                Target::Attached(pid) => (0, format!("process {pid} runs on")),
            },
        }
    }
}

/// What a profile is made of: the kernel's counts and what the session knows of the
/// processes, at the end or (SIGUSR1) while the target runs.
struct ProfileSource<'a> {
    tracer: &'a Tracer,
    probes: &'a [Probe],
    symbol_mappings: HashMap<u32, Vec<SymbolMapping>>,
    object_mappings: HashMap<bpf_prog::ObjectId, Vec<SymbolMapping>>,
    /// Exited processes counted together under [`MERGED_PID`].
    merged_processes: u64,
    /// The objects' tables, and what did not fit in the maps cargo-trace fills.
    coverage: Coverage,
    pid: u32,
    entry: Option<u64>,
    argv: Option<Vec<String>>,
    executable: Option<String>,
    started_at: SystemTime,
    elapsed: Duration,
    timeline: Vec<TimelinePoint>,
    heap_timeline: Vec<HeapPoint>,
}

/// The kernel's counts, symbolized.
fn build_profile(source: ProfileSource<'_>, alloc: &AllocArgs) -> Result<Profile> {
    let (mut value_types, period) = value_types(source.probes);
    let mut raw = raw_samples(source.tracer, source.probes)?;
    timings::done(Phase::Read);
    let heap = if source.probes.iter().any(|p| p.event_spec().is_none()) {
        Some(crate::alloc::add_samples(
            source.tracer,
            &mut value_types,
            &mut raw,
            &alloc.options(),
            source.started_at + source.elapsed,
        )?)
    } else {
        None
    };
    let mut symbolizer = Symbolizer::new();
    // A child that exited before its mappings were read ran with its parent's (fork
    // copies them): the target's are the best guess for it.
    symbolizer.set_fallback(source.pid);
    symbolizer.set_parents(source.tracer.parents());
    for (pid, mappings) in source.symbol_mappings {
        symbolizer.add_process(pid, mappings);
    }
    symbolizer.add_objects(source.object_mappings);
    if source.merged_processes > 0 {
        // Runtime addresses of many processes: none of their mappings can name them.
        symbolizer.add_process(MERGED_PID, Vec::new());
    }
    let mut not_the_targets = 0;
    let held_at_entry = |sample: &RawSample, symbolizer: &mut Symbolizer| {
        source.entry.is_some_and(|entry| {
            sample.pid == source.pid
                && sample.user.len() == 1
                && symbolizer.runtime_address(sample.pid, sample.user[0]) == entry
                && sample
                    .kernel
                    .iter()
                    .any(|&pc| symbolizer.kernel(pc).function.ends_with("exc_int3"))
        })
    };
    // Counted in events: the values that count (a time is no count of events).
    let counts: Vec<usize> = (0..value_types.len())
        .filter(|&index| value_types[index].unit == "count")
        .collect();
    let raw: Vec<RawSample> = raw
        .into_iter()
        .filter(|sample| {
            let own = held_at_entry(sample, &mut symbolizer);
            if own {
                not_the_targets += counts.iter().map(|&i| sample.values[i]).sum::<i64>();
            }
            !own
        })
        .collect();
    let mut builder = ProfileBuilder::new(&mut symbolizer, value_types);
    for sample in &raw {
        builder.add(sample);
    }
    let walk_ends = source
        .tracer
        .walk_ends()
        .context("reading the walk counters")?;
    let losses = source
        .tracer
        .losses()
        .context("reading the loss counters")?;
    if let Some((lost, error)) = source.tracer.storage_failure() {
        eprintln!(
            "cargo-trace: warning: {lost} stacks or counters of exited processes could not be \
             written to the stack storage's file ({error}): their stacks show as lost, their \
             counts are missing"
        );
    }
    // The kernel's losses, and what did not fit in the maps filled here.
    let mut limits = source.coverage.limits;
    for loss in Loss::ALL {
        if loss != Loss::InExec && !NO_USER_STACK.contains(&loss) {
            *limits.entry(Limit::Loss(loss)).or_default() += losses[loss as usize];
        }
    }
    let summary = Summary {
        failures: walk_ends
            .failures()
            .map(|(name, count)| (name.to_string(), count))
            .collect(),
        losses: limits::reported(&limits),
        in_exec: losses[Loss::InExec as usize],
        no_user_stack: NO_USER_STACK
            .iter()
            .filter(|loss| losses[**loss as usize] > 0)
            .map(|loss| (loss.name().to_string(), losses[*loss as usize]))
            .collect(),
        without_table: source.coverage.without_table,
        not_the_targets: u64::try_from(not_the_targets).unwrap_or(0),
        merged_processes: source.merged_processes,
    };
    let metadata = Metadata {
        command: source.argv,
        pid: source.pid,
        executable: source.executable,
        started: Some(source.started_at),
        timeline: source.timeline,
        duration: source.elapsed,
        period,
    };
    let probes = source.probes.iter().map(|p| p.text.clone()).collect();
    let mut profile = builder.finish(probes, summary, metadata);
    profile.heap = heap.map(|heap| HeapTotals {
        timeline: source.heap_timeline,
        ..heap
    });
    Ok(profile)
}

/// The outputs the command line asks for, checked and opened: each with its format.
fn open_outputs(cli: &Cli) -> Result<Vec<(Format, Destination)>> {
    let requested = cli.outputs();
    let paths: Vec<(Option<&std::path::Path>, &'static str)> = requested
        .iter()
        .map(|(format, path)| (Some(path.as_path()), format.describe()))
        .collect();
    let opened = output::open_all(&paths)?;
    Ok(requested
        .iter()
        .zip(opened)
        .filter_map(|((format, _), destination)| Some((*format, destination?)))
        .collect())
}

/// Writes every output. One that fails does not keep the others from being written;
/// [`output::Written`] says what was written and what failed.
fn write_outputs(
    cli: &Cli,
    outputs: &[(Format, Destination)],
    profile: &Profile,
    argv: Option<&[String]>,
) -> output::Written {
    let metric = profile.heap.as_ref().map(|_| cli.alloc.metric);
    let options = writers::Options {
        weighting: Weighting {
            value: metric
                .and_then(|metric| profile.value_index(metric.value_kind()))
                .unwrap_or(0),
            line_numbers: cli.line_numbers,
        },
        title: cli.title.clone().unwrap_or_else(|| {
            let title = default_title(&profile.probes, argv, profile.metadata.pid);
            match metric {
                Some(metric) => format!("{title} ({})", metric.describe()),
                None => title,
            }
        }),
        order_by: cli.alloc.order_by,
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

fn parse_probes(texts: &[String]) -> Result<Vec<Probe>> {
    // bpftrace's comma lists: `uprobe:./p:f,uprobe:./p:g` is two probes.
    let listed: Vec<&str> = texts
        .iter()
        .map(|text| probes::split_list(text).map_err(anyhow::Error::from))
        .collect::<Result<Vec<_>>>()?
        .concat();
    listed
        .iter()
        .map(|text| {
            if let Some(alloc) = AllocProbe::parse(text) {
                return Ok(Probe {
                    text: text.to_string(),
                    kind: ProbeKind::Alloc(alloc?),
                });
            }
            let spec = probes::parse(text)?;
            // Fail before launching anything when this kernel cannot run the probe.
            match &spec {
                ProbeSpec::Kprobe(_) => probes::kprobe_support()?,
                ProbeSpec::Hardware { .. } => probes::hardware_support()?,
                _ => {}
            }
            Ok(Probe {
                text: text.to_string(),
                kind: ProbeKind::Event(spec),
            })
        })
        .collect()
}

/// The command to launch: `-c` split like a shell would, or the binary cargo builds.
fn command_line(cli: &Cli) -> Result<Vec<String>> {
    if let Some(command) = &cli.command {
        let mut argv = shell_words::split(command)
            .with_context(|| format!("cannot split the command '{command}'"))?;
        argv.extend(cli.trailing.iter().cloned());
        if argv.is_empty() {
            bail!("the command given with -c is empty");
        }
        return Ok(argv);
    }
    let executable = crate::cargo::build(&cli.cargo)?;
    let mut argv = vec![executable.display().to_string()];
    argv.extend(cli.trailing.iter().cloned());
    Ok(argv)
}

/// The event programs the probes attach (the others are not loaded: the verifier's time
/// is most of a session's start).
/// `preload`: with the preloaded library's programs.
fn programs_for(probes: &[Probe], preload: bool) -> std::collections::BTreeSet<EventProgram> {
    probes
        .iter()
        .flat_map(|probe| match &probe.kind {
            ProbeKind::Event(spec) => vec![event_program(spec.program_kind())],
            ProbeKind::Alloc(_) if preload => [
                &crate::alloc::PROGRAMS[..],
                &crate::alloc::preload_programs()[..],
            ]
            .concat(),
            ProbeKind::Alloc(_) => crate::alloc::PROGRAMS.to_vec(),
        })
        .collect()
}

/// Whether a launched target runs with the preloaded library: an alloc probe would take
/// its sites for libc's functions.
fn wants_preload(probes: &[Probe], alloc: &AllocArgs) -> bool {
    probes.iter().any(|probe| match &probe.kind {
        ProbeKind::Alloc(heap) => heap.wants_preload(alloc),
        ProbeKind::Event(_) => false,
    })
}

/// The BPF program a probe of `kind` attaches.
fn event_program(kind: ProgramKind) -> EventProgram {
    match kind {
        ProgramKind::Uprobe => EventProgram::Uprobe,
        ProgramKind::Uretprobe => EventProgram::Uretprobe,
        ProgramKind::PerfEvent => EventProgram::PerfEvent,
        ProgramKind::Tracepoint => EventProgram::Tracepoint,
        ProgramKind::RawTracepoint => EventProgram::RawTracepoint,
        ProgramKind::Kprobe | ProgramKind::Kretprobe => EventProgram::Kprobe,
        ProgramKind::OffCpu => EventProgram::OffCpu,
        ProgramKind::Interval => EventProgram::Interval,
    }
}

/// How the probes attach.
#[derive(Clone, Debug)]
struct AttachPlan {
    scope: UprobeScope,
    unsafe_addresses: bool,
}

/// Where the session's uprobes fire.
#[derive(Clone, Debug)]
enum UprobeScope {
    /// In the target only (`--no-follow-forks`).
    Target,
    /// In the traced processes and all they start ([`probes::bound`]): untraced
    /// processes never trap.
    Bound(UprobeGroup),
    /// In every process mapping the file, the program keeping the traced ones: where
    /// tracefs has no uprobe events to bind with.
    Everywhere,
}

impl UprobeScope {
    fn new(follow: bool) -> UprobeScope {
        if !follow {
            return UprobeScope::Target;
        }
        match UprobeGroup::new() {
            Ok(group) => UprobeScope::Bound(group),
            Err(error) => {
                eprintln!(
                    "cargo-trace: warning: uprobes cannot be bound to the traced processes \
                     ({error}); they trap in every process mapping their files"
                );
                UprobeScope::Everywhere
            }
        }
    }

    /// Where a uprobe attached now fires: `target` is the session's target, `processes`
    /// every process traced now.
    fn fire<'a>(&'a self, target: u32, processes: &'a [u32]) -> Fire<'a> {
        match self {
            UprobeScope::Target => Fire::InProcess(target),
            UprobeScope::Bound(group) => Fire::InDescendants { group, processes },
            UprobeScope::Everywhere => Fire::Everywhere,
        }
    }

    /// What deletes the bound uprobes should cargo-trace die (the guard does it).
    fn removal(&self) -> Option<(std::path::PathBuf, String)> {
        match self {
            UprobeScope::Bound(group) => Some(group.removal()),
            UprobeScope::Target | UprobeScope::Everywhere => None,
        }
    }
}

/// Attaches every probe with its index as the BPF cookie: counts keep probes apart by it.
/// A uprobe on a library no traced process maps and none of the library directories
/// holds (a plugin to be dlopened) is not an error: it waits in [`Pending`].
fn attach_all(
    tracer: &Tracer,
    probes: &[Probe],
    alloc: &AllocArgs,
    pid: u32,
    plan: &AttachPlan,
    preload: Option<&Preload>,
) -> Result<(Vec<Attachment>, Pending)> {
    let mut links = Vec::new();
    let mut pending = Pending {
        probes: Vec::new(),
        plan: plan.clone(),
        target: pid,
    };
    for (index, probe) in probes.iter().enumerate() {
        if let ProbeKind::Alloc(heap) = &probe.kind {
            let target = [pid];
            let fire = plan.scope.fire(pid, &target);
            links.extend(heap.attach(tracer, alloc, pid, fire, index as u32, preload)?);
            continue;
        }
        match attach_one(tracer, probe, index, pid, plan, &[pid]) {
            Ok(attached) => links.extend(attached),
            Err(error) if waits_for_a_library(&error) => {
                eprintln!(
                    "cargo-trace: warning: {}: {error}; it is attached when a traced process \
                     maps it (dlopen)",
                    probe.text
                );
                pending.probes.push(index);
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok((links, pending))
}

/// Attaches one probe, resolving its names in process `pid`, for the traced
/// `processes`; prints its notices.
fn attach_one(
    tracer: &Tracer,
    probe: &Probe,
    index: usize,
    pid: u32,
    plan: &AttachPlan,
    processes: &[u32],
) -> Result<Vec<Attachment>, probes::Error> {
    // An alloc probe attaches as a whole (attach_all); it never waits for a library.
    let Some(spec) = probe.event_spec() else {
        return Ok(Vec::new());
    };
    let program = tracer.program(event_program(spec.program_kind()));
    let options = probes::AttachOptions {
        resolve_in: Some(pid),
        fire: plan.scope.fire(pid, processes),
        unsafe_addresses: plan.unsafe_addresses,
    };
    let attached = probes::attach_probe_with(program, spec, &options, index as u64)?;
    for notice in &attached.notices {
        eprintln!("cargo-trace: {}: {notice}", notice.level());
    }
    Ok(attached.links)
}

/// Whether a probe failed only because its library is nowhere yet.
fn waits_for_a_library(error: &probes::Error) -> bool {
    matches!(
        error,
        probes::Error::Resolve(probes::ResolveError::LibraryNotFound { .. })
    )
}

/// Uprobes on libraries no traced process had mapped when the session started.
struct Pending {
    /// Indexes into the session's probes.
    probes: Vec<usize>,
    plan: AttachPlan,
    /// Without following children, probes fire in the target only.
    target: u32,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.probes.is_empty()
    }

    /// Attaches the pending probes whose library process `pid` maps now, for every
    /// process traced now. `pid` is held stopped after a dlopen (except an attached
    /// process), so nothing it runs in the library goes uncounted.
    fn attach_in(
        &mut self,
        tracer: &Tracer,
        probes: &[Probe],
        pid: u32,
        links: &mut Vec<Attachment>,
    ) {
        let following = !matches!(self.plan.scope, UprobeScope::Target);
        if self.probes.is_empty() || (!following && pid != self.target) {
            return;
        }
        let processes = tracer.filtered_pids();
        self.probes.retain(|&index| {
            let probe = &probes[index];
            match attach_one(tracer, probe, index, pid, &self.plan, &processes) {
                Ok(attached) => {
                    eprintln!(
                        "cargo-trace: note: {} attached: process {pid} mapped its library",
                        probe.text
                    );
                    links.extend(attached);
                    false
                }
                Err(error) if waits_for_a_library(&error) => true,
                Err(error) => {
                    eprintln!("cargo-trace: warning: {}: {error}", probe.text);
                    false
                }
            }
        });
    }
}

/// Registers the mappings of processes that joined the filter (children the
/// program followed) or exec'd since, re-reads every traced process's mappings
/// (dlopen) and forgets those that exited. Returns how many are traced.
fn track_processes(
    tracer: &mut Tracer,
    tables: &mut ProcessTables,
    exited_processes: &mut ExitedProcesses,
) -> usize {
    let mut traced = 0;
    let mut exited = Vec::new();
    for pid in tracer.filtered_pids() {
        let known = tables.knows(pid);
        if !process::alive(pid) {
            exited.push(pid);
            continue;
        }
        traced += 1;
        if known && !tracer.has_mappings(pid) {
            // It exec'd: the program dropped the old image's mappings.
            tables.forget(pid);
        }
        // The process may be exiting: a failed read is not an error.
        let _ = tables.sync(tracer, pid);
    }
    for pid in exited {
        // Its filter and mappings entries are freed; its counts leave the kernel.
        let _ = tracer.unfilter_pid(pid);
        let _ = tracer.remove_process(pid);
        let apart = exited_processes.exited(pid);
        tables.release(pid, apart);
    }
    exited_processes.retire(tracer, false);
    traced
}

/// How one event of a probe weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Weight {
    /// A clock sample, standing for this many nanoseconds of CPU time.
    Clock(i64),
    /// A stay off the CPU, whose amount is its nanoseconds.
    OffCpu,
    /// An event, counted under its program's name for events.
    Events(&'static str),
}

impl Weight {
    fn of(spec: &ProbeSpec) -> Weight {
        match (spec, clock_period_ns(spec)) {
            (_, Some(period)) => Weight::Clock(period),
            (ProbeSpec::OffCpu, _) => Weight::OffCpu,
            _ => Weight::Events(event_program(spec.program_kind()).count_name()),
        }
    }
}

/// A value of the session's samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    /// Clock samples.
    Samples,
    /// The CPU time clock samples stand for.
    Cpu,
    /// Nanoseconds off the CPU.
    OffCpu,
    /// Stays off the CPU.
    Blocks,
    /// Each probe's own time: CPU time of clock samples, time off the CPU of the
    /// others, under their probes' roots; the flamegraph of a run that has both.
    Time,
    /// Events of any probe, under this name.
    Events(&'static str),
}

impl Column {
    fn value_type(self) -> ValueType {
        match self {
            Column::Samples => ValueType::new("samples", "count"),
            Column::Cpu => ValueType::new("cpu", "nanoseconds"),
            Column::OffCpu => ValueType::new("off-cpu", "nanoseconds"),
            Column::Blocks => ValueType::new("blocks", "count"),
            Column::Time => ValueType::new("time", "nanoseconds"),
            Column::Events(name) => ValueType::new(name, "count"),
        }
    }

    /// The value of `events` events of a probe that weighs `weight`, with the amount
    /// its program added.
    fn value(self, weight: Weight, events: i64, amount: i64) -> i64 {
        match (self, weight) {
            (Column::Samples, Weight::Clock(_)) | (Column::Blocks, Weight::OffCpu) => events,
            (Column::Cpu | Column::Time, Weight::Clock(period)) => events.saturating_mul(period),
            (Column::OffCpu | Column::Time, Weight::OffCpu) => amount,
            (Column::Events(_), _) => events,
            _ => 0,
        }
    }
}

/// What the samples of a session weigh: clock samples count samples and the CPU time
/// they stand for, off-CPU probes the nanoseconds off the CPU and the blocks; a run with
/// both keeps them in their own values, after one of each probe's own time for the
/// flamegraph. Other probes count what their program calls its events ("samples" of
/// other perf events, "events"), "events" when the probes' names differ, beside the
/// time off the CPU if an off-CPU probe is among them.
fn columns(weights: &[Weight]) -> Vec<Column> {
    let clock = |w: &Weight| matches!(w, Weight::Clock(_));
    let off_cpu = |w: &Weight| *w == Weight::OffCpu;
    if weights.iter().all(clock) {
        return vec![Column::Samples, Column::Cpu];
    }
    if weights.iter().all(off_cpu) {
        return vec![Column::OffCpu, Column::Blocks];
    }
    if weights.iter().all(|w| clock(w) || off_cpu(w)) {
        return vec![
            Column::Time,
            Column::Cpu,
            Column::OffCpu,
            Column::Samples,
            Column::Blocks,
        ];
    }
    let mut names = weights.iter().map(|w| match w {
        Weight::Clock(_) => "samples",
        Weight::OffCpu => "blocks",
        Weight::Events(name) => name,
    });
    let first = names.next().unwrap_or("events");
    let name = if names.all(|name| name == first) {
        first
    } else {
        "events"
    };
    let mut columns = vec![Column::Events(name)];
    if weights.iter().any(off_cpu) {
        columns.push(Column::OffCpu);
    }
    columns
}

/// The session's value types, and for a clock-only run the CPU time of a sample.
fn value_types(probes: &[Probe]) -> (Vec<ValueType>, Option<(ValueType, i64)>) {
    let weights: Vec<Weight> = probes
        .iter()
        .filter_map(Probe::event_spec)
        .map(Weight::of)
        .collect();
    if weights.is_empty() {
        return (Vec::new(), None);
    }
    let columns = columns(&weights);
    let types = columns.iter().map(|c| c.value_type()).collect();
    let period = match columns.as_slice() {
        [Column::Samples, Column::Cpu] => weights
            .iter()
            .filter_map(|w| match w {
                Weight::Clock(period) => Some(*period),
                _ => None,
            })
            .max()
            .map(|period| (Column::Cpu.value_type(), period)),
        _ => None,
    };
    (types, period)
}

/// Nanoseconds of CPU time one sample of a `profile` probe stands for.
fn clock_period_ns(spec: &ProbeSpec) -> Option<i64> {
    let ProbeSpec::Profile(rate) = spec else {
        return None;
    };
    let ns = match *rate {
        Rate::Hz(hz) => 1_000_000_000 / hz.max(1),
        Rate::Seconds(n) => n.saturating_mul(1_000_000_000),
        Rate::Millis(n) => n.saturating_mul(1_000_000),
        Rate::Micros(n) => n.saturating_mul(1_000),
    };
    i64::try_from(ns).ok()
}

/// Every counter with its stacks, as the profile builder takes them, with the values
/// [`value_types`] lists.
fn raw_samples(tracer: &Tracer, probes: &[Probe]) -> Result<Vec<RawSample>> {
    // Per probe, in the probes' order (a heap probe has none: its counts are its own).
    let weights: Vec<Option<Weight>> = probes
        .iter()
        .map(|p| p.event_spec().map(Weight::of))
        .collect();
    let columns = columns(&weights.iter().flatten().copied().collect::<Vec<_>>());
    let counts = tracer.counts().context("reading the event counts")?;
    let mut samples = Vec::with_capacity(counts.len());
    for (key, count) in counts {
        let (user, truncated) = user_stack(tracer, key.stack)?;
        let kernel = match key.kernel_stack {
            Some(id) => tracer.kernel_stack(id).unwrap_or_default(),
            None => Vec::new(),
        };
        let probe = key.probe_id as usize;
        let interval = probes
            .get(probe)
            .and_then(Probe::event_spec)
            .is_some_and(|spec| matches!(spec, ProbeSpec::Interval(_)));
        // An interval firing without stacks: the target ran on another CPU than the
        // timer's (or was between two of its threads' runs).
        let truncated = if interval && key.stack == StackRef::None && kernel.is_empty() {
            Some(Loss::TargetElsewhere.name().to_string())
        } else {
            truncated
        };
        let weight = weights
            .get(probe)
            .copied()
            .flatten()
            .unwrap_or(Weight::Events("events"));
        let events = i64::try_from(count.events).unwrap_or(i64::MAX);
        let amount = i64::try_from(count.amount).unwrap_or(i64::MAX);
        let values = columns
            .iter()
            .map(|column| column.value(weight, events, amount))
            .collect();
        samples.push(RawSample {
            probe,
            pid: key.pid,
            user,
            truncated,
            kernel,
            values,
        });
    }
    Ok(samples)
}

/// The user stack `stack` refers to, innermost first, and why it ends early if it does.
pub(crate) fn user_stack(tracer: &Tracer, stack: StackRef) -> Result<(Vec<u64>, Option<String>)> {
    Ok(match stack {
        StackRef::None => (Vec::new(), None),
        StackRef::NotStored => (Vec::new(), Some(Loss::StackNotStored.name().to_string())),
        StackRef::Hash(hash) => match tracer.stack(hash).context("reading a stack")? {
            Some(stack) => {
                let truncated = (!stack.is_complete()).then(|| stack.end.to_string());
                (stack.pcs, truncated)
            }
            None => (
                Vec::new(),
                Some(format!("stack lost: {}", Loss::StackRingFull.name())),
            ),
        },
    })
}

fn default_title(probes: &[String], argv: Option<&[String]>, pid: u32) -> String {
    let target = match argv {
        Some(argv) => shell_words::join(argv),
        None => format!("process {pid}"),
    };
    format!("{} — {target}", probes.join(" "))
}

fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {signal}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(columns: &[Column], weight: Weight, events: i64, amount: i64) -> Vec<i64> {
        columns
            .iter()
            .map(|column| column.value(weight, events, amount))
            .collect()
    }

    #[test]
    fn off_cpu_weighs_nanoseconds_first() {
        let columns = columns(&[Weight::OffCpu]);
        assert_eq!(columns, [Column::OffCpu, Column::Blocks]);
        assert_eq!(values(&columns, Weight::OffCpu, 3, 30_000), [30_000, 3]);
    }

    #[test]
    fn profile_and_off_cpu_keep_their_values_apart() {
        let clock = Weight::Clock(1_000);
        let columns = columns(&[clock, Weight::OffCpu]);
        let kinds: Vec<String> = columns.iter().map(|c| c.value_type().kind).collect();
        assert_eq!(kinds, ["time", "cpu", "off-cpu", "samples", "blocks"]);
        // Clock samples: 5 of them; the off-CPU amount is not theirs.
        assert_eq!(values(&columns, clock, 5, 0), [5_000, 5_000, 0, 5, 0]);
        assert_eq!(
            values(&columns, Weight::OffCpu, 2, 70_000),
            [70_000, 0, 70_000, 0, 2]
        );
    }

    #[test]
    fn events_of_other_probes_stay_counts() {
        assert_eq!(
            columns(&[Weight::Clock(10)]),
            [Column::Samples, Column::Cpu]
        );
        assert_eq!(
            columns(&[Weight::Events("events"), Weight::Events("events")]),
            [Column::Events("events")]
        );
        assert_eq!(
            columns(&[Weight::Events("events"), Weight::OffCpu]),
            [Column::Events("events"), Column::OffCpu]
        );
    }
}
