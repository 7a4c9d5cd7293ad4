//! What the kernel counted, read out of the tracer's maps as the seam's values: frames
//! typed, counters named.

use anyhow::{Context, Result};
use bpf_prog::{AllocCounter, Frame, Loss, StackRef, Tracer};

use crate::alloc::MAPPED;
use crate::collect::{
    Collected, Estimated, EventCount, HeapCollected, HeapCount, HeapStats, UserFrame, UserStack,
    Walks,
};
use crate::frame::ObjectId;
use crate::limits::{self, Limit};
use crate::probe::Probe;
use crate::settings::HeapSettings;

/// Events that had no user stack to walk, by what they are: not walks, and not losses.
const NO_USER_STACK: [Loss; 3] = [Loss::Exiting, Loss::KernelThread, Loss::TargetElsewhere];

/// Everything the kernel counted so far.
/// `heap`: the heap's settings, if it counts the heap probes.
pub fn collected(
    tracer: &Tracer,
    probes: &[Probe],
    heap: Option<&HeapSettings>,
) -> Result<Collected> {
    let events = event_counts(tracer, probes)?;
    let heap = match heap {
        Some(heap) if probes.iter().any(Probe::is_heap) => Some(heap_collected(tracer, heap)?),
        _ => None,
    };
    let walk_ends = tracer.walk_ends().context("reading the walk counters")?;
    let losses = tracer.losses().context("reading the loss counters")?;
    let mut limits = limits::Counts::new();
    for loss in Loss::ALL {
        if loss != Loss::InExec && !NO_USER_STACK.contains(&loss) {
            *limits.entry(Limit::Loss(loss)).or_default() += losses[loss as usize];
        }
    }
    Ok(Collected {
        events,
        heap,
        walks: Walks {
            failures: walk_ends
                .failures()
                .map(|(name, count)| (name.to_string(), count))
                .collect(),
            total: walk_ends.total(),
            memo_hits: tracer.memo_hits().unwrap_or(0),
        },
        losses: limits,
        in_exec: losses[Loss::InExec as usize],
        no_user_stack: NO_USER_STACK
            .iter()
            .filter(|loss| losses[**loss as usize] > 0)
            .map(|loss| (loss.name().to_string(), losses[*loss as usize]))
            .collect(),
        merged_processes: 0,
        parents: tracer.parents(),
        warnings: Vec::new(),
        allocators: Vec::new(),
    })
}

/// Every counter of the event probes with its stacks.
fn event_counts(tracer: &Tracer, probes: &[Probe]) -> Result<Vec<EventCount>> {
    let counts = tracer.counts().context("reading the event counts")?;
    let mut events = Vec::with_capacity(counts.len());
    for (key, count) in counts {
        let mut user = user_stack(tracer, key.stack)?;
        let kernel = match key.kernel_stack {
            Some(id) => tracer.kernel_stack(id).unwrap_or_default(),
            None => Vec::new(),
        };
        let probe = key.probe_id as usize;
        // An interval firing without stacks: the target ran on another CPU than the
        // timer's (or was between two of its threads' runs).
        let interval = probes.get(probe).is_some_and(Probe::is_interval);
        if interval && key.stack == StackRef::None && kernel.is_empty() {
            user.truncated = Some(Loss::TargetElsewhere.name().to_string());
        }
        events.push(EventCount {
            probe,
            pid: key.pid,
            user,
            kernel,
            events: count.events,
            amount: count.amount,
        });
    }
    Ok(events)
}

/// The heap statistics of every stack, the processes' totals and the heap's counters.
fn heap_collected(tracer: &Tracer, settings: &HeapSettings) -> Result<HeapCollected> {
    let counters = tracer
        .alloc_counters()
        .context("reading the heap counters")?;
    let processes: Vec<profile::HeapProcess> = tracer
        .alloc_processes()
        .context("reading the heap totals")?
        .into_iter()
        .map(|p| profile::HeapProcess {
            probe: p.probe_id as usize,
            pid: p.pid,
            allocs: p.allocs,
            bytes: p.bytes,
            frees: p.frees,
            freed_bytes: p.freed_bytes,
            live_bytes: p.live_bytes,
            peak_bytes: p.peak_bytes,
            unknown_frees: p.unknown_frees,
        })
        .collect();
    let mut stacks = heap_stacks(tracer)?;
    if !settings.sampling() {
        for count in &mut stacks {
            count.stats.estimated = None;
        }
    }
    // Mappings counted apart (`alloc::MAPPED` in their probe id) are no heap blocks.
    stacks.retain(|count| count.probe & MAPPED as usize == 0);
    let (mapped, processes): (Vec<profile::HeapProcess>, Vec<profile::HeapProcess>) = processes
        .into_iter()
        .partition(|p: &profile::HeapProcess| p.probe & MAPPED as usize != 0);
    let mapped = (!settings.count_mmap).then(|| profile::MappedMemory {
        counted: false,
        processes: mapped
            .iter()
            .map(|p| profile::MappedProcess {
                pid: p.pid,
                maps: p.allocs,
                bytes: p.bytes,
                unmaps: p.frees,
                unmapped_bytes: p.freed_bytes,
                live_bytes: p.live_bytes,
            })
            .collect(),
    });
    Ok(HeapCollected {
        stacks,
        processes,
        lost: limits::reported(
            &AllocCounter::ALL
                .iter()
                .map(|c| (Limit::Heap(*c), counters[*c as usize]))
                .collect(),
        ),
        now_ns: bpf_prog::monotonic_ns(),
        mapped,
        in_process: None,
    })
}

/// The heap statistics of every stack as of now.
pub fn heap_stacks(tracer: &Tracer) -> Result<Vec<HeapCount>> {
    let mut stacks = Vec::new();
    for (key, stats) in tracer
        .alloc_stats()
        .context("reading the heap statistics")?
    {
        stacks.push(HeapCount {
            probe: key.probe_id as usize,
            pid: key.pid,
            user: user_stack(tracer, key.stack)?,
            stats: HeapStats {
                allocs: stats.allocs,
                bytes: stats.bytes,
                frees: stats.frees,
                freed_bytes: stats.freed_bytes,
                temporaries: stats.temporaries,
                untracked: stats.untracked,
                live_blocks: stats.live_blocks(),
                live_bytes: stats.live_bytes,
                live_birth_us: stats.live_birth_us,
                peak_bytes: stats.peak_bytes,
                size_hist: stats.size_hist.to_vec(),
                life_hist: stats.life_hist.to_vec(),
                estimated: Some(Estimated {
                    allocs: stats.estimated.allocs,
                    bytes: stats.estimated.bytes,
                    frees: stats.estimated.frees,
                    freed_bytes: stats.estimated.freed_bytes,
                }),
            },
        });
    }
    Ok(stacks)
}

// The heap's histograms as the programs fill them and as the profile names them.
const _: () = assert!(bpf_prog::ALLOC_BUCKETS == profile::heap::BUCKETS);

/// The user stack `stack` refers to, and why it ends early if it does.
fn user_stack(tracer: &Tracer, stack: StackRef) -> Result<UserStack> {
    Ok(match stack {
        StackRef::None => UserStack::default(),
        StackRef::NotStored => UserStack {
            frames: Vec::new(),
            truncated: Some(Loss::StackNotStored.name().to_string()),
        },
        StackRef::Hash(hash) => match tracer.stack(hash).context("reading a stack")? {
            Some(stack) => UserStack {
                truncated: (!stack.is_complete()).then(|| stack.end.to_string()),
                frames: stack.pcs.iter().map(|&raw| user_frame(raw)).collect(),
            },
            None => UserStack {
                frames: Vec::new(),
                truncated: Some(format!("stack lost: {}", Loss::StackRingFull.name())),
            },
        },
    })
}

/// A frame as the walker stored it, typed.
fn user_frame(raw: u64) -> UserFrame {
    match Frame::from_raw(raw) {
        Frame::InObject { object, address } => match ObjectId::new(object.index()) {
            Some(object) => UserFrame::InObject { object, address },
            None => UserFrame::Runtime(address),
        },
        Frame::Runtime(address) => UserFrame::Runtime(address),
    }
}
