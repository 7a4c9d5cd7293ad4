//! What heap profiling does while the target runs: the timeline of live bytes,
//! allocation and free counts and RSS (every [`TIMELINE_STEP`]), and with `--interval`
//! the top outstanding stacks printed every interval (tracelloc's view of a running
//! server), both from the kernel's statistics as they are.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Result;
use bpf_prog::Tracer;

use crate::tables::ProcessTables;
use profile::HeapPoint;

/// How often the timeline takes a point.
pub const TIMELINE_STEP: Duration = Duration::from_millis(100);

/// The heap's watch over a running target: its timeline, and the live view if asked for.
pub struct HeapWatch {
    started: Instant,
    next_point: Instant,
    timeline: Vec<HeapPoint>,
    view: Option<LiveView>,
}

impl HeapWatch {
    pub fn new(interval: Option<Duration>) -> HeapWatch {
        let now = Instant::now();
        HeapWatch {
            started: now,
            next_point: now,
            timeline: Vec::new(),
            view: interval.map(LiveView::new),
        }
    }

    /// Takes a timeline point and prints the live view when they are due.
    pub fn tick(&mut self, tracer: &Tracer, tables: &ProcessTables) {
        if Instant::now() >= self.next_point {
            self.next_point += TIMELINE_STEP;
            if let Ok(point) = self.point(tracer) {
                self.timeline.push(point);
            }
        }
        if let Some(view) = &mut self.view {
            view.tick(tracer, tables);
        }
    }

    /// The timeline so far.
    pub fn timeline(&self) -> &[HeapPoint] {
        &self.timeline
    }

    /// The timeline so far, with a last point as of now.
    pub fn finish(mut self, tracer: &Tracer) -> Vec<HeapPoint> {
        if let Ok(point) = self.point(tracer) {
            self.timeline.push(point);
        }
        self.timeline
    }

    /// Every traced process's live bytes and calls so far, and their resident memory.
    fn point(&self, tracer: &Tracer) -> Result<HeapPoint> {
        let processes = tracer.alloc_processes()?;
        let mut pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
        pids.dedup();
        Ok(HeapPoint {
            at: self.started.elapsed(),
            live_bytes: processes.iter().map(|p| p.live_bytes).sum(),
            allocs: processes.iter().map(|p| p.allocs).sum(),
            frees: processes.iter().map(|p| p.frees).sum(),
            rss_bytes: pids.iter().filter_map(|&pid| rss_bytes(pid)).sum(),
        })
    }
}

/// The resident set of process `pid` (`/proc/PID/statm`), if it still runs.
fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// Stacks listed each time.
const TOP: usize = 10;
/// Functions named per stack, innermost first.
const FUNCTIONS_SHOWN: usize = 8;

pub struct LiveView {
    interval: Duration,
    started: Instant,
    last: Instant,
}

impl LiveView {
    pub fn new(interval: Duration) -> LiveView {
        let now = Instant::now();
        LiveView {
            interval,
            started: now,
            last: now,
        }
    }

    /// Prints the view if an interval passed since the last one. A failure to read the
    /// maps is said and tracing goes on.
    pub fn tick(&mut self, tracer: &Tracer, tables: &ProcessTables) {
        if self.last.elapsed() < self.interval {
            return;
        }
        self.last = Instant::now();
        let mut err = std::io::stderr().lock();
        if let Err(error) = self.print(tracer, tables, &mut err) {
            let _ = writeln!(err, "cargo-trace: live view: {error:#}");
        }
    }

    fn print(&self, tracer: &Tracer, tables: &ProcessTables, out: &mut dyn Write) -> Result<()> {
        let mut stats = tracer.alloc_stats()?;
        stats.retain(|(_, s)| s.live_bytes > 0);
        stats.sort_by_key(|(_, s)| std::cmp::Reverse(s.live_bytes));
        let blocks: u64 = stats.iter().map(|(_, s)| s.live_blocks()).sum();
        let bytes: i64 = stats.iter().map(|(_, s)| s.live_bytes).sum();
        writeln!(
            out,
            "cargo-trace: live at {:.1} s: {blocks} blocks, {bytes} B outstanding (allocated \
             while traced); top {TOP} stacks:",
            self.started.elapsed().as_secs_f64()
        )?;
        let mut symbolizer = tables.symbolizer();
        for (rank, (key, stats)) in stats.iter().take(TOP).enumerate() {
            let (pcs, _) = crate::session::user_stack(tracer, key.stack)?;
            let mut names: Vec<String> = Vec::new();
            for (depth, &pc) in pcs.iter().enumerate() {
                for frame in symbolizer.user(key.pid, pc, depth > 0).into_iter().rev() {
                    if names.last() != Some(&frame.function) {
                        names.push(frame.function);
                    }
                }
                if names.len() > FUNCTIONS_SHOWN {
                    break;
                }
            }
            names.truncate(FUNCTIONS_SHOWN);
            writeln!(
                out,
                "  #{:<2} {:>8} blocks {:>12} B  pid {}  {}",
                rank + 1,
                stats.live_blocks(),
                stats.live_bytes,
                key.pid,
                names.join(" <- ")
            )?;
        }
        Ok(())
    }
}

/// `5s`, `500ms`, `2.5` (seconds).
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.strip_suffix("ms") {
        Some(number) => (number, 1e-3),
        None => (text.strip_suffix('s').unwrap_or(text), 1.0),
    };
    number
        .parse::<f64>()
        .ok()
        .map(|n| n * unit)
        .filter(|seconds| seconds.is_finite() && *seconds > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("'{text}' is not a positive interval (e.g. 5s, 500ms)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("2.5"), Ok(Duration::from_millis(2500)));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
