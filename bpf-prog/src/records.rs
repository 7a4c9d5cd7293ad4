//! What userspace reads back: counters, stacks, walk errors.

use std::fmt;

use unwind_tables::UnsupportedReason;

use crate::layout::{self, CtCount, CtCountKey, CtStack};

/// How a walk ended, and the other ways an event can lose information.
/// The discriminants are the indexes of the `walk_errors` map (`enum ct_walk_error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WalkError {
    /// The walk reached an end-of-stack rule: the stack is complete.
    Ok = 0,
    /// The process has no registered mappings.
    NoProc = 1,
    /// A pc lies in no registered mapping.
    NoMapping = 2,
    /// A pc lies in a gap of its table, or in a mapping without a table.
    NoRow = 3,
    /// The row covering a pc is marked unsupported.
    Unsupported = 4,
    /// Reading the user stack failed.
    ReadFault = 5,
    /// [`MAX_FRAMES`](crate::MAX_FRAMES) frames and the stack goes on.
    DepthCap = 6,
    /// A return address of 0, or a frame whose CFA did not grow the stack.
    BadReturnAddress = 7,
    /// The stacks map was full: the event is counted without its stack.
    StackMapFull = 8,
    /// The counts map was full: the event was not counted.
    CountMapFull = 9,
    /// Two distinct stacks had the same hash; the second went to the next slot.
    HashCollision = 10,
    /// The event has no kernel stack: `bpf_get_stack` failed, or the stacks map was full.
    KernelStackLost = 11,
    /// Walks were in progress at every nesting level of the CPU (programs interrupting
    /// each other): the event is counted without its user stack.
    TooNested = 12,
    /// A kernel-mode event inside execve whose user stack could not be walked: the
    /// image that called execve was gone already, or the new one was not registered
    /// yet. Counted with its kernel stack only; not a walk failure (and not a walk).
    InExec = 13,
}

impl WalkError {
    /// Entries of the `walk_errors` map.
    pub const COUNT: usize = layout::WALK_ERROR_COUNT;

    /// Every value, in index order.
    pub const ALL: [WalkError; WalkError::COUNT] = [
        WalkError::Ok,
        WalkError::NoProc,
        WalkError::NoMapping,
        WalkError::NoRow,
        WalkError::Unsupported,
        WalkError::ReadFault,
        WalkError::DepthCap,
        WalkError::BadReturnAddress,
        WalkError::StackMapFull,
        WalkError::CountMapFull,
        WalkError::HashCollision,
        WalkError::KernelStackLost,
        WalkError::TooNested,
        WalkError::InExec,
    ];

    pub fn from_index(index: usize) -> Option<WalkError> {
        WalkError::ALL.get(index).copied()
    }

    /// Whether this value ends a walk (the others count events that lost
    /// something after it). Every walk counts exactly one walk end.
    pub fn is_walk_end(self) -> bool {
        (self as usize) < layout::WALK_STOP_COUNT
    }

    /// A short lowercase name for reports, e.g. `[truncated: read fault]`.
    pub fn name(self) -> &'static str {
        match self {
            WalkError::Ok => "complete",
            WalkError::NoProc => "no process",
            WalkError::NoMapping => "no mapping",
            WalkError::NoRow => "no row",
            WalkError::Unsupported => "unsupported rule",
            WalkError::ReadFault => "read fault",
            WalkError::DepthCap => "depth cap",
            WalkError::BadReturnAddress => "bad return address",
            WalkError::StackMapFull => "stack map full",
            WalkError::CountMapFull => "count map full",
            WalkError::HashCollision => "hash collision",
            WalkError::KernelStackLost => "kernel stack lost",
            WalkError::TooNested => "too nested",
            WalkError::InExec => "in execve",
        }
    }
}

impl fmt::Display for WalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<unwind_tables::walk::WalkEnd> for WalkError {
    /// The userspace twin's name for the same walk end.
    fn from(end: unwind_tables::walk::WalkEnd) -> WalkError {
        use unwind_tables::walk::WalkEnd;
        match end {
            WalkEnd::Complete => WalkError::Ok,
            WalkEnd::NoMapping => WalkError::NoMapping,
            WalkEnd::NoRow => WalkError::NoRow,
            WalkEnd::Unsupported(_) => WalkError::Unsupported,
            WalkEnd::ReadFault => WalkError::ReadFault,
            WalkEnd::DepthCap => WalkError::DepthCap,
            WalkEnd::BadReturnAddress => WalkError::BadReturnAddress,
        }
    }
}

// The enum must list the header's values in order.
const _: () = {
    let mut index = 0;
    while index < WalkError::COUNT {
        assert!(WalkError::ALL[index] as usize == index);
        index += 1;
    }
};

/// A user stack as the BPF program stored it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// `pcs[0]` is the pc of the event; the others are return addresses as
    /// read (symbolize them at `pc - 1`), or after a signal frame the
    /// interrupted pc.
    pub pcs: Vec<u64>,
    /// Why the walk ended; [`WalkError::Ok`] for a complete stack.
    pub error: WalkError,
    /// For [`WalkError::Unsupported`]: why the row was marked unsupported.
    pub unsupported: Option<UnsupportedReason>,
}

impl Stack {
    pub(crate) fn from_raw(raw: &CtStack) -> Stack {
        let len = (raw.len as usize).min(raw.pcs.len());
        let error = WalkError::from_index(usize::from(raw.error)).unwrap_or(WalkError::Unsupported);
        let unsupported = (error == WalkError::Unsupported)
            .then(|| {
                u8::try_from(raw.reason)
                    .ok()
                    .and_then(UnsupportedReason::from_u8)
            })
            .flatten();
        Stack {
            pcs: raw.pcs[..len].to_vec(),
            error,
            unsupported,
        }
    }

    /// Whether the walk reached the end of the stack.
    pub fn is_complete(&self) -> bool {
        self.error == WalkError::Ok
    }
}

/// The user stack an event was counted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StackRef {
    /// No user stack was walked (a kernel thread, a counting-only probe).
    None,
    /// The stack was walked but the stacks map had no room for it
    /// ([`WalkError::StackMapFull`] counts these).
    NotStored,
    /// The key of the stack in the stacks map: see [`Tracer::stack`](crate::Tracer::stack).
    Hash(u64),
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
            stack: match raw.stack_hash {
                layout::STACK_NONE => StackRef::None,
                layout::STACK_NOT_STORED => StackRef::NotStored,
                hash => StackRef::Hash(hash),
            },
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
    /// A probe-defined amount (e.g. bytes allocated); 0 unless a program adds it.
    pub bytes: u64,
}

impl From<CtCount> for Count {
    fn from(raw: CtCount) -> Count {
        Count {
            events: raw.events,
            bytes: raw.bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_errors_have_report_names() {
        let names: Vec<String> = WalkError::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "complete",
                "no process",
                "no mapping",
                "no row",
                "unsupported rule",
                "read fault",
                "depth cap",
                "bad return address",
                "stack map full",
                "count map full",
                "hash collision",
                "kernel stack lost",
                "too nested",
                "in execve",
            ]
        );
        assert!(WalkError::BadReturnAddress.is_walk_end());
        assert!(!WalkError::StackMapFull.is_walk_end());
        assert_eq!(WalkError::from_index(WalkError::COUNT), None);
    }

    #[test]
    fn raw_stack_keeps_its_frames_and_reason() {
        let mut raw = Box::new(CtStack {
            check: 1,
            len: 3,
            error: WalkError::Unsupported as u16,
            reason: UnsupportedReason::CfaRegister as u16,
            pcs: [0; layout::MAX_FRAMES],
        });
        raw.pcs[..4].copy_from_slice(&[10, 20, 30, 40]);
        let stack = Stack::from_raw(&raw);
        assert_eq!(stack.pcs, [10, 20, 30]);
        assert_eq!(stack.error, WalkError::Unsupported);
        assert_eq!(stack.unsupported, Some(UnsupportedReason::CfaRegister));
        assert!(!stack.is_complete());

        raw.len = u32::MAX; // never trust a length from the kernel blindly
        raw.error = 0;
        let stack = Stack::from_raw(&raw);
        assert_eq!(stack.pcs.len(), layout::MAX_FRAMES);
        assert_eq!(stack.unsupported, None);
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
