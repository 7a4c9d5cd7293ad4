//! The heap statistics of processes that exited, kept in userspace: what
//! [`Tracer::retire_heap`](crate::Tracer::retire_heap) moved out of the kernel's maps, so
//! that those hold the running processes only. Each process is added under the pid it is
//! retired under: its own, or one that stands for many ([`Tracer::retire_processes`]'s
//! convention), where the statistics of one stack add up. No I/O: the readers of the
//! `alloc` module add the running processes to a copy of it.
//!
//! The peak of processes counted under one pid is the highest of their own peaks, and
//! each stack's bytes at the peak are those of the process that reached it: a moment of
//! one process, whose stacks' bytes add up to it. The bytes live at once in processes
//! that ran at different times would be no moment of anything, and the profile's peak
//! (the highest of its processes') is the same whether processes stay apart or not.
//!
//! [`Tracer::retire_processes`]: crate::Tracer::retire_processes

use std::collections::HashMap;

use crate::heap::{AllocKey, AllocProcess, AllocStats};
use crate::records::StackRef;

/// A process (pid, probe id), as the kernel keys its totals.
type ProcessKey = (u32, u32);

#[derive(Clone, Debug, Default)]
pub(crate) struct RetiredHeap {
    processes: HashMap<ProcessKey, AllocProcess>,
    stacks: HashMap<ProcessKey, HashMap<StackRef, AllocStats>>,
}

impl RetiredHeap {
    /// Adds the totals of `process` and the statistics of its stacks (their bytes at the
    /// peak resolved against its peak) under `pid`.
    pub(crate) fn add(
        &mut self,
        pid: u32,
        process: AllocProcess,
        stacks: impl IntoIterator<Item = (StackRef, AllocStats)>,
    ) {
        let key = (pid, process.probe_id);
        let mut peak_is_its = true;
        self.processes
            .entry(key)
            .and_modify(|total| peak_is_its = add_totals(total, &process))
            .or_insert(AllocProcess { pid, ..process });
        let counted = self.stacks.entry(key).or_default();
        if peak_is_its {
            // A new peak: the stacks' bytes at the old one are no part of it.
            for stats in counted.values_mut() {
                stats.peak_bytes = 0;
            }
        }
        for (stack, stats) in stacks {
            let peak_bytes = if peak_is_its { stats.peak_bytes } else { 0 };
            counted
                .entry(stack)
                .and_modify(|total| {
                    add_stats(total, &stats);
                    if peak_is_its {
                        total.peak_bytes = peak_bytes;
                    }
                })
                .or_insert(AllocStats {
                    peak_bytes,
                    ..stats
                });
        }
    }

    /// The totals of every process kept and of `running` (their sums where a pid is in
    /// both: one that exited and was kept apart, taken again by a running one).
    pub(crate) fn processes_with(
        &self,
        running: impl IntoIterator<Item = AllocProcess>,
    ) -> Vec<AllocProcess> {
        let mut processes = self.processes.clone();
        for process in running {
            processes
                .entry((process.pid, process.probe_id))
                .and_modify(|total| {
                    add_totals(total, &process);
                })
                .or_insert(process);
        }
        processes.into_values().collect()
    }

    /// Every stack's statistics, in no particular order.
    pub(crate) fn into_stats(self) -> Vec<(AllocKey, AllocStats)> {
        self.stacks
            .into_iter()
            .flat_map(|((pid, probe_id), stacks)| {
                stacks.into_iter().map(move |(stack, stats)| {
                    let key = AllocKey {
                        probe_id,
                        pid,
                        stack,
                    };
                    (key, stats)
                })
            })
            .collect()
    }
}

/// Adds the totals of `process` to `total`, the peak the higher of the two; true if it
/// is `process`'s (a tie keeps the first).
fn add_totals(total: &mut AllocProcess, process: &AllocProcess) -> bool {
    total.allocs += process.allocs;
    total.bytes += process.bytes;
    total.frees += process.frees;
    total.freed_bytes += process.freed_bytes;
    // What a process that exited had live, it leaked.
    total.live_bytes += process.live_bytes;
    total.unknown_frees += process.unknown_frees;
    let higher = process.peak_bytes > total.peak_bytes;
    if higher {
        total.peak_bytes = process.peak_bytes;
    }
    higher
}

/// Adds `stats` to `total`, but for the bytes at the peak (see the module's docs).
fn add_stats(total: &mut AllocStats, stats: &AllocStats) {
    total.allocs += stats.allocs;
    total.bytes += stats.bytes;
    total.frees += stats.frees;
    total.freed_bytes += stats.freed_bytes;
    total.temporaries += stats.temporaries;
    total.untracked += stats.untracked;
    total.untracked_bytes += stats.untracked_bytes;
    total.live_bytes += stats.live_bytes;
    total.live_birth_us += stats.live_birth_us;
    for (total, n) in total.size_hist.iter_mut().zip(&stats.size_hist) {
        *total += n;
    }
    for (total, n) in total.life_hist.iter_mut().zip(&stats.life_hist) {
        *total += n;
    }
    total.estimated.allocs += stats.estimated.allocs;
    total.estimated.bytes += stats.estimated.bytes;
    total.estimated.frees += stats.estimated.frees;
    total.estimated.freed_bytes += stats.estimated.freed_bytes;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::{Estimated, ALLOC_BUCKETS};

    fn process(pid: u32, allocs: u64, live_bytes: i64, peak_bytes: i64) -> AllocProcess {
        AllocProcess {
            probe_id: 1,
            pid,
            allocs,
            bytes: allocs * 10,
            frees: 1,
            freed_bytes: 10,
            live_bytes,
            peak_bytes,
            unknown_frees: 2,
        }
    }

    fn stats(allocs: u64, live_bytes: i64, peak_bytes: i64) -> AllocStats {
        let mut size_hist = [0; ALLOC_BUCKETS];
        size_hist[4] = allocs;
        AllocStats {
            allocs,
            bytes: allocs * 10,
            frees: 0,
            freed_bytes: 0,
            temporaries: 1,
            untracked: 0,
            untracked_bytes: 0,
            live_bytes,
            live_birth_us: 100,
            peak_bytes,
            size_hist,
            life_hist: [0; ALLOC_BUCKETS],
            estimated: Estimated::default(),
        }
    }

    fn stats_of(heap: &RetiredHeap, pid: u32) -> HashMap<StackRef, AllocStats> {
        heap.clone()
            .into_stats()
            .into_iter()
            .filter(|(key, _)| key.pid == pid)
            .map(|(key, stats)| (key.stack, stats))
            .collect()
    }

    const A: StackRef = StackRef::Hash(0xa);
    const B: StackRef = StackRef::Hash(0xb);

    /// One process kept under its own pid comes back as it went.
    #[test]
    fn a_process_apart_is_kept_as_it_was() {
        let mut heap = RetiredHeap::default();
        heap.add(
            7,
            process(7, 3, 20, 30),
            [(A, stats(2, 10, 20)), (B, stats(1, 10, 10))],
        );
        assert_eq!(heap.processes_with([]), [process(7, 3, 20, 30)]);
        let stacks = stats_of(&heap, 7);
        assert_eq!(stacks[&A], stats(2, 10, 20));
        assert_eq!(stacks[&B], stats(1, 10, 10));
    }

    /// Processes merged under one pid: their counts add up, their peak is the highest
    /// single one, and the stacks' bytes at the peak are that process's, whichever order
    /// they came in.
    #[test]
    fn merged_processes_keep_the_highest_peak_and_its_stacks() {
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
            let added = [
                (
                    process(10, 3, 20, 30),
                    vec![(A, stats(2, 10, 20)), (B, stats(1, 10, 10))],
                ),
                (process(11, 1, 5, 50), vec![(B, stats(1, 5, 50))]),
                (process(12, 1, 5, 40), vec![(A, stats(1, 5, 40))]),
            ];
            let mut heap = RetiredHeap::default();
            for index in order {
                let (process, stacks) = added[index].clone();
                heap.add(0, process, stacks);
            }
            let [total] = heap.processes_with([])[..] else {
                panic!("one process under pid 0");
            };
            assert_eq!(
                (
                    total.pid,
                    total.allocs,
                    total.bytes,
                    total.frees,
                    total.live_bytes
                ),
                (0, 5, 50, 3, 30),
                "{order:?}"
            );
            assert_eq!(
                (total.peak_bytes, total.unknown_frees),
                (50, 6),
                "{order:?}"
            );
            let stacks = stats_of(&heap, 0);
            assert_eq!(stacks[&A].allocs, 3);
            assert_eq!(stacks[&A].live_bytes, 15);
            assert_eq!(stacks[&A].temporaries, 2);
            assert_eq!(stacks[&A].live_birth_us, 200);
            assert_eq!(stacks[&A].size_hist[4], 3);
            assert_eq!(stacks[&B].allocs, 2);
            assert_eq!(
                (stacks[&A].peak_bytes, stacks[&B].peak_bytes),
                (0, 50),
                "{order:?}: the stacks at pid 11's peak"
            );
        }
    }

    /// A pid that exited and was kept apart, then taken by a running process: one entry
    /// with the totals of both.
    #[test]
    fn a_running_process_adds_to_an_exited_one_of_its_pid() {
        let mut heap = RetiredHeap::default();
        heap.add(7, process(7, 3, 20, 30), []);
        heap.add(8, process(8, 1, 0, 10), []);
        let mut all = heap.processes_with([process(7, 2, 5, 40), process(9, 1, 1, 1)]);
        all.sort_by_key(|p| p.pid);
        let summary: Vec<(u32, u64, i64, i64)> = all
            .iter()
            .map(|p| (p.pid, p.allocs, p.live_bytes, p.peak_bytes))
            .collect();
        assert_eq!(summary, [(7, 5, 25, 40), (8, 1, 0, 10), (9, 1, 1, 1)]);
    }
}
