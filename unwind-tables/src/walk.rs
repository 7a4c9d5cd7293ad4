//! The userspace twin of the BPF stack walker.
//!
//! [`walk`] executes compact unwind rules exactly as `bpf-prog`'s program does
//! (the contract is `docs/walk.md`; change both or neither). It is the
//! reference the BPF side is tested against, and it lets the rules be checked
//! on real stacks without root: give it a thread's registers, a way to read
//! the thread's memory and the tables of the objects mapped in its process.
//!
//! Design constraints, shared with the BPF program:
//! - no guessing: a row marked unsupported, an address no table covers or a
//!   failed read ends the walk, and the reason travels with the frames found
//!   so far ([`WalkEnd`]);
//! - the only successful end is an explicit end-of-stack rule
//!   ([`Rule::End`]), never "the return address looked odd";
//! - a return address is looked up at `pc - 1`, because a call that ends its
//!   function (e.g. to a `noreturn` callee) returns past the function's last
//!   byte, into the next function's rows.

use crate::rule::{rsp_steps_offset, sigframe, Cfa, RbpRule, Reg, Rule, UnsupportedReason};
use crate::table::CompactTable;

/// Frames the BPF program records at most (`CT_MAX_FRAMES`).
pub const MAX_FRAMES: usize = 512;

/// The registers the walk starts from: those of the interrupted user thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Registers {
    pub rip: u64,
    pub rsp: u64,
    pub rbp: u64,
    /// Known at the first frame only (a [`Rule::ReturnInRdi`] needs it), `None` after.
    pub rdi: Option<u64>,
}

/// Reads the walked thread's memory, as `bpf_probe_read_user` does.
pub trait Memory {
    /// The little-endian u64 at `addr`, or `None` when it cannot be read.
    fn read_u64(&self, addr: u64) -> Option<u64>;
}

impl<M: Memory + ?Sized> Memory for &M {
    fn read_u64(&self, addr: u64) -> Option<u64> {
        (**self).read_u64(addr)
    }
}

/// One executable mapping of the walked process.
#[derive(Clone, Copy, Debug)]
pub struct Mapping<'t> {
    /// Runtime address range `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// Runtime address minus ELF virtual address (the table is by ELF address).
    pub bias: u64,
    /// The unwind table of the mapped object. An object without one (JIT code)
    /// can be given an empty table: every pc in it then ends the walk with
    /// [`WalkEnd::NoRow`].
    pub table: &'t CompactTable,
}

/// Two mappings given to [`AddressSpace::new`] overlap, or one is empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("mapping {start:#x}-{end:#x} is empty or overlaps another")]
pub struct BadMapping {
    pub start: u64,
    pub end: u64,
}

/// The executable mappings of one process, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct AddressSpace<'t> {
    mappings: Vec<Mapping<'t>>,
}

impl<'t> AddressSpace<'t> {
    /// Sorts `mappings`; they must be non-empty and disjoint (as in `/proc/PID/maps`).
    pub fn new(mut mappings: Vec<Mapping<'t>>) -> Result<Self, BadMapping> {
        mappings.sort_by_key(|m| m.start);
        for (index, m) in mappings.iter().enumerate() {
            let overlaps_next = mappings
                .get(index + 1)
                .is_some_and(|next| next.start < m.end);
            if m.start >= m.end || overlaps_next {
                return Err(BadMapping {
                    start: m.start,
                    end: m.end,
                });
            }
        }
        Ok(AddressSpace { mappings })
    }

    pub fn mappings(&self) -> &[Mapping<'t>] {
        &self.mappings
    }

    /// The mapping with `start <= addr < end`.
    pub fn find(&self, addr: u64) -> Option<&Mapping<'t>> {
        let after = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(after.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }
}

/// Why a walk stopped. Only [`WalkEnd::Complete`] means the whole stack was found.
///
/// The one type of walk ends for both walkers: the BPF program stores it with every stack
/// (`bpf_prog::Stack::end`) and counts each kind (`bpf_prog::WalkCounters`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WalkEnd {
    /// An end-of-stack rule was reached (`_start`, a thread's entry).
    Complete,
    /// The process has no registered mappings: the BPF walker only, the twin is always
    /// given an address space.
    NoProcess,
    /// A pc lies in no mapping of the address space.
    NoMapping,
    /// A pc lies in a gap of its object's table (no CFI covers it).
    NoRow,
    /// The row that covers a pc is marked unsupported.
    Unsupported(UnsupportedReason),
    /// A read of the stack (or of a DRAP slot) failed.
    ReadFault,
    /// `max_frames` frames were found and the stack goes on.
    DepthCap,
    /// A return address of 0, or a frame whose CFA did not grow the stack pointer.
    BadReturnAddress,
}

impl WalkEnd {
    /// A short lowercase name for reports, e.g. `[truncated: read fault]`; the reason of
    /// an unsupported rule is left out.
    pub fn name(self) -> &'static str {
        match self {
            WalkEnd::Complete => "complete",
            WalkEnd::NoProcess => "no process",
            WalkEnd::NoMapping => "no mapping",
            WalkEnd::NoRow => "no row",
            WalkEnd::Unsupported(_) => "unsupported rule",
            WalkEnd::ReadFault => "read fault",
            WalkEnd::DepthCap => "depth cap",
            WalkEnd::BadReturnAddress => "bad return address",
        }
    }
}

impl std::fmt::Display for WalkEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalkEnd::Unsupported(reason) => write!(f, "{}: {reason:?}", self.name()),
            _ => f.write_str(self.name()),
        }
    }
}

/// The result of a walk: the frames found, innermost first, and why it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walk {
    /// `frames[0]` is the thread's rip; the others are return addresses as
    /// read from the stack (symbolize them at `pc - 1`), or, after a signal
    /// frame, the interrupted rip (exact).
    pub frames: Vec<u64>,
    pub end: WalkEnd,
}

/// The state carried from one frame to the next.
#[derive(Clone, Copy)]
struct Frame {
    regs: Registers,
    /// `regs.rip` is a current pc (frame 0, or interrupted by a signal), not a return address.
    exact: bool,
}

/// Walks the stack of a thread stopped at `regs` (see `docs/walk.md`).
///
/// At most `max_frames` frames are returned (the BPF program uses
/// [`MAX_FRAMES`]); a stack that goes on ends with [`WalkEnd::DepthCap`].
/// `max_frames` of 0 is treated as 1: the thread's own pc is always a frame.
pub fn walk(
    space: &AddressSpace<'_>,
    regs: Registers,
    memory: &dyn Memory,
    max_frames: usize,
) -> Walk {
    let mut frames = vec![regs.rip];
    let mut frame = Frame { regs, exact: true };
    let end = loop {
        let next = match step(space, frame, memory) {
            Ok(next) => next,
            Err(end) => break end,
        };
        if frames.len() >= max_frames {
            break WalkEnd::DepthCap;
        }
        frames.push(next.regs.rip);
        frame = next;
    };
    Walk { frames, end }
}

/// One step from `frame` to its caller; `Err` is why the walk stops there.
fn step(space: &AddressSpace<'_>, frame: Frame, memory: &dyn Memory) -> Result<Frame, WalkEnd> {
    let pc = frame.regs.rip;
    let lookup = if frame.exact { pc } else { pc.wrapping_sub(1) };
    let mapping = space.find(lookup).ok_or(WalkEnd::NoMapping)?;
    let (rule, row_offset) = mapping
        .table
        .lookup_in_row(lookup.wrapping_sub(mapping.bias));
    let caller = unwind_step(rule, row_offset, frame.regs, memory)?;
    if caller.must_grow && caller.regs.rsp <= frame.regs.rsp {
        return Err(WalkEnd::BadReturnAddress);
    }
    if caller.regs.rip == 0 {
        return Err(WalkEnd::BadReturnAddress);
    }
    Ok(Frame {
        regs: caller.regs,
        exact: caller.exact,
    })
}

/// What one rule says of the caller of a frame: see [`unwind_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The caller's registers (`rdi` unknown: `None`).
    pub regs: Registers,
    /// `regs.rip` is a current pc (after a signal frame), not a return address.
    pub exact: bool,
    /// The rule is an ordinary frame's: the caller's rsp (the CFA) must lie above this
    /// frame's, or the walk stops with [`WalkEnd::BadReturnAddress`].
    pub must_grow: bool,
}

/// The rule semantics of `docs/walk.md`: the caller of the frame at `regs` by `rule`, the
/// rule of its pc, `row_offset` bytes past its row's start (as
/// [`CompactTable::lookup_in_row`] gives it). `Err` for a rule that ends the walk
/// ([`Rule::End`] with [`WalkEnd::Complete`]) or a failed read. The sanity checks on the
/// result (a return address of 0, a stack that did not grow) are the walk's, not the rule's.
pub fn unwind_step(
    rule: Rule,
    row_offset: u32,
    regs: Registers,
    memory: &dyn Memory,
) -> Result<Caller, WalkEnd> {
    let Registers {
        rip: pc,
        rsp,
        rbp,
        rdi,
    } = regs;
    let read = |addr: u64| memory.read_u64(addr).ok_or(WalkEnd::ReadFault);
    let caller = |rip, rsp, rbp, exact, must_grow| Caller {
        regs: Registers {
            rip,
            rsp,
            rbp,
            rdi: None,
        },
        exact,
        must_grow,
    };
    Ok(match rule {
        Rule::Gap => return Err(WalkEnd::NoRow),
        Rule::Unsupported(reason) => return Err(WalkEnd::Unsupported(reason)),
        Rule::End => return Err(WalkEnd::Complete),
        Rule::Signal => caller(
            read(rsp.wrapping_add(sigframe::RIP))?,
            read(rsp.wrapping_add(sigframe::RSP))?,
            read(rsp.wrapping_add(sigframe::RBP))?,
            true,
            false,
        ),
        // The return address already left the stack: the caller's rsp may be this
        // frame's, so the growth check does not apply.
        Rule::ReturnInRdi(offset) => caller(
            rdi.ok_or(WalkEnd::Unsupported(UnsupportedReason::ReturnAddress))?,
            rsp.wrapping_add_signed(offset.into()),
            rbp,
            false,
            false,
        ),
        Rule::Frame { cfa, rbp: rbp_rule } => {
            let cfa = match cfa {
                Cfa::Rsp(offset) => rsp.wrapping_add_signed(offset.into()),
                Cfa::RspSteps {
                    offset,
                    pushes,
                    pops,
                } => rsp.wrapping_add_signed(rsp_steps_offset(offset, pushes, pops, row_offset)),
                Cfa::Rbp(offset) => rbp.wrapping_add_signed(offset.into()),
                // GCC's PLT expression: the second half of each 16-byte PLT
                // entry runs after its `push`, one slot deeper.
                Cfa::Plt { threshold } => {
                    let pushed = if pc & 15 >= u64::from(threshold) {
                        8
                    } else {
                        0
                    };
                    rsp.wrapping_add(8 + pushed)
                }
                Cfa::Deref { reg, offset, add } => {
                    let base = match reg {
                        Reg::Rsp => rsp,
                        Reg::Rbp => rbp,
                    };
                    read(base.wrapping_add_signed(offset.into()))?.wrapping_add_signed(add.into())
                }
            };
            let rip = read(cfa.wrapping_sub(8))?;
            let rbp = match rbp_rule {
                RbpRule::Same => rbp,
                RbpRule::AtCfa(offset) => read(cfa.wrapping_add_signed(offset.into()))?,
                RbpRule::AtRbp(offset) => read(rbp.wrapping_add_signed(offset.into()))?,
            };
            caller(rip, cfa, rbp, false, true)
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Builds a table from `(ELF address, rule)` rows sorted by address, as the compiler does.
    fn build_table(rows: &[(u64, Rule)]) -> CompactTable {
        let table = CompactTable::from_sorted_rows(rows).expect("a valid table");
        table.check().expect("table invariants");
        table
    }

    #[derive(Default)]
    struct FakeMemory(HashMap<u64, u64>);

    impl FakeMemory {
        fn with(mut self, addr: u64, value: u64) -> Self {
            self.0.insert(addr, value);
            self
        }
    }

    impl Memory for FakeMemory {
        fn read_u64(&self, addr: u64) -> Option<u64> {
            self.0.get(&addr).copied()
        }
    }

    const BIAS: u64 = 0x5555_0000_0000;

    fn frame(cfa: Cfa, rbp: RbpRule) -> Rule {
        Rule::Frame { cfa, rbp }
    }

    /// From `pc` (ELF address) with rsp 0x7000, the rule must find the return address at
    /// `cfa - 8`: the walk takes one step, to `_start`-like End code at 0x1010.
    fn assert_one_step_to_end(space: &AddressSpace<'_>, pc: u64, cfa: u64) {
        let memory = FakeMemory::default().with(cfa - 8, BIAS + 0x1010);
        let regs = Registers {
            rip: BIAS + pc,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        let result = walk(space, regs, &memory, MAX_FRAMES);
        assert_eq!(result.frames, vec![BIAS + pc, BIAS + 0x1010], "pc {pc:#x}");
        assert_eq!(result.end, WalkEnd::Complete, "pc {pc:#x}");
    }

    fn space(table: &CompactTable) -> AddressSpace<'_> {
        AddressSpace::new(vec![Mapping {
            start: BIAS + 0x1000,
            end: BIAS + 0x4_0000,
            bias: BIAS,
            table,
        }])
        .unwrap()
    }

    /// A program with three functions:
    /// - `leaf` at 0x1000..0x1100: CFA = rsp+16 after its push of rbp (0x1001),
    ///   rbp saved at CFA-16;
    /// - `mid` at 0x1100..0x1200: CFA = rbp+16 (frame pointer);
    /// - `entry` at 0x1200..0x1300: end of stack.
    fn program() -> CompactTable {
        build_table(&[
            (0x1000, frame(Cfa::Rsp(8), RbpRule::Same)),
            (0x1001, frame(Cfa::Rsp(16), RbpRule::AtCfa(-16))),
            (0x1100, frame(Cfa::Rbp(16), RbpRule::AtCfa(-16))),
            (0x1200, Rule::End),
            (0x1300, Rule::Gap),
        ])
    }

    #[test]
    fn walks_rsp_and_rbp_frames_to_the_end_of_stack() {
        let table = program();
        let space = space(&table);
        // leaf's frame: [rsp] = saved rbp of mid, [rsp+8] = return into mid.
        // mid's frame: rbp = 0x7f00, [rbp] = saved rbp, [rbp+8] = return into entry.
        let memory = FakeMemory::default()
            .with(0x7000, 0x7f00)
            .with(0x7008, BIAS + 0x1150)
            .with(0x7f00, 0x1234)
            .with(0x7f08, BIAS + 0x1210);
        let regs = Registers {
            rip: BIAS + 0x1010,
            rsp: 0x7000,
            rbp: 0xdead,
            rdi: None,
        };
        let result = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(
            result.frames,
            vec![BIAS + 0x1010, BIAS + 0x1150, BIAS + 0x1210]
        );
        assert_eq!(result.end, WalkEnd::Complete);
    }

    #[test]
    fn first_instruction_uses_the_row_at_the_exact_pc() {
        let table = program();
        let space = space(&table);
        // At leaf's first byte nothing is pushed yet: CFA = rsp+8, rbp unchanged.
        let memory = FakeMemory::default()
            .with(0x7000, BIAS + 0x1150)
            .with(0x7f00, 0x1234)
            .with(0x7f08, BIAS + 0x1210);
        let regs = Registers {
            rip: BIAS + 0x1000,
            rsp: 0x7000,
            rbp: 0x7f00,
            rdi: None,
        };
        let result = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(
            result.frames,
            vec![BIAS + 0x1000, BIAS + 0x1150, BIAS + 0x1210]
        );
        assert_eq!(result.end, WalkEnd::Complete);
    }

    #[test]
    fn return_address_is_looked_up_at_pc_minus_one() {
        // `caller` ends with a call to a noreturn function: its return address
        // is the first byte of `entry`, whose rule (End) must not apply.
        let table = build_table(&[
            (0x1000, frame(Cfa::Rsp(8), RbpRule::Same)),  // callee
            (0x1100, frame(Cfa::Rsp(32), RbpRule::Same)), // caller
            (0x1200, Rule::End),                          // next function
            (0x1300, frame(Cfa::Rsp(8), RbpRule::Same)),  // outer
            (0x1400, Rule::End),                          // _start
            (0x1500, Rule::Gap),
        ]);
        let space = space(&table);
        let memory = FakeMemory::default()
            .with(0x7000, BIAS + 0x1200) // callee returns to caller's end
            .with(0x7020, BIAS + 0x1350) // caller returns into outer
            .with(0x7028, BIAS + 0x1410); // outer returns into _start
        let regs = Registers {
            rip: BIAS + 0x1000,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        let result = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(
            result.frames,
            vec![BIAS + 0x1000, BIAS + 0x1200, BIAS + 0x1350, BIAS + 0x1410]
        );
        assert_eq!(result.end, WalkEnd::Complete);

        // The same address as the thread's own pc is exact: End applies.
        let regs = Registers {
            rip: BIAS + 0x1200,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        let result = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(result.frames, vec![BIAS + 0x1200]);
        assert_eq!(result.end, WalkEnd::Complete);
    }

    #[test]
    fn row_from_an_earlier_page_governs_until_the_first_row_of_the_page() {
        // One function spans 0x1_fff0..0x3_0010: page 2 has no row at all and
        // page 3 has one row at 0x3_0010.
        let table = build_table(&[
            (0x1000, Rule::End),
            (0x1_fff0, frame(Cfa::Rsp(24), RbpRule::Same)),
            (0x3_0010, frame(Cfa::Rsp(40), RbpRule::Same)),
            (0x3_0100, Rule::Gap),
        ]);
        let space = space(&table);
        let memory = FakeMemory::default()
            .with(0x7010, BIAS + 0x1010)
            .with(0x7020, BIAS + 0x1010);
        for (pc, cfa) in [
            (0x2_0000, 0x7018),
            (0x2_8000, 0x7018),
            (0x3_0000, 0x7018),
            (0x3_000f, 0x7018),
            (0x3_0010, 0x7028),
        ] {
            assert_one_step_to_end(&space, pc, cfa);
        }
        // Past the last row's gap marker and before the first row: no row.
        for pc in [0x3_0100, 0x3_ffff] {
            let regs = Registers {
                rip: BIAS + pc,
                rsp: 0x7000,
                rbp: 0,
                rdi: None,
            };
            assert_eq!(
                walk(&space, regs, &memory, MAX_FRAMES).end,
                WalkEnd::NoRow,
                "pc {pc:#x}"
            );
        }
        let space = AddressSpace::new(vec![Mapping {
            start: BIAS,
            end: BIAS + 0x4_0000,
            bias: BIAS,
            table: &table,
        }])
        .unwrap();
        let regs = Registers {
            rip: BIAS + 0xfff,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        assert_eq!(
            walk(&space, regs, &memory, MAX_FRAMES),
            Walk {
                frames: vec![BIAS + 0xfff],
                end: WalkEnd::NoRow
            }
        );
    }

    #[test]
    fn plt_rule_switches_at_its_threshold() {
        // A 16-byte PLT entry: `jmp *GOT` at 0..6, `push $n` at 6..11, `jmp PLT0` at 11..16.
        // GCC's expression: CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0).
        let table = build_table(&[
            (0x1000, Rule::End),
            (0x2000, frame(Cfa::Plt { threshold: 11 }, RbpRule::Same)),
            (0x2100, Rule::Gap),
        ]);
        let space = space(&table);
        let memory = FakeMemory::default()
            .with(0x7000, BIAS + 0x1010)
            .with(0x7008, BIAS + 0x1020);
        for (offset, caller) in [
            (0x20, 0x1010),
            (0x26, 0x1010),
            (0x2a, 0x1010),
            (0x2b, 0x1020),
            (0x2f, 0x1020),
        ] {
            let regs = Registers {
                rip: BIAS + 0x2000 + offset,
                rsp: 0x7000,
                rbp: 0,
                rdi: None,
            };
            let result = walk(&space, regs, &memory, MAX_FRAMES);
            assert_eq!(
                result.frames,
                vec![BIAS + 0x2000 + offset, BIAS + caller],
                "offset {offset:#x}"
            );
            assert_eq!(result.end, WalkEnd::Complete);
        }
    }

    #[test]
    fn push_pop_rule_moves_the_cfa_at_each_step() {
        // push %r15 (2 bytes); push %rbx (1 byte); body; … pop %rbx; pop %r15; ret
        let table = build_table(&[
            (0x1000, Rule::End),
            (
                0x2000,
                frame(
                    Cfa::RspSteps {
                        offset: 8,
                        pushes: 0b110,
                        pops: 0,
                    },
                    RbpRule::Same,
                ),
            ),
            (0x2100, Rule::Gap),
            (
                0x2200,
                frame(
                    Cfa::RspSteps {
                        offset: 24,
                        pushes: 0,
                        pops: 0b11,
                    },
                    RbpRule::Same,
                ),
            ),
            (0x2300, Rule::Gap),
        ]);
        let space = space(&table);
        for (pc, cfa) in [
            (0x2000, 0x7008),
            (0x2001, 0x7008),
            (0x2002, 0x7010),
            (0x2003, 0x7018),
            (0x20ff, 0x7018),
            (0x2200, 0x7018),
            (0x2201, 0x7010),
            (0x2202, 0x7008),
            (0x22ff, 0x7008),
        ] {
            assert_one_step_to_end(&space, pc, cfa);
        }
    }

    #[test]
    fn deref_rule_reads_the_cfa_from_the_stack() {
        // A stack-realigning function (DRAP): CFA = *(rbp - 8) + 0, rbp saved at rbp+0.
        let table = build_table(&[
            (0x1000, Rule::End),
            (
                0x2000,
                frame(
                    Cfa::Deref {
                        reg: Reg::Rbp,
                        offset: -8,
                        add: 0,
                    },
                    RbpRule::AtRbp(0),
                ),
            ),
            (
                0x2100,
                frame(
                    Cfa::Deref {
                        reg: Reg::Rsp,
                        offset: 16,
                        add: 8,
                    },
                    RbpRule::Same,
                ),
            ),
            (0x2200, Rule::Gap),
        ]);
        let space = space(&table);
        let memory = FakeMemory::default()
            .with(0x7f00, 0x6666) // saved rbp
            .with(0x7ef8, 0x8000) // DRAP slot: the CFA
            .with(0x7ff8, BIAS + 0x1010);
        let regs = Registers {
            rip: BIAS + 0x2010,
            rsp: 0x7000,
            rbp: 0x7f00,
            rdi: None,
        };
        let walk1 = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(walk1.frames, vec![BIAS + 0x2010, BIAS + 0x1010]);
        assert_eq!(walk1.end, WalkEnd::Complete);

        let memory = FakeMemory::default()
            .with(0x7010, 0x8ff8)
            .with(0x8ff8, BIAS + 0x1010);
        let regs = Registers {
            rip: BIAS + 0x2110,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        let walk2 = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(walk2.frames, vec![BIAS + 0x2110, BIAS + 0x1010]);
        assert_eq!(walk2.end, WalkEnd::Complete);

        // The DRAP slot itself unreadable.
        let regs = Registers {
            rip: BIAS + 0x2010,
            rsp: 0x7000,
            rbp: 0x9f00,
            rdi: None,
        };
        assert_eq!(
            walk(&space, regs, &memory, MAX_FRAMES).end,
            WalkEnd::ReadFault
        );
    }

    #[test]
    fn return_address_in_rdi_is_taken_at_the_first_frame_only() {
        // vfork: `pop %rdi` (0x2000), then CFA = rsp + 0 with the return address in rdi.
        let table = build_table(&[
            (0x1000, Rule::End),
            (0x1100, frame(Cfa::Rsp(8), RbpRule::Same)),
            (0x1200, Rule::Gap),
            (0x2001, Rule::ReturnInRdi(0)),
            (0x2020, Rule::Gap),
        ]);
        let space = space(&table);
        let regs = Registers {
            rip: BIAS + 0x2010,
            rsp: 0x7000,
            rbp: 0,
            rdi: Some(BIAS + 0x1010),
        };
        let first = walk(&space, regs, &FakeMemory::default(), MAX_FRAMES);
        assert_eq!(first.frames, vec![BIAS + 0x2010, BIAS + 0x1010]);
        assert_eq!(first.end, WalkEnd::Complete);

        let unknown = walk(
            &space,
            Registers { rdi: None, ..regs },
            &FakeMemory::default(),
            MAX_FRAMES,
        );
        assert_eq!(unknown.frames, vec![BIAS + 0x2010]);
        assert_eq!(
            unknown.end,
            WalkEnd::Unsupported(UnsupportedReason::ReturnAddress)
        );

        // Reached as a caller, rdi is long gone.
        let memory = FakeMemory::default().with(0x7000, BIAS + 0x2011);
        let regs = Registers {
            rip: BIAS + 0x1100,
            rsp: 0x7000,
            rbp: 0,
            rdi: Some(BIAS + 0x1010),
        };
        let caller = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(caller.frames, vec![BIAS + 0x1100, BIAS + 0x2011]);
        assert_eq!(
            caller.end,
            WalkEnd::Unsupported(UnsupportedReason::ReturnAddress)
        );
    }

    #[test]
    fn signal_frame_resumes_at_the_interrupted_pc_exactly() {
        // __restore_rt at 0x3000; the handler at 0x2000 was called with its
        // return address pointing at __restore_rt. The interrupted pc is the
        // first byte of `entry` (0x1200 in `program`), looked up exactly: End.
        let table = build_table(&[
            (0x1000, frame(Cfa::Rsp(8), RbpRule::Same)),
            (0x1200, Rule::End),
            (0x1300, Rule::Gap),
            (0x2000, frame(Cfa::Rsp(8), RbpRule::Same)),
            (0x2100, Rule::Gap),
            // glibc's FDE for __restore_rt starts one byte early, at a nop,
            // so that the handler's return address looked up at pc - 1 finds it.
            (0x2fff, Rule::Signal),
            (0x3010, Rule::Gap),
        ]);
        let space = space(&table);
        let uc = 0x7008;
        let memory = FakeMemory::default()
            .with(0x7000, BIAS + 0x3000)
            .with(uc + sigframe::RIP, BIAS + 0x1200)
            .with(uc + sigframe::RSP, 0x9000)
            .with(uc + sigframe::RBP, 0x4242);
        let regs = Registers {
            rip: BIAS + 0x2010,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        let walk1 = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(
            walk1.frames,
            vec![BIAS + 0x2010, BIAS + 0x3000, BIAS + 0x1200]
        );
        assert_eq!(walk1.end, WalkEnd::Complete);

        // Interrupted in the middle of `leaf`: its rule applies at the exact
        // pc, with the rsp and rbp of the ucontext. The signal frame may lie
        // above the interrupted stack (sigaltstack): no growth check.
        let memory = FakeMemory::default()
            .with(0x7000, BIAS + 0x3000)
            .with(uc + sigframe::RIP, BIAS + 0x1000)
            .with(uc + sigframe::RSP, 0x6000)
            .with(uc + sigframe::RBP, 0x4242)
            .with(0x6000, BIAS + 0x1201);
        let walk2 = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(
            walk2.frames,
            vec![BIAS + 0x2010, BIAS + 0x3000, BIAS + 0x1000, BIAS + 0x1201]
        );
        assert_eq!(walk2.end, WalkEnd::Complete);

        // A ucontext that cannot be read.
        let memory = FakeMemory::default().with(0x7000, BIAS + 0x3000);
        assert_eq!(
            walk(&space, regs, &memory, MAX_FRAMES).end,
            WalkEnd::ReadFault
        );
    }

    #[test]
    fn each_stop_reason() {
        let table = build_table(&[
            (0x1000, frame(Cfa::Rsp(8), RbpRule::Same)),
            (0x1100, Rule::Unsupported(UnsupportedReason::CfaRegister)),
            (0x1200, frame(Cfa::Rsp(8), RbpRule::AtCfa(-16))),
            (0x1300, frame(Cfa::Rsp(0), RbpRule::Same)),
            (0x1400, Rule::Gap),
        ]);
        let space = space(&table);
        let at = |pc: u64, memory: &FakeMemory| {
            walk(
                &space,
                Registers {
                    rip: BIAS + pc,
                    rsp: 0x7000,
                    rbp: 0,
                    rdi: None,
                },
                memory,
                MAX_FRAMES,
            )
        };

        let unsupported = FakeMemory::default().with(0x7000, BIAS + 0x1150);
        assert_eq!(
            at(0x1000, &unsupported).end,
            WalkEnd::Unsupported(UnsupportedReason::CfaRegister)
        );
        assert_eq!(
            at(0x1000, &unsupported).frames,
            vec![BIAS + 0x1000, BIAS + 0x1150]
        );

        let gap = FakeMemory::default().with(0x7000, BIAS + 0x1450);
        assert_eq!(
            at(0x1000, &gap),
            Walk {
                frames: vec![BIAS + 0x1000, BIAS + 0x1450],
                end: WalkEnd::NoRow
            }
        );

        let outside = FakeMemory::default().with(0x7000, 0x4000_0000);
        assert_eq!(
            at(0x1000, &outside),
            Walk {
                frames: vec![BIAS + 0x1000, 0x4000_0000],
                end: WalkEnd::NoMapping
            }
        );
        // The thread's own pc outside every mapping.
        let regs = Registers {
            rip: 0x10,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        assert_eq!(
            walk(&space, regs, &outside, MAX_FRAMES),
            Walk {
                frames: vec![0x10],
                end: WalkEnd::NoMapping
            }
        );

        let zero = FakeMemory::default().with(0x7000, 0);
        assert_eq!(
            at(0x1000, &zero),
            Walk {
                frames: vec![BIAS + 0x1000],
                end: WalkEnd::BadReturnAddress
            }
        );

        // The return address is readable but the saved rbp is not.
        let rbp_fault = FakeMemory::default().with(0x7000, BIAS + 0x1010);
        assert_eq!(
            at(0x1200, &rbp_fault),
            Walk {
                frames: vec![BIAS + 0x1200],
                end: WalkEnd::ReadFault
            }
        );
        assert_eq!(at(0x1000, &FakeMemory::default()).end, WalkEnd::ReadFault);

        // CFA = rsp + 0: the stack does not grow.
        let flat = FakeMemory::default().with(0x6ff8, BIAS + 0x1010);
        assert_eq!(
            at(0x1300, &flat),
            Walk {
                frames: vec![BIAS + 0x1300],
                end: WalkEnd::BadReturnAddress
            }
        );
    }

    #[test]
    fn depth_cap_keeps_max_frames() {
        // A recursion that never ends: each frame returns into the same function.
        let table = build_table(&[
            (0x1000, frame(Cfa::Rsp(32), RbpRule::Same)),
            (0x1100, Rule::Gap),
        ]);
        let space = space(&table);
        let mut memory = FakeMemory::default();
        for depth in 0..1000 {
            memory = memory.with(0x7000 + 32 * depth + 24, BIAS + 0x1050);
        }
        let regs = Registers {
            rip: BIAS + 0x1010,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        let capped = walk(&space, regs, &memory, MAX_FRAMES);
        assert_eq!(capped.frames.len(), MAX_FRAMES);
        assert_eq!(capped.end, WalkEnd::DepthCap);
        assert_eq!(
            walk(&space, regs, &memory, 3).frames,
            vec![BIAS + 0x1010, BIAS + 0x1050, BIAS + 0x1050]
        );
        assert_eq!(walk(&space, regs, &memory, 0).frames.len(), 1);

        // A stack of exactly max_frames frames that ends is complete, not capped.
        let table = build_table(&[
            (0x1000, frame(Cfa::Rsp(8), RbpRule::Same)),
            (0x1100, Rule::End),
            (0x1200, Rule::Gap),
        ]);
        let space = AddressSpace::new(vec![Mapping {
            start: BIAS,
            end: BIAS + 0x2000,
            bias: BIAS,
            table: &table,
        }])
        .unwrap();
        let memory = FakeMemory::default().with(0x7000, BIAS + 0x1101);
        let regs = Registers {
            rip: BIAS + 0x1010,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        assert_eq!(
            walk(&space, regs, &memory, 2),
            Walk {
                frames: vec![BIAS + 0x1010, BIAS + 0x1101],
                end: WalkEnd::Complete
            }
        );
        assert_eq!(
            walk(&space, regs, &memory, 1),
            Walk {
                frames: vec![BIAS + 0x1010],
                end: WalkEnd::DepthCap
            }
        );
    }

    #[test]
    fn mappings_translate_by_their_own_bias() {
        // Two objects with the same ELF addresses loaded at different places.
        let exe = build_table(&[
            (0x1000, frame(Cfa::Rsp(8), RbpRule::Same)),
            (0x1100, Rule::Gap),
        ]);
        let lib = build_table(&[(0x1000, Rule::End), (0x1100, Rule::Gap)]);
        let space = AddressSpace::new(vec![
            Mapping {
                start: 0x7f00_0000_1000,
                end: 0x7f00_0000_2000,
                bias: 0x7f00_0000_0000,
                table: &lib,
            },
            Mapping {
                start: 0x5000_1000,
                end: 0x5000_2000,
                bias: 0x5000_0000,
                table: &exe,
            },
        ])
        .unwrap();
        let memory = FakeMemory::default().with(0x7000, 0x7f00_0000_1050);
        let regs = Registers {
            rip: 0x5000_1010,
            rsp: 0x7000,
            rbp: 0,
            rdi: None,
        };
        assert_eq!(
            walk(&space, regs, &memory, MAX_FRAMES),
            Walk {
                frames: vec![0x5000_1010, 0x7f00_0000_1050],
                end: WalkEnd::Complete
            }
        );
        // The end of a mapping is exclusive.
        let memory = FakeMemory::default().with(0x7000, 0x7f00_0000_2001);
        assert_eq!(
            walk(&space, regs, &memory, MAX_FRAMES).end,
            WalkEnd::NoMapping
        );
    }

    #[test]
    fn address_space_rejects_overlaps() {
        let t = CompactTable::default();
        let m = |start, end| Mapping {
            start,
            end,
            bias: 0,
            table: &t,
        };
        assert!(AddressSpace::new(vec![m(0x3000, 0x4000), m(0x1000, 0x3000)]).is_ok());
        assert_eq!(
            AddressSpace::new(vec![m(0x1000, 0x3000), m(0x2000, 0x4000)]).unwrap_err(),
            BadMapping {
                start: 0x1000,
                end: 0x3000
            }
        );
        assert!(AddressSpace::new(vec![m(0x1000, 0x1000)]).is_err());
        let space = AddressSpace::new(vec![m(0x3000, 0x4000), m(0x1000, 0x2000)]).unwrap();
        assert_eq!(space.find(0x1fff).map(|m| m.start), Some(0x1000));
        assert!(space.find(0x2000).is_none());
        assert!(space.find(0xfff).is_none());
        assert_eq!(space.find(0x3000).map(|m| m.start), Some(0x3000));
    }
}
