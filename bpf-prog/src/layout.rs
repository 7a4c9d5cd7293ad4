//! Rust mirrors of every struct and constant of `src/bpf/cargo_trace.h`.
//!
//! Each mirror is checked at compile time against the type libbpf-cargo
//! generated from the BPF object's BTF (`skel::types`, i.e. what clang made of
//! the header): same size, alignment and field offsets, same scalar field
//! types, and no padding. Constants are checked against the header's enums,
//! which the BPF program anchors into BTF. Editing the header without this
//! file (or the reverse) therefore fails the build.

use std::mem::{align_of, offset_of, size_of};

use crate::skel::types as c;

/// Frames a stack holds at most (`CT_MAX_FRAMES`).
pub const MAX_FRAMES: usize = 512;
/// Mappings a process may register (`CT_MAX_MAPPINGS`).
pub const MAX_MAPPINGS: usize = 512;
/// log2 of the table page size (`CT_PAGE_SHIFT`), as in `unwind_tables::PAGE_SHIFT`.
pub const PAGE_SHIFT: u32 = 16;
/// Frames of a kernel stack (`CT_KSTACK_DEPTH`).
pub const KSTACK_DEPTH: usize = 127;
/// Rows per element of the rows map (`CT_ROWS_PER_CHUNK`).
pub const ROWS_PER_CHUNK: usize = 1024;
/// Slots a stack may take after hash collisions (`CT_STACK_SLOTS`).
pub const STACK_SLOTS: u64 = 4;
/// Bytes of user stack a page slot of the walk holds at most (`CT_USER_PAGE_SIZE`).
pub const USER_PAGE_SIZE: usize = 4096;
/// Pages of user stack cached per walk (`CT_PAGE_SLOTS`).
pub const PAGE_SLOTS: usize = 8;
/// Walks in progress at once on one CPU (`CT_NEST_LEVELS`), each with its own page slots.
pub const NEST_LEVELS: usize = 4;
/// Entries of the rule cache per CPU (`CT_RULE_CACHE_SLOTS`).
pub const RULE_CACHE_SLOTS: usize = 4096;
/// Entries of the cache of known stacks per CPU (`CT_KNOWN_CACHE_SLOTS`).
pub const KNOWN_CACHE_SLOTS: usize = 4096;
/// Sets of the walk memo per CPU (`CT_MEMO_SETS`).
pub const MEMO_SETS: usize = 16;
/// Entries of a set of the walk memo (`CT_MEMO_WAYS`).
pub const MEMO_WAYS: usize = 4;
/// Words of user memory a remembered walk may have read (`CT_MEMO_WORDS`).
pub const MEMO_WORDS: usize = 256;
/// Words from the lowest to the highest a remembered walk read, at most
/// (`CT_MEMO_SPAN_WORDS`): a page_cache element's.
pub const MEMO_SPAN_WORDS: usize = USER_PAGE_SIZE * PAGE_SLOTS / 8;
/// Words above rsp a remembered walk's reads start below (`CT_MEMO_REACH`).
pub const MEMO_REACH: usize = 1 << 16;
/// Bytes past its row's start the last push/pop step of a row may lie (`CT_STEP_WINDOW`),
/// as in `unwind_tables::rule::STEP_WINDOW`.
pub const STEP_WINDOW: u32 = 16;

/// Bytes of the `new_images` ring buffer for `processes` traced at once: a stopped process
/// waits for userspace with one report in it (a pid behind the ring's 8-byte header, 16
/// bytes), and sends no other until it is continued. A power of 2 from 64 KiB (a
/// multiple of any page size, as ring buffers must be) to 1 GiB.
pub fn new_images_ring_bytes(processes: u32) -> u32 {
    const REPORT_BYTES: u64 = 16;
    (u64::from(processes) * REPORT_BYTES)
        .next_power_of_two()
        .clamp(64 << 10, 1 << 30) as u32
}

/// `ct_count_key.stack_hash` of an event whose user stack was not walked.
pub const STACK_NONE: u64 = 0;
/// The cookie of `on_start_main` on `__libc_start_main` (`CT_START_MAIN_COOKIE`, a
/// `#define`, so not checked against the header); on ld.so's `_dl_debug_state` its cookie is
/// `_r_debug`'s address minus `_dl_debug_state`'s.
pub const START_MAIN_COOKIE: u64 = u64::MAX;
/// `ct_count_key.stack_hash` of an event whose stack found its keys held by colliding stacks.
pub const STACK_NOT_STORED: u64 = 1;

/// `enum ct_rule_kind`, `enum ct_rbp_kind` and `enum ct_reg`: the numbers of
/// [`unwind_tables::rule::EncodedRule`], checked against the header below.
pub use unwind_tables::rule::encoded::{kind as rule_kind, rbp as rbp_kind, reg};

/// `enum ct_sigframe`: ucontext offsets, the same as `unwind_tables::rule::sigframe`.
pub mod sigframe {
    pub const RBP: u64 = 120;
    pub const RSP: u64 = 160;
    pub const RIP: u64 = 168;
}

/// `CT_MAPPING_NO_TABLE`.
pub const MAPPING_NO_TABLE: u32 = 1;

/// `CT_FRAME_IN_OBJECT`: set in a stored user frame that is an object's ELF address
/// (see [`Frame`](crate::Frame)). A `#define` (an enum cannot hold it), so unchecked.
pub const FRAME_IN_OBJECT: u64 = 1 << 63;
/// `CT_FRAME_OBJECT_SHIFT`: where the object id starts in such a frame.
pub const FRAME_OBJECT_SHIFT: u32 = 48;
/// `CT_MAX_OBJECTS`: object ids are below this.
pub const MAX_OBJECTS: u32 = 1 << 15;

/// `enum ct_walk_end`: `ct_stack.error`, and the index of the walk_ends map.
pub mod walk_end {
    pub const COMPLETE: u16 = 0;
    pub const NO_PROC: u16 = 1;
    pub const NO_MAPPING: u16 = 2;
    pub const NO_ROW: u16 = 3;
    pub const UNSUPPORTED: u16 = 4;
    pub const READ_FAULT: u16 = 5;
    pub const DEPTH_CAP: u16 = 6;
    pub const BAD_RA: u16 = 7;
    /// Entries of the walk_ends map (`CT_WALK_END_COUNT`).
    pub const COUNT: usize = 8;
}

/// Entries of the losses map (`CT_LOSS_COUNT`), indexed by [`Loss`](crate::Loss).
pub const LOSS_COUNT: usize = 16;

/// `enum ct_record_kind`: the first 4 bytes of a record of the records ring buffer.
pub mod record_kind {
    /// A [`CtStack`](super::CtStack) cut to its frames.
    pub const STACK: u32 = 1;
    /// A [`CtCountRecord`](super::CtCountRecord).
    pub const COUNT: u32 = 2;
}

/// Asserts at compile time that each Rust constant (or enum value) equals its C one.
macro_rules! check_constants {
    ($($rust:expr => $c:expr),* $(,)?) => {
        const _: () = {
            $(assert!($rust as u64 == $c.0 as u64);)*
        };
    };
}
pub(crate) use check_constants;

check_constants! {
    MAX_FRAMES => c::ct_limits::CT_MAX_FRAMES,
    MAX_MAPPINGS => c::ct_limits::CT_MAX_MAPPINGS,
    PAGE_SHIFT => c::ct_limits::CT_PAGE_SHIFT,
    KSTACK_DEPTH => c::ct_limits::CT_KSTACK_DEPTH,
    ROWS_PER_CHUNK => c::ct_limits::CT_ROWS_PER_CHUNK,
    STACK_SLOTS => c::ct_limits::CT_STACK_SLOTS,
    USER_PAGE_SIZE => c::ct_limits::CT_USER_PAGE_SIZE,
    PAGE_SLOTS => c::ct_limits::CT_PAGE_SLOTS,
    NEST_LEVELS => c::ct_limits::CT_NEST_LEVELS,
    RULE_CACHE_SLOTS => c::ct_limits::CT_RULE_CACHE_SLOTS,
    KNOWN_CACHE_SLOTS => c::ct_limits::CT_KNOWN_CACHE_SLOTS,
    STEP_WINDOW => c::ct_limits::CT_STEP_WINDOW,
    MEMO_SETS => c::ct_limits::CT_MEMO_SETS,
    MEMO_WAYS => c::ct_limits::CT_MEMO_WAYS,
    MEMO_WORDS => c::ct_limits::CT_MEMO_WORDS,
    MEMO_SPAN_WORDS => c::ct_limits::CT_MEMO_SPAN_WORDS,
    MEMO_REACH => c::ct_limits::CT_MEMO_REACH,
    STACK_NONE => c::ct_stack_key::CT_STACK_NONE,
    STACK_NOT_STORED => c::ct_stack_key::CT_STACK_NOT_STORED,
    rule_kind::GAP => c::ct_rule_kind::CT_RULE_GAP,
    rule_kind::CFA_RSP => c::ct_rule_kind::CT_RULE_CFA_RSP,
    rule_kind::CFA_RBP => c::ct_rule_kind::CT_RULE_CFA_RBP,
    rule_kind::PLT => c::ct_rule_kind::CT_RULE_PLT,
    rule_kind::CFA_DEREF => c::ct_rule_kind::CT_RULE_CFA_DEREF,
    rule_kind::END => c::ct_rule_kind::CT_RULE_END,
    rule_kind::SIGNAL => c::ct_rule_kind::CT_RULE_SIGNAL,
    rule_kind::UNSUPPORTED => c::ct_rule_kind::CT_RULE_UNSUPPORTED,
    rule_kind::CFA_RSP_STEPS => c::ct_rule_kind::CT_RULE_CFA_RSP_STEPS,
    rule_kind::RETURN_IN_RDI => c::ct_rule_kind::CT_RULE_RETURN_IN_RDI,
    rbp_kind::SAME => c::ct_rbp_kind::CT_RBP_SAME,
    rbp_kind::AT_CFA => c::ct_rbp_kind::CT_RBP_AT_CFA,
    rbp_kind::AT_RBP => c::ct_rbp_kind::CT_RBP_AT_RBP,
    reg::RBP => c::ct_reg::CT_REG_RBP,
    reg::RSP => c::ct_reg::CT_REG_RSP,
    sigframe::RBP => c::ct_sigframe::CT_SIGFRAME_RBP,
    sigframe::RSP => c::ct_sigframe::CT_SIGFRAME_RSP,
    sigframe::RIP => c::ct_sigframe::CT_SIGFRAME_RIP,
    MAPPING_NO_TABLE => c::ct_mapping_flags::CT_MAPPING_NO_TABLE,
    FRAME_OBJECT_SHIFT => c::ct_frame::CT_FRAME_OBJECT_SHIFT,
    MAX_OBJECTS => c::ct_frame::CT_MAX_OBJECTS,
    walk_end::COMPLETE => c::ct_walk_end::CT_WALK_COMPLETE,
    walk_end::NO_PROC => c::ct_walk_end::CT_WALK_NO_PROC,
    walk_end::NO_MAPPING => c::ct_walk_end::CT_WALK_NO_MAPPING,
    walk_end::NO_ROW => c::ct_walk_end::CT_WALK_NO_ROW,
    walk_end::UNSUPPORTED => c::ct_walk_end::CT_WALK_UNSUPPORTED,
    walk_end::READ_FAULT => c::ct_walk_end::CT_WALK_READ_FAULT,
    walk_end::DEPTH_CAP => c::ct_walk_end::CT_WALK_DEPTH_CAP,
    walk_end::BAD_RA => c::ct_walk_end::CT_WALK_BAD_RA,
    walk_end::COUNT => c::ct_walk_end::CT_WALK_END_COUNT,
    LOSS_COUNT => c::ct_loss::CT_LOSS_COUNT,
    record_kind::STACK => c::ct_record_kind::CT_RECORD_STACK,
    record_kind::COUNT => c::ct_record_kind::CT_RECORD_COUNT,
}

// The walk contract is shared with the userspace twin: its constants must agree.
const _: () = {
    assert!(PAGE_SHIFT == unwind_tables::PAGE_SHIFT);
    assert!(MAX_FRAMES == unwind_tables::walk::MAX_FRAMES);
    assert!(STEP_WINDOW == unwind_tables::rule::STEP_WINDOW);
    // CT_UNSUPPORTED_RETURN_ADDRESS, a #define of the header.
    assert!(unwind_tables::UnsupportedReason::ReturnAddress as u8 == 5);
    assert!(sigframe::RBP == unwind_tables::rule::sigframe::RBP);
    assert!(sigframe::RSP == unwind_tables::rule::sigframe::RSP);
    assert!(sigframe::RIP == unwind_tables::rule::sigframe::RIP);
};

/// Plain data (`repr(C)`, integers and arrays of them, no padding, any bit pattern
/// valid), copied as bytes: bytemuck's, implemented by [`mirror!`] where it checks so.
pub use bytemuck::{bytes_of, cast_slice as bytes_of_slice, Pod};

/// A `T` read from the first `size_of::<T>()` bytes of `bytes`.
pub fn from_bytes<T: Pod>(bytes: &[u8]) -> Option<T> {
    bytemuck::try_pod_read_unaligned(bytes.get(..size_of::<T>())?).ok()
}

/// Checks a mirror against the generated C type and implements [`Pod`] for it.
///
/// Lists every field with its Rust type; `as T` names the C field's type
/// where it differs (nested structs). The field list must be complete: the
/// sum of the field sizes must equal the struct size (no padding).
macro_rules! mirror {
    ($rust:ident = $c:ident { $($field:ident: $ty:ty $(as $cty:ty)?),* $(,)? }) => {
        const _: () = {
            assert!(size_of::<$rust>() == size_of::<c::$c>());
            assert!(align_of::<$rust>() == align_of::<c::$c>());
            assert!(size_of::<$rust>() == 0 $(+ size_of::<$ty>())*);
            $(assert!(offset_of!($rust, $field) == offset_of!(c::$c, $field));)*
            // Never called: every field's type must be plain data itself.
            #[allow(dead_code)]
            fn fields_are_pod() {
                fn pod<T: Pod>() {}
                $(pod::<$ty>();)*
            }
            // Never called: it only has to type-check.
            #[allow(dead_code)]
            fn field_types(rust: &$rust, c: &c::$c) {
                $(
                    let _: &$ty = &rust.$field;
                    let _: &mirror!(@c_type $ty $(, $cty)?) = &c.$field;
                )*
            }
        };
        // SAFETY: checked above: repr(C), fields of plain data, no padding, so every bit
        // pattern (zero included) is a value.
        unsafe impl bytemuck::Zeroable for $rust {}
        // SAFETY: as above.
        unsafe impl Pod for $rust {}
    };
    (@c_type $ty:ty) => { $ty };
    (@c_type $ty:ty, $cty:ty) => { $cty };
}

/// `struct ct_rule`: one unwinding step, converted from [`unwind_tables::Rule`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtRule {
    pub kind: u8,
    pub cfa_reg: u8,
    pub rbp_kind: u8,
    pub reason: u8,
    pub cfa_off: i32,
    pub rbp_off: i32,
    /// `CFA_DEREF`: the (signed) addend; `CFA_RSP_STEPS`: pushes | pops << 16.
    pub cfa_arg: u32,
}
mirror!(
    CtRule = ct_rule {
        kind: u8,
        cfa_reg: u8,
        rbp_kind: u8,
        reason: u8,
        cfa_off: i32,
        rbp_off: i32,
        cfa_arg: u32,
    }
);

/// `struct ct_row`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtRow {
    pub addr_lo: u16,
    pub rule: u16,
}
mirror!(
    CtRow = ct_row {
        addr_lo: u16,
        rule: u16
    }
);

/// `struct ct_row_chunk`: one element of the rows map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtRowChunk {
    pub rows: [CtRow; ROWS_PER_CHUNK],
}
mirror!(
    CtRowChunk = ct_row_chunk {
        rows: [CtRow; ROWS_PER_CHUNK] as [c::ct_row; ROWS_PER_CHUNK],
    }
);

/// `struct ct_user_page`: one page slot of a walk (BPF-internal).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtUserPage {
    pub words: [u64; USER_PAGE_SIZE / 8],
}
mirror!(
    CtUserPage = ct_user_page {
        words: [u64; USER_PAGE_SIZE / 8]
    }
);

/// `struct ct_user_pages`: one element of the page_cache map, the page slots of one
/// walk (BPF-internal).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtUserPages {
    pub slots: [CtUserPage; PAGE_SLOTS],
}
mirror!(
    CtUserPages = ct_user_pages {
        slots: [CtUserPage; PAGE_SLOTS] as [c::ct_user_page; PAGE_SLOTS],
    }
);

/// `struct ct_rule_cache_entry`: one entry of a CPU's rule cache (BPF-internal).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtRuleCacheEntry {
    pub addr: u64,
    pub generation: u32,
    pub object: u32,
    pub bias: u64,
    pub rule: CtRule,
}
mirror!(
    CtRuleCacheEntry = ct_rule_cache_entry {
        addr: u64,
        generation: u32,
        object: u32,
        bias: u64,
        rule: CtRule as c::ct_rule,
    }
);

/// `struct ct_rule_cache`: one element of the rule_cache map, one CPU's cache
/// (BPF-internal).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtRuleCache {
    pub entries: [CtRuleCacheEntry; RULE_CACHE_SLOTS],
}
mirror!(
    CtRuleCache = ct_rule_cache {
        entries: [CtRuleCacheEntry; RULE_CACHE_SLOTS] as [c::ct_rule_cache_entry; RULE_CACHE_SLOTS],
    }
);

/// `struct ct_known_entry`: a stack a CPU found stored (BPF-internal).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtKnownEntry {
    pub key: u64,
    pub check: u64,
}
mirror!(
    CtKnownEntry = ct_known_entry {
        key: u64,
        check: u64
    }
);

/// `struct ct_known_cache`: one element of the known_cache map, one CPU's cache of known
/// stacks (BPF-internal).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtKnownCache {
    pub entries: [CtKnownEntry; KNOWN_CACHE_SLOTS],
}
mirror!(
    CtKnownCache = ct_known_cache {
        entries: [CtKnownEntry; KNOWN_CACHE_SLOTS] as [c::ct_known_entry; KNOWN_CACHE_SLOTS],
    }
);

/// `struct ct_memo_entry`: a walk remembered by a CPU's walk memo (BPF-internal).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtMemoEntry {
    pub rip: u64,
    pub rsp: u64,
    pub rbp: u64,
    pub trampoline: u64,
    pub key: u64,
    pub tgid: u32,
    pub generation: u32,
    pub nwords: u16,
    pub first: u16,
    pub span: u16,
    pub uses_rbp: u16,
    pub offsets: [u16; MEMO_WORDS],
    pub values: [u64; MEMO_WORDS],
}
mirror!(
    CtMemoEntry = ct_memo_entry {
        rip: u64,
        rsp: u64,
        rbp: u64,
        trampoline: u64,
        key: u64,
        tgid: u32,
        generation: u32,
        nwords: u16,
        first: u16,
        span: u16,
        uses_rbp: u16,
        offsets: [u16; MEMO_WORDS],
        values: [u64; MEMO_WORDS],
    }
);

/// `struct ct_memo_set`: the entries of one set of a CPU's walk memo (BPF-internal).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtMemoSet {
    pub next: u64,
    pub ways: [CtMemoEntry; MEMO_WAYS],
}
mirror!(
    CtMemoSet = ct_memo_set {
        next: u64,
        ways: [CtMemoEntry; MEMO_WAYS] as [c::ct_memo_entry; MEMO_WAYS],
    }
);

/// `struct ct_walk_memo`: one element of the walk_memo map, one CPU's memo (BPF-internal).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtWalkMemo {
    pub sets: [CtMemoSet; MEMO_SETS],
}
mirror!(
    CtWalkMemo = ct_walk_memo {
        sets: [CtMemoSet; MEMO_SETS] as [c::ct_memo_set; MEMO_SETS],
    }
);

/// `struct ct_page`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtPage {
    pub first_row: u32,
    pub nrows: u32,
}
mirror!(
    CtPage = ct_page {
        first_row: u32,
        nrows: u32
    }
);

/// `struct ct_table`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtTable {
    pub first_page: u64,
    pub pages_base: u32,
    pub npages: u32,
    pub rows_base: u32,
    pub nrows: u32,
    pub rules_base: u32,
    pub nrules: u32,
}
mirror!(
    CtTable = ct_table {
        first_page: u64,
        pages_base: u32,
        npages: u32,
        rows_base: u32,
        nrows: u32,
        rules_base: u32,
        nrules: u32,
    }
);

/// `struct ct_mapping`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtMapping {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub table_id: u32,
    pub flags: u32,
    pub object: u32,
    pub pad: u32,
}
mirror!(
    CtMapping = ct_mapping {
        start: u64,
        end: u64,
        bias: u64,
        table_id: u32,
        flags: u32,
        object: u32,
        pad: u32,
    }
);

/// `struct ct_file_key`: a key of the file_objects map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtFileKey {
    pub dev: u64,
    pub inode: u64,
    pub pgoff: u64,
}
mirror!(
    CtFileKey = ct_file_key {
        dev: u64,
        inode: u64,
        pgoff: u64,
    }
);

/// `struct ct_file_object`: a value of the file_objects map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtFileObject {
    pub bias_from_start: u64,
    pub table_id: u32,
    pub flags: u32,
    pub object: u32,
    pub pad: u32,
}
mirror!(
    CtFileObject = ct_file_object {
        bias_from_start: u64,
        table_id: u32,
        flags: u32,
        object: u32,
        pad: u32,
    }
);

/// `struct ct_proc`: the value of the procs map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtProc {
    pub nmappings: u32,
    /// Unique to this set of mappings, never 0 (the rule cache's key).
    pub generation: u32,
    pub mappings: [CtMapping; MAX_MAPPINGS],
}
mirror!(
    CtProc = ct_proc {
        nmappings: u32,
        generation: u32,
        mappings: [CtMapping; MAX_MAPPINGS] as [c::ct_mapping; MAX_MAPPINGS],
    }
);

/// `struct ct_stack`: a stack as the records ring buffer carries it, cut to `len` frames.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtStack {
    pub kind: u32,
    pub len: u32,
    pub key: u64,
    pub check: u64,
    pub error: u16,
    pub reason: u16,
    pub pad: u32,
    pub pcs: [u64; MAX_FRAMES],
}
mirror!(
    CtStack = ct_stack {
        kind: u32,
        len: u32,
        key: u64,
        check: u64,
        error: u16,
        reason: u16,
        pad: u32,
        pcs: [u64; MAX_FRAMES],
    }
);

/// Bytes of a stack record before its frames.
pub const STACK_HEADER_SIZE: usize = offset_of!(CtStack, pcs);

/// `struct ct_count_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtCountKey {
    pub stack_hash: u64,
    pub kstack_hash: u64,
    pub pid: u32,
    pub probe_id: u32,
}
mirror!(
    CtCountKey = ct_count_key {
        stack_hash: u64,
        kstack_hash: u64,
        pid: u32,
        probe_id: u32,
    }
);

/// `struct ct_count`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtCount {
    pub events: u64,
    pub amount: u64,
}
mirror!(
    CtCount = ct_count {
        events: u64,
        amount: u64,
    }
);

/// `struct ct_count_record`: an event the counts map had no room for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtCountRecord {
    pub kind: u32,
    pub pad: u32,
    pub key: CtCountKey,
    pub count: CtCount,
}
mirror!(
    CtCountRecord = ct_count_record {
        kind: u32,
        pad: u32,
        key: CtCountKey as c::ct_count_key,
        count: CtCount as c::ct_count,
    }
);
/// Heap profiling (`alloc.bpf.h`): the header's last section.
pub mod alloc {
    use super::*;

    /// Buckets of a log2 histogram (`CT_ALLOC_BUCKETS`): bucket k holds values of bit
    /// length k (0 for 0), the last one everything longer.
    pub const BUCKETS: usize = 48;
    /// Allocator calls in progress at once on one thread (`CT_ALLOC_NEST`).
    pub const NEST: usize = 8;
    /// An alloc program's cookie is `probe id | kind << KIND_SHIFT` (`CT_ALLOC_KIND_SHIFT`).
    pub const KIND_SHIFT: u32 = 32;
    /// Estimated counts are in 1/2^WEIGHT_SHIFT (`CT_ALLOC_WEIGHT_SHIFT`).
    pub const WEIGHT_SHIFT: u32 = 16;
    /// The live filter of frees has 1 << LIVE_FILTER_BITS slots
    /// (`CT_ALLOC_LIVE_FILTER_BITS`), when some allocations are left out.
    pub const LIVE_FILTER_BITS: u32 = 16;

    /// `enum ct_alloc_kind`: where a function's size and addresses are.
    pub mod kind {
        pub const SIZE_ARG0: u32 = 0;
        pub const SIZE_ARG1: u32 = 1;
        pub const CALLOC: u32 = 2;
        pub const REALLOC: u32 = 3;
        pub const REALLOCARRAY: u32 = 4;
        pub const POSIX_MEMALIGN: u32 = 5;
        pub const FREE: u32 = 6;
        pub const MMAP: u32 = 7;
        pub const MUNMAP: u32 = 8;
        pub const XALLOCX: u32 = 9;
        pub const COUNT: u32 = 10;
    }

    /// Entries of the alloc_counters map (`CT_ALLOC_COUNTER_COUNT`), indexed by
    /// [`AllocCounter`](crate::AllocCounter).
    pub const COUNTER_COUNT: usize = 7;
    /// Entries of a thread's free log in the preloaded library (`CT_FREE_LOG`).
    pub const FREE_LOG: usize = 16;

    check_constants! {
        BUCKETS => c::ct_alloc_limits::CT_ALLOC_BUCKETS,
        NEST => c::ct_alloc_limits::CT_ALLOC_NEST,
        KIND_SHIFT => c::ct_alloc_limits::CT_ALLOC_KIND_SHIFT,
        WEIGHT_SHIFT => c::ct_alloc_limits::CT_ALLOC_WEIGHT_SHIFT,
        LIVE_FILTER_BITS => c::ct_alloc_limits::CT_ALLOC_LIVE_FILTER_BITS,
        FREE_LOG => c::ct_alloc_limits::CT_FREE_LOG,
        kind::SIZE_ARG0 => c::ct_alloc_kind::CT_ALLOC_SIZE_ARG0,
        kind::SIZE_ARG1 => c::ct_alloc_kind::CT_ALLOC_SIZE_ARG1,
        kind::CALLOC => c::ct_alloc_kind::CT_ALLOC_CALLOC,
        kind::REALLOC => c::ct_alloc_kind::CT_ALLOC_REALLOC,
        kind::REALLOCARRAY => c::ct_alloc_kind::CT_ALLOC_REALLOCARRAY,
        kind::POSIX_MEMALIGN => c::ct_alloc_kind::CT_ALLOC_POSIX_MEMALIGN,
        kind::FREE => c::ct_alloc_kind::CT_ALLOC_FREE,
        kind::MMAP => c::ct_alloc_kind::CT_ALLOC_MMAP,
        kind::MUNMAP => c::ct_alloc_kind::CT_ALLOC_MUNMAP,
        kind::XALLOCX => c::ct_alloc_kind::CT_ALLOC_XALLOCX,
        kind::COUNT => c::ct_alloc_kind::CT_ALLOC_KIND_COUNT,
        COUNTER_COUNT => c::ct_alloc_counter::CT_ALLOC_COUNTER_COUNT,
    }

    /// `struct ct_alloc_key`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct CtAllocKey {
        pub stack: u64,
        pub pid: u32,
        pub probe_id: u32,
    }
    mirror!(
        CtAllocKey = ct_alloc_key {
            stack: u64,
            pid: u32,
            probe_id: u32,
        }
    );

    /// `struct ct_alloc_stats`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct CtAllocStats {
        pub allocs: u64,
        pub bytes: u64,
        pub frees: u64,
        pub freed_bytes: u64,
        pub temporaries: u64,
        pub untracked: u64,
        pub untracked_bytes: u64,
        pub live_bytes: i64,
        pub live_birth_us: u64,
        pub changed_seq: u64,
        pub peak_live_bytes: i64,
        pub est_allocs: u64,
        pub est_bytes: u64,
        pub est_frees: u64,
        pub est_freed_bytes: u64,
        pub size_hist: [u64; BUCKETS],
        pub life_hist: [u64; BUCKETS],
    }
    mirror!(
        CtAllocStats = ct_alloc_stats {
            allocs: u64,
            bytes: u64,
            frees: u64,
            freed_bytes: u64,
            temporaries: u64,
            untracked: u64,
            untracked_bytes: u64,
            live_bytes: i64,
            live_birth_us: u64,
            changed_seq: u64,
            peak_live_bytes: i64,
            est_allocs: u64,
            est_bytes: u64,
            est_frees: u64,
            est_freed_bytes: u64,
            size_hist: [u64; BUCKETS],
            life_hist: [u64; BUCKETS],
        }
    );

    /// `struct ct_alloc_proc_key`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct CtAllocProcKey {
        pub pid: u32,
        pub probe_id: u32,
    }
    mirror!(
        CtAllocProcKey = ct_alloc_proc_key {
            pid: u32,
            probe_id: u32
        }
    );

    /// `struct ct_alloc_proc`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CtAllocProc {
        pub live_bytes: i64,
        pub peak_bytes: i64,
        pub seq: u64,
        pub peak_seq: u64,
        pub allocs: u64,
        pub frees: u64,
        pub bytes: u64,
        pub freed_bytes: u64,
        pub unknown_frees: u64,
        pub pad: u64,
    }
    mirror!(
        CtAllocProc = ct_alloc_proc {
            live_bytes: i64,
            peak_bytes: i64,
            seq: u64,
            peak_seq: u64,
            allocs: u64,
            frees: u64,
            bytes: u64,
            freed_bytes: u64,
            unknown_frees: u64,
            pad: u64,
        }
    );

    /// `struct ct_live_key`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct CtLiveKey {
        pub address: u64,
        pub pid: u32,
        pub pad: u32,
    }
    mirror!(
        CtLiveKey = ct_live_key {
            address: u64,
            pid: u32,
            pad: u32,
        }
    );

    /// `struct ct_live_block`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CtLiveBlock {
        pub size: u64,
        pub stack: u64,
        pub born_ns: u64,
        pub probe_id: u32,
        pub pad: u32,
    }
    mirror!(
        CtLiveBlock = ct_live_block {
            size: u64,
            stack: u64,
            born_ns: u64,
            probe_id: u32,
            pad: u32,
        }
    );

    /// `struct ct_alloc_call` (BPF-internal: task storage).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CtAllocCall {
        pub sp: u64,
        pub size: u64,
        pub stack: u64,
        pub out: u64,
        pub old: u64,
        pub old_block: CtLiveBlock,
        pub kind: u32,
        pub flags: u32,
        pub probe_id: u32,
        pub pad: u32,
    }
    mirror!(
        CtAllocCall = ct_alloc_call {
            sp: u64,
            size: u64,
            stack: u64,
            out: u64,
            old: u64,
            old_block: CtLiveBlock as c::ct_live_block,
            kind: u32,
            flags: u32,
            probe_id: u32,
            pad: u32,
        }
    );

    /// `struct ct_free_entry`: one free of a thread's log.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CtFreeEntry {
        pub address: u64,
        pub ns: u64,
    }
    mirror!(
        CtFreeEntry = ct_free_entry {
            address: u64,
            ns: u64
        }
    );

    /// `struct ct_alloc_thread` (BPF-internal: task storage).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CtAllocThread {
        pub depth: u32,
        pub tgid: u32,
        pub calls: [CtAllocCall; NEST],
        pub free_log: u64,
        pub log_probe_id: u32,
        pub pad: u32,
        pub told: [CtFreeEntry; FREE_LOG],
    }
    mirror!(
        CtAllocThread = ct_alloc_thread {
            depth: u32,
            tgid: u32,
            calls: [CtAllocCall; NEST] as [c::ct_alloc_call; NEST],
            free_log: u64,
            log_probe_id: u32,
            pad: u32,
            told: [CtFreeEntry; FREE_LOG] as [c::ct_free_entry; FREE_LOG],
        }
    );

    /// `enum ct_alloc_call_flags`.
    pub mod call_flags {
        pub const NESTED: u32 = 1;
        pub const OLD_KNOWN: u32 = 2;
        pub const UNSAMPLED: u32 = 4;
    }
    check_constants! {
        call_flags::NESTED => c::ct_alloc_call_flags::CT_CALL_NESTED,
        call_flags::OLD_KNOWN => c::ct_alloc_call_flags::CT_CALL_OLD_KNOWN,
        call_flags::UNSAMPLED => c::ct_alloc_call_flags::CT_CALL_UNSAMPLED,
    }
}

#[cfg(test)]
mod tests {
    use super::new_images_ring_bytes;

    #[test]
    fn new_images_ring_holds_a_report_per_process() {
        // The default 4096 processes: the 64 KiB the ring always had.
        assert_eq!(new_images_ring_bytes(4096), 64 << 10);
        assert_eq!(new_images_ring_bytes(1), 64 << 10);
        assert_eq!(new_images_ring_bytes(100_000), 2 << 20);
        assert_eq!(new_images_ring_bytes(u32::MAX), 1 << 30);
    }
}
