//! One tracing session: probes, target, tables, attach, run, report.
//!
//! Order matters: the probes are parsed and checked before anything starts, the
//! BPF object is loaded (and verified) before the target is launched, and the
//! target is held at its entry point until every table is loaded and every
//! probe attached, so nothing of `main` runs unobserved.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bpf_prog::{EventProgram, Loss, Options, StackRef, Tracer, WalkCounters};
use libbpf_rs::Link;
use probes::{ProbeSpec, ProgramKind};

use crate::cli::Cli;
use crate::guard::Guard;
use crate::launch::{self, Exit};
use crate::report::{self, Sample};
use crate::signals;
use crate::symbolize::Symbolizer;
use crate::tables::ProcessTables;

/// How often the target's mappings are re-read (libraries opened with dlopen).
const REFRESH_INTERVAL: Duration = Duration::from_millis(200);
/// How often the wait loop looks at the target.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// A probe as the user wrote it and as parsed.
struct Probe {
    text: String,
    spec: ProbeSpec,
}

/// The process being traced.
enum Target {
    Launched(launch::Running),
    Attached(u32),
}

pub fn run(cli: &Cli) -> Result<i32> {
    let probes = parse_probes(&cli.probes)?;
    let argv = match cli.pid {
        Some(_) => None,
        None => Some(command_line(cli)?),
    };

    let follow = !cli.no_follow_forks;
    let options = Options {
        // Uprobes that fire in every process mapping the file, for the children,
        // filtered to the traced ones in the program.
        filter_uprobes: follow,
        programs: programs_for(&probes),
        max_stacks: cli.max_stacks,
        max_counts: cli.max_counts,
        record_ring_bytes: cli.ring_buffer_mib << 20,
        max_procs: cli.max_processes,
        max_filtered_pids: cli.max_processes,
        ..Options::default()
    };
    let mut tracer = Tracer::load(&options).map_err(|error| {
        if error.is_permission_denied() {
            anyhow::anyhow!("loading BPF programs needs root (or CAP_BPF and CAP_PERFMON): {error}")
        } else {
            anyhow::Error::new(error)
        }
    })?;
    // Before anything can be stopped: resumes what is, should cargo-trace die.
    let guard = Guard::spawn(tracer.pid_filter_fd()).context("starting the guard process")?;
    let scratch = ScratchDir::create()?;
    let mut tables = ProcessTables::new(scratch.0.clone());

    // Launched: stopped at its entry point until the probes are live.
    let (pid, stopped) = match (&argv, cli.pid) {
        (Some(argv), _) => {
            let stopped = launch::start(argv)?;
            (stopped.pid(), Some(stopped))
        }
        (None, Some(pid)) => {
            if !process_exists(pid) {
                bail!("no process {pid}");
            }
            (pid, None)
        }
        (None, None) => unreachable!("either a command or a pid"),
    };
    signals::install(stopped.as_ref().map(|s| s.pid()))?;

    tables.sync(&mut tracer, pid)?;
    tracer
        .filter_pid(pid)
        .context("adding the target to the event filter")?;
    let mut links = attach_all(&tracer, &probes, pid, follow)?;
    // Processes the program stops at their start, for their mappings to be registered.
    let started_images = Rc::new(RefCell::new(Vec::new()));
    let new_images = if follow {
        links.extend(
            tracer
                .follow_forks()
                .context("following the target's children")?,
        );
        links.extend(stop_children_at_start(&tracer, pid, stopped.is_none())?);
        let sink = Rc::clone(&started_images);
        Some(tracer.new_images(move |pid| sink.borrow_mut().push(pid))?)
    } else {
        None
    };

    // Statistics cost a clock read per run: only when asked for.
    let stats_guard = if cli.bpf_stats {
        Some(bpf_prog::enable_run_time_stats().context("enabling BPF run-time statistics")?)
    } else {
        None
    };
    let started = Instant::now();
    let target = match stopped {
        Some(stopped) => Target::Launched(stopped.resume()?),
        None => Target::Attached(pid),
    };
    let deadline = cli.duration.map(|duration| started + duration);
    let children = Children {
        new_images: new_images.as_ref(),
        started: &started_images,
    };
    let exit = wait(&target, &mut tracer, &mut tables, &children, deadline)?;
    // No child stops at its start once the links are gone; one that stopped
    // since the last poll must not stay stopped.
    drop(links);
    if let Some(ring) = &new_images {
        let _ = ring.consume();
    }
    for pid in started_images.borrow_mut().drain(..) {
        // SAFETY: kill(2) with a pid the program reported.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    }
    drop(new_images);
    guard.dismiss();
    let elapsed = started.elapsed();

    let samples = read_samples(&tracer)?;
    let mut symbolizer = Symbolizer::new();
    // A child that exited before its mappings were read ran with its parent's
    // (fork copies them): the target's are the best guess for it.
    symbolizer.set_fallback(pid);
    symbolizer.set_parents(tracer.parents());
    for (pid, mappings) in tables.take_symbol_mappings() {
        symbolizer.add_process(pid, mappings);
    }
    let names: Vec<String> = probes.iter().map(|p| p.text.clone()).collect();
    let folded = report::fold(&samples, &names, &mut symbolizer, cli.line_numbers);

    if let Some(path) = &cli.folded {
        folded.write_folded(path)?;
    }
    if !cli.no_svg {
        let title = cli
            .title
            .clone()
            .unwrap_or_else(|| default_title(&names, &argv, pid));
        folded.write_svg(&cli.output, &title, count_name(&probes))?;
    }

    let walk_ends = tracer.walk_ends().context("reading the walk counters")?;
    let losses = tracer.losses().context("reading the loss counters")?;
    eprintln!(
        "{}",
        summary(
            folded.total(),
            folded.lines.len(),
            processes(&samples),
            &walk_ends,
            &losses,
            elapsed
        )
    );
    for (name, reason) in &tables.coverage.without_table {
        if !name.starts_with('[') {
            eprintln!("cargo-trace: note: no unwind table for {name}: {reason}");
        }
    }
    if stats_guard.is_some() {
        let stats = tracer.program_stats().context("reading BPF statistics")?;
        let mut programs: Vec<_> = stats.iter().filter(|(_, s)| s.run_count > 0).collect();
        programs.sort_by_key(|(name, _)| *name);
        for (name, s) in programs {
            eprintln!(
                "cargo-trace: bpf {name}: {} runs, {} ns per run",
                s.run_count,
                s.run_time_ns / s.run_count
            );
        }
    }
    drop(stats_guard);
    let mut written = Vec::new();
    if !cli.no_svg {
        written.push(cli.output.display().to_string());
    }
    if let Some(path) = &cli.folded {
        written.push(path.display().to_string());
    }
    if !written.is_empty() {
        eprintln!("cargo-trace: wrote {}", written.join(", "));
    }
    drop(scratch);

    Ok(match exit {
        Some(exit) => {
            if let Exit::Signal(signal) = exit {
                eprintln!(
                    "cargo-trace: the target was killed by {}",
                    signal_name(signal)
                );
            }
            exit.code()
        }
        None => {
            if let Target::Launched(running) = &target {
                eprintln!(
                    "cargo-trace: stopped tracing after the duration; process {} runs on",
                    running.pid()
                );
            }
            0
        }
    })
}

fn parse_probes(texts: &[String]) -> Result<Vec<Probe>> {
    texts
        .iter()
        .map(|text| {
            let spec = probes::parse(text).map_err(|error| anyhow::anyhow!("{error}"))?;
            // Fail before launching anything when this kernel cannot run the probe.
            match &spec {
                ProbeSpec::Kprobe(_) => probes::kprobe_support()?,
                ProbeSpec::Hardware { .. } => probes::hardware_support()?,
                _ => {}
            }
            Ok(Probe {
                text: text.clone(),
                spec,
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
fn programs_for(probes: &[Probe]) -> std::collections::BTreeSet<EventProgram> {
    probes
        .iter()
        .map(|probe| event_program(probe.spec.program_kind()))
        .collect()
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
    }
}

/// Attaches every probe with its index as the BPF cookie: counts keep probes apart by it.
/// `follow`: uprobes fire in every process (the program keeps the target and its
/// children); else in the target only.
fn attach_all(tracer: &Tracer, probes: &[Probe], pid: u32, follow: bool) -> Result<Vec<Link>> {
    let mut links = Vec::new();
    for (index, probe) in probes.iter().enumerate() {
        let program = tracer.program(event_program(probe.spec.program_kind()));
        let fire_in = (!follow).then_some(pid);
        let attached =
            probes::attach_probe_for(program, &probe.spec, Some(pid), fire_in, index as u64)
                .map_err(|error| anyhow::anyhow!("{error}"))?;
        links.extend(attached);
    }
    Ok(links)
}

/// How the session learns of the target's children that exec'd.
struct Children<'a> {
    /// Reports processes stopped at their start; `None` when not following.
    new_images: Option<&'a libbpf_rs::RingBuffer<'static>>,
    /// What it reported, not yet registered.
    started: &'a RefCell<Vec<u32>>,
}

/// Attaches the program that stops an exec'd child once ld.so has mapped its libraries,
/// in every process (the program picks the followed ones): at ld.so's `_dl_debug_state`
/// when the link map turns consistent (before relocation ends and before any library
/// constructor runs), and, failing that, at libc's `__libc_start_main` (before `main`).
/// Children that use neither the target's ld.so nor its libc are registered by polling.
/// `attached` (`-p`): the attached process itself is never stopped, so the ld.so probe,
/// which stops any traced process after a dlopen, is left out.
fn stop_children_at_start(tracer: &Tracer, pid: u32, attached: bool) -> Result<Vec<Link>> {
    const LD_SO: &str = "uprobe:ld-linux-x86-64.so.2:_dl_debug_state";
    const START_MAIN: &str = "uprobe:libc:__libc_start_main";
    let hooks: &[&str] = if attached {
        &[START_MAIN]
    } else {
        &[LD_SO, START_MAIN]
    };
    let mut links = Vec::new();
    for &probe in hooks {
        let spec = match probes::parse(probe) {
            Ok(ProbeSpec::Uprobe(spec)) => spec,
            _ => unreachable!("a valid uprobe spec"),
        };
        // A static target has neither: polling alone then.
        let Ok(targets) = probes::resolve_uprobe(&spec, Some(pid)) else {
            continue;
        };
        for target in &targets {
            // On ld.so, the program finds `_r_debug` from the probed address.
            let cookie = if probe == LD_SO {
                match r_debug_offset(&target.path, target.address) {
                    Some(offset) => offset,
                    None => continue,
                }
            } else {
                bpf_prog::START_MAIN_COOKIE
            };
            let link =
                probes::attach_uprobe(tracer.start_main_program(), target, None, false, cookie)
                    .map_err(|error| anyhow::anyhow!("{error}"))?;
            links.push(link);
        }
    }
    Ok(links)
}

/// `_r_debug`'s address in ld.so `path` minus `debug_state`'s (`_dl_debug_state`), as the
/// two's complement the program adds to the probed pc.
fn r_debug_offset(path: &std::path::Path, debug_state: u64) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let r_debug = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|symbol| symbol.name() == Ok("_r_debug"))?
        .address();
    Some(r_debug.wrapping_sub(debug_state))
}

/// Runs until the target exits (launch mode) or disappears or a stop is asked
/// for (attach mode), or the deadline passes, refreshing its mappings as it goes.
/// `None`: the target is still running.
fn wait(
    target: &Target,
    tracer: &mut Tracer,
    tables: &mut ProcessTables,
    children: &Children<'_>,
    deadline: Option<Instant>,
) -> Result<Option<Exit>> {
    let mut last_refresh = Instant::now();
    loop {
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Ok(None);
        }
        match target {
            Target::Launched(running) => {
                if let Some(exit) = running.try_wait()? {
                    return Ok(Some(exit));
                }
            }
            Target::Attached(pid) => {
                if signals::stop_requested() || !process_exists(*pid) {
                    return Ok(None);
                }
            }
        }
        match children.new_images {
            // Wakes up as soon as a child stops at its start.
            Some(ring) => {
                let _ = ring.poll(POLL_INTERVAL);
            }
            None => std::thread::sleep(POLL_INTERVAL),
        }
        // New stacks reach userspace through a ring buffer: drained at every wake-up so
        // that a burst of them finds it empty. A failure here loses nothing: the records
        // stay for the next drain.
        let _ = tracer.drain_records();
        for pid in children.started.borrow_mut().drain(..) {
            tables.forget(pid);
            let _ = tables.sync(tracer, pid);
            // SAFETY: kill(2) with a pid the program reported; at worst the
            // process is gone.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        // Not at every wake-up: a child that execs reports itself (above), and one
        // that only forked walks with its parent's mappings meanwhile; reading the
        // whole filter map is a system call per process.
        if last_refresh.elapsed() >= REFRESH_INTERVAL {
            last_refresh = Instant::now();
            track_processes(tracer, tables);
        }
    }
}

/// Registers the mappings of processes that joined the filter (children the
/// program followed) or exec'd since, re-reads every traced process's mappings
/// (dlopen) and forgets those that exited.
fn track_processes(tracer: &mut Tracer, tables: &mut ProcessTables) {
    for pid in tracer.filtered_pids() {
        let known = tables.knows(pid);
        if !process_exists(pid) {
            // Its counts stay; its filter and mappings entries are freed.
            let _ = tracer.unfilter_pid(pid);
            let _ = tracer.remove_process(pid);
            continue;
        }
        if known && !tracer.has_mappings(pid) {
            // It exec'd: the program dropped the old image's mappings.
            tables.forget(pid);
        }
        // The process may be exiting: a failed read is not an error.
        let _ = tables.sync(tracer, pid);
    }
}

fn process_exists(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

/// Every counter with its stacks, as [`report::fold`] takes them.
fn read_samples(tracer: &Tracer) -> Result<Vec<Sample>> {
    let counts = tracer.counts().context("reading the event counts")?;
    let mut samples = Vec::with_capacity(counts.len());
    for (key, count) in counts {
        let (user, truncated) = match key.stack {
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
        };
        let kernel = match key.kernel_stack {
            Some(id) => tracer.kernel_stack(id).unwrap_or_default(),
            None => Vec::new(),
        };
        samples.push(Sample {
            probe: key.probe_id as usize,
            pid: key.pid,
            user,
            truncated,
            kernel,
            count: count.events,
        });
    }
    Ok(samples)
}

/// The closing line: events, distinct stacks, and every failure that happened.
fn summary(
    events: u64,
    distinct: usize,
    processes: usize,
    walk_ends: &WalkCounters,
    losses: &[u64; Loss::COUNT],
    elapsed: Duration,
) -> String {
    let mut line = format!("cargo-trace: {events} events, {distinct} distinct stacks");
    if processes > 1 {
        line.push_str(&format!(" from {processes} processes"));
    }
    line.push_str(&format!(" in {:.2} s", elapsed.as_secs_f64()));
    let failures: Vec<String> = walk_ends
        .failures()
        .map(|(name, count)| format!("{name} {count}"))
        .collect();
    if failures.is_empty() {
        line.push_str("; every stack walk reached the end of the stack");
    } else {
        line.push_str("; walk failures: ");
        line.push_str(&failures.join(", "));
    }
    let lost: Vec<String> = Loss::ALL
        .iter()
        .filter(|loss| **loss != Loss::InExec && losses[**loss as usize] > 0)
        .map(|loss| format!("{} {}", loss.name(), losses[*loss as usize]))
        .collect();
    if !lost.is_empty() {
        line.push_str("; losses and limits: ");
        line.push_str(&lost.join(", "));
    }
    let in_exec = losses[Loss::InExec as usize];
    if in_exec > 0 {
        line.push_str(&format!(
            "; {in_exec} in execve with no user stack left to walk (kernel stack only)"
        ));
    }
    line
}

/// How many processes had events.
fn processes(samples: &[Sample]) -> usize {
    let pids: std::collections::BTreeSet<u32> = samples.iter().map(|s| s.pid).collect();
    pids.len()
}

/// What the probes' events are called: their programs' name if they agree, else "events".
fn count_name(probes: &[Probe]) -> &'static str {
    let mut names = probes
        .iter()
        .map(|p| event_program(p.spec.program_kind()).count_name());
    let first = names.next().unwrap_or("events");
    if names.all(|name| name == first) {
        first
    } else {
        "events"
    }
}

fn default_title(probes: &[String], argv: &Option<Vec<String>>, pid: u32) -> String {
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

/// A private directory for the session's scratch files (vDSO copies), removed
/// when the session ends, however it ends.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn create() -> Result<ScratchDir> {
        let dir = std::env::temp_dir().join(format!("cargo-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the scratch directory {}", dir.display()))?;
        Ok(ScratchDir(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
