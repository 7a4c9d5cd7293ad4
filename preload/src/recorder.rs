//! The consumer: reads every process's region (while it runs and after it died), orders
//! the events of its threads' rings, and aggregates per (pid, stack) with the BPF heap
//! path's semantics (`bpf-prog/src/bpf/alloc.bpf.h`: the fields of `bpf_prog::AllocStats`
//! and `bpf_prog::AllocProcess`, the counters of `bpf_prog::AllocCounter` that apply).
//!
//! Order: each ring is one thread's, in order. Across rings, events go by time, and
//! where an event needs one of another thread before it (a free of a block this
//! consumer has not seen allocated; an allocation at an address still live) the rings'
//! heads are read again and every event of another ring stamped at or before it goes
//! first. That is exact: the library publishes an allocation before its pointer can
//! escape to another thread, and a free before the allocator can hand the address out
//! again, so the predecessor was published before the event that needs it, and stamped
//! no later (one clock, `CLOCK_MONOTONIC`, read before publishing). What still finds no
//! predecessor then is what the BPF path counts: an unknown free, a reused address.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::mem::offset_of;
use std::os::fd::OwnedFd;

use unwind_tables::walk::WalkEnd;
use unwind_tables::UnsupportedReason;

use crate::layout::{self, event, region, ring_state, Event, Region, Ring, RINGS, RING_EVENTS};
use crate::live::{Block, LiveTable};
use crate::sys::{self, Shared};

/// A multiply-rotate hash (rustc's FxHash) for the consumer's maps: their keys are
/// addresses and small ids, not attacker-chosen strings, and SipHash would cost the
/// consumer most of its time per event.
#[derive(Clone, Copy, Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        // the product's low bits are poor (addresses are 16-aligned: four zero bits),
        // and hashbrown picks buckets with them: bring well-mixed high bits down
        self.0.rotate_left(26)
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// Turns the library's TSC stamps into `CLOCK_MONOTONIC` ns: piecewise linear between
/// (ticks, ns) pairs this process takes, at least a millisecond apart (the last one at
/// every poll, after the rings' heads were read, so every event read lies before it).
/// The mapping is increasing, as the clock is: events keep their order.
struct Clock {
    samples: Vec<(u64, u64)>,
    /// The bracket of the last conversion: [from, to) in ticks, its start in ns and its
    /// slope (no division per event).
    bracket: (u64, u64, u64, f64),
}

/// Samples kept (the oldest go first; an event older than all is extrapolated).
const CLOCK_SAMPLES: usize = 1 << 16;
const CLOCK_SPACING_NS: u64 = 1_000_000;

impl Clock {
    fn new() -> Clock {
        let first = Clock::sample();
        let mut second = Clock::sample();
        while second.1 < first.1 + 2 * CLOCK_SPACING_NS {
            std::hint::spin_loop();
            second = Clock::sample();
        }
        Clock {
            samples: vec![first, second],
            bracket: (0, 0, 0, 0.0),
        }
    }

    /// Ticks and ns read at once (the ticks read on both sides, their middle taken).
    fn sample() -> (u64, u64) {
        let before = sys::ticks();
        let ns = sys::monotonic_ns();
        let after = sys::ticks();
        (before + (after - before) / 2, ns)
    }

    fn update(&mut self) {
        let now = Clock::sample();
        let n = self.samples.len();
        if now.0 <= self.samples[n - 1].0 {
            return;
        }
        if self.samples[n - 1].1 < self.samples[n - 2].1 + CLOCK_SPACING_NS {
            self.samples[n - 1] = now; // the tip moves until it is far enough
        } else {
            self.samples.push(now);
        }
        if self.samples.len() > CLOCK_SAMPLES {
            self.samples.drain(..CLOCK_SAMPLES / 2);
        }
        self.bracket = (0, 0, 0, 0.0);
    }

    fn ns(&mut self, ticks: u64) -> u64 {
        let (from, to, ns, slope) = self.bracket;
        if from <= ticks && ticks < to {
            return ns + ((ticks - from) as f64 * slope) as u64;
        }
        let s = &self.samples;
        let i = s.partition_point(|&(t, _)| t <= ticks);
        let (a, b, to) = if i == 0 {
            (s[0], s[1], 0) // before every sample: extrapolated, not kept
        } else if i >= s.len() {
            (s[s.len() - 2], s[s.len() - 1], 0)
        } else {
            (s[i - 1], s[i], s[i].0)
        };
        // f64 keeps ns exact to well under a nanosecond over days of uptime (53 bits)
        let slope = (b.1 - a.1) as f64 / (b.0 - a.0).max(1) as f64;
        if to != 0 {
            self.bracket = (a.0, to, a.1, slope);
        }
        let dt = ticks as f64 - a.0 as f64;
        (a.1 as f64 + dt * slope).max(0.0) as u64
    }

    /// ns per tick, over everything sampled.
    fn rate(&self) -> f64 {
        let (a, b) = (self.samples[0], self.samples[self.samples.len() - 1]);
        (b.1 - a.1) as f64 / (b.0 - a.0).max(1) as f64
    }
}

/// How far (in ns) an event's predecessor on another thread may be stamped after it: the
/// TSC read is not ordered with the loads before it, so a free's stamp can precede, by a
/// few instructions' time, that of the allocation whose pointer it got.
const STAMP_SLACK_NS: f64 = 1000.0;

/// Asks the CPU for the line at `value`, ahead of a use.
fn prefetch<T>(value: &T) {
    // SAFETY: a prefetch is a hint that never faults; the address is a live reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (value as *const T).cast(),
        )
    };
}

/// Log2 buckets of the size and lifetime histograms (`CT_ALLOC_BUCKETS`).
pub const BUCKETS: usize = 48;
/// Fixed point of the estimated counts (`CT_ALLOC_WEIGHT_SHIFT`).
const WEIGHT_SHIFT: u32 = 16;

/// What is recorded and how it is counted: `bpf_prog::AllocOptions`' settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// A block freed sooner than this after its allocation is a temporary.
    pub temporary_ns: u64,
    /// Count an allocation with a chance of 1 in this (0 or 1: every one).
    pub sample_every: u32,
    /// Count an allocation of `s` bytes with a chance of `s / sample_bytes` (0: all).
    pub sample_bytes: u64,
    /// Only allocations of at least / at most this many bytes (0: any).
    pub min_size: u64,
    pub max_size: u64,
    /// Blocks tracked at once (all processes); beyond, counted but untracked. In this
    /// process's memory (about 50 bytes a block), not the kernel's: the default is 16 Mi
    /// blocks where the BPF path's live map holds 1 Mi.
    pub max_live_blocks: usize,
    /// The library's walk memo (off: every stack walked, for the benchmark's figures).
    pub walk_memo: bool,
    /// Anonymous mappings counted in the processes' totals and peaks as heap blocks are
    /// (else their part is only in [`ProcessTotals::mapped`]).
    pub count_mapped: bool,
    /// The wrappers record nothing and pass every call through with a tail jump: a
    /// session of a named allocator (`alloc:jemalloc`), whose functions are all hooked,
    /// even those the wrappers reach.
    pub wrappers_pass: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            temporary_ns: 1_000_000,
            sample_every: 0,
            sample_bytes: 0,
            min_size: 0,
            max_size: 0,
            max_live_blocks: 1 << 24,
            walk_memo: true,
            count_mapped: true,
            wrappers_pass: false,
        }
    }
}

impl Options {
    pub fn sampling(&self) -> bool {
        self.sample_every > 1 || self.sample_bytes > 0
    }

    fn leaving_out(&self) -> bool {
        self.sampling() || self.min_size > 0 || self.max_size > 0
    }

    /// What the library is told.
    pub(crate) fn for_library(&self) -> layout::Options {
        layout::Options {
            sample_every: self.sample_every,
            flags: if self.walk_memo {
                0
            } else {
                layout::OPT_NO_MEMO
            } | if self.wrappers_pass {
                layout::OPT_WRAPPERS_PASS
            } else {
                0
            },
            sample_bytes: self.sample_bytes,
            min_size: self.min_size,
            max_size: self.max_size,
        }
    }

    fn weight_count(&self, size: u64) -> u64 {
        if self.sample_every > 1 {
            return u64::from(self.sample_every) << WEIGHT_SHIFT;
        }
        if size >= self.sample_bytes || size == 0 {
            return 1 << WEIGHT_SHIFT;
        }
        (self.sample_bytes << WEIGHT_SHIFT) / size
    }

    fn weight_bytes(&self, size: u64) -> u64 {
        if self.sample_every > 1 {
            return size * u64::from(self.sample_every);
        }
        size.max(self.sample_bytes)
    }
}

/// A frame as the walker stored it, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// In an object with an id: its ELF address there.
    InObject { object: u32, address: u64 },
    /// Anywhere else: the runtime address.
    Runtime(u64),
}

impl Frame {
    pub fn from_stored(word: u64) -> Frame {
        if word & layout::FRAME_IN_OBJECT != 0 {
            Frame::InObject {
                object: ((word & !layout::FRAME_IN_OBJECT) >> layout::FRAME_OBJECT_SHIFT) as u32,
                address: word & ((1 << layout::FRAME_OBJECT_SHIFT) - 1),
            }
        } else {
            Frame::Runtime(word)
        }
    }
}

/// A stack: frames innermost first (the first is the library's wrapper of the call),
/// and how its walk ended.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Stack {
    pub frames: Vec<Frame>,
    pub end: WalkEnd,
}

/// A stack's index in [`Recorder::stacks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u32);

/// What sampled events stand for (each weighs the inverse of its chance).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimated {
    pub allocs: f64,
    pub bytes: u64,
    pub frees: f64,
    pub freed_bytes: u64,
}

/// What one stack of one process allocated and freed: `bpf_prog::AllocStats`.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocStats {
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    pub temporaries: u64,
    pub untracked: u64,
    pub untracked_bytes: u64,
    pub live_bytes: i64,
    pub live_birth_us: u64,
    /// Its live bytes when its process's live bytes last peaked.
    pub peak_bytes: i64,
    pub size_hist: [u64; BUCKETS],
    pub life_hist: [u64; BUCKETS],
    pub estimated: Estimated,
    /// Its blocks are anonymous mappings (mmap), not heap blocks.
    pub mapped: bool,
}

/// The raw per-stack state, with what the lazy peak needs.
/// The pid of a slot let go (its process retired into another), for a new one.
const FREE: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Slot {
    pid: u32,
    process: u32,
    stack: StackId,
    state: StackState,
}

/// One (process, stack)'s counters as the consumer keeps them: what every allocation
/// and free changes in one cache line, the rest after (a process with thousands of
/// stacks makes each event's stack a cache miss: one line rather than four).
#[derive(Clone, Debug)]
#[repr(C, align(64))]
struct StackState {
    allocs: u64,
    bytes: u64,
    frees: u64,
    freed_bytes: u64,
    live_bytes: i64,
    live_birth_us: u64,
    /// The process's change count at this stack's last change, and its live bytes
    /// at the process's last peak if it changed since (alloc.bpf.h's lazy peak).
    changed_seq: u64,
    peak_live_bytes: i64,
    temporaries: u64,
    untracked: u64,
    untracked_bytes: u64,
    est_allocs: u64,
    est_frees: u64,
    est_bytes: u64,
    est_freed_bytes: u64,
    mapped: bool,
    size_hist: [u64; BUCKETS],
    life_hist: [u64; BUCKETS],
}

impl StackState {
    /// Adds another process's counters of the same stack (its peak apart: see
    /// [`Recorder::retire`]).
    fn add(&mut self, o: &StackState) {
        self.allocs += o.allocs;
        self.bytes += o.bytes;
        self.frees += o.frees;
        self.freed_bytes += o.freed_bytes;
        self.live_bytes += o.live_bytes;
        self.live_birth_us = self.live_birth_us.wrapping_add(o.live_birth_us);
        self.temporaries += o.temporaries;
        self.untracked += o.untracked;
        self.untracked_bytes += o.untracked_bytes;
        self.est_allocs += o.est_allocs;
        self.est_frees += o.est_frees;
        self.est_bytes += o.est_bytes;
        self.est_freed_bytes += o.est_freed_bytes;
        self.mapped |= o.mapped;
        for (a, b) in self.size_hist.iter_mut().zip(o.size_hist) {
            *a += b;
        }
        for (a, b) in self.life_hist.iter_mut().zip(o.life_hist) {
            *a += b;
        }
    }
}

impl Default for StackState {
    fn default() -> Self {
        StackState {
            allocs: 0,
            bytes: 0,
            frees: 0,
            freed_bytes: 0,
            live_bytes: 0,
            live_birth_us: 0,
            changed_seq: 0,
            peak_live_bytes: 0,
            temporaries: 0,
            untracked: 0,
            untracked_bytes: 0,
            est_allocs: 0,
            est_frees: 0,
            est_bytes: 0,
            est_freed_bytes: 0,
            mapped: false,
            size_hist: [0; BUCKETS],
            life_hist: [0; BUCKETS],
        }
    }
}

/// Anonymous mappings' part of a process's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappedTotals {
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    pub live_bytes: i64,
}

/// A process's totals: `bpf_prog::AllocProcess` (heap blocks and mappings together, as
/// the BPF path counts them, or the heap blocks alone without
/// [`Options::count_mapped`]), with the mappings' part apart in `mapped`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessTotals {
    pub pid: u32,
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    pub live_bytes: i64,
    pub peak_bytes: i64,
    pub unknown_frees: u64,
    pub mapped: MappedTotals,
}

#[derive(Clone, Debug, Default)]
struct ProcessState {
    totals: ProcessTotals,
    seq: u64,
    peak_seq: u64,
    /// Its (process, stack) slots.
    slots: Vec<u32>,
    /// Processes retired into it ([`Recorder::retire`]): each stack's bytes at its peak
    /// are set when they are, never counted from its own changes.
    merged: bool,
    /// Retired into another process: its index is free for the next new process.
    gone: bool,
}

/// Counters of what the recording could not pair or keep, and of the walks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `AllocCounter::UnknownFrees`.
    pub unknown_frees: u64,
    /// `AllocCounter::Failed`.
    pub failed: u64,
    /// `AllocCounter::LiveMapFull`.
    pub live_map_full: u64,
    /// `AllocCounter::Reused`.
    pub reused: u64,
    /// Walks by how they ended (`WalkEnd` in `ct_walk_end` order), memo answers apart.
    pub walk_ends: [u64; layout::WALK_ENDS],
    pub walks: u64,
    pub memo_hits: u64,
    pub walked_frames: u64,
    /// Time spent walking, in TSC ticks (see [`Recorder::counters`] for ns).
    pub walk_ticks: u64,
    pub walk_ns: u64,
    /// Events lost: signal handlers nested deeper than the library's levels.
    pub nested_lost: u64,
    /// Events whose stack was not stored (the region's stack area full).
    pub not_stored: u64,
    /// Events lost: their thread found no free ring.
    pub no_ring: u64,
    /// Times a thread's ring was full and it waited for this consumer.
    pub waits: u64,
    /// Events of signal handlers that ran inside the recorder (published by it after).
    pub nested_events: u64,
    /// Wrapped calls made inside a wrapped allocator's call (its own mmaps, or a
    /// signal handler's calls then): part of that call, not events.
    pub inside_calls: u64,
    /// Memo answers timed (one in 1024) and their time: ns per memo answer.
    pub memo_timed: u64,
    pub memo_ticks: u64,
    pub memo_ns: u64,
    /// Mappings the library asked for (a pc in none it knew).
    pub lookups: u64,
}

impl Counters {
    /// Adds what a library counted (`other`'s walks, waits, losses and lookups).
    fn add_library(&mut self, c: &Counters) {
        self.walks += c.walks;
        self.memo_hits += c.memo_hits;
        self.walked_frames += c.walked_frames;
        self.walk_ticks += c.walk_ticks;
        for (t, n) in self.walk_ends.iter_mut().zip(c.walk_ends) {
            *t += n;
        }
        self.nested_lost += c.nested_lost;
        self.not_stored += c.not_stored;
        self.no_ring += c.no_ring;
        self.waits += c.waits;
        self.nested_events += c.nested_events;
        self.inside_calls += c.inside_calls;
        self.memo_timed += c.memo_timed;
        self.memo_ticks += c.memo_ticks;
        self.lookups += c.lookups;
    }

    fn add_ring(&mut self, ring: &RingCounters) {
        self.walks += ring.walks;
        self.memo_hits += ring.memo_hits;
        self.walked_frames += ring.walked_frames;
        self.walk_ticks += ring.walk_ticks;
        for (total, n) in self.walk_ends.iter_mut().zip(ring.walk_ends) {
            *total += n;
        }
        self.nested_lost += ring.nested_lost;
        self.not_stored += ring.not_stored;
        self.waits += ring.waits;
        self.nested_events += ring.nested_events;
        self.inside_calls += ring.inside_calls;
        self.memo_timed += ring.memo_timed;
        self.memo_ticks += ring.memo_ticks;
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct RingCounters {
    walks: u64,
    memo_hits: u64,
    walked_frames: u64,
    walk_ticks: u64,
    walk_ends: [u64; layout::WALK_ENDS],
    nested_lost: u64,
    not_stored: u64,
    waits: u64,
    nested_events: u64,
    inside_calls: u64,
    memo_timed: u64,
    memo_ticks: u64,
}

/// The library's memory in one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LibraryMemory {
    pub pid: u32,
    /// The shared region's size: the most it can use (its pages are used as touched).
    pub region_bound: u64,
    /// Of which in use: the rings of the threads seen, the stack table, the stacks.
    pub region_used: u64,
    /// Its other memory (thread states, mapping sets) now, and at most.
    pub private_bytes: u64,
    pub private_bound: u64,
}

/// A realloc's entry kept until its return: the old block, taken from the live blocks,
/// the size asked for and the stack walked at the entry (none if left out).
#[derive(Clone, Copy, Debug)]
struct Resizing {
    old: u64,
    size: u64,
    block: Option<Block>,
    slot: Option<u32>,
}

/// How far ahead in a ring the consumer asks for the live block an event will look up
/// (a cache miss takes about as long as handling this many events).
const PREFETCH_AHEAD: u64 = 16;

/// Realloc entries kept per ring for their returns (a signal handler's realloc may
/// come between an entry and its return; the target could write entries alone).
const MAX_CALLS: usize = 64;

/// One process image's region.
struct RegionReader {
    pid: u32,
    map: Option<Shared>,
    /// Its connection is gone (the process exited or exec'd).
    closed: bool,
    /// Events consumed per ring (what the ring's tail says).
    cursors: Vec<u64>,
    /// Rings a thread ever owned (for the memory figures).
    used_rings: Vec<bool>,
    /// Its process's index in `Recorder::processes`.
    process: u32,
    /// The region's stack ids, as the recorder's (process, stack) slots.
    slots: FxMap<u32, u32>,
    calls: Vec<Vec<Resizing>>,
}

const RING_HEAD: usize = offset_of!(Ring, head);
const RING_TAIL: usize = offset_of!(Ring, tail);
const RING_STATE: usize = offset_of!(Ring, state);
const RING_EVENTS_AT: usize = offset_of!(Ring, events);

fn ring_at(index: usize) -> usize {
    region::RINGS_OFFSET + index * size_of::<Ring>()
}

impl RegionReader {
    fn map(&self) -> &Shared {
        self.map.as_ref().expect("a region is read while mapped")
    }

    fn event(&self, ring: usize, index: u64) -> Event {
        let at =
            ring_at(ring) + RING_EVENTS_AT + (index as usize % RING_EVENTS) * size_of::<Event>();
        self.map().read(at)
    }

    fn prefetch_event(&self, ring: usize, index: u64) {
        let at =
            ring_at(ring) + RING_EVENTS_AT + (index as usize % RING_EVENTS) * size_of::<Event>();
        self.map().prefetch(at);
    }

    fn event_address(&self, ring: usize, index: u64) -> u64 {
        let at = ring_at(ring)
            + RING_EVENTS_AT
            + (index as usize % RING_EVENTS) * size_of::<Event>()
            + offset_of!(Event, address);
        self.map().read(at)
    }

    fn head(&self, ring: usize) -> u64 {
        self.map().load_acquire(ring_at(ring) + RING_HEAD)
    }

    fn counters(&self) -> (Counters, LibraryMemory) {
        let map = self.map();
        let mut counters = Counters::default();
        let mut used = region::HEADER as u64;
        for ring in 0..RINGS {
            let at = ring_at(ring);
            let read = |field: usize| map.read::<u64>(at + field);
            let mut walk_ends = [0; layout::WALK_ENDS];
            for (i, end) in walk_ends.iter_mut().enumerate() {
                *end = read(offset_of!(Ring, walk_ends) + 8 * i);
            }
            counters.add_ring(&RingCounters {
                walks: read(offset_of!(Ring, walks)),
                memo_hits: read(offset_of!(Ring, memo_hits)),
                walked_frames: read(offset_of!(Ring, walked_frames)),
                walk_ticks: read(offset_of!(Ring, walk_ticks)),
                walk_ends,
                nested_lost: read(offset_of!(Ring, nested_lost)),
                not_stored: read(offset_of!(Ring, not_stored)),
                waits: read(offset_of!(Ring, waits)),
                nested_events: read(offset_of!(Ring, nested_events)),
                inside_calls: read(offset_of!(Ring, inside_calls)),
                memo_timed: read(offset_of!(Ring, memo_timed)),
                memo_ticks: read(offset_of!(Ring, memo_ticks)),
            });
            if self.used_rings[ring] || read(offset_of!(Ring, owners)) > 0 {
                used += size_of::<Ring>() as u64;
            }
        }
        let header: Region = map.read(0);
        counters.no_ring = header.no_ring;
        counters.lookups = header.lookups;
        let words = header.words_used.min(region::WORDS as u64);
        used += (region::SLOTS * size_of::<layout::StackSlot>()) as u64 + words * 8;
        let memory = LibraryMemory {
            pid: self.pid,
            region_bound: region::BYTES as u64,
            region_used: used,
            private_bytes: header.private_bytes,
            private_bound: header.private_bound,
        };
        (counters, memory)
    }
}

/// Why a region was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("the region of process {pid} is {found} bytes, not {expected}")]
    Size { pid: u32, found: u64, expected: u64 },
    #[error("mapping the region of process {pid}: {source}")]
    Map { pid: u32, source: std::io::Error },
}

/// How many closed regions' library memory is kept one by one (the most any one used is
/// kept however many there are).
const CLOSED_MEMORY_KEPT: usize = 64;

/// Reads the regions and keeps the aggregates.
///
/// Its memory follows the processes running and the distinct stacks, not the processes
/// started: a process that exited is [`Recorder::retire`]d (its live blocks let go, and
/// past the first ones its statistics added to pid 0's), and a closed region keeps a
/// few words (its counters added up).
pub struct Recorder {
    options: Options,
    regions: Vec<RegionReader>,
    /// The pid of each process image that connected, in order.
    images: Vec<u32>,
    /// The counters of the regions closed and read to their end, added up, and the
    /// library's memory in the first of them and the most in any.
    closed_counters: Counters,
    closed_memory: Vec<LibraryMemory>,
    closed_most: LibraryMemory,
    closed_regions: u64,
    /// Slots and process indices let go by retired processes, for new ones.
    free_slots: Vec<u32>,
    free_processes: Vec<u32>,
    stacks: Vec<Stack>,
    stack_ids: HashMap<Stack, StackId>,
    /// Per (process, stack): its statistics, by slot (the live blocks name theirs).
    slots: Vec<Slot>,
    slot_ids: FxMap<(u32, StackId), u32>,
    processes: Vec<ProcessState>,
    process_ids: FxMap<u32, u32>,
    /// Per process: its live blocks by address.
    live: Vec<LiveTable>,
    live_blocks: usize,
    counters: Counters,
    clock: Clock,
    /// The last (region, region's stack id, slot) looked up.
    last_slot: (usize, u32, u32),
    /// Events handled so far.
    events: u64,
}

impl Recorder {
    pub fn new(options: Options) -> Recorder {
        Recorder {
            options,
            regions: Vec::new(),
            images: Vec::new(),
            closed_counters: Counters::default(),
            closed_memory: Vec::new(),
            closed_most: LibraryMemory::default(),
            closed_regions: 0,
            free_slots: Vec::new(),
            free_processes: Vec::new(),
            stacks: Vec::new(),
            stack_ids: HashMap::new(),
            slots: Vec::new(),
            slot_ids: FxMap::default(),
            processes: Vec::new(),
            process_ids: FxMap::default(),
            live: Vec::new(),
            live_blocks: 0,
            counters: Counters::default(),
            clock: Clock::new(),
            last_slot: (usize::MAX, 0, 0),
            events: 0,
        }
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Takes the region process `pid` sent with its hello (`image`: at a process
    /// image's start, not in a forked child before its exec); its index for
    /// [`Recorder::close`].
    pub(crate) fn add_region(
        &mut self,
        pid: u32,
        fd: &OwnedFd,
        image: bool,
    ) -> Result<usize, RegionError> {
        let found = sys::file_len(fd).map_err(|source| RegionError::Map { pid, source })?;
        if found != region::BYTES as u64 {
            return Err(RegionError::Size {
                pid,
                found,
                expected: region::BYTES as u64,
            });
        }
        let map = Shared::map(fd, region::BYTES, true)
            .map_err(|source| RegionError::Map { pid, source })?;
        let process = self.process_index(pid);
        self.regions.push(RegionReader {
            pid,
            map: Some(map),
            closed: false,
            cursors: vec![0; RINGS],
            used_rings: vec![false; RINGS],
            process,
            slots: FxMap::default(),
            calls: vec![Vec::new(); RINGS],
        });
        if image {
            self.images.push(pid);
        }
        Ok(self.regions.len() - 1)
    }

    /// The region's process closed its connection (exited, or exec'd): what it wrote is
    /// read to the end at the next poll, and the region let go.
    pub(crate) fn close(&mut self, region: usize) {
        if let Some(r) = self.regions.get_mut(region) {
            r.closed = true;
        }
    }

    /// Tells the library in process `pid` that its mappings changed otherwise than by a
    /// new object (one unmapped and another mapped over it, which the library cannot
    /// see): its next walk asks for them again. For the session's periodic re-read of
    /// the mappings (`ProcessTables::sync`) to call when it finds a change.
    pub fn mappings_changed(&mut self, pid: u32) {
        for region in &self.regions {
            if region.pid != pid || region.closed {
                continue;
            }
            if let Some(map) = &region.map {
                let at = offset_of!(Region, mappings_epoch);
                let epoch: u32 = map.read(at);
                map.store_u32_release(at, epoch.wrapping_add(1));
            }
        }
    }

    /// Reads every region's new events, in order; the events handled.
    pub fn poll(&mut self) -> u64 {
        let before = self.events;
        for index in 0..self.regions.len() {
            if self.regions[index].map.is_none() {
                continue;
            }
            self.drain(index);
            if self.regions[index].closed {
                self.let_go(index);
            }
        }
        self.events - before
    }

    /// Whether every region was closed and read to its end.
    pub fn all_closed(&self) -> bool {
        self.regions.iter().all(|r| r.map.is_none())
    }

    /// A closed region read to its end: its counters and memory figures added up, its
    /// mapping and buffers let go (a few words stay, for the server's indices).
    fn let_go(&mut self, index: usize) {
        let r = &mut self.regions[index];
        let (counters, memory) = r.counters();
        r.map = None;
        r.cursors = Vec::new();
        r.used_rings = Vec::new();
        r.calls = Vec::new();
        r.slots = FxMap::default();
        if self.last_slot.0 == index {
            self.last_slot = (usize::MAX, 0, 0);
        }
        self.closed_counters.add_library(&counters);
        self.closed_regions += 1;
        if self.closed_memory.len() < CLOSED_MEMORY_KEPT {
            self.closed_memory.push(memory);
        }
        let most = &mut self.closed_most;
        most.region_bound = most.region_bound.max(memory.region_bound);
        most.region_used = most.region_used.max(memory.region_used);
        most.private_bytes = most.private_bytes.max(memory.private_bytes);
        most.private_bound = most.private_bound.max(memory.private_bound);
    }

    /// The pid of every process image that connected so far (a pid that exec'd twice
    /// with the library is there twice).
    pub fn images(&self) -> Vec<u32> {
        self.images.clone()
    }

    /// The processes whose every region was closed and read to its end, not retired:
    /// each has exited, or exec'd and its new image not connected yet (the caller
    /// tells which before it retires one).
    pub fn quiet_processes(&self) -> Vec<u32> {
        let mut open: std::collections::HashSet<u32> = std::collections::HashSet::new();
        for region in &self.regions {
            if region.map.is_some() {
                open.insert(region.pid);
            }
        }
        self.process_ids
            .keys()
            .copied()
            .filter(|pid| {
                !open.contains(pid) && !self.processes[self.process_ids[pid] as usize].merged
            })
            .collect()
    }

    /// Process `pid` exited: the blocks it left live are let go (they stay counted as
    /// leaked, as on the BPF path), and so are its bookkeeping and, with `into`, its
    /// statistics, added to process `into`'s (pid 0 for those past `--keep-exited`):
    /// their peak is the highest of theirs, each stack's bytes at it those of the
    /// process that reached it (bytes live in processes that ran at different times
    /// were never live at once). A pid that connects again after is a new process.
    pub fn retire(&mut self, pid: u32, into: Option<u32>) {
        let Some(from) = self.process_ids.remove(&pid) else {
            return;
        };
        let from = from as usize;
        let live = std::mem::replace(&mut self.live[from], LiveTable::empty());
        self.live_blocks -= live.len();
        drop(live);
        let slots = std::mem::take(&mut self.processes[from].slots);
        for &slot in &slots {
            self.slot_ids
                .remove(&(pid, self.slots[slot as usize].stack));
        }
        let Some(into) = into.filter(|&into| into != pid) else {
            // kept under its own pid: its slots stay, under no key a new process finds
            self.processes[from].slots = slots;
            return;
        };
        let target = self.process_index(into) as usize;
        self.processes[target].merged = true;
        let peak_seq = self.processes[from].peak_seq;
        let (t, f) = (self.processes[target].totals, self.processes[from].totals);
        let higher_peak = f.peak_bytes > t.peak_bytes;
        if higher_peak {
            // the bytes at pid 0's peak are now this process's, and only its
            for &slot in &self.processes[target].slots {
                self.slots[slot as usize].state.peak_live_bytes = 0;
            }
        }
        let totals = &mut self.processes[target].totals;
        totals.allocs += f.allocs;
        totals.bytes += f.bytes;
        totals.frees += f.frees;
        totals.freed_bytes += f.freed_bytes;
        totals.live_bytes += f.live_bytes;
        totals.peak_bytes = t.peak_bytes.max(f.peak_bytes);
        totals.unknown_frees += f.unknown_frees;
        totals.mapped.allocs += f.mapped.allocs;
        totals.mapped.bytes += f.mapped.bytes;
        totals.mapped.frees += f.mapped.frees;
        totals.mapped.freed_bytes += f.mapped.freed_bytes;
        totals.mapped.live_bytes += f.mapped.live_bytes;
        for slot in slots {
            let state = std::mem::take(&mut self.slots[slot as usize].state);
            let stack = self.slots[slot as usize].stack;
            let peak = if peak_seq >= state.changed_seq {
                state.live_bytes
            } else {
                state.peak_live_bytes
            };
            let merged = self.slot_of(into, target as u32, stack);
            let m = &mut self.slots[merged as usize].state;
            m.add(&state);
            if higher_peak {
                m.peak_live_bytes = peak;
            }
            self.slots[slot as usize].pid = FREE;
            self.free_slots.push(slot);
        }
        self.processes[from] = ProcessState {
            gone: true,
            ..ProcessState::default()
        };
        self.free_processes.push(from as u32);
        self.last_slot = (usize::MAX, 0, 0);
    }

    /// Process `pid`'s slot of `stack` (`process`: its index), made if new.
    fn slot_of(&mut self, pid: u32, process: u32, stack: StackId) -> u32 {
        if let Some(&slot) = self.slot_ids.get(&(pid, stack)) {
            return slot;
        }
        let fresh = Slot {
            pid,
            process,
            stack,
            state: StackState::default(),
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = fresh;
                slot
            }
            None => {
                self.slots.push(fresh);
                self.slots.len() as u32 - 1
            }
        };
        self.slot_ids.insert((pid, stack), slot);
        self.processes[process as usize].slots.push(slot);
        slot
    }

    pub fn regions(&self) -> usize {
        self.regions.len()
    }

    fn process_index(&mut self, pid: u32) -> u32 {
        if let Some(&index) = self.process_ids.get(&pid) {
            return index;
        }
        let state = ProcessState {
            totals: ProcessTotals {
                pid,
                ..ProcessTotals::default()
            },
            ..ProcessState::default()
        };
        let index = match self.free_processes.pop() {
            Some(index) => {
                self.processes[index as usize] = state;
                self.live[index as usize] = LiveTable::default();
                index
            }
            None => {
                self.processes.push(state);
                self.live.push(LiveTable::default());
                self.processes.len() as u32 - 1
            }
        };
        self.process_ids.insert(pid, index);
        index
    }

    fn drain(&mut self, index: usize) {
        let mut heads = [0u64; RINGS];
        // the next event of each ring that has one, read once
        let mut next: Vec<(usize, Event)> = Vec::new();
        let refresh =
            |reader: &RegionReader, heads: &mut [u64; RINGS], next: &mut Vec<(usize, Event)>| {
                next.clear();
                let limit =
                    (reader.map().read::<u32>(offset_of!(Region, ring_limit)) as usize).min(RINGS);
                for (ring, head) in heads.iter_mut().enumerate().take(limit) {
                    let mut h = reader.head(ring);
                    let cursor = reader.cursors[ring];
                    // a head the target scribbled: no more than a ring ahead
                    if h < cursor || h - cursor > RING_EVENTS as u64 {
                        h = cursor;
                    }
                    *head = h;
                    if h > cursor {
                        next.push((ring, reader.event(ring, cursor)));
                    }
                }
            };
        refresh(&self.regions[index], &mut heads, &mut next);
        self.clock.update();
        let process = self.regions[index].process as usize;
        let slack = (STAMP_SLACK_NS / self.clock.rate()) as u64;
        let mut refreshed_for: Option<(usize, u64)> = None;
        let mut handled = 0u64;
        while !next.is_empty() {
            let mut at = 0;
            for (i, (_, e)) in next.iter().enumerate().skip(1) {
                if e.time < next[at].1.time {
                    at = i;
                }
            }
            let (ring, event) = next[at];
            let cursor = self.regions[index].cursors[ring];
            if !self.handle(index, ring, &event, true) {
                // its predecessor may be in another ring, published since the heads
                // were read: read them again, once
                if refreshed_for != Some((ring, cursor)) {
                    refresh(&self.regions[index], &mut heads, &mut next);
                    self.clock.update();
                    refreshed_for = Some((ring, cursor));
                    continue;
                }
                // the earliest event of another ring stamped no later (within the
                // stamps' slack) goes first; else it has none
                let mut first: Option<usize> = None;
                for (i, &(r, e)) in next.iter().enumerate() {
                    if r != ring
                        && e.time <= event.time.saturating_add(slack)
                        && first.is_none_or(|f| e.time < next[f].1.time)
                    {
                        first = Some(i);
                    }
                }
                at = first.unwrap_or(at);
                let (ring, event) = next[at];
                self.handle(index, ring, &event, false);
            }
            let ring = next[at].0;
            handled += 1;
            let reader = &mut self.regions[index];
            reader.cursors[ring] += 1;
            reader.used_rings[ring] = true;
            let cursor = reader.cursors[ring];
            if cursor == heads[ring] {
                next.swap_remove(at);
            } else {
                next[at].1 = reader.event(ring, cursor);
            }
            // the ring's line a few events on (written on the target's core), and the
            // live block an event further on will look up: asked for now
            if cursor + 8 < heads[ring] {
                reader.prefetch_event(ring, cursor + 8);
            }
            if cursor + PREFETCH_AHEAD < heads[ring] && self.live[process].is_large() {
                let address = reader.event_address(ring, cursor + PREFETCH_AHEAD);
                self.live[process].prefetch(address);
                // half as far on, the counters of the event's stack: its live block
                // (asked for above, that many events ago) or its stack id names them
                let soon = reader.event(ring, cursor + PREFETCH_AHEAD / 2);
                let slot = match soon.kind {
                    event::FREE | event::MUNMAP => self.live[process].slot_of(soon.address),
                    event::ALLOC | event::MMAP => reader.slots.get(&soon.stack).copied(),
                    _ => None,
                };
                if let Some(slot) = slot.and_then(|slot| self.slots.get(slot as usize)) {
                    prefetch(&slot.state);
                }
            }
            let reader = &mut self.regions[index];
            if handled.is_multiple_of(1024) {
                // room for the producer while this drain goes on
                reader
                    .map()
                    .store_release(ring_at(ring) + RING_TAIL, cursor);
            }
        }
        let reader = &self.regions[index];
        let map = reader.map();
        for ring in 0..RINGS {
            let cursor = reader.cursors[ring];
            map.store_release(ring_at(ring) + RING_TAIL, cursor);
            let state: u32 = map.read(ring_at(ring) + RING_STATE);
            if state == ring_state::RELEASED && reader.head(ring) == cursor {
                map.store_u32_release(ring_at(ring) + RING_STATE, ring_state::FREE);
            }
        }
    }

    /// The (process, stack) slot of the region's stack `id`; id 0 (the library could
    /// not store it: its region's stack area was full) and an unreadable record are the
    /// stack "not stored", with no frame, as the BPF path's `CT_STACK_NOT_STORED`.
    fn slot(&mut self, region: usize, id: u32) -> u32 {
        let (last_region, last_id, last_slot) = self.last_slot;
        if last_region == region && last_id == id {
            return last_slot;
        }
        if let Some(&slot) = self.regions[region].slots.get(&id) {
            self.last_slot = (region, id, slot);
            return slot;
        }
        let stack = self.read_stack(region, id).unwrap_or(Stack {
            frames: Vec::new(),
            end: WalkEnd::Complete,
        });
        let stack = self.intern(stack);
        let (pid, process) = (self.regions[region].pid, self.regions[region].process);
        let slot = self.slot_of(pid, process, stack);
        self.regions[region].slots.insert(id, slot);
        self.last_slot = (region, id, slot);
        slot
    }

    fn intern(&mut self, stack: Stack) -> StackId {
        let next = StackId(self.stacks.len() as u32);
        *self.stack_ids.entry(stack.clone()).or_insert_with(|| {
            self.stacks.push(stack);
            next
        })
    }

    fn read_stack(&self, region: usize, id: u32) -> Option<Stack> {
        if id == 0 {
            return None;
        }
        let map = self.regions[region].map();
        let at = id as usize - 1;
        if at >= region::WORDS {
            return None;
        }
        let word = |i: usize| map.read::<u64>(region::WORDS_OFFSET + 8 * i);
        let header = word(at);
        let len = (header & 0xffff_ffff) as usize;
        if len == 0 || len > layout::MAX_FRAMES || at + 1 + len > region::WORDS {
            return None;
        }
        let end = walk_end((header >> 32) as u16, (header >> 48) as u16);
        let frames = (0..len)
            .map(|i| Frame::from_stored(word(at + 1 + i)))
            .collect();
        Some(Stack { frames, end })
    }

    /// Handles one event. With `defer`, an event whose predecessor on another thread is
    /// not seen yet (a free of an address not live, an allocation at one still live) is
    /// left as it is, and false returned.
    fn handle(&mut self, region: usize, ring: usize, e: &Event, defer: bool) -> bool {
        let process = self.regions[region].process as usize;
        // the common kinds first, with one lookup of the live blocks each
        match e.kind {
            event::FREE | event::MUNMAP => {
                let block = match e.address {
                    0 => None,
                    address => self.live[process].remove(address),
                };
                if block.is_none() && defer && e.address != 0 {
                    return false;
                }
                self.events += 1;
                let now = self.clock.ns(e.time);
                match block {
                    Some(block) => {
                        self.live_blocks -= 1;
                        self.account_free(&block, process, now);
                    }
                    None if e.kind == event::FREE => self.count_unknown_free(process),
                    None => {}
                }
                return true;
            }
            event::ALLOC | event::MMAP => {
                let slot = self.slot(region, e.stack);
                let now = self.clock.ns(e.time);
                let mapped = e.kind == event::MMAP;
                if !self.alloc_block(process, e.address, e.size, slot, now, mapped, defer) {
                    return false;
                }
                self.events += 1;
                return true;
            }
            _ => {}
        }
        let live = &self.live[process];
        match e.kind {
            event::RESIZING if defer && e.address != 0 && !live.contains(e.address) => {
                return false;
            }
            event::RESIZED
                if defer
                    && e.address != 0
                    && self.regions[region].calls[ring]
                        .last()
                        .is_some_and(|call| call.slot.is_some())
                    && live.contains(e.address) =>
            {
                return false;
            }
            _ => {}
        }
        self.events += 1;
        let now = self.clock.ns(e.time);
        match e.kind {
            event::FAILED => self.counters.failed += 1,
            event::RESIZING => {
                let block = match e.address {
                    0 => None,
                    old => self.take_live(process, old),
                };
                let slot = (e.flags & event::UNSAMPLED == 0).then(|| self.slot(region, e.stack));
                let calls = &mut self.regions[region].calls[ring];
                if calls.len() >= MAX_CALLS {
                    // entries whose returns never came (the target wrote them): the
                    // oldest goes, as a thread's deepest calls do in alloc.bpf.h
                    calls.remove(0);
                }
                calls.push(Resizing {
                    old: e.address,
                    size: e.size,
                    block,
                    slot,
                });
            }
            event::RESIZED => {
                // a return whose entry was not seen (CT_ALLOC_NO_ENTRY): nothing to pair
                if let Some(call) = self.regions[region].calls[ring].pop() {
                    self.resized(process, call, e.address, now);
                }
            }
            _ => {}
        }
        true
    }

    fn take_live(&mut self, process: usize, address: u64) -> Option<Block> {
        let block = self.live[process].remove(address)?;
        self.live_blocks -= 1;
        Some(block)
    }

    /// A realloc's return (alloc_return in alloc.bpf.h), of `address`.
    fn resized(&mut self, process: usize, call: Resizing, address: u64, now: u64) {
        if call.old != 0 {
            if address == 0 && call.size != 0 {
                // failed: the old block lives on
                self.counters.failed += 1;
                if let Some(block) = call.block {
                    if self.live[process].insert(call.old, block).is_none() {
                        self.live_blocks += 1;
                    }
                }
                return;
            }
            match call.block {
                Some(block) => self.account_free(&block, process, now),
                None => self.count_unknown_free(process),
            }
        }
        if address == 0 {
            // realloc(p, 0) freeing p is not a failure
            if call.old == 0 {
                self.counters.failed += 1;
            }
            return;
        }
        if let Some(slot) = call.slot {
            self.alloc_block(process, address, call.size, slot, now, false, false);
        }
    }

    fn count_unknown_free(&mut self, process: usize) {
        if self.options.leaving_out() {
            return; // most are frees of blocks left out
        }
        self.counters.unknown_frees += 1;
        self.processes[process].totals.unknown_frees += 1;
    }

    /// Adds delta to the live bytes of a slot and of its process, keeping the peak
    /// lazily (change_live in alloc.bpf.h).
    fn change_live(&mut self, process: usize, slot: u32, delta: i64, mapped: bool) {
        if mapped && !self.options.count_mapped {
            // apart: the stack's live bytes alone, out of the process's and its peak
            self.slots[slot as usize].state.live_bytes += delta;
            return;
        }
        let proc = &mut self.processes[process];
        proc.seq += 1;
        let seq = proc.seq;
        let peak_seq = proc.peak_seq;
        proc.totals.live_bytes += delta;
        if proc.totals.live_bytes > proc.totals.peak_bytes {
            proc.totals.peak_bytes = proc.totals.live_bytes;
            proc.peak_seq = seq;
        }
        let state = &mut self.slots[slot as usize].state;
        if peak_seq >= state.changed_seq {
            state.peak_live_bytes = state.live_bytes;
        }
        state.live_bytes += delta;
        state.changed_seq = seq;
    }

    /// Counts the allocation of `size` bytes at `address` under `slot` and tracks the
    /// block (account_alloc in alloc.bpf.h), with one lookup of the live blocks. With
    /// `defer`, an address still live is left as it is (its free may be in another
    /// ring) and false returned.
    #[allow(clippy::too_many_arguments)]
    fn alloc_block(
        &mut self,
        process: usize,
        address: u64,
        size: u64,
        slot: u32,
        now: u64,
        mapped: bool,
        defer: bool,
    ) -> bool {
        let block = Block {
            size,
            slot,
            born_ns: now,
            mapped,
        };
        let live = &mut self.live[process];
        let place = live.lookup(address);
        if defer && place.live {
            return false; // its free may be in another ring
        }
        // full: a block at the address is replaced still (it was freed unseen)
        let tracked = place.live || self.live_blocks < self.options.max_live_blocks;
        let old = if tracked {
            live.put(place, address, block)
        } else {
            None
        };
        if tracked && old.is_none() {
            self.live_blocks += 1;
        }
        let sampling = self.options.sampling();
        let (weight_count, weight_bytes) = (
            self.options.weight_count(size),
            self.options.weight_bytes(size),
        );
        let s = &mut self.slots[slot as usize].state;
        s.allocs += 1;
        s.bytes += size;
        s.size_hist[log2_bucket(size)] += 1;
        s.mapped |= mapped;
        if sampling {
            s.est_allocs += weight_count;
            s.est_bytes += weight_bytes;
        }
        let counted = !mapped || self.options.count_mapped;
        let totals = &mut self.processes[process].totals;
        if counted {
            totals.allocs += 1;
            totals.bytes += size;
        }
        if mapped {
            totals.mapped.allocs += 1;
            totals.mapped.bytes += size;
        }
        if let Some(old) = old {
            // handed out again with no free seen: the old block is counted freed now
            self.counters.reused += 1;
            self.account_free(&old, process, now);
        }
        if !tracked {
            self.counters.live_map_full += 1;
            let s = &mut self.slots[slot as usize].state;
            s.untracked += 1;
            s.untracked_bytes += size;
            return true;
        }
        self.slots[slot as usize].state.live_birth_us += now / 1000;
        if mapped {
            self.processes[process].totals.mapped.live_bytes += size as i64;
        }
        self.change_live(process, slot, size as i64, mapped);
        true
    }

    fn account_free(&mut self, block: &Block, process: usize, now: u64) {
        let lifetime = now.saturating_sub(block.born_ns);
        let temporary = lifetime < self.options.temporary_ns;
        let sampling = self.options.sampling();
        let (weight_count, weight_bytes) = (
            self.options.weight_count(block.size),
            self.options.weight_bytes(block.size),
        );
        let s = &mut self.slots[block.slot as usize].state;
        s.frees += 1;
        s.freed_bytes += block.size;
        if temporary {
            s.temporaries += 1;
        }
        s.life_hist[log2_bucket(lifetime)] += 1;
        s.live_birth_us = s.live_birth_us.wrapping_sub(block.born_ns / 1000);
        if sampling {
            s.est_frees += weight_count;
            s.est_freed_bytes += weight_bytes;
        }
        self.change_live(process, block.slot, -(block.size as i64), block.mapped);
        let counted = !block.mapped || self.options.count_mapped;
        let totals = &mut self.processes[process].totals;
        if counted {
            totals.frees += 1;
            totals.freed_bytes += block.size;
        }
        if block.mapped {
            totals.mapped.frees += 1;
            totals.mapped.freed_bytes += block.size;
            totals.mapped.live_bytes -= block.size as i64;
        }
    }

    /// Every stack met, by [`StackId`].
    pub fn stacks(&self) -> &[Stack] {
        &self.stacks
    }

    pub fn stack_of(&self, id: StackId) -> &Stack {
        &self.stacks[id.0 as usize]
    }

    /// The statistics of every (pid, stack), with each stack's live bytes at its
    /// process's peak resolved.
    pub fn stats(&self) -> Vec<(u32, StackId, AllocStats)> {
        let mut out: Vec<_> = self
            .slots
            .iter()
            .filter(|slot| slot.pid != FREE)
            .map(|slot| {
                let state = &slot.state;
                let process = &self.processes[slot.process as usize];
                let fixed = |v: u64| v as f64 / f64::from(1u32 << WEIGHT_SHIFT);
                let stats = AllocStats {
                    allocs: state.allocs,
                    bytes: state.bytes,
                    frees: state.frees,
                    freed_bytes: state.freed_bytes,
                    temporaries: state.temporaries,
                    untracked: state.untracked,
                    untracked_bytes: state.untracked_bytes,
                    live_bytes: state.live_bytes,
                    live_birth_us: state.live_birth_us,
                    // unchanged since the process's last peak: its live bytes now; a
                    // process others were retired into: its bytes at the peak as set
                    peak_bytes: if !process.merged && process.peak_seq >= state.changed_seq {
                        state.live_bytes
                    } else {
                        state.peak_live_bytes
                    },
                    size_hist: state.size_hist,
                    life_hist: state.life_hist,
                    estimated: Estimated {
                        allocs: fixed(state.est_allocs),
                        bytes: state.est_bytes,
                        frees: fixed(state.est_frees),
                        freed_bytes: state.est_freed_bytes,
                    },
                    mapped: state.mapped,
                };
                (slot.pid, slot.stack, stats)
            })
            .collect();
        out.sort_by_key(|(pid, stack, _)| (*pid, *stack));
        out
    }

    /// Each process's totals.
    pub fn processes(&self) -> Vec<ProcessTotals> {
        let mut out: Vec<_> = self
            .processes
            .iter()
            .filter(|p| !p.gone)
            .map(|p| p.totals)
            .collect();
        out.sort_by_key(|p| p.pid);
        out
    }

    /// The counters, the libraries' included.
    pub fn counters(&self) -> Counters {
        let mut total = self.counters;
        total.add_library(&self.closed_counters);
        for region in self.regions.iter().filter(|r| r.map.is_some()) {
            total.add_library(&region.counters().0);
        }
        total.walk_ns = (total.walk_ticks as f64 * self.clock.rate()) as u64;
        total.memo_ns = (total.memo_ticks as f64 * self.clock.rate()) as u64;
        total
    }

    /// The library's memory in each process image connected now, and in the first
    /// that closed.
    pub fn library_memory(&self) -> Vec<LibraryMemory> {
        let open = self.regions.iter().filter(|r| r.map.is_some());
        self.closed_memory
            .iter()
            .copied()
            .chain(open.map(|r| r.counters().1))
            .collect()
    }

    /// The processes (regions) the library recorded in so far, and the most its memory
    /// took in any one (each figure's own most).
    pub fn library_memory_most(&self) -> (u64, LibraryMemory) {
        let mut most = self.closed_most;
        for region in self.regions.iter().filter(|r| r.map.is_some()) {
            let memory = region.counters().1;
            most.region_bound = most.region_bound.max(memory.region_bound);
            most.region_used = most.region_used.max(memory.region_used);
            most.private_bytes = most.private_bytes.max(memory.private_bytes);
            most.private_bound = most.private_bound.max(memory.private_bound);
        }
        (self.regions.len() as u64, most)
    }

    /// Live bytes now, all processes (the live view).
    pub fn live_bytes(&self) -> i64 {
        self.processes.iter().map(|p| p.totals.live_bytes).sum()
    }

    /// Events handled so far (the live view's call counts).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The `n` stacks with the most live bytes now, most first.
    pub fn top_live(&self, n: usize) -> Vec<(u32, StackId, i64)> {
        let mut all: Vec<_> = self
            .slots
            .iter()
            .filter(|slot| slot.pid != FREE && slot.state.live_bytes > 0)
            .map(|slot| (slot.pid, slot.stack, slot.state.live_bytes))
            .collect();
        all.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
        all.truncate(n);
        all
    }
}

/// The walk end of a stack record (`enum ctp_walk_end` and a reason).
fn walk_end(end: u16, reason: u16) -> WalkEnd {
    match end {
        0 => WalkEnd::Complete,
        1 => WalkEnd::NoProcess,
        2 => WalkEnd::NoMapping,
        3 => WalkEnd::NoRow,
        4 => WalkEnd::Unsupported(
            UnsupportedReason::from_u8(reason as u8).unwrap_or(UnsupportedReason::BadCfi),
        ),
        5 => WalkEnd::ReadFault,
        6 => WalkEnd::DepthCap,
        _ => WalkEnd::BadReturnAddress,
    }
}

/// Bucket of a log2 histogram: the bit length of v (0 for 0), capped.
fn log2_bucket(v: u64) -> usize {
    ((64 - v.leading_zeros()) as usize).min(BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_bit_lengths() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 1);
        assert_eq!(log2_bucket(48), 6);
        assert_eq!(log2_bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn frames_decode_as_stored() {
        let word = layout::FRAME_IN_OBJECT | 7 << layout::FRAME_OBJECT_SHIFT | 0x1234;
        assert_eq!(
            Frame::from_stored(word),
            Frame::InObject {
                object: 7,
                address: 0x1234
            }
        );
        assert_eq!(
            Frame::from_stored(0x7f00_0000_1000),
            Frame::Runtime(0x7f00_0000_1000)
        );
    }
}
