//! The event stream of a heaptrack file, synthesized from per-stack totals (see the
//! parent module for what replays exactly): numbers only, no profile, no file format.
//! [`plan`] gives it as [`Step`]s, runs of events a few per stack however many events
//! they stand for; [`Step::events`] expands them as the file is written.

/// One stack's heap figures, as the profile has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackFigures {
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    pub leaked_blocks: u64,
    pub leaked_bytes: u64,
    pub temporaries: u64,
    /// Its live bytes when its process's live bytes peaked.
    pub peak_bytes: u64,
}

/// One event of the synthesized stream. A block is named by its stack, its size and a
/// variant: blocks with the same three share an allocation info, and a free right after
/// an allocation of the same info is what heaptrack counts as a temporary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    Alloc(BlockKey),
    Free(BlockKey),
    /// The rise to the peak starts: its timestamp goes here.
    PeakTime,
}

/// The stream in runs of events: a few steps per stack, however many events they stand
/// for, expanded only as the file is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `count` allocations of blocks of one info.
    Alloc(BlockKey, u64),
    /// `count` frees of such blocks.
    Free(BlockKey, u64),
    /// `count` times a block allocated and freed at once: a temporary.
    Pairs(BlockKey, u64),
    /// `batches` times: `per_batch` blocks allocated, the last under variant 1, then
    /// freed from the first.
    Batches {
        key: BlockKey,
        per_batch: u64,
        batches: u64,
    },
    PeakTime,
}

impl Step {
    fn is_empty(&self) -> bool {
        match *self {
            Step::Alloc(_, count) | Step::Free(_, count) | Step::Pairs(_, count) => count == 0,
            Step::Batches { batches, .. } => batches == 0,
            Step::PeakTime => false,
        }
    }

    /// The allocation infos it uses.
    pub fn keys(&self) -> Vec<BlockKey> {
        match *self {
            Step::Alloc(key, _) | Step::Free(key, _) | Step::Pairs(key, _) => vec![key],
            Step::Batches { key, .. } => vec![key, BlockKey { variant: 1, ..key }],
            Step::PeakTime => vec![],
        }
    }

    pub fn events(self) -> Box<dyn Iterator<Item = Event>> {
        use std::iter::{once, repeat_n};
        let n = |count: u64| usize::try_from(count).unwrap_or(usize::MAX);
        match self {
            Step::Alloc(key, count) => Box::new(repeat_n(Event::Alloc(key), n(count))),
            Step::Free(key, count) => Box::new(repeat_n(Event::Free(key), n(count))),
            Step::Pairs(key, count) => {
                Box::new((0..count).flat_map(move |_| [Event::Alloc(key), Event::Free(key)]))
            }
            Step::Batches {
                key,
                per_batch,
                batches,
            } => {
                let last = BlockKey { variant: 1, ..key };
                Box::new((0..batches).flat_map(move |_| {
                    repeat_n(Event::Alloc(key), n(per_batch - 1))
                        .chain(once(Event::Alloc(last)))
                        .chain(repeat_n(Event::Free(key), n(per_batch - 1)))
                        .chain(once(Event::Free(last)))
                }))
            }
            Step::PeakTime => Box::new(once(Event::PeakTime)),
        }
    }
}

/// The variant of leaked blocks: never freed, they must not share an info with a freed
/// block that could be freed right after one of them is allocated.
const LEAKED: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub stack: usize,
    pub size: u64,
    pub variant: u8,
}

/// How one stack's blocks are split for the stream.
#[derive(Clone, Copy, Debug, Default)]
struct Split {
    /// Leaked blocks live at the peak, and allocated after it.
    leaked_at_peak: Group,
    leaked_late: Group,
    /// Freed blocks live at the peak, freed right after it.
    freed_at_peak: Group,
    /// Freed blocks never live at the peak: the first `temporaries` of them freed right
    /// after their allocation.
    freed_other: Group,
    temporaries: u64,
    /// Temporaries live at the peak, which the stream can show as one at most.
    temporaries_at_peak: u64,
    /// Blocks counted but neither freed nor leaked (untracked): freed, not temporaries.
    untracked: Group,
}

/// Blocks and their bytes; sizes split evenly (the first `bytes % count` one byte larger).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Group {
    count: u64,
    bytes: u64,
}

impl Group {
    /// Its blocks as runs of one size: `bytes % count` blocks one byte larger first.
    fn runs(self, stack: usize, variant: u8) -> impl Iterator<Item = (BlockKey, u64)> {
        let (each, larger) = match self.count {
            0 => (0, 0),
            n => (self.bytes / n, self.bytes % n),
        };
        [(each + 1, larger), (each, self.count - larger)]
            .into_iter()
            .filter(|&(_, count)| count > 0)
            .map(move |(size, count)| {
                (
                    BlockKey {
                        stack,
                        size,
                        variant,
                    },
                    count,
                )
            })
    }
}

/// The number of a group's `count` blocks (of `bytes`) that can carry `part` of its
/// bytes, the rest carrying the rest: `None` when one block would have to carry both.
fn blocks_for(count: u64, bytes: u64, part: u64) -> Option<u64> {
    if part == 0 {
        Some(0)
    } else if part == bytes {
        Some(count)
    } else if count >= 2 && part < bytes {
        let share = (count as u128 * part as u128 + bytes as u128 / 2) / bytes as u128;
        Some((share as u64).clamp(1, count - 1))
    } else {
        None
    }
}

/// Splits a stack's blocks into the groups of the stream, `peak` of its bytes live at
/// the peak; `None` when its blocks cannot carry exactly that.
fn split(stack: &Normalized, peak: u64) -> Option<Split> {
    let leaked = Group {
        count: stack.leaked,
        bytes: stack.leaked_bytes,
    };
    let freed = Group {
        count: stack.freed,
        bytes: stack.freed_bytes,
    };
    // Prefer leaked blocks at the peak (long-lived), else as few of them as possible.
    let mut candidates = vec![leaked.bytes.min(peak), peak.saturating_sub(freed.bytes)];
    candidates.dedup();
    candidates.into_iter().find_map(|from_leaked| {
        let from_freed = peak.checked_sub(from_leaked)?;
        if from_freed > freed.bytes || from_leaked > leaked.bytes {
            return None;
        }
        let leaked_count = blocks_for(leaked.count, leaked.bytes, from_leaked)?;
        let mut freed_count = blocks_for(freed.count, freed.bytes, from_freed)?;
        // Leave room outside the peak for the temporaries when the bytes allow it.
        let room = freed.count.saturating_sub(stack.temporaries).max(1);
        if freed_count > room && from_freed < freed.bytes {
            freed_count = room;
        }
        let other = freed.count - freed_count;
        let temporaries = stack.temporaries.min(other);
        Some(Split {
            leaked_at_peak: Group {
                count: leaked_count,
                bytes: from_leaked,
            },
            leaked_late: Group {
                count: leaked.count - leaked_count,
                bytes: leaked.bytes - from_leaked,
            },
            freed_at_peak: Group {
                count: freed_count,
                bytes: from_freed,
            },
            freed_other: Group {
                count: other,
                bytes: freed.bytes - from_freed,
            },
            temporaries,
            temporaries_at_peak: stack.temporaries - temporaries,
            untracked: stack.untracked,
        })
    })
}

/// A stack's figures made consistent: every block allocated is leaked, freed or
/// untracked, and bytes go with blocks.
#[derive(Clone, Copy, Debug)]
struct Normalized {
    leaked: u64,
    leaked_bytes: u64,
    freed: u64,
    freed_bytes: u64,
    temporaries: u64,
    untracked: Group,
    peak: u64,
}

fn normalize(stack: &StackFigures) -> Normalized {
    let leaked = stack.leaked_blocks.min(stack.allocs);
    let leaked_bytes = if leaked > 0 {
        stack.leaked_bytes.min(stack.bytes)
    } else {
        0
    };
    let freed = stack.frees.min(stack.allocs - leaked);
    let mut freed_bytes = if freed > 0 {
        stack.freed_bytes.min(stack.bytes - leaked_bytes)
    } else {
        0
    };
    let mut untracked = Group {
        count: stack.allocs - leaked - freed,
        bytes: stack.bytes - leaked_bytes - freed_bytes,
    };
    if untracked.count == 0 && untracked.bytes > 0 && freed > 0 {
        // Bytes without blocks (estimates): carried by the freed blocks.
        freed_bytes += untracked.bytes;
        untracked.bytes = 0;
    }
    Normalized {
        leaked,
        leaked_bytes,
        freed,
        freed_bytes,
        temporaries: stack.temporaries.min(freed),
        untracked,
        peak: stack.peak_bytes.min(leaked_bytes + freed_bytes),
    }
}

/// The event stream that replays, in heaptrack's accounting, into `stacks`' figures and
/// a peak of `peak` live bytes (the parent module's documentation says what is exact).
pub fn plan(stacks: &[StackFigures], peak: u64) -> Vec<Step> {
    let mut normalized: Vec<Normalized> = stacks.iter().map(normalize).collect();
    // The stacks' shares of the peak add up to the process's peak (they may not, by a
    // race between threads): the difference goes to the stacks with room.
    let total: u64 = normalized.iter().map(|s| s.peak).sum();
    if total < peak {
        let mut missing = peak - total;
        for stack in &mut normalized {
            let add = (stack.leaked_bytes + stack.freed_bytes - stack.peak).min(missing);
            stack.peak += add;
            missing -= add;
        }
    } else {
        let mut excess = total - peak;
        for stack in &mut normalized {
            let take = stack.peak.min(excess);
            stack.peak -= take;
            excess -= take;
        }
    }
    let splits: Vec<Split> = normalized
        .iter()
        .map(|stack| {
            split(stack, stack.peak).unwrap_or_else(|| {
                // No split carries exactly its share: whole groups, nearest below it.
                let leaked = Group {
                    count: stack.leaked,
                    bytes: stack.leaked_bytes,
                };
                let freed = Group {
                    count: stack.freed,
                    bytes: stack.freed_bytes,
                };
                let options = [0, leaked.bytes, freed.bytes, leaked.bytes + freed.bytes];
                let best = options
                    .into_iter()
                    .filter(|&bytes| bytes <= stack.peak)
                    .max()
                    .unwrap_or(0);
                split(stack, best).unwrap_or_default()
            })
        })
        .collect();
    let peak: u64 = splits
        .iter()
        .map(|s| s.leaked_at_peak.bytes + s.freed_at_peak.bytes)
        .sum();

    // Freed blocks never live at the peak: temporaries as allocation-free pairs, the
    // others in batches, each freed from its first block, whose info differs from the
    // batch's last (variant 1). Before the peak they must stay below it; after it, with
    // the leaks live at the peak still live, they may reach it: where there is more room.
    let leaked_at_peak_bytes: u64 = splits.iter().map(|s| s.leaked_at_peak.bytes).sum();
    let after_peak = leaked_at_peak_bytes == 0;
    let cap = if after_peak {
        peak
    } else {
        peak.saturating_sub(1)
    };
    let mut pairs: Vec<(BlockKey, u64)> = Vec::new();
    let mut others: Vec<(BlockKey, u64)> = Vec::new();
    for (stack, split) in splits.iter().enumerate() {
        let mut temporaries = split.temporaries;
        for (key, count) in split.freed_other.runs(stack, 0) {
            let paired = count.min(temporaries);
            temporaries -= paired;
            pairs.push((key, paired));
            others.push((key, count - paired));
        }
        others.extend(split.untracked.runs(stack, 0));
    }
    pairs.retain(|&(_, count)| count > 0);
    others.retain(|&(_, count)| count > 0);
    let mut unpeaked = Batcher {
        cap,
        pairs,
        steps: Vec::new(),
        open: Vec::new(),
        live: 0,
    };
    for (key, count) in others {
        unpeaked.add(key, count);
    }
    let mut unpeaked = unpeaked.finish();
    let mut steps = Vec::new();
    if !after_peak {
        steps.append(&mut unpeaked);
    }

    // The rise to the peak: blocks freed after it, then leaked ones. When a stack has
    // temporaries live at the peak, one of its blocks is allocated last and freed
    // first: heaptrack counts that one as a temporary.
    let mut freed_at_peak: Vec<(BlockKey, u64)> = Vec::new();
    let mut leaked_at_peak: Vec<(BlockKey, u64)> = Vec::new();
    for (stack, split) in splits.iter().enumerate() {
        freed_at_peak.extend(split.freed_at_peak.runs(stack, 0));
        leaked_at_peak.extend(split.leaked_at_peak.runs(stack, LEAKED));
    }
    let temporary_last = splits
        .iter()
        .enumerate()
        .filter(|(_, s)| s.temporaries_at_peak > 0)
        .find_map(|(stack, _)| freed_at_peak.iter().rposition(|(k, _)| k.stack == stack));
    steps.push(Step::PeakTime);
    let mut last = None;
    if let Some(at) = temporary_last {
        freed_at_peak[at].1 -= 1;
        last = Some(freed_at_peak[at].0);
    } else if leaked_at_peak.is_empty() && freed_at_peak.iter().map(|r| r.1).sum::<u64>() > 1 {
        // The last allocated is freed last, under an info of its own.
        if let Some((key, count)) = freed_at_peak.last_mut() {
            *count -= 1;
            let mut own = *key;
            own.variant = 1;
            freed_at_peak.push((own, 1));
        }
    }
    for &(key, count) in freed_at_peak.iter().chain(&leaked_at_peak) {
        steps.push(Step::Alloc(key, count));
    }
    if let Some(key) = last {
        steps.push(Step::Pairs(key, 1));
    }
    for &(key, count) in &freed_at_peak {
        steps.push(Step::Free(key, count));
    }
    steps.append(&mut unpeaked);
    // After the peak: the leaks allocated since.
    for (stack, split) in splits.iter().enumerate() {
        steps.extend(
            split
                .leaked_late
                .runs(stack, LEAKED)
                .map(|(key, count)| Step::Alloc(key, count)),
        );
    }
    steps.retain(|step| !step.is_empty());
    steps
}

/// Forms the batches of freed blocks that are not temporaries: as many blocks as fit
/// below `cap` allocated, then freed from the first, so that each free follows a free
/// or an allocation of another info. A batch of one block takes a temporary pair inside
/// it when one fits (else it replays as a temporary).
struct Batcher {
    cap: u64,
    /// Temporaries not yet written, as runs.
    pairs: Vec<(BlockKey, u64)>,
    steps: Vec<Step>,
    /// The batch being filled, as runs, and its bytes.
    open: Vec<(BlockKey, u64)>,
    live: u64,
}

impl Batcher {
    fn add(&mut self, key: BlockKey, mut count: u64) {
        let fits = |room: u64, count: u64| match key.size {
            0 => count,
            size => (room / size).min(count),
        };
        // Fill the open batch.
        let into_open = fits(self.cap.saturating_sub(self.live), count);
        if into_open > 0 {
            self.open.push((key, into_open));
            self.live += into_open * key.size;
            count -= into_open;
        }
        if count == 0 {
            return;
        }
        self.close();
        // Whole batches of this key, then an open one with the rest.
        let per_batch = fits(self.cap, count).max(1);
        if per_batch >= 2 {
            let batches = count / per_batch;
            self.steps.push(Step::Batches {
                key,
                per_batch,
                batches,
            });
            count -= batches * per_batch;
        } else {
            for _ in 1..count {
                self.single(key);
            }
            count = 1;
        }
        if count > 0 {
            self.open.push((key, count));
            self.live = count * key.size;
        }
    }

    /// Writes the open batch.
    fn close(&mut self) {
        let open = std::mem::take(&mut self.open);
        self.live = 0;
        match open.iter().map(|r| r.1).sum::<u64>() {
            0 => {}
            1 => self.single(open[0].0),
            _ => {
                let (mut last, _) = open[open.len() - 1];
                last.variant = 1;
                let mut runs = open;
                if let Some(run) = runs.last_mut() {
                    run.1 -= 1;
                }
                runs.push((last, 1));
                self.steps
                    .extend(runs.iter().map(|&(key, count)| Step::Alloc(key, count)));
                self.steps
                    .extend(runs.iter().map(|&(key, count)| Step::Free(key, count)));
            }
        }
    }

    /// One block alone: a temporary pair inside it if one fits.
    fn single(&mut self, key: BlockKey) {
        self.steps.push(Step::Alloc(key, 1));
        let room = self.cap.saturating_sub(key.size);
        if let Some(pair) = self
            .pairs
            .iter_mut()
            .find(|(p, count)| *count > 0 && p.size <= room)
        {
            pair.1 -= 1;
            self.steps.push(Step::Pairs(pair.0, 1));
        }
        self.steps.push(Step::Free(key, 1));
    }

    fn finish(mut self) -> Vec<Step> {
        // A last batch of one block takes one from whole batches before it, if it fits.
        let open_blocks: u64 = self.open.iter().map(|r| r.1).sum();
        if open_blocks == 1 {
            if let Some(Step::Batches {
                key,
                per_batch,
                batches,
            }) = self.steps.last().cloned()
            {
                let single = self.open[0].0;
                if per_batch >= 3 && batches >= 1 && key.size + single.size <= self.cap {
                    self.steps.pop();
                    self.steps.push(Step::Batches {
                        key,
                        per_batch,
                        batches: batches - 1,
                    });
                    self.open = vec![(key, per_batch - 1)];
                    self.close();
                    self.open = vec![(key, 1), (single, 1)];
                }
            }
        }
        self.close();
        for (key, count) in std::mem::take(&mut self.pairs) {
            self.steps.push(Step::Pairs(key, count));
        }
        self.steps
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// heaptrack's accounting (AccumulatedTraceData::read) replayed over a stream.
    #[derive(Debug, Default, PartialEq, Eq)]
    struct Replayed {
        allocations: u64,
        temporaries: u64,
        peak: u64,
        leaked: u64,
        /// Per stack: allocations, bytes, frees, temporaries, leaked, live at the peak.
        stacks: HashMap<usize, [u64; 6]>,
    }

    fn replay(steps: &[Step]) -> Replayed {
        let events: Vec<Event> = steps.iter().flat_map(|s| s.events()).collect();
        let mut r = Replayed::default();
        let mut last: Option<BlockKey> = None;
        let mut live: HashMap<usize, u64> = HashMap::new();
        let mut first_peak: Option<HashMap<usize, u64>> = None;
        let mut total: u64 = 0;
        for event in &events {
            match *event {
                Event::Alloc(key) => {
                    r.allocations += 1;
                    total += key.size;
                    *live.entry(key.stack).or_default() += key.size;
                    let s = r.stacks.entry(key.stack).or_default();
                    s[0] += 1;
                    s[1] += key.size;
                    if total > r.peak {
                        r.peak = total;
                        first_peak = Some(live.clone());
                    }
                    last = Some(key);
                }
                Event::Free(key) => {
                    total -= key.size;
                    *live.get_mut(&key.stack).unwrap() -= key.size;
                    let s = r.stacks.entry(key.stack).or_default();
                    s[2] += 1;
                    if last == Some(key) {
                        r.temporaries += 1;
                        s[3] += 1;
                    }
                    last = None;
                }
                Event::PeakTime => {}
            }
        }
        r.leaked = total;
        for (stack, bytes) in live {
            r.stacks.get_mut(&stack).unwrap()[4] = bytes;
        }
        for (stack, bytes) in first_peak.unwrap_or_default() {
            r.stacks.get_mut(&stack).unwrap()[5] = bytes;
        }
        r
    }

    fn stack(
        allocs: u64,
        size: u64,
        frees: u64,
        temporaries: u64,
        at_peak_blocks: u64,
    ) -> StackFigures {
        let leaked = allocs - frees;
        StackFigures {
            allocs,
            bytes: allocs * size,
            frees,
            freed_bytes: frees * size,
            leaked_blocks: leaked,
            leaked_bytes: leaked * size,
            temporaries,
            peak_bytes: at_peak_blocks * size,
        }
    }

    /// Every figure of every stack replays exactly.
    fn check_exact(stacks: &[StackFigures], peak: u64) -> Replayed {
        let steps = plan(stacks, peak);
        let r = replay(&steps);
        assert_eq!(r.peak, peak, "{stacks:?}");
        assert_eq!(r.allocations, stacks.iter().map(|s| s.allocs).sum::<u64>());
        assert_eq!(r.leaked, stacks.iter().map(|s| s.leaked_bytes).sum::<u64>());
        for (i, s) in stacks.iter().enumerate() {
            let got = r.stacks.get(&i).copied().unwrap_or_default();
            assert_eq!(got[0], s.allocs, "stack {i} allocations");
            assert_eq!(got[1], s.bytes, "stack {i} bytes");
            assert_eq!(got[2], s.frees, "stack {i} frees");
            assert_eq!(got[4], s.leaked_bytes, "stack {i} leaked");
            assert_eq!(got[5], s.peak_bytes, "stack {i} at the peak");
        }
        r
    }

    #[test]
    fn the_c_fixture_replays_exactly() {
        // alloc_c's sites: temporaries freed at once, three peak blocks, seven leaks.
        let stacks = [
            stack(10, 1001, 10, 10, 0),
            stack(5, 1011, 5, 5, 0),
            stack(4, 40961, 4, 4, 0),
            stack(3, 20011, 3, 0, 3),
            stack(7, 1093, 0, 0, 0),
        ];
        let r = check_exact(&stacks, 3 * 20011);
        assert_eq!(r.temporaries, 19);
    }

    #[test]
    fn temporaries_are_exact_when_none_was_live_at_the_peak() {
        let stacks = [
            stack(6, 100, 6, 2, 1),
            stack(3, 50, 1, 1, 2),
            stack(2, 90, 2, 0, 0),
            stack(9, 10, 9, 9, 0),
        ];
        let peak = 100 + 2 * 50;
        let r = check_exact(&stacks, peak);
        assert_eq!(r.temporaries, 2 + 1 + 9);
        for (i, s) in stacks.iter().enumerate() {
            assert_eq!(r.stacks[&i][3], s.temporaries, "stack {i}");
        }
    }

    #[test]
    fn one_temporary_live_at_the_peak_replays_as_one() {
        // A buffer freed within the threshold that made the peak.
        let stacks = [stack(4, 1000, 4, 4, 1), stack(2, 10, 0, 0, 2)];
        let r = check_exact(&stacks, 1020);
        assert_eq!(r.temporaries, 4);
    }

    #[test]
    fn sizes_that_differ_keep_their_bytes() {
        // A realloc chain: blocks of 1021, 2041 and 4093 bytes; 4093 live at the peak.
        let chain = StackFigures {
            allocs: 3,
            bytes: 1021 + 2041 + 4093,
            frees: 3,
            freed_bytes: 1021 + 2041 + 4093,
            temporaries: 3,
            peak_bytes: 4093,
            ..StackFigures::default()
        };
        check_exact(&[chain], 4093);
    }

    #[test]
    fn a_single_block_that_must_split_takes_whole_groups() {
        // One leaked block that was not live at the peak, while another stack's was.
        let stacks = [stack(1, 300, 0, 0, 0), stack(2, 400, 2, 0, 1)];
        check_exact(&stacks, 400);
    }

    #[test]
    fn the_peak_of_racing_threads_is_kept() {
        // The stacks' shares add up to less than the process's peak.
        let stacks = [stack(4, 100, 4, 0, 1), stack(4, 100, 4, 0, 1)];
        let r = replay(&plan(&stacks, 300));
        assert_eq!(r.peak, 300);
        assert_eq!(r.allocations, 8);
    }

    #[test]
    fn untracked_blocks_move_neither_peak_nor_leaks() {
        let mut s = stack(11, 64, 4, 0, 3);
        s.leaked_blocks = 3; // four blocks untracked
        s.leaked_bytes = 192;
        let r = replay(&plan(&[s], 192));
        assert_eq!(
            (r.allocations, r.peak, r.leaked, r.temporaries),
            (11, 192, 192, 0)
        );
    }

    #[test]
    fn many_random_consistent_profiles_replay_exactly() {
        // A small generator (no dependency): stacks of one size each.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let (mut cases, mut exact) = (0, 0);
        for _ in 0..500 {
            let count = 1 + next(6) as usize;
            let mut stacks = Vec::new();
            for _ in 0..count {
                let allocs = 1 + next(20);
                let size = next(5000);
                let frees = next(allocs + 1);
                let temporaries = next(frees + 1);
                let leaked = allocs - frees;
                let non_temporary = allocs - temporaries;
                let at_peak = next(non_temporary.min(leaked + frees - temporaries) + 1);
                stacks.push(stack(allocs, size, frees, temporaries, at_peak));
            }
            let peak: u64 = stacks.iter().map(|s| s.peak_bytes).sum();
            let largest = stacks
                .iter()
                .map(|s| s.bytes.checked_div(s.allocs).unwrap_or(0))
                .max()
                .unwrap_or(0);
            let leaked: u64 = stacks.iter().map(|s| s.leaked_bytes).sum();
            if peak <= largest || peak < leaked {
                continue; // not a heap any run could have
            }
            let r = check_exact(&stacks, peak);
            let expected: u64 = stacks.iter().map(|s| s.temporaries).sum();
            // A block that must be alone between its allocation and its free (the
            // peak was one block, or no two fit below it) replays as a temporary.
            assert!(r.temporaries <= expected + 1, "{stacks:?}");
            cases += 1;
            exact += u32::from(r.temporaries == expected);
        }
        assert!(
            cases > 100 && exact * 100 >= cases * 95,
            "{exact} of {cases}"
        );
    }

    #[test]
    fn millions_of_events_are_a_few_steps() {
        let stacks = [
            stack(1_000_000, 48, 1_000_000, 900_000, 0),
            stack(300_000, 16, 299_000, 0, 1000),
        ];
        let steps = plan(&stacks, 16_000);
        assert!(steps.len() < 30, "{steps:?}");
        let events: usize = steps.iter().map(|s| s.events().count()).sum();
        assert_eq!(events, 1_300_000 + 1_299_000 + 1);
    }
}
