//! What userspace reads back: counters, stacks, walk errors.

use std::fmt;

use unwind_tables::walk::WalkEnd;
use unwind_tables::UnsupportedReason;

use std::mem::offset_of;

use crate::layout::{self, CtCount, CtCountKey, CtCountRecord, CtStack};

/// Ways an event lost something (or nearly did), apart from how its walk ended: each is
/// a counter of the `losses` map (`enum ct_loss`), read with [`Tracer::losses`].
///
/// [`Tracer::losses`]: crate::Tracer::losses
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Loss {
    /// The stack's hash and the keys after it were held by colliding stacks: the event is
    /// counted without its stack ([`StackRef::NotStored`]).
    StackNotStored = 0,
    /// The counts map had no room (or no memory at that moment): the event went through
    /// the records ring buffer instead, and is counted all the same.
    CountMapFull = 1,
    /// Two distinct stacks had the same hash; the second went to the next key.
    HashCollision = 2,
    /// The event has no kernel stack: `bpf_get_stack` failed.
    KernelStackLost = 3,
    /// Walks were in progress at every nesting level of the CPU (programs interrupting
    /// each other): the event is counted without its stacks.
    TooNested = 4,
    /// A kernel-mode event inside execve whose user stack could not be walked: the
    /// image that called execve was gone already, or the new one was not registered
    /// yet. Counted with its kernel stack only; not a walk failure (and not a walk).
    InExec = 5,
    /// The records ring buffer had no room for a new stack: the event is counted under
    /// the stack's key and a later event with the same stack sends it again; a stack
    /// that never arrives is missing from [`Tracer::stack`](crate::Tracer::stack).
    StackRingFull = 6,
    /// The set of known stacks had no room: the stack is sent again each time it is met
    /// (nothing is lost, but the ring buffer carries more).
    KnownStacksFull = 7,
    /// The counts map and the ring buffer were both full: the event was not counted.
    CountLost = 8,
    /// The pid filter was full: a child of a traced process was not followed
    /// ([`Options::max_filtered_pids`](crate::Options::max_filtered_pids)).
    PidFilterFull = 9,
    /// The map of processes' mappings was full: a child could not take its parent's, and
    /// walks end with [`WalkEnd::NoProcess`] until it is registered
    /// ([`Options::max_procs`](crate::Options::max_procs)).
    ProcsFull = 10,
    /// The ring buffer of new images was full: a process that exec'd or loaded libraries
    /// was not stopped for its mappings to be registered; it is found by polling, and its
    /// first walks may end early.
    NewImagesFull = 11,
    /// A kernel-mode event of a process whose memory exit had released already: no user
    /// stack to walk. Counted with its kernel stack only; not a walk.
    Exiting = 12,
    /// A kernel-mode event of a kernel thread: no user stack. Counted with its kernel
    /// stack only; not a walk.
    KernelThread = 13,
    /// An interval timer fired while no traced process ran on its CPU: the firing is the
    /// target's, counted without stacks.
    TargetElsewhere = 14,
    /// A stay off the CPU of a traced thread not counted: the map of threads off the
    /// CPU was full ([`crate::Options::max_off_cpu_threads`]).
    OffCpuFull = 15,
}

impl Loss {
    /// Entries of the `losses` map.
    pub const COUNT: usize = layout::LOSS_COUNT;

    /// Every value, in index order.
    pub const ALL: [Loss; Loss::COUNT] = [
        Loss::StackNotStored,
        Loss::CountMapFull,
        Loss::HashCollision,
        Loss::KernelStackLost,
        Loss::TooNested,
        Loss::InExec,
        Loss::StackRingFull,
        Loss::KnownStacksFull,
        Loss::CountLost,
        Loss::PidFilterFull,
        Loss::ProcsFull,
        Loss::NewImagesFull,
        Loss::Exiting,
        Loss::KernelThread,
        Loss::TargetElsewhere,
        Loss::OffCpuFull,
    ];

    /// A short lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Loss::StackNotStored => "stack not stored",
            Loss::CountMapFull => "count map full",
            Loss::HashCollision => "hash collision",
            Loss::KernelStackLost => "kernel stack lost",
            Loss::TooNested => "too nested",
            Loss::InExec => "in execve",
            Loss::StackRingFull => "stack ring full",
            Loss::KnownStacksFull => "known stacks full",
            Loss::CountLost => "count lost",
            Loss::PidFilterFull => "pid filter full",
            Loss::ProcsFull => "process map full",
            Loss::NewImagesFull => "new images ring full",
            Loss::Exiting => "process exiting",
            Loss::KernelThread => "kernel thread",
            Loss::TargetElsewhere => "not on the interval timer's CPU",
            Loss::OffCpuFull => "off-CPU map full",
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

/// The id of a mapped object, chosen by whoever registers mappings
/// ([`Mapping::object`](crate::mappings::Mapping::object)): user frames in its mappings are stored
/// as addresses in it ([`Frame::InObject`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(u16);

impl ObjectId {
    /// The id `index` (1 up to [`ObjectId::MAX`]), `None` outside that range.
    pub fn new(index: u32) -> Option<ObjectId> {
        (index > 0 && index <= Self::MAX)
            .then(|| ObjectId(u16::try_from(index).expect("below MAX_OBJECTS")))
    }

    /// The largest id.
    pub const MAX: u32 = layout::MAX_OBJECTS - 1;

    pub fn index(self) -> u32 {
        u32::from(self.0)
    }
}

/// One user frame of a stored stack, as the BPF program stores it (`CT_FRAME_IN_OBJECT`).
///
/// A frame the walker found in a registered mapping of an object with an id is its
/// object's ELF address (runtime address minus the mapping's load bias): the same in
/// every process running that code, wherever address-space randomization put it, so
/// that the kernel keeps, and sends, one copy of a stack that many processes meet.
/// Other frames (no mapping, no object id) are runtime addresses of their process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    InObject { object: ObjectId, address: u64 },
    Runtime(u64),
}

impl Frame {
    /// A frame as stored in [`Stack::pcs`].
    pub fn from_raw(raw: u64) -> Frame {
        let object = (raw & !layout::FRAME_IN_OBJECT) >> layout::FRAME_OBJECT_SHIFT;
        match ObjectId::new(object as u32) {
            Some(object) if raw & layout::FRAME_IN_OBJECT != 0 => Frame::InObject {
                object,
                address: raw & ((1 << layout::FRAME_OBJECT_SHIFT) - 1),
            },
            _ => Frame::Runtime(raw),
        }
    }

    /// The frame as [`Stack::pcs`] stores it.
    pub fn to_raw(self) -> u64 {
        match self {
            Frame::InObject { object, address } => {
                layout::FRAME_IN_OBJECT
                    | u64::from(object.index()) << layout::FRAME_OBJECT_SHIFT
                    | address
            }
            Frame::Runtime(address) => address,
        }
    }

    /// The frame's runtime address in a process with these mappings: for a frame in an
    /// object, in the first of the object's mappings that holds it.
    pub fn runtime_address(self, mappings: &[crate::mappings::Mapping]) -> Option<u64> {
        match self {
            Frame::Runtime(address) => Some(address),
            Frame::InObject { object, address } => mappings
                .iter()
                .filter(|m| m.object == Some(object))
                .map(|m| address.wrapping_add(m.bias))
                // a return address may be the end of its mapping
                .find(|&pc| {
                    mappings
                        .iter()
                        .any(|m| m.object == Some(object) && m.start <= pc && pc <= m.end)
                }),
        }
    }
}

/// A user stack as the BPF program stored it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// `pcs[0]` is the pc of the event; the others are return addresses as
    /// read (symbolize them at `pc - 1`), or after a signal frame the
    /// interrupted pc. Each is stored as [`Frame`] says: [`Stack::frames`] reads them.
    pub pcs: Vec<u64>,
    /// How the walk ended; [`WalkEnd::Complete`] for a complete stack (and for a kernel
    /// stack).
    pub end: WalkEnd,
}

impl Stack {
    /// The frames, innermost first.
    pub fn frames(&self) -> impl Iterator<Item = Frame> + '_ {
        self.pcs.iter().map(|&raw| Frame::from_raw(raw))
    }

    /// The frames as runtime addresses of a process with these mappings (a frame of an
    /// object it does not map as 0).
    pub fn runtime_pcs(&self, mappings: &[crate::mappings::Mapping]) -> Vec<u64> {
        self.frames()
            .map(|frame| frame.runtime_address(mappings).unwrap_or(0))
            .collect()
    }

    /// Whether the walk reached the end of the stack.
    pub fn is_complete(&self) -> bool {
        self.end == WalkEnd::Complete
    }
}

/// A record of the records ring buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// A stack sent once: its key, its check (the second hash) and the stack.
    Stack { key: u64, check: u64, stack: Stack },
    /// An event the counts map had no room for.
    Count(CountKey, Count),
}

/// What names a stack record, and how many of its bytes are the record's (the ring
/// buffer's may run past its frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StackHeader {
    pub key: u64,
    pub check: u64,
    pub frames: usize,
    pub bytes: usize,
}

impl Record {
    /// The header of a stack record, if `data` is one whose bytes hold its frames; read
    /// without the frames, which stay where they are.
    pub(crate) fn stack_header(data: &[u8]) -> Option<StackHeader> {
        let u32_at = |at: usize| Some(u32::from_ne_bytes(data.get(at..at + 4)?.try_into().ok()?));
        let u64_at = |at: usize| Some(u64::from_ne_bytes(data.get(at..at + 8)?.try_into().ok()?));
        if u32_at(0)? != layout::record_kind::STACK {
            return None;
        }
        let frames = u32_at(offset_of!(CtStack, len))? as usize;
        let bytes = layout::STACK_HEADER_SIZE + frames * 8;
        if frames > layout::MAX_FRAMES || data.len() < bytes {
            return None;
        }
        Some(StackHeader {
            key: u64_at(offset_of!(CtStack, key))?,
            check: u64_at(offset_of!(CtStack, check))?,
            frames,
            bytes,
        })
    }

    /// Reads a record as the program wrote it; `None` if it is not one (too short, an
    /// unknown kind, a length its bytes do not hold).
    pub(crate) fn parse(data: &[u8]) -> Option<Record> {
        let u16_at = |at: usize| Some(u16::from_ne_bytes(data.get(at..at + 2)?.try_into().ok()?));
        if let Some(header) = Record::stack_header(data) {
            let pcs = data[layout::STACK_HEADER_SIZE..header.bytes]
                .chunks_exact(8)
                .map(|pc| u64::from_ne_bytes(pc.try_into().expect("8 bytes")))
                .collect();
            let end = walk_end_from_raw(
                u16_at(offset_of!(CtStack, error))?,
                u16_at(offset_of!(CtStack, reason))?,
            );
            return Some(Record::Stack {
                key: header.key,
                check: header.check,
                stack: Stack { pcs, end },
            });
        }
        let record = layout::from_bytes::<CtCountRecord>(data)?;
        (record.kind == layout::record_kind::COUNT)
            .then(|| Record::Count(CountKey::from_raw(&record.key), Count::from(record.count)))
    }
}

/// The user stack an event was counted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StackRef {
    /// No user stack was walked (a kernel thread, a counting-only probe).
    None,
    /// The stack was walked but colliding stacks held its keys
    /// ([`Loss::StackNotStored`] counts these).
    NotStored,
    /// The key of the stack: see [`Tracer::stack`](crate::Tracer::stack).
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

    /// The key as the BPF program writes it.
    pub(crate) fn to_raw(self) -> u64 {
        match self {
            StackRef::None => layout::STACK_NONE,
            StackRef::NotStored => layout::STACK_NOT_STORED,
            StackRef::Hash(hash) => hash,
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
    /// Key of the kernel stack (see
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

    /// The key as the BPF program writes it (an unknown kernel stack as none).
    pub(crate) fn to_raw(self) -> CtCountKey {
        CtCountKey {
            stack_hash: self.stack.to_raw(),
            kstack_hash: self.kernel_stack.unwrap_or(layout::STACK_NONE),
            pid: self.pid,
            probe_id: self.probe_id,
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

// Each loss is the header's `enum ct_loss` value.
crate::layout::check_constants! {
    Loss::StackNotStored => crate::skel::types::ct_loss::CT_LOSS_STACK_NOT_STORED,
    Loss::CountMapFull => crate::skel::types::ct_loss::CT_LOSS_COUNT_MAP_FULL,
    Loss::HashCollision => crate::skel::types::ct_loss::CT_LOSS_HASH_COLLISION,
    Loss::KernelStackLost => crate::skel::types::ct_loss::CT_LOSS_KSTACK_LOST,
    Loss::TooNested => crate::skel::types::ct_loss::CT_LOSS_TOO_NESTED,
    Loss::InExec => crate::skel::types::ct_loss::CT_LOSS_IN_EXEC,
    Loss::StackRingFull => crate::skel::types::ct_loss::CT_LOSS_STACK_RING_FULL,
    Loss::KnownStacksFull => crate::skel::types::ct_loss::CT_LOSS_KNOWN_STACKS_FULL,
    Loss::CountLost => crate::skel::types::ct_loss::CT_LOSS_COUNT_LOST,
    Loss::PidFilterFull => crate::skel::types::ct_loss::CT_LOSS_PID_FILTER_FULL,
    Loss::ProcsFull => crate::skel::types::ct_loss::CT_LOSS_PROCS_FULL,
    Loss::NewImagesFull => crate::skel::types::ct_loss::CT_LOSS_NEW_IMAGES_FULL,
    Loss::Exiting => crate::skel::types::ct_loss::CT_LOSS_EXITING,
    Loss::KernelThread => crate::skel::types::ct_loss::CT_LOSS_KERNEL_THREAD,
    Loss::TargetElsewhere => crate::skel::types::ct_loss::CT_LOSS_TARGET_ELSEWHERE,
    Loss::OffCpuFull => crate::skel::types::ct_loss::CT_LOSS_OFF_CPU_FULL,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_in_objects_round_trip_and_runtime_addresses_stay_as_they_are() {
        let object = ObjectId::new(ObjectId::MAX).unwrap();
        let frame = Frame::InObject {
            object,
            address: 0x1234,
        };
        assert_eq!(Frame::from_raw(frame.to_raw()), frame);
        assert_eq!(frame.to_raw() >> 63, 1);
        let runtime = Frame::Runtime(0x7fff_ffff_f000);
        assert_eq!(Frame::from_raw(runtime.to_raw()), runtime);
        assert!(ObjectId::new(0).is_none() && ObjectId::new(ObjectId::MAX + 1).is_none());
        let mapping = crate::mappings::Mapping {
            start: 0x5555_0000,
            end: 0x5556_0000,
            bias: 0x5554_0000,
            table: None,
            object: Some(object),
        };
        assert_eq!(
            Frame::InObject {
                object,
                address: 0x10010,
            }
            .runtime_address(&[mapping]),
            Some(0x5555_0010)
        );
        // A return address may be its mapping's end; an address past it is not the
        // object's there.
        assert_eq!(
            Frame::InObject {
                object,
                address: 0x20000
            }
            .runtime_address(&[mapping]),
            Some(0x5556_0000)
        );
        assert_eq!(
            Frame::InObject {
                object,
                address: 0x30000
            }
            .runtime_address(&[mapping]),
            None
        );
    }

    #[test]
    fn losses_have_report_names() {
        let names: Vec<String> = Loss::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "stack not stored",
                "count map full",
                "hash collision",
                "kernel stack lost",
                "too nested",
                "in execve",
                "stack ring full",
                "known stacks full",
                "count lost",
                "pid filter full",
                "process map full",
                "new images ring full",
                "process exiting",
                "kernel thread",
                "not on the interval timer's CPU",
                "off-CPU map full",
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

    /// The bytes of a stack record as the program sends it: the header, then `len` pcs.
    fn stack_record(raw: &CtStack, frames: usize) -> Vec<u8> {
        let mut bytes = layout::bytes_of(raw)[..layout::STACK_HEADER_SIZE].to_vec();
        bytes.extend(layout::bytes_of_slice(&raw.pcs[..frames]));
        bytes
    }

    #[test]
    fn stack_records_keep_their_frames_and_reason() {
        let mut raw = Box::new(CtStack {
            kind: layout::record_kind::STACK,
            len: 3,
            key: 0xfeed,
            check: 0xc0de,
            error: layout::walk_end::UNSUPPORTED,
            reason: UnsupportedReason::CfaRegister as u16,
            pad: 0,
            pcs: [0; layout::MAX_FRAMES],
        });
        raw.pcs[..4].copy_from_slice(&[10, 20, 30, 40]);
        let Some(Record::Stack { key, check, stack }) = Record::parse(&stack_record(&raw, 3))
        else {
            panic!("not a stack record");
        };
        assert_eq!((key, check), (0xfeed, 0xc0de));
        assert_eq!(stack.pcs, [10, 20, 30]);
        assert_eq!(
            stack.end,
            WalkEnd::Unsupported(UnsupportedReason::CfaRegister)
        );
        assert!(!stack.is_complete());

        // Never trust a length from the kernel blindly.
        assert_eq!(Record::parse(&stack_record(&raw, 2)), None);
        raw.len = u32::MAX;
        assert_eq!(Record::parse(&stack_record(&raw, 4)), None);
        raw.len = 0;
        raw.error = 0;
        let Some(Record::Stack { stack, .. }) = Record::parse(&stack_record(&raw, 0)) else {
            panic!("not a stack record");
        };
        assert!(stack.pcs.is_empty() && stack.is_complete());
        raw.kind = 7;
        assert_eq!(Record::parse(&stack_record(&raw, 0)), None);
        assert_eq!(Record::parse(&[1, 0]), None);
    }

    #[test]
    fn count_records_carry_their_key_and_count() {
        let record = CtCountRecord {
            kind: layout::record_kind::COUNT,
            pad: 0,
            key: CtCountKey {
                stack_hash: 0xabc,
                kstack_hash: 0,
                pid: 5,
                probe_id: 6,
            },
            count: CtCount {
                events: 1,
                amount: 32,
            },
        };
        let Some(Record::Count(key, count)) = Record::parse(layout::bytes_of(&record)) else {
            panic!("not a count record");
        };
        assert_eq!(key.stack, StackRef::Hash(0xabc));
        assert_eq!((key.pid, key.probe_id, key.kernel_stack), (5, 6, None));
        assert_eq!(
            count,
            Count {
                events: 1,
                amount: 32
            }
        );
        assert_eq!(Record::parse(&layout::bytes_of(&record)[..20]), None);
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
