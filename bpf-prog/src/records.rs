//! What userspace reads back: counters, stacks, walk errors.

use std::fmt;

use unwind_tables::walk::WalkEnd;
use unwind_tables::UnsupportedReason;

use crate::layout::{self, CtCount, CtCountKey, CtStack};

/// Ways an event lost something (or nearly did), apart from how its walk ended: each is
/// a counter of the `losses` map (`enum ct_loss`), read with [`Tracer::losses`].
///
/// [`Tracer::losses`]: crate::Tracer::losses
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Loss {
    /// The stacks map was full: the event is counted without its stack.
    StackMapFull = 0,
    /// The counts map was full: the event was not counted.
    CountMapFull = 1,
    /// Two distinct stacks had the same hash; the second went to the next slot.
    HashCollision = 2,
    /// The event has no kernel stack: `bpf_get_stack` failed, or the stacks map was full.
    KernelStackLost = 3,
    /// Walks were in progress at every nesting level of the CPU (programs interrupting
    /// each other): the event is counted without its stacks.
    TooNested = 4,
    /// A kernel-mode event inside execve whose user stack could not be walked: the
    /// image that called execve was gone already, or the new one was not registered
    /// yet. Counted with its kernel stack only; not a walk failure (and not a walk).
    InExec = 5,
}

impl Loss {
    /// Entries of the `losses` map.
    pub const COUNT: usize = layout::LOSS_COUNT;

    /// Every value, in index order.
    pub const ALL: [Loss; Loss::COUNT] = [
        Loss::StackMapFull,
        Loss::CountMapFull,
        Loss::HashCollision,
        Loss::KernelStackLost,
        Loss::TooNested,
        Loss::InExec,
    ];

    /// A short lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Loss::StackMapFull => "stack map full",
            Loss::CountMapFull => "count map full",
            Loss::HashCollision => "hash collision",
            Loss::KernelStackLost => "kernel stack lost",
            Loss::TooNested => "too nested",
            Loss::InExec => "in execve",
        }
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// The enum must list the header's values in order.
const _: () = {
    let mut index = 0;
    while index < Loss::COUNT {
        assert!(Loss::ALL[index] as usize == index);
        index += 1;
    }
};

/// How many walks ended each way ([`Tracer::walk_ends`](crate::Tracer::walk_ends)), summed
/// over CPUs: the `walk_ends` map, indexed by `enum ct_walk_end`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkCounters(pub(crate) [u64; layout::walk_end::COUNT]);

impl WalkCounters {
    /// Walks that ended as `end` (any reason, for [`WalkEnd::Unsupported`]).
    pub fn get(&self, end: WalkEnd) -> u64 {
        self.0[usize::from(walk_end_index(end))]
    }

    /// Every walk.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The walks that did not reach the end of the stack, by end (named by
    /// [`WalkEnd::name`]), in the header's order; ends that never happened are left out.
    pub fn failures(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        (1..layout::walk_end::COUNT as u16).filter_map(|index| {
            let count = self.0[usize::from(index)];
            (count > 0).then(|| (walk_end_from_raw(index, 0).name(), count))
        })
    }
}

/// The `enum ct_walk_end` value of `end`.
pub(crate) fn walk_end_index(end: WalkEnd) -> u16 {
    use layout::walk_end;
    match end {
        WalkEnd::Complete => walk_end::COMPLETE,
        WalkEnd::NoProcess => walk_end::NO_PROC,
        WalkEnd::NoMapping => walk_end::NO_MAPPING,
        WalkEnd::NoRow => walk_end::NO_ROW,
        WalkEnd::Unsupported(_) => walk_end::UNSUPPORTED,
        WalkEnd::ReadFault => walk_end::READ_FAULT,
        WalkEnd::DepthCap => walk_end::DEPTH_CAP,
        WalkEnd::BadReturnAddress => walk_end::BAD_RA,
    }
}

/// The walk end a stored stack carries (`ct_stack.error` and `.reason`). A value this
/// build does not know, or an unsupported row without a known reason, reads as
/// [`UnsupportedReason::BadCfi`]: never as a complete stack.
pub(crate) fn walk_end_from_raw(error: u16, reason: u16) -> WalkEnd {
    use layout::walk_end;
    let unsupported = || {
        let reason = u8::try_from(reason)
            .ok()
            .and_then(UnsupportedReason::from_u8)
            .unwrap_or(UnsupportedReason::BadCfi);
        WalkEnd::Unsupported(reason)
    };
    match error {
        walk_end::COMPLETE => WalkEnd::Complete,
        walk_end::NO_PROC => WalkEnd::NoProcess,
        walk_end::NO_MAPPING => WalkEnd::NoMapping,
        walk_end::NO_ROW => WalkEnd::NoRow,
        walk_end::READ_FAULT => WalkEnd::ReadFault,
        walk_end::DEPTH_CAP => WalkEnd::DepthCap,
        walk_end::BAD_RA => WalkEnd::BadReturnAddress,
        _ => unsupported(),
    }
}

/// A user stack as the BPF program stored it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// `pcs[0]` is the pc of the event; the others are return addresses as
    /// read (symbolize them at `pc - 1`), or after a signal frame the
    /// interrupted pc.
    pub pcs: Vec<u64>,
    /// How the walk ended; [`WalkEnd::Complete`] for a complete stack (and for a kernel
    /// stack).
    pub end: WalkEnd,
}

impl Stack {
    pub(crate) fn from_raw(raw: &CtStack) -> Stack {
        let len = (raw.len as usize).min(raw.pcs.len());
        Stack {
            pcs: raw.pcs[..len].to_vec(),
            end: walk_end_from_raw(raw.error, raw.reason),
        }
    }

    /// Whether the walk reached the end of the stack.
    pub fn is_complete(&self) -> bool {
        self.end == WalkEnd::Complete
    }
}

/// The user stack an event was counted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StackRef {
    /// No user stack was walked (a kernel thread, a counting-only probe).
    None,
    /// The stack was walked but the stacks map had no room for it
    /// ([`Loss::StackMapFull`] counts these).
    NotStored,
    /// The key of the stack in the stacks map: see [`Tracer::stack`](crate::Tracer::stack).
    Hash(u64),
}

impl StackRef {
    /// The stack of a key the BPF program wrote (`ct_count_key.stack_hash`).
    pub(crate) fn from_raw(key: u64) -> StackRef {
        match key {
            layout::STACK_NONE => StackRef::None,
            layout::STACK_NOT_STORED => StackRef::NotStored,
            hash => StackRef::Hash(hash),
        }
    }
}

/// The aggregation key: one counter per (probe, process, user stack, kernel stack).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CountKey {
    /// The probe's attach cookie.
    pub probe_id: u32,
    /// Thread group id (what userspace calls the pid).
    pub pid: u32,
    pub stack: StackRef,
    /// Key of the kernel stack in the stacks map (see
    /// [`Tracer::kernel_stack`](crate::Tracer::kernel_stack)), for events that fired in
    /// kernel mode.
    pub kernel_stack: Option<u64>,
}

impl CountKey {
    pub(crate) fn from_raw(raw: &CtCountKey) -> CountKey {
        CountKey {
            probe_id: raw.probe_id,
            pid: raw.pid,
            stack: StackRef::from_raw(raw.stack_hash),
            kernel_stack: match raw.kstack_hash {
                layout::STACK_NONE | layout::STACK_NOT_STORED => None,
                hash => Some(hash),
            },
        }
    }
}

/// What was counted under one key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Count {
    pub events: u64,
    /// The sum of a probe-defined amount per event (e.g. bytes allocated); 0 unless the
    /// program adds one.
    pub amount: u64,
}

impl From<CtCount> for Count {
    fn from(raw: CtCount) -> Count {
        Count {
            events: raw.events,
            amount: raw.amount,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_have_report_names() {
        let names: Vec<String> = Loss::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "stack map full",
                "count map full",
                "hash collision",
                "kernel stack lost",
                "too nested",
                "in execve",
            ]
        );
    }

    #[test]
    fn walk_ends_round_trip_through_the_kernel_encoding() {
        let mut ends = vec![
            WalkEnd::Complete,
            WalkEnd::NoProcess,
            WalkEnd::NoMapping,
            WalkEnd::NoRow,
            WalkEnd::ReadFault,
            WalkEnd::DepthCap,
            WalkEnd::BadReturnAddress,
        ];
        ends.extend(UnsupportedReason::ALL.map(WalkEnd::Unsupported));
        let mut indexes = std::collections::BTreeSet::new();
        for end in ends {
            let reason = match end {
                WalkEnd::Unsupported(reason) => reason as u16,
                _ => 0,
            };
            let index = walk_end_index(end);
            assert_eq!(walk_end_from_raw(index, reason), end);
            indexes.insert(index);
        }
        assert_eq!(indexes.len(), layout::walk_end::COUNT, "one index per kind");
        assert_eq!(
            walk_end_from_raw(layout::walk_end::COUNT as u16, 0),
            WalkEnd::Unsupported(UnsupportedReason::BadCfi)
        );
        let mut counters = WalkCounters::default();
        counters.0[usize::from(layout::walk_end::READ_FAULT)] = 3;
        counters.0[usize::from(layout::walk_end::COMPLETE)] = 5;
        assert_eq!(counters.total(), 8);
        assert_eq!(counters.get(WalkEnd::ReadFault), 3);
        assert_eq!(counters.failures().collect::<Vec<_>>(), [("read fault", 3)]);
    }

    #[test]
    fn raw_stack_keeps_its_frames_and_reason() {
        let mut raw = Box::new(CtStack {
            check: 1,
            len: 3,
            error: layout::walk_end::UNSUPPORTED,
            reason: UnsupportedReason::CfaRegister as u16,
            pcs: [0; layout::MAX_FRAMES],
        });
        raw.pcs[..4].copy_from_slice(&[10, 20, 30, 40]);
        let stack = Stack::from_raw(&raw);
        assert_eq!(stack.pcs, [10, 20, 30]);
        assert_eq!(
            stack.end,
            WalkEnd::Unsupported(UnsupportedReason::CfaRegister)
        );
        assert!(!stack.is_complete());

        raw.len = u32::MAX; // never trust a length from the kernel blindly
        raw.error = 0;
        let stack = Stack::from_raw(&raw);
        assert_eq!(stack.pcs.len(), layout::MAX_FRAMES);
        assert!(stack.is_complete());
    }

    #[test]
    fn count_keys_decode_the_reserved_values() {
        let raw = |stack_hash, kstack_hash| CtCountKey {
            stack_hash,
            kstack_hash,
            pid: 5,
            probe_id: 6,
        };
        assert_eq!(CountKey::from_raw(&raw(0, 0)).stack, StackRef::None);
        assert_eq!(CountKey::from_raw(&raw(0, 0)).kernel_stack, None);
        assert_eq!(CountKey::from_raw(&raw(1, 1)).stack, StackRef::NotStored);
        assert_eq!(CountKey::from_raw(&raw(1, 1)).kernel_stack, None);
        let key = CountKey::from_raw(&raw(0xfeed, 0xbeef));
        assert_eq!(key.stack, StackRef::Hash(0xfeed));
        assert_eq!(key.kernel_stack, Some(0xbeef));
        assert_eq!((key.pid, key.probe_id), (5, 6));
    }
}
