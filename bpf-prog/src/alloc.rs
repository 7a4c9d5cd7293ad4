//! Heap profiling's side of the [`Tracer`]: readers of what the programs of
//! `src/bpf/alloc.bpf.h` counted, and the move of what processes that exited counted out
//! of the maps ([`Tracer::retire_heap`], into `retired_heap`'s store). What they count
//! and how they are set is `heap.rs`'s.

use std::collections::{HashMap, HashSet};
use std::sync::MutexGuard;

use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::{Error, Result};
use crate::heap::{AllocCounter, AllocKey, AllocProcess, AllocStats, Estimated};
use crate::layout::alloc::{
    self as raw, CtAllocKey, CtAllocProc, CtAllocProcKey, CtAllocStats, CtLiveKey,
};
use crate::layout::{from_bytes, Pod};
use crate::records::StackRef;
use crate::retired_heap::RetiredHeap;
use crate::tracer::Tracer;

impl Tracer {
    /// Every stack's heap statistics, in no particular order: the running processes'
    /// from the kernel, and those of the processes retired ([`Tracer::retire_heap`]). A
    /// stack's live bytes at the peak are resolved against its process's totals.
    pub fn alloc_stats(&self) -> Result<Vec<(AllocKey, AllocStats)>> {
        let retired = self.lock_retired_heap();
        let mut all = retired.clone();
        for (process, stacks) in self.running_heap()? {
            all.add(process.pid, process, stacks);
        }
        Ok(all.into_stats())
    }

    /// Every process's heap totals: the running processes' and those retired (see
    /// [`AllocProcess::peak_bytes`] for processes retired under one pid).
    pub fn alloc_processes(&self) -> Result<Vec<AllocProcess>> {
        let retired = self.lock_retired_heap();
        let running =
            entries::<CtAllocProcKey, CtAllocProc>(&self.skel().maps.alloc_procs, "alloc_procs")?;
        Ok(retired.processes_with(running.iter().map(process_from_raw)))
    }

    /// Moves the heap statistics of the processes in `retired`, which exited, out of the
    /// kernel's maps into this tracer's own store, each under the pid `retired` gives
    /// (as [`Tracer::retire_processes`] does their counters: call both), and deletes
    /// their live blocks: the maps then hold what the running processes need, and
    /// [`Tracer::alloc_stats`] and [`Tracer::alloc_processes`] give the same figures. A
    /// block a process left live when it exited stays counted as allocated and not freed
    /// under its stack (leaked: nothing can free it any more). Returns how many kernel
    /// entries went.
    ///
    /// One pass over the maps: call it for many processes at once. A process must be
    /// gone, as for [`Tracer::retire_processes`] (a pid reused that soon would lose its
    /// blocks). A failure leaves what was not moved in the kernel, counted all the same
    /// (its stacks' bytes at the peak may then be misread), for the next pass. The live
    /// filter of frees keeps counting the blocks deleted (harmless: see `alloc.bpf.h`).
    pub fn retire_heap(&self, retired: &HashMap<u32, u32>) -> Result<usize> {
        if retired.is_empty() {
            return Ok(0);
        }
        let maps = &self.skel().maps;
        let mut store = self.lock_retired_heap();
        let mut procs: Vec<(CtAllocProcKey, CtAllocProc)> = Vec::new();
        let mut stats: Vec<(CtAllocKey, CtAllocStats)> = Vec::new();
        // The totals first, which resolve the stacks' bytes at the peak; nothing
        // changes either now.
        let taken = take_entries(
            &maps.alloc_procs,
            "alloc_procs",
            |key: &CtAllocProcKey| retired.contains_key(&key.pid),
            &mut procs,
        )
        .and_then(|()| {
            take_entries(
                &maps.alloc_stats,
                "alloc_stats",
                |key: &CtAllocKey| retired.contains_key(&key.pid),
                &mut stats,
            )
        });
        let moved = procs.len() + stats.len();
        let with_live_blocks: HashSet<u32> = stats
            .iter()
            .filter(|(_, raw)| raw.allocs.saturating_sub(raw.untracked) > raw.frees)
            .map(|(key, _)| key.pid)
            .collect();
        for (process, stacks) in gather(procs, stats) {
            store.add(retired[&process.pid], process, stacks);
        }
        drop(store);
        taken?;
        let deleted = delete_live_blocks(&maps.alloc_live, &with_live_blocks)?;
        Ok(moved + deleted)
    }

    fn lock_retired_heap(&self) -> MutexGuard<'_, RetiredHeap> {
        self.retired_heap
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The heap statistics of the processes in the kernel's maps, by process.
    fn running_heap(&self) -> Result<Vec<ProcessHeap>> {
        let maps = &self.skel().maps;
        let procs = entries::<CtAllocProcKey, CtAllocProc>(&maps.alloc_procs, "alloc_procs")?;
        let stats = entries::<CtAllocKey, CtAllocStats>(&maps.alloc_stats, "alloc_stats")?;
        Ok(gather(procs, stats))
    }

    /// The heap counters summed over CPUs, indexed by [`AllocCounter`].
    pub fn alloc_counters(&self) -> Result<[u64; AllocCounter::COUNT]> {
        let mut totals = [0u64; AllocCounter::COUNT];
        crate::tracer::sum_per_cpu(
            &self.skel().maps.alloc_counters,
            "alloc_counters",
            &mut totals,
        )?;
        Ok(totals)
    }

    /// Under [`AllocOptions::sample_every`], the allocating calls whose entry kept state
    /// for a return not seen yet, all threads together (0 otherwise). While it is 0 the
    /// return program of a call left out ends without a helper call; a call whose return
    /// never came (its thread killed in it) stays counted.
    pub fn alloc_calls_kept(&self) -> u64 {
        self.skel()
            .maps
            .bss_data
            .as_deref()
            .map_or(0, |bss| bss.alloc_calls_kept)
    }
}

fn fixed_point(value: u64) -> f64 {
    value as f64 / f64::from(1u32 << raw::WEIGHT_SHIFT)
}

/// A process's totals and its stacks' statistics.
type ProcessHeap = (AllocProcess, Vec<(StackRef, AllocStats)>);

/// The kernel's totals and stacks' statistics, by process (a process with statistics
/// but no totals, which their map had no room for, with zero totals). A stack's live
/// bytes at the peak are resolved against its process's totals.
fn gather(
    procs: Vec<(CtAllocProcKey, CtAllocProc)>,
    stats: Vec<(CtAllocKey, CtAllocStats)>,
) -> Vec<ProcessHeap> {
    let mut by_process: HashMap<(u32, u32), (AllocProcess, Option<CtAllocProc>, Vec<_>)> = procs
        .iter()
        .map(|entry| {
            let (key, raw) = entry;
            let process = process_from_raw(entry);
            ((key.pid, key.probe_id), (process, Some(*raw), Vec::new()))
        })
        .collect();
    for (key, raw) in stats {
        let (_, proc, stacks) = by_process
            .entry((key.pid, key.probe_id))
            .or_insert_with(|| {
                let process = AllocProcess {
                    probe_id: key.probe_id,
                    pid: key.pid,
                    ..AllocProcess::default()
                };
                (process, None, Vec::new())
            });
        // Unchanged since the process's last peak: its live bytes now are those.
        let peak_bytes = match proc {
            Some(proc) if proc.peak_seq >= raw.changed_seq => raw.live_bytes,
            _ => raw.peak_live_bytes,
        };
        stacks.push((
            StackRef::from_raw(key.stack),
            stats_from_raw(&raw, peak_bytes),
        ));
    }
    by_process
        .into_values()
        .map(|(process, _, stacks)| (process, stacks))
        .collect()
}

fn process_from_raw((key, raw): &(CtAllocProcKey, CtAllocProc)) -> AllocProcess {
    AllocProcess {
        probe_id: key.probe_id,
        pid: key.pid,
        allocs: raw.allocs,
        bytes: raw.bytes,
        frees: raw.frees,
        freed_bytes: raw.freed_bytes,
        live_bytes: raw.live_bytes,
        peak_bytes: raw.peak_bytes,
        unknown_frees: raw.unknown_frees,
    }
}

fn stats_from_raw(raw: &CtAllocStats, peak_bytes: i64) -> AllocStats {
    AllocStats {
        allocs: raw.allocs,
        bytes: raw.bytes,
        frees: raw.frees,
        freed_bytes: raw.freed_bytes,
        temporaries: raw.temporaries,
        untracked: raw.untracked,
        untracked_bytes: raw.untracked_bytes,
        live_bytes: raw.live_bytes,
        live_birth_us: raw.live_birth_us,
        peak_bytes,
        size_hist: raw.size_hist,
        life_hist: raw.life_hist,
        estimated: Estimated {
            allocs: fixed_point(raw.est_allocs),
            bytes: raw.est_bytes,
            frees: fixed_point(raw.est_frees),
            freed_bytes: raw.est_freed_bytes,
        },
    }
}

/// Every (key, value) of a hash map; entries deleted while reading are skipped.
fn entries<K: Pod, V: Pod>(map: &MapMut<'_>, name: &'static str) -> Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    let mut value = vec![0u8; size_of::<V>()];
    for key in map.keys() {
        let found = map
            .lookup_into(&key, &mut value, MapFlags::ANY)
            .map_err(|source| Error::Map {
                map: name,
                op: "lookup",
                source,
            })?;
        if !found {
            continue;
        }
        if let (Some(key), Some(value)) = (from_bytes::<K>(&key), from_bytes::<V>(&value)) {
            out.push((key, value));
        }
    }
    Ok(out)
}

/// Entries read or deleted in one system call: a few hundred KiB of buffers for the
/// largest value (a stack's statistics).
const BATCH: u32 = 512;

/// The keys of a hash map that `wanted` picks, read in batches.
fn matching_keys<K: Pod>(
    map: &MapMut<'_>,
    name: &'static str,
    wanted: impl Fn(&K) -> bool,
) -> Result<Vec<Vec<u8>>> {
    Ok(map
        .lookup_batch(BATCH, MapFlags::ANY, MapFlags::ANY)
        .map_err(|source| Error::Map {
            map: name,
            op: "lookup batch",
            source,
        })?
        .map(|(key, _)| key)
        .filter(|key| from_bytes::<K>(key).is_some_and(|key| wanted(&key)))
        .collect())
}

/// Moves the entries of a hash map that `wanted` picks out of it, into `out`.
fn take_entries<K: Pod, V: Pod>(
    map: &MapMut<'_>,
    name: &'static str,
    wanted: impl Fn(&K) -> bool,
    out: &mut Vec<(K, V)>,
) -> Result<()> {
    let mut value = vec![0u8; map.value_size() as usize];
    for key in matching_keys(map, name, wanted)? {
        let found = map
            .lookup_into_and_delete(&key, &mut value)
            .map_err(|source| Error::Map {
                map: name,
                op: "lookup and delete",
                source,
            })?;
        if let (true, Some(key), Some(value)) = (found, from_bytes::<K>(&key), from_bytes(&value)) {
            out.push((key, value));
        }
    }
    Ok(())
}

/// Deletes the live blocks of processes `pids`; returns how many.
fn delete_live_blocks(map: &MapMut<'_>, pids: &HashSet<u32>) -> Result<usize> {
    if pids.is_empty() {
        return Ok(0);
    }
    let keys = matching_keys(map, "alloc_live", |key: &CtLiveKey| pids.contains(&key.pid))?;
    for batch in keys.chunks(BATCH as usize) {
        if map
            .delete_batch(
                &batch.concat(),
                batch.len() as u32,
                MapFlags::ANY,
                MapFlags::ANY,
            )
            .is_ok()
        {
            continue;
        }
        // The batch stops at a key gone meanwhile (a free in a process that took the
        // pid since): the others one by one.
        for key in batch {
            match map.delete(key) {
                Err(error) if error.kind() != libbpf_rs::ErrorKind::NotFound => {
                    return Err(Error::Map {
                        map: "alloc_live",
                        op: "delete",
                        source: error,
                    })
                }
                _ => {}
            }
        }
    }
    Ok(keys.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::{alloc_cookie, AllocKind, ALLOC_BUCKETS};

    #[test]
    fn cookies_carry_probe_and_kind() {
        assert_eq!(alloc_cookie(3, AllocKind::SizeArg0), 3);
        assert_eq!(alloc_cookie(3, AllocKind::Free), 3 | 6 << 32);
        assert_eq!(
            alloc_cookie(u32::MAX, AllocKind::PosixMemalign) >> 32,
            u64::from(raw::kind::POSIX_MEMALIGN)
        );
    }

    #[test]
    fn moved_arguments_are_read_where_they_are() {
        let in_place = [0, 1, 2, 3, 4, 5].map(Some);
        for kind in [AllocKind::SizeArg0, AllocKind::Realloc, AllocKind::Free] {
            assert_eq!(kind.reading_moved(&in_place), Some(kind));
        }
        // mi_malloc_aligned(size, alignment) past `mov %rsi,%rdx; mov %rdi,%rsi`, rdi
        // then loaded with the heap
        let shifted = [None, Some(0), Some(1), Some(3), Some(4), Some(5)];
        assert_eq!(
            AllocKind::SizeArg0.reading_moved(&shifted),
            Some(AllocKind::SizeArg1)
        );
        // and back: aligned_alloc(alignment, size) with the size copied to rdi
        let size_in_rdi = [Some(1), None, Some(2), None, None, None];
        assert_eq!(
            AllocKind::SizeArg1.reading_moved(&size_in_rdi),
            Some(AllocKind::SizeArg0)
        );
        // mi_free past `mov %rdi,%rsi`, rdi then loaded with the page: read from rsi
        assert_eq!(
            AllocKind::Free.reading_moved(&shifted),
            Some(AllocKind::FreeArg1)
        );
        // no munmap reads its address from rsi, no realloc its block
        assert_eq!(AllocKind::Munmap.reading_moved(&shifted), None);
        assert_eq!(AllocKind::Realloc.reading_moved(&shifted), None);
        // calloc's count lost
        let lost = [None, Some(1), Some(2), Some(3), Some(4), Some(5)];
        assert_eq!(AllocKind::Calloc.reading_moved(&lost), None);
        // what a kind does not read may change
        assert_eq!(
            AllocKind::Realloc.reading_moved(&[Some(0), Some(1), None, None, None, None]),
            Some(AllocKind::Realloc)
        );
    }

    #[test]
    fn mean_age_of_live_blocks() {
        let stats = AllocStats {
            allocs: 5,
            bytes: 50,
            frees: 2,
            freed_bytes: 20,
            temporaries: 0,
            untracked: 1,
            untracked_bytes: 10,
            live_bytes: 20,
            live_birth_us: 100 + 300,
            peak_bytes: 0,
            size_hist: [0; ALLOC_BUCKETS],
            life_hist: [0; ALLOC_BUCKETS],
            estimated: Estimated::default(),
        };
        assert_eq!(stats.live_blocks(), 2);
        assert_eq!(stats.mean_live_age_us(1000), Some((2000 - 400) / 2));
    }
}
