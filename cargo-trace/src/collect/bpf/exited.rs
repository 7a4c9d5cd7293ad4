//! Processes that exited while traced. Their counters and heap statistics leave the
//! kernel's maps (which then hold only what the running processes count; their live
//! blocks are deleted, counted as leaked) for the tracer's own store, and past a
//! number of them they are counted together under [`MERGED_PID`] rather than each under
//! its own pid: a program that keeps starting short children (a shell loop, a build)
//! makes a profile whose size, and cargo-trace's memory, follow its distinct stacks,
//! not the number of processes it started.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bpf_prog::Tracer;
use profile::MERGED_PID;

/// A pass over the kernel's counters costs a read of the whole map: at most one in
/// this long, and at most one in ten times the last pass's own time.
const PASS_INTERVAL: Duration = Duration::from_secs(1);

pub struct ExitedProcesses {
    /// The target: its counters always stay under its own pid.
    target: u32,
    /// Exited processes whose counters stay under their own pid, besides the target.
    keep_apart: usize,
    apart: usize,
    /// Exited processes counted under [`MERGED_PID`].
    merged: u64,
    /// Exited processes whose counters are still in the kernel, with the pid to move
    /// them under.
    pending: HashMap<u32, u32>,
    last_pass: Option<Instant>,
    pass_cost: Duration,
}

impl ExitedProcesses {
    pub fn new(keep_apart: usize, target: u32) -> ExitedProcesses {
        ExitedProcesses {
            target,
            keep_apart,
            apart: 0,
            merged: 0,
            pending: HashMap::new(),
            last_pass: None,
            pass_cost: Duration::ZERO,
        }
    }

    /// Notes that `pid` exited; true if its counters stay under its own pid (then the
    /// mappings that name its frames are worth keeping).
    pub fn exited(&mut self, pid: u32) -> bool {
        let apart = if pid == self.target {
            true
        } else if self.apart < self.keep_apart {
            self.apart += 1;
            true
        } else {
            self.merged += 1;
            false
        };
        self.pending
            .insert(pid, if apart { pid } else { MERGED_PID });
        apart
    }

    /// Moves the counters of the processes that exited since the last pass out of the
    /// kernel, if a pass is due (or `now`). A failure leaves them where they are, counted
    /// all the same, for the next pass.
    pub fn retire(&mut self, tracer: &Tracer, now: bool) {
        if self.pending.is_empty() {
            return;
        }
        let due = self
            .last_pass
            .is_none_or(|last| last.elapsed() >= PASS_INTERVAL.max(self.pass_cost * 10));
        if !(now || due) {
            return;
        }
        let started = Instant::now();
        // Each on its own: one failing does not keep the other's maps full.
        let counts = tracer.retire_processes(&self.pending);
        let heap = tracer.retire_heap(&self.pending);
        if counts.is_ok() && heap.is_ok() {
            self.pending.clear();
        }
        self.last_pass = Some(Instant::now());
        self.pass_cost = started.elapsed();
    }

    /// Exited processes counted together under [`MERGED_PID`].
    pub fn merged(&self) -> u64 {
        self.merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_past_the_first_ones_are_merged() {
        let mut exited = ExitedProcesses::new(2, 1);
        assert!(exited.exited(10));
        assert!(exited.exited(11));
        assert!(!exited.exited(12));
        assert!(exited.exited(1), "the target stays apart");
        assert!(!exited.exited(13));
        assert_eq!(exited.merged(), 2);
        assert_eq!(exited.pending[&11], 11);
        assert_eq!(exited.pending[&12], MERGED_PID);
    }
}
