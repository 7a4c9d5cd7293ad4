//! What heap profiling does while the target runs: the timeline of live bytes,
//! allocation and free counts and RSS (every [`TIMELINE_STEP`]), and with `--interval`
//! the top outstanding stacks printed every interval (tracelloc's view of a running
//! server), both from the kernel's statistics as they are.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::tables::SharedTables;
use profile::HeapPoint;

use crate::collect::{Collector, HeapNow};

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
    pub fn tick(&mut self, collectors: &[Box<dyn Collector>], tables: &SharedTables) {
        if Instant::now() >= self.next_point {
            self.next_point += TIMELINE_STEP;
            if let Some(point) = self.point(collectors) {
                self.timeline.push(point);
            }
        }
        if let Some(view) = &mut self.view {
            view.tick(collectors, tables);
        }
    }

    /// The timeline so far.
    pub fn timeline(&self) -> &[HeapPoint] {
        &self.timeline
    }

    /// The timeline so far, with a last point as of now.
    pub fn finish(mut self, collectors: &[Box<dyn Collector>]) -> Vec<HeapPoint> {
        if let Some(point) = self.point(collectors) {
            self.timeline.push(point);
        }
        self.timeline
    }

    /// Every traced process's live bytes and calls so far, and their resident memory.
    fn point(&self, collectors: &[Box<dyn Collector>]) -> Option<HeapPoint> {
        let mut now = HeapNow::default();
        let mut any = false;
        for heap in collectors.iter().filter_map(|c| c.heap_now()) {
            any = true;
            now.live_bytes += heap.live_bytes;
            now.allocs += heap.allocs;
            now.frees += heap.frees;
            now.pids.extend(heap.pids);
        }
        now.pids.sort_unstable();
        now.pids.dedup();
        any.then(|| HeapPoint {
            at: self.started.elapsed(),
            live_bytes: now.live_bytes,
            allocs: now.allocs,
            frees: now.frees,
            rss_bytes: now.pids.iter().filter_map(|&pid| rss_bytes(pid)).sum(),
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
    pub fn tick(&mut self, collectors: &[Box<dyn Collector>], tables: &SharedTables) {
        if self.last.elapsed() < self.interval {
            return;
        }
        self.last = Instant::now();
        let mut err = std::io::stderr().lock();
        if let Err(error) = self.print(collectors, tables, &mut err) {
            let _ = writeln!(err, "cargo-trace: live view: {error:#}");
        }
    }

    fn print(
        &self,
        collectors: &[Box<dyn Collector>],
        tables: &SharedTables,
        out: &mut dyn Write,
    ) -> Result<()> {
        let mut stats = Vec::new();
        for collector in collectors {
            stats.extend(collector.heap_live()?);
        }
        stats.retain(|count| count.stats.live_bytes > 0);
        stats.sort_by_key(|count| std::cmp::Reverse(count.stats.live_bytes));
        let blocks: u64 = stats.iter().map(|count| count.stats.live_blocks).sum();
        let bytes: i64 = stats.iter().map(|count| count.stats.live_bytes).sum();
        writeln!(
            out,
            "cargo-trace: live at {:.1} s: {blocks} blocks, {bytes} B outstanding (allocated \
             while traced); top {TOP} stacks:",
            self.started.elapsed().as_secs_f64()
        )?;
        let mut symbolizer = tables.lock().symbolizer();
        for (rank, count) in stats.iter().take(TOP).enumerate() {
            let mut names: Vec<String> = Vec::new();
            for (depth, &frame) in count.user.frames.iter().enumerate() {
                for frame in symbolizer
                    .user(count.pid, frame, depth > 0)
                    .into_iter()
                    .rev()
                {
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
                count.stats.live_blocks,
                count.stats.live_bytes,
                count.pid,
                names.join(" <- ")
            )?;
        }
        Ok(())
    }
}
