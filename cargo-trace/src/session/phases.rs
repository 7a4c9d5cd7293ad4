//! The three phases of a session, as three types:
//!
//! - [`Prepared`]: the collectors loaded (the verifier ran), the target started and
//!   held at its entry point (or found, with `-p`), the collectors attached to it.
//!   Nothing of `main` has run.
//! - [`Running`]: the target runs at full speed; the collectors are polled (new
//!   processes, stacks and mappings as they appear).
//! - [`Finished`]: tracing stopped; what the collectors held is let go. What they
//!   counted becomes a [`Profile`].
//!
//! Leaving a phase, by success or by error, tears down what it held in `Drop`: a
//! collector's teardown is its own (the BPF collector's links, held children and guard
//! go with it), a launched target held at its entry is let go with its `Stopped`.

use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use profile::{HeapPoint, Profile, TimelinePoint};

use super::heap_watch::HeapWatch;
use super::profile_of::{self, Source};
use crate::collect::{Collector, Target as CollectorTarget, When};
use crate::launch::{self, Exit};
use crate::probe::Probe;
use crate::process;
use crate::progress::{self, Progress};
use crate::settings::{HeapSettings, Settings};
use crate::signals;
use crate::tables::SharedTables;
use crate::timings::{self, Phase};
use crate::wake::Wakeup;

/// How often the wait loop looks at the target.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How often the stack walks so far are noted (the events over time).
const NOTE_INTERVAL: Duration = Duration::from_millis(200);

/// The process being traced.
enum Target {
    Launched(launch::Running),
    Attached(u32),
}

/// What every phase holds: the probes, the collectors and the processes' tables.
struct Traced {
    probes: Vec<Probe>,
    /// The command launched; `None` with `-p`.
    argv: Option<Vec<String>>,
    pid: u32,
    /// The launched target's entry point, where it was held by a breakpoint.
    entry: Option<u64>,
    /// The target's executable (`/proc/PID/exe`).
    executable: Option<String>,
    collectors: Vec<Box<dyn Collector>>,
    tables: SharedTables,
}

/// Phase 1: everything attached, the target held at its entry point.
pub struct Prepared {
    traced: Traced,
    /// With a heap probe: the heap timeline, and the top outstanding stacks with
    /// `--interval`.
    heap: Option<HeapWatch>,
    /// The launched target, stopped under ptrace; `None` with `-p`.
    stopped: Option<launch::Stopped>,
}

impl Prepared {
    /// Launches `argv` (or finds the `-p` process) and attaches the collectors to it.
    pub fn new(
        settings: &Settings,
        probes: Vec<Probe>,
        mut collectors: Vec<Box<dyn Collector>>,
        tables: SharedTables,
        argv: Option<Vec<String>>,
    ) -> Result<Prepared> {
        let (pid, stopped) = match (&argv, &settings.target) {
            (Some(argv), _) => {
                let env: Vec<_> = collectors.iter().flat_map(|c| c.environment()).collect();
                let stopped = launch::start(argv, &env)?;
                (stopped.pid(), Some(stopped))
            }
            (None, crate::settings::TargetSpec::Pid(pid)) => (*pid, None),
            (None, _) => unreachable!("either a command or a pid"),
        };
        signals::install(stopped.as_ref().map(|s| s.pid()))?;
        timings::done(Phase::Launch);
        let target = CollectorTarget {
            pid,
            launched: stopped.is_some(),
        };
        for collector in &mut collectors {
            collector.attach(target)?;
        }
        let heap = probes
            .iter()
            .any(Probe::is_heap)
            .then(|| HeapWatch::new(settings.heap.interval));
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
                collectors,
                tables,
            },
            stopped,
        })
    }

    /// Lets the target run. `quiet`: no progress line.
    pub fn start(mut self, quiet: bool) -> Result<Running> {
        // The session's span, the duration it reports, starts here, and an interval
        // counts from here: not while the probes were attached with the target held
        // at its entry (a second and more on a loaded machine).
        let started = Instant::now();
        let started_at = SystemTime::now();
        for collector in &mut self.traced.collectors {
            collector.start()?;
        }
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
            timeline: Vec::new(),
            started,
            started_at,
        })
    }
}

/// Phase 2: the target runs.
pub struct Running {
    traced: Traced,
    heap: Option<HeapWatch>,
    target: Target,
    /// Stack walks so far, noted every [`NOTE_INTERVAL`].
    timeline: Vec<TimelinePoint>,
    progress: Progress,
    started: Instant,
    started_at: SystemTime,
    /// Ends the loop's sleeps when the target exits.
    wakeup: Wakeup,
}

impl Running {
    /// Runs until the target exits (launch mode) or disappears or a stop is asked for
    /// (attach mode), or `duration` passes. On SIGUSR1, `on_snapshot` gets the profile
    /// as of then.
    pub fn wait(
        mut self,
        duration: Option<Duration>,
        heap_settings: &HeapSettings,
        on_snapshot: &mut dyn FnMut(&Profile),
    ) -> Result<Finished> {
        let deadline = duration.map(|duration| self.started + duration);
        let exit = self.wait_for_end(deadline, heap_settings, on_snapshot)?;
        timings::done(Phase::Run);
        // The span ends: nothing counts any more, though what counted stays attached
        // until the collectors stop.
        for collector in &mut self.traced.collectors {
            collector.end();
        }
        let elapsed = self.started.elapsed();
        self.note_walks();
        let traced = &self.traced;
        let untraced = traced
            .collectors
            .iter()
            .flat_map(|c| c.still_running(traced.pid))
            .collect();
        let heap_timeline = match self.heap.take() {
            Some(heap) => heap.finish(&self.traced.collectors),
            None => Vec::new(),
        };
        let Running {
            mut traced,
            target,
            started_at,
            timeline,
            progress,
            ..
        } = self;
        // Cleared before anything else is printed.
        drop(progress);
        for collector in &mut traced.collectors {
            collector.stop();
        }
        timings::done(Phase::Teardown);
        Ok(Finished {
            traced,
            target,
            exit,
            started_at,
            timeline,
            elapsed,
            untraced,
            heap_timeline,
        })
    }

    /// Adds the stack walks counted so far to the timeline and the progress line.
    fn note_walks(&mut self) {
        let mut walks = None;
        for (total, failed) in self
            .traced
            .collectors
            .iter()
            .filter_map(|c| c.walks_so_far())
        {
            let (all, failures) = walks.get_or_insert((0, 0));
            *all += total;
            *failures += failed;
        }
        let Some((walks, failed)) = walks else {
            return;
        };
        let at = self.started.elapsed();
        self.timeline.push(TimelinePoint { at, walks });
        self.progress.update(progress::Status {
            elapsed: at,
            events: walks,
            failed,
            processes: self
                .traced
                .collectors
                .iter()
                .map(|c| c.processes())
                .max()
                .unwrap_or(1),
        });
    }

    /// `None`: the target is still running.
    fn wait_for_end(
        &mut self,
        deadline: Option<Instant>,
        heap_settings: &HeapSettings,
        on_snapshot: &mut dyn FnMut(&Profile),
    ) -> Result<Option<Exit>> {
        let mut last_note = Instant::now();
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
            // Sleeps until the target ends, a collector has work, or the interval passes.
            let wake: Vec<_> = self
                .traced
                .collectors
                .iter()
                .filter_map(|c| c.wake_fd())
                .collect();
            self.wakeup.wait(&wake, POLL_INTERVAL);
            for collector in &mut self.traced.collectors {
                collector.poll();
            }
            if last_note.elapsed() >= NOTE_INTERVAL {
                last_note = Instant::now();
                self.note_walks();
            }
            if let Some(heap) = &mut self.heap {
                heap.tick(&self.traced.collectors, &self.traced.tables);
            }
            if signals::snapshot_requested() {
                match self.snapshot(heap_settings) {
                    Ok(profile) => on_snapshot(&profile),
                    Err(error) => eprintln!("cargo-trace: error: on SIGUSR1: {error:#}"),
                }
            }
        }
    }

    /// The profile as of now, for SIGUSR1.
    fn snapshot(&mut self, heap_settings: &HeapSettings) -> Result<Profile> {
        let traced = &mut self.traced;
        let mut collected = Vec::new();
        for collector in &mut traced.collectors {
            collected.push(collector.collected(When::Snapshot)?);
        }
        let tables = traced.tables.lock();
        let source = Source {
            probes: &traced.probes,
            collected,
            symbol_mappings: tables.symbol_mappings().clone(),
            object_mappings: tables.object_mappings().clone(),
            coverage: tables.coverage.clone(),
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
        };
        Ok(profile_of::build(source, heap_settings))
    }
}

/// Phase 3: tracing stopped, the collectors let go of the processes; the counts wait
/// to be read.
pub struct Finished {
    traced: Traced,
    target: Target,
    /// `None`: the target still runs (attached, or stopped after a duration).
    exit: Option<Exit>,
    started_at: SystemTime,
    timeline: Vec<TimelinePoint>,
    elapsed: Duration,
    /// Traced processes other than the target still running at the end (daemons).
    untraced: Vec<u32>,
    /// With a heap probe: memory over time.
    heap_timeline: Vec<HeapPoint>,
}

impl Finished {
    /// What the collectors counted, symbolized.
    pub fn profile(&mut self, heap_settings: &HeapSettings) -> Result<Profile> {
        let traced = &mut self.traced;
        let mut collected = Vec::new();
        for collector in &mut traced.collectors {
            collected.push(collector.collected(When::Final)?);
        }
        let mut tables = traced.tables.lock();
        let source = Source {
            probes: &traced.probes,
            collected,
            symbol_mappings: tables.take_symbol_mappings(),
            object_mappings: tables.object_mappings().clone(),
            coverage: tables.coverage.clone(),
            pid: traced.pid,
            entry: traced.entry,
            argv: traced.argv.clone(),
            executable: traced.executable.clone(),
            started_at: self.started_at,
            elapsed: self.elapsed,
            timeline: self.timeline.clone(),
            heap_timeline: std::mem::take(&mut self.heap_timeline),
        };
        Ok(profile_of::build(source, heap_settings))
    }

    /// The command launched; `None` with `-p`.
    pub fn argv(&self) -> Option<&[String]> {
        self.traced.argv.as_deref()
    }

    /// Traced processes other than the target still running at the end.
    pub fn untraced(&self) -> &[u32] {
        &self.untraced
    }

    /// What the collectors cost, if asked for (`--bpf-stats`).
    pub fn cost_report(&self) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        for collector in &self.traced.collectors {
            lines.extend(collector.cost_report()?);
        }
        Ok(lines)
    }

    /// Says how the target ended when that is news, and returns the exit code to pass
    /// on (the target's, 128 + signal if it was killed, 0 when it still runs) with the
    /// target's fate in words, for a failure message that must not hide it.
    pub fn announce_exit(&self) -> (i32, String) {
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

fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {signal}"))
}
