//! Heap profiling's vocabulary, as the programs of `src/bpf/alloc.bpf.h` know it: the
//! kinds of allocator function and the cookie that tells them apart, the maps' sizes and
//! settings ([`AllocOptions`], set before load), and the records the readers
//! (`alloc.rs`) return. A leaf of the crate: it knows the layouts and nothing of the
//! loaded tracer.
//!
//! An allocator function is attached as the programs its [`AllocKind`] names
//! ([`AllocKind::programs`]: an entry program and [`EventProgram::AllocReturn`] for an
//! allocating function, [`EventProgram::Free`] for a freeing one), each with the cookie
//! [`alloc_cookie`] makes of the probe id and the function's kind, one uprobe (or
//! uretprobe) per function.

use std::fmt;

use crate::error::{Error, Result};
use crate::layout::alloc as raw;
use crate::programs::EventProgram;
use crate::records::StackRef;
use crate::skel::OpenTraceSkel;

/// Buckets of the size and lifetime histograms: bucket `k` counts values of bit length
/// `k` (`[2^(k-1), 2^k)`, bucket 0 the value 0); the last one also counts everything
/// longer.
pub const ALLOC_BUCKETS: usize = raw::BUCKETS;

/// Where an allocator function takes its size and addresses (`enum ct_alloc_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllocKind {
    /// `malloc(size)`, `valloc`, `pvalloc`, `mallocx(size, flags)`, `mi_malloc`.
    SizeArg0,
    /// `aligned_alloc(align, size)`, `memalign(align, size)`.
    SizeArg1,
    /// `calloc(n, size)`.
    Calloc,
    /// `realloc(ptr, size)`, `rallocx(ptr, size, flags)`: a free of `ptr` and an
    /// allocation; `realloc(NULL, n)` allocates only, `realloc(p, 0)` returning NULL frees only.
    Realloc,
    /// `reallocarray(ptr, n, size)`.
    ReallocArray,
    /// `posix_memalign(&ptr, align, size)`: the address is read from `ptr` at the return.
    PosixMemalign,
    /// `free(ptr)`, `sdallocx(ptr, size, flags)`, `dallocx(ptr, flags)`, `mi_free`.
    Free,
    /// A free whose address is in the second argument register: a free's probe moved past
    /// instructions that copied it there (`mi_free`, see [`AllocKind::reading_moved`]).
    FreeArg1,
    /// `mmap(addr, len, prot, flags, fd, offset)`: anonymous mappings only.
    Mmap,
    /// `munmap(addr, len)`: ends the mapping made at `addr`; an address no mapping was
    /// made at is not counted as an unknown free.
    Munmap,
    /// jemalloc's `xallocx(ptr, size, extra, flags)`, which resizes in place and returns
    /// the usable size: a free of the block and an allocation at the same address, of
    /// the usable size capped at `size + extra`; no change when it returns less than
    /// `size` (the block could not be resized).
    Xallocx,
    /// The preloaded library's site `cargo_trace_allocated(address, size, mapped, log, n)`,
    /// called after an allocating function returned, with the thread's frees logged since
    /// its last allocation (`EventProgram::PreloadAlloc`).
    Allocated,
    /// Its site `cargo_trace_resizing(old, size, log, n)`, before a realloc: as realloc's
    /// entry, after the thread's logged frees.
    Resizing,
    /// Its site `cargo_trace_resized(address)`, after the realloc: as realloc's return.
    Resized,
    /// Its site `cargo_trace_freed(log, n)`: a thread's log of frees, full
    /// (`EventProgram::PreloadFreed`).
    Freed,
    /// Its site `cargo_trace_log(log)`: where a thread logs its frees, told at its exit
    /// (`EventProgram::PreloadLog`).
    Log,
}

impl AllocKind {
    fn raw(self) -> u32 {
        use raw::kind;
        match self {
            AllocKind::SizeArg0 => kind::SIZE_ARG0,
            AllocKind::SizeArg1 => kind::SIZE_ARG1,
            AllocKind::Calloc => kind::CALLOC,
            AllocKind::Realloc => kind::REALLOC,
            AllocKind::ReallocArray => kind::REALLOCARRAY,
            AllocKind::PosixMemalign => kind::POSIX_MEMALIGN,
            AllocKind::Free | AllocKind::FreeArg1 => kind::FREE,
            AllocKind::Mmap => kind::MMAP,
            AllocKind::Munmap => kind::MUNMAP,
            AllocKind::Xallocx => kind::XALLOCX,
            // The sites' programs read no kind.
            AllocKind::Allocated | AllocKind::Freed | AllocKind::Log => kind::SIZE_ARG0,
            // The entry's arguments are realloc's.
            AllocKind::Resizing | AllocKind::Resized => kind::REALLOC,
        }
    }

    /// The argument registers its entry program reads (0: rdi, 1: rsi, 2: rdx, 3: rcx,
    /// 4: r8), in the order of what it reads: a size, a count and a size, a block and a
    /// size... Kinds of one of [`SAME_VALUES`] read the same values in that order, each
    /// from its own registers.
    fn registers_read(self) -> &'static [usize] {
        match self {
            AllocKind::SizeArg0
            | AllocKind::Free
            | AllocKind::Munmap
            | AllocKind::Resized
            | AllocKind::Log => &[0],
            AllocKind::SizeArg1 | AllocKind::FreeArg1 => &[1],
            AllocKind::Calloc | AllocKind::Realloc | AllocKind::Freed => &[0, 1],
            AllocKind::PosixMemalign => &[0, 2],
            AllocKind::Mmap => &[1, 3],
            AllocKind::ReallocArray | AllocKind::Xallocx => &[0, 1, 2],
            AllocKind::Resizing => &[0, 1, 2, 3],
            AllocKind::Allocated => &[0, 1, 2, 3, 4],
        }
    }

    /// The kind whose entry program reads what this kind's reads at a function's entry,
    /// at a place past it where the function's first instructions moved its arguments:
    /// `holds[r]` is the argument whose entry value argument register `r` holds there
    /// (as `AllocKind::registers_read` numbers them). Itself when what it reads is
    /// where it was; `mi_malloc_aligned(size, alignment)`, once past `mov %rdi,%rsi`,
    /// is read as [`AllocKind::SizeArg1`]; `None` when no kind reads the values where
    /// they are.
    pub fn reading_moved(self, holds: &[Option<usize>]) -> Option<AllocKind> {
        let family = SAME_VALUES
            .iter()
            .find(|family| family.contains(&self))
            .map_or(std::slice::from_ref(&self), |family| *family);
        let reads = self.registers_read();
        family.iter().copied().find(|other| {
            let there = other.registers_read();
            there.len() == reads.len()
                && there
                    .iter()
                    .zip(reads)
                    .all(|(&register, &argument)| holds.get(register) == Some(&Some(argument)))
        })
    }

    /// Whether the function frees only (attached at its entry, no return probe).
    pub fn frees_only(self) -> bool {
        matches!(
            self,
            AllocKind::Free | AllocKind::FreeArg1 | AllocKind::Munmap
        )
    }

    /// The programs a function of this kind is attached as, each with whether it is a
    /// return probe. A function that resizes a block has an entry program of its own
    /// ([`EventProgram::ResizeEntry`]): the others' entry, when sampling 1 in N leaves a
    /// call out, ends before reading which kind it is, a helper call spared.
    pub fn programs(self) -> &'static [(EventProgram, bool)] {
        match self {
            AllocKind::Free | AllocKind::Munmap => &[(EventProgram::Free, false)],
            AllocKind::FreeArg1 => &[(EventProgram::FreeArg1, false)],
            AllocKind::Realloc | AllocKind::ReallocArray | AllocKind::Xallocx => &[
                (EventProgram::ResizeEntry, false),
                (EventProgram::AllocReturn, true),
            ],
            AllocKind::SizeArg0
            | AllocKind::SizeArg1
            | AllocKind::Calloc
            | AllocKind::PosixMemalign
            | AllocKind::Mmap => &[
                (EventProgram::AllocEntry, false),
                (EventProgram::AllocReturn, true),
            ],
            AllocKind::Allocated => &[(EventProgram::PreloadAlloc, false)],
            AllocKind::Resizing => &[(EventProgram::PreloadResize, false)],
            AllocKind::Resized => &[(EventProgram::PreloadResized, false)],
            AllocKind::Freed => &[(EventProgram::PreloadFreed, false)],
            AllocKind::Log => &[(EventProgram::PreloadLog, false)],
        }
    }
}

/// Kinds whose programs read the same values and treat them alike, each from registers
/// of its own: a function of one whose arguments moved may be probed as another.
const SAME_VALUES: &[&[AllocKind]] = &[
    &[AllocKind::SizeArg0, AllocKind::SizeArg1],
    &[AllocKind::Free, AllocKind::FreeArg1],
];

/// The attach cookie of an allocator function of kind `kind` for probe `probe_id`.
pub fn alloc_cookie(probe_id: u32, kind: AllocKind) -> u64 {
    u64::from(probe_id) | u64::from(kind.raw()) << raw::KIND_SHIFT
}

/// Heap profiling settings fixed at load time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocOptions {
    /// Blocks tracked at once (all processes); an allocation beyond is counted but not
    /// tracked ([`AllocCounter::LiveMapFull`], [`AllocStats::untracked`]).
    pub max_live_blocks: u32,
    /// Distinct (stack, process, probe) statistics.
    pub max_stacks: u32,
    /// Distinct (process, probe) totals.
    pub max_processes: u32,
    /// A block freed sooner than this after its allocation is a temporary.
    pub temporary_ns: u64,
    /// Count an outermost allocating call with a chance of 1 in this (0 or 1: every call).
    pub sample_every: u32,
    /// Count an allocation of `s` bytes with a chance of `s / sample_bytes` (1 from that
    /// size up); 0: every allocation. Not with `sample_every`.
    pub sample_bytes: u64,
    /// Count only allocations of at least this many bytes (0: any).
    pub min_size: u64,
    /// Count only allocations of at most this many bytes (0: any).
    pub max_size: u64,
}

impl AllocOptions {
    /// Whether only some events are counted (and [`AllocStats::estimated`] holds what
    /// they stand for).
    pub fn sampling(&self) -> bool {
        self.sample_every > 1 || self.sample_bytes > 0
    }

    /// Whether some allocations are not counted, by sampling or by size: most frees
    /// are then of blocks never tracked, which the live filter tells at once.
    fn leaves_out(&self) -> bool {
        self.sampling() || self.min_size > 0 || self.max_size > 0
    }
}

impl Default for AllocOptions {
    fn default() -> Self {
        AllocOptions {
            max_live_blocks: 1 << 20,
            max_stacks: 65536,
            max_processes: 4096,
            temporary_ns: 1_000_000,
            sample_every: 0,
            sample_bytes: 0,
            min_size: 0,
            max_size: 0,
        }
    }
}

/// What the heap programs could not pair or keep: the `alloc_counters` map, indexed by
/// `enum ct_alloc_counter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllocCounter {
    /// Frees of addresses no tracked block held (allocated before the attach, by a
    /// function not probed, or freed twice): never subtracted from a stack.
    UnknownFrees = 0,
    /// Allocations that returned NULL.
    Failed = 1,
    /// Blocks not tracked because the live map was full.
    LiveMapFull = 2,
    /// Events not counted because the statistics map was full.
    StatsMapFull = 3,
    /// Returns whose entry was not kept (calls nested too deep, or in progress at the attach).
    NoEntry = 4,
    /// Addresses handed out again with no free seen: the old block was counted freed then.
    Reused = 5,
    /// Free logs of the preloaded library the kernel could not read (at their thread's
    /// exit, after the kernel released its memory): their frees are not counted.
    LogsUnread = 6,
}

impl AllocCounter {
    pub const COUNT: usize = raw::COUNTER_COUNT;
    pub const ALL: [AllocCounter; Self::COUNT] = [
        AllocCounter::UnknownFrees,
        AllocCounter::Failed,
        AllocCounter::LiveMapFull,
        AllocCounter::StatsMapFull,
        AllocCounter::NoEntry,
        AllocCounter::Reused,
        AllocCounter::LogsUnread,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            AllocCounter::UnknownFrees => "unknown frees",
            AllocCounter::Failed => "failed allocations",
            AllocCounter::LiveMapFull => "blocks untracked (live map full)",
            AllocCounter::StatsMapFull => "events uncounted (stats map full)",
            AllocCounter::NoEntry => "returns without their entry",
            AllocCounter::Reused => "addresses reused without a free",
            AllocCounter::LogsUnread => "free logs unread (frees not counted)",
        }
    }
}

impl fmt::Display for AllocCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// The enum must list the header's values in order.
const _: () = {
    let mut index = 0;
    while index < AllocCounter::COUNT {
        assert!(AllocCounter::ALL[index] as usize == index);
        index += 1;
    }
};

/// The key of one stack's heap statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocKey {
    /// The probe id of the allocating function's cookie.
    pub probe_id: u32,
    pub pid: u32,
    /// The stack walked at the allocating function's entry.
    pub stack: StackRef,
}

/// What the blocks allocated under one stack in one process did.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocStats {
    pub allocs: u64,
    pub bytes: u64,
    /// Frees of its blocks, wherever they were freed.
    pub frees: u64,
    pub freed_bytes: u64,
    /// Blocks freed sooner than [`AllocOptions::temporary_ns`] after their allocation.
    pub temporaries: u64,
    /// Blocks the live map had no room for: allocated, never seen freed.
    pub untracked: u64,
    pub untracked_bytes: u64,
    /// Bytes of its tracked blocks still live.
    pub live_bytes: i64,
    /// Sum of the birth times of its live tracked blocks, in microseconds of
    /// `CLOCK_MONOTONIC` (see [`AllocStats::mean_live_age_us`]).
    pub live_birth_us: u64,
    /// Its live bytes when its process's live bytes last peaked (see
    /// [`AllocProcess::peak_bytes`] for processes retired under one pid).
    pub peak_bytes: i64,
    /// Allocations by size: bucket `k` counts sizes of bit length `k` (see [`ALLOC_BUCKETS`]).
    pub size_hist: [u64; ALLOC_BUCKETS],
    /// Frees by lifetime in nanoseconds, bucketed as `size_hist`.
    pub life_hist: [u64; ALLOC_BUCKETS],
    /// Under sampling ([`AllocOptions::sampling`]): what the sampled events stand for.
    /// The other fields count the sampled events only.
    pub estimated: Estimated,
}

/// What sampled events stand for: each weighs the inverse of its chance to be sampled.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimated {
    pub allocs: f64,
    pub bytes: u64,
    pub frees: f64,
    pub freed_bytes: u64,
}

impl AllocStats {
    /// Tracked blocks still live.
    pub fn live_blocks(&self) -> u64 {
        (self.allocs - self.untracked).saturating_sub(self.frees)
    }

    /// The mean age of its live tracked blocks at `now_us` (microseconds of
    /// `CLOCK_MONOTONIC`), if it has any.
    pub fn mean_live_age_us(&self, now_us: u64) -> Option<u64> {
        let live = self.live_blocks();
        (live > 0).then(|| (live * now_us).saturating_sub(self.live_birth_us) / live)
    }
}

/// The totals of one process (and probe).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocProcess {
    pub probe_id: u32,
    pub pid: u32,
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    /// Bytes of tracked blocks live now (for a process that exited: when it exited,
    /// leaked), and at most so far.
    pub live_bytes: i64,
    /// For processes retired under one pid ([`Tracer::retire_heap`]: pid 0 past
    /// `--keep-exited`), the highest of their own peaks; [`AllocStats::peak_bytes`] of
    /// their stacks are then the bytes live at that one (those of the other processes
    /// are 0). Bytes live at once in processes that ran at different times would be no
    /// moment of anything.
    pub peak_bytes: i64,
    pub unknown_frees: u64,
}

/// Sizes the heap maps and sets the temporary threshold and sampling, before load. Without
/// the heap programs (`used` false) the maps take one entry each: a hash map's buckets
/// are allocated when it is created (16 MiB for a million live blocks).
pub(crate) fn configure(
    open: &mut OpenTraceSkel<'_>,
    options: &AllocOptions,
    used: bool,
) -> Result<()> {
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .expect("the object has a .rodata section");
    rodata.alloc_temporary_ns = options.temporary_ns;
    rodata.alloc_sample_every = options.sample_every;
    rodata.alloc_sample_bytes = options.sample_bytes;
    rodata.alloc_min_size = options.min_size;
    rodata.alloc_max_size = options.max_size;
    let maps = &mut open.maps;
    for (map, name, entries) in [
        (&mut maps.alloc_live, "alloc_live", options.max_live_blocks),
        (&mut maps.alloc_stats, "alloc_stats", options.max_stacks),
        (&mut maps.alloc_procs, "alloc_procs", options.max_processes),
        (
            &mut maps.alloc_live_filter,
            "alloc_live_filter",
            if options.leaves_out() {
                1 << raw::LIVE_FILTER_BITS
            } else {
                1
            },
        ),
    ] {
        let entries = if used { entries.max(1) } else { 1 };
        map.set_max_entries(entries)
            .map_err(|source| Error::Configure { map: name, source })?;
    }
    Ok(())
}

// Each counter is the header's `enum ct_alloc_counter` value.
crate::layout::check_constants! {
    AllocCounter::UnknownFrees => crate::skel::types::ct_alloc_counter::CT_ALLOC_UNKNOWN_FREES,
    AllocCounter::Failed => crate::skel::types::ct_alloc_counter::CT_ALLOC_FAILED,
    AllocCounter::LiveMapFull => crate::skel::types::ct_alloc_counter::CT_ALLOC_LIVE_FULL,
    AllocCounter::StatsMapFull => crate::skel::types::ct_alloc_counter::CT_ALLOC_STATS_FULL,
    AllocCounter::NoEntry => crate::skel::types::ct_alloc_counter::CT_ALLOC_NO_ENTRY,
    AllocCounter::Reused => crate::skel::types::ct_alloc_counter::CT_ALLOC_REUSED,
    AllocCounter::LogsUnread => crate::skel::types::ct_alloc_counter::CT_ALLOC_LOGS_UNREAD,
}
