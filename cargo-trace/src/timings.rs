//! Where a session's time goes (`--timings`): the wall time of each phase, from
//! cargo-trace's start to its end, and the process's peak memory, printed to stderr
//! when the run ends.
//!
//! The session marks the end of each phase with [`done`]; the time since the last
//! mark is charged to that phase. Nothing is kept or printed unless [`start`] was
//! called, so the marks cost a lock of an empty mutex otherwise. A phase may end
//! more than once (its times add up), and one that never ends is not printed.
//!
//! ```text
//! cargo-trace: timings (wall ms, peak RSS MiB after it):
//!   load           3.1    9.8  parse the probes, open the BPF object, create its maps
//!   verify        81.0   10.1  the kernel's verifier checks the programs
//!   ...
//!   total        140.2  peak RSS 21.4 MiB
//! ```

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A phase of a session, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Load,
    Verify,
    Guard,
    Launch,
    Tables,
    Attach,
    Run,
    Read,
    Symbolize,
    Write,
    Teardown,
}

impl Phase {
    const ALL: [Phase; 11] = [
        Phase::Load,
        Phase::Verify,
        Phase::Guard,
        Phase::Launch,
        Phase::Tables,
        Phase::Attach,
        Phase::Run,
        Phase::Read,
        Phase::Symbolize,
        Phase::Write,
        Phase::Teardown,
    ];

    /// Its name in the report, as the benchmark parses it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Verify => "verify",
            Phase::Guard => "guard",
            Phase::Launch => "launch",
            Phase::Tables => "tables",
            Phase::Attach => "attach",
            Phase::Run => "run",
            Phase::Read => "read",
            Phase::Symbolize => "symbolize",
            Phase::Write => "write",
            Phase::Teardown => "teardown",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Phase::Load => "parse the probes, open the BPF object, create its maps",
            Phase::Verify => "the kernel's verifier checks the programs",
            Phase::Guard => "fork the guard process",
            Phase::Launch => "start the target, run it to its entry point",
            Phase::Tables => "unwind tables of its mappings, into the maps",
            Phase::Attach => "attach the probes, follow the children",
            Phase::Run => "the target runs",
            Phase::Read => "read the kernel's counts and stacks",
            Phase::Symbolize => "symbolize into a profile",
            Phase::Write => "write the outputs",
            Phase::Teardown => "detach, resume, dismiss the guard, free",
        }
    }
}

struct Clock {
    started: Instant,
    last: Instant,
    spent: [Option<Duration>; Phase::ALL.len()],
    /// The peak RSS when the phase last ended, in KiB: where the peak was reached.
    peak_after: [Option<u64>; Phase::ALL.len()],
}

static CLOCK: Mutex<Option<Clock>> = Mutex::new(None);

fn with_clock(f: impl FnOnce(&mut Clock)) {
    let mut clock = CLOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(clock) = clock.as_mut() {
        f(clock);
    }
}

/// Starts the clock: the phases are timed from now.
pub fn start() {
    let now = Instant::now();
    *CLOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Clock {
        started: now,
        last: now,
        spent: [None; Phase::ALL.len()],
        peak_after: [None; Phase::ALL.len()],
    });
}

fn charge(clock: &mut Clock, phase: Phase, time: Duration) {
    let spent = &mut clock.spent[phase as usize];
    *spent = Some(spent.unwrap_or_default() + time);
    clock.peak_after[phase as usize] = peak_rss_kib();
}

/// Charges the time since the last mark to `phase`.
pub fn done(phase: Phase) {
    with_clock(|clock| {
        let now = Instant::now();
        charge(clock, phase, now - clock.last);
        clock.last = now;
    });
}

/// Charges the time since the last mark to `first` and `last`, `last_part` of it (at
/// most) to `last`: a step that timed its own end.
pub fn done_split(first: Phase, last: Phase, last_part: Duration) {
    with_clock(|clock| {
        let now = Instant::now();
        let all = now - clock.last;
        let last_part = last_part.min(all);
        charge(clock, first, all - last_part);
        charge(clock, last, last_part);
        clock.last = now;
    });
}

/// The report, or `None` if the clock was not started.
pub fn report() -> Option<String> {
    let clock = CLOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let clock = clock.as_ref()?;
    let mut text = String::from("cargo-trace: timings (wall ms, peak RSS MiB after it):\n");
    for phase in Phase::ALL {
        if let Some(spent) = clock.spent[phase as usize] {
            let peak = clock.peak_after[phase as usize].unwrap_or(0);
            text.push_str(&format!(
                "  {:<10}{:>8.1} {:>6.1}  {}\n",
                phase.name(),
                spent.as_secs_f64() * 1e3,
                peak as f64 / 1024.0,
                phase.what()
            ));
        }
    }
    let peak = match peak_rss_kib() {
        Some(kib) => format!("  peak RSS {:.1} MiB", kib as f64 / 1024.0),
        None => String::new(),
    };
    text.push_str(&format!(
        "  {:<10}{:>8.1}{peak}",
        "total",
        clock.started.elapsed().as_secs_f64() * 1e3
    ));
    Some(text)
}

/// The process's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_charged_in_order_and_reported_once_each() {
        start();
        done(Phase::Load);
        done_split(Phase::Load, Phase::Verify, Duration::from_secs(3600));
        done(Phase::Run);
        let report = report().expect("started");
        let names: Vec<&str> = report
            .lines()
            .skip(1)
            .filter_map(|line| line.split_whitespace().next())
            .collect();
        // Other tests may mark phases meanwhile (the clock is global): these at least.
        let at = |name: &str| names.iter().position(|n| *n == name).expect(name);
        assert!(
            at("load") < at("verify") && at("verify") < at("run"),
            "{report}"
        );
        assert_eq!(names.last(), Some(&"total"));
        assert!(report.contains("peak RSS"), "{report}");
    }
}
