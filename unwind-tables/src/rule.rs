//! The rules a compact row points at: how to get from one frame to its caller.
//!
//! These are the only unwinding operations the BPF program and the userspace
//! twin ([`crate::walk`]) know. Whatever CFI does not reduce to one of them is
//! [`Rule::Unsupported`], so that no walker ever guesses.
//!
//! One rule depends on where the pc lies in its row: [`Cfa::RspSteps`], the rows of a
//! run of pushes or pops merged into one (see [`STEP_WINDOW`]).

/// DWARF register numbers (x86-64 System V) a rule may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reg {
    Rbp = 6,
    Rsp = 7,
}

/// How far past its row's start a step of [`Cfa::RspSteps`] may lie: bit `k` of its masks
/// is the step at row start + `k` + 1, so a row offset is only ever needed up to this.
pub const STEP_WINDOW: u32 = 16;

/// How to compute the canonical frame address (the caller's rsp after return).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cfa {
    /// CFA = rsp + offset.
    Rsp(i32),
    /// A run of pushes and pops in one row: CFA = rsp + offset + 8 × (pushes − pops at or
    /// before the pc). Bit `k` of `pushes` (`pops`) is a push (pop) whose effect starts at
    /// row start + `k` + 1; see [`rsp_steps_offset`]. Each merged row of the run was
    /// `Rsp(offset ± 8 …)` with the same rbp rule, so this is exact at every byte.
    RspSteps { offset: i32, pushes: u16, pops: u16 },
    /// CFA = rbp + offset.
    Rbp(i32),
    /// GCC's PLT expression: CFA = rsp + 8 + ((rip & 15) >= threshold ? 8 : 0).
    Plt { threshold: u8 },
    /// CFA = *(reg + offset) + add (stack-realigning functions using a DRAP register).
    Deref { reg: Reg, offset: i32, add: i32 },
}

/// The CFA offset from rsp of `Cfa::RspSteps { offset, pushes, pops }` at `row_offset` bytes
/// past its row's start: the steps at row offsets 1..=`row_offset` have happened. Offsets at
/// or past [`STEP_WINDOW`] see every step. This is the computation both walkers do.
pub fn rsp_steps_offset(offset: i32, pushes: u16, pops: u16, row_offset: u32) -> i64 {
    let happened = (1u32 << row_offset.min(STEP_WINDOW)) - 1;
    let passed = |steps: u16| i64::from((u32::from(steps) & happened).count_ones());
    i64::from(offset) + 8 * (passed(pushes) - passed(pops))
}

/// Where the caller's rbp is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RbpRule {
    /// rbp is unchanged in the caller.
    Same,
    /// caller's rbp = *(CFA + offset).
    AtCfa(i32),
    /// caller's rbp = *(rbp + offset) (DRAP frames describe it from rbp).
    AtRbp(i32),
}

/// Why a row is marked unsupported. The numeric values are part of the BPF
/// layout (`ct_rule.reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum UnsupportedReason {
    /// The CFA is computed from a register other than rsp/rbp (e.g. r10 in DRAP epilogues).
    CfaRegister = 1,
    /// The CFA is a DWARF expression of a shape the walker does not know.
    CfaExpression = 2,
    /// An offset does not fit in i32.
    OffsetOverflow = 3,
    /// rbp is restored by a rule other than "same" or "at CFA/rbp + offset".
    RbpRule = 4,
    /// The return address is not at CFA-8.
    ReturnAddress = 5,
    /// The CFI could not be evaluated (gimli error inside an otherwise good FDE).
    BadCfi = 6,
}

/// One unwinding step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// No CFI covers this address.
    Gap,
    /// An ordinary frame: return address at CFA-8.
    Frame { cfa: Cfa, rbp: RbpRule },
    /// The return address is undefined: this is the outermost frame (`_start`, thread entry).
    End,
    /// A signal trampoline (`__restore_rt`): rip, rsp and rbp come from the ucontext at rsp.
    Signal,
    /// The return address is in rdi (glibc's `vfork` pops it there around the syscall);
    /// CFA = rsp + offset, rbp unchanged. Only the walk's first frame knows rdi: anywhere
    /// else this stops the walk as unsupported.
    ReturnInRdi(i32),
    /// CFI exists but the walker must not guess at it.
    Unsupported(UnsupportedReason),
}

/// Offsets of the interrupted registers in the x86-64 `ucontext_t` found at rsp
/// inside `__restore_rt`. Mirrored by `CT_SIGFRAME_*` in the BPF header.
pub mod sigframe {
    pub const RBP: u64 = 120;
    pub const RSP: u64 = 160;
    pub const RIP: u64 = 168;
}

impl UnsupportedReason {
    /// Every reason, in numeric order.
    pub const ALL: [UnsupportedReason; 6] = [
        UnsupportedReason::CfaRegister,
        UnsupportedReason::CfaExpression,
        UnsupportedReason::OffsetOverflow,
        UnsupportedReason::RbpRule,
        UnsupportedReason::ReturnAddress,
        UnsupportedReason::BadCfi,
    ];

    /// The reason with numeric value `value`, as stored in `ct_rule.reason`.
    pub fn from_u8(value: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|reason| *reason as u8 == value)
    }

    /// A short lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            UnsupportedReason::CfaRegister => "cfa-register",
            UnsupportedReason::CfaExpression => "cfa-expression",
            UnsupportedReason::OffsetOverflow => "offset-overflow",
            UnsupportedReason::RbpRule => "rbp-rule",
            UnsupportedReason::ReturnAddress => "return-address",
            UnsupportedReason::BadCfi => "bad-cfi",
        }
    }
}

/// The shape of a rule without its operands, for statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleKind {
    Gap,
    CfaRsp,
    CfaRspSteps,
    CfaRbp,
    Plt,
    Deref,
    End,
    Signal,
    ReturnInRdi,
    Unsupported(UnsupportedReason),
}

impl RuleKind {
    /// A short lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            RuleKind::Gap => "gap",
            RuleKind::CfaRsp => "cfa-rsp",
            RuleKind::CfaRspSteps => "cfa-rsp-steps",
            RuleKind::CfaRbp => "cfa-rbp",
            RuleKind::Plt => "plt",
            RuleKind::Deref => "deref",
            RuleKind::End => "end",
            RuleKind::Signal => "signal",
            RuleKind::ReturnInRdi => "return-in-rdi",
            RuleKind::Unsupported(reason) => reason.name(),
        }
    }
}

impl Rule {
    /// The shape of this rule.
    pub fn kind(&self) -> RuleKind {
        match *self {
            Rule::Gap => RuleKind::Gap,
            Rule::Frame { cfa, .. } => match cfa {
                Cfa::Rsp(_) => RuleKind::CfaRsp,
                Cfa::RspSteps { .. } => RuleKind::CfaRspSteps,
                Cfa::Rbp(_) => RuleKind::CfaRbp,
                Cfa::Plt { .. } => RuleKind::Plt,
                Cfa::Deref { .. } => RuleKind::Deref,
            },
            Rule::End => RuleKind::End,
            Rule::Signal => RuleKind::Signal,
            Rule::ReturnInRdi(_) => RuleKind::ReturnInRdi,
            Rule::Unsupported(reason) => RuleKind::Unsupported(reason),
        }
    }

    /// The rule in effect `row_offset` bytes past the start of a row with this rule:
    /// [`Cfa::RspSteps`] becomes the [`Cfa::Rsp`] it amounts to there (or
    /// `Unsupported(OffsetOverflow)` if that does not fit i32, which no compiled table
    /// holds); every other rule is itself.
    pub fn at_row_offset(self, row_offset: u32) -> Rule {
        match self {
            Rule::Frame {
                cfa:
                    Cfa::RspSteps {
                        offset,
                        pushes,
                        pops,
                    },
                rbp,
            } => match i32::try_from(rsp_steps_offset(offset, pushes, pops, row_offset)) {
                Ok(offset) => Rule::Frame {
                    cfa: Cfa::Rsp(offset),
                    rbp,
                },
                Err(_) => Rule::Unsupported(UnsupportedReason::OffsetOverflow),
            },
            rule => rule,
        }
    }

    /// True for the rules a walker can execute: [`Rule::Frame`], [`Rule::End`],
    /// [`Rule::Signal`] and [`Rule::ReturnInRdi`] (at a first frame). Code covered by these
    /// counts as "supported" in [`crate::Stats`].
    pub fn is_supported(&self) -> bool {
        matches!(
            self,
            Rule::Frame { .. } | Rule::End | Rule::Signal | Rule::ReturnInRdi(_)
        )
    }
}

/// A rule as the walkers beyond this crate read it: the BPF program's `struct ct_rule`
/// and the preloaded library's `struct ctp_rule` (each crate checks its header's numbers
/// against [`encoded`] and copies the fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodedRule {
    /// [`encoded::kind`].
    pub kind: u8,
    /// [`encoded::reg`]: `CFA_DEREF`'s base register.
    pub cfa_reg: u8,
    /// [`encoded::rbp`].
    pub rbp_kind: u8,
    /// `UNSUPPORTED`: the [`UnsupportedReason`].
    pub reason: u8,
    pub cfa_off: i32,
    pub rbp_off: i32,
    /// `CFA_DEREF`: the (signed) addend; `CFA_RSP_STEPS`: pushes | pops << 16.
    pub cfa_arg: u32,
}

/// The numbers of an [`EncodedRule`]'s fields.
pub mod encoded {
    /// Its `kind`.
    pub mod kind {
        pub const GAP: u8 = 0;
        pub const CFA_RSP: u8 = 1;
        pub const CFA_RBP: u8 = 2;
        pub const PLT: u8 = 3;
        pub const CFA_DEREF: u8 = 4;
        pub const END: u8 = 5;
        pub const SIGNAL: u8 = 6;
        pub const UNSUPPORTED: u8 = 7;
        pub const CFA_RSP_STEPS: u8 = 8;
        pub const RETURN_IN_RDI: u8 = 9;
    }

    /// Its `rbp_kind`.
    pub mod rbp {
        pub const SAME: u8 = 0;
        pub const AT_CFA: u8 = 1;
        pub const AT_RBP: u8 = 2;
    }

    /// Its `cfa_reg`: DWARF register numbers.
    pub mod reg {
        pub const RBP: u8 = super::super::Reg::Rbp as u8;
        pub const RSP: u8 = super::super::Reg::Rsp as u8;
    }
}

impl Rule {
    /// The rule as the walkers beyond this crate read it.
    pub fn encode(self) -> EncodedRule {
        use encoded::{kind, rbp as rbp_kind};
        let mut e = EncodedRule::default();
        match self {
            Rule::Gap => e.kind = kind::GAP,
            Rule::End => e.kind = kind::END,
            Rule::Signal => e.kind = kind::SIGNAL,
            Rule::ReturnInRdi(offset) => {
                e.kind = kind::RETURN_IN_RDI;
                e.cfa_off = offset;
            }
            Rule::Unsupported(reason) => {
                e.kind = kind::UNSUPPORTED;
                e.reason = reason as u8;
            }
            Rule::Frame { cfa, rbp } => {
                match cfa {
                    Cfa::Rsp(offset) => {
                        e.kind = kind::CFA_RSP;
                        e.cfa_off = offset;
                    }
                    Cfa::RspSteps {
                        offset,
                        pushes,
                        pops,
                    } => {
                        e.kind = kind::CFA_RSP_STEPS;
                        e.cfa_off = offset;
                        e.cfa_arg = u32::from(pushes) | u32::from(pops) << 16;
                    }
                    Cfa::Rbp(offset) => {
                        e.kind = kind::CFA_RBP;
                        e.cfa_off = offset;
                    }
                    Cfa::Plt { threshold } => {
                        e.kind = kind::PLT;
                        e.cfa_off = threshold.into();
                    }
                    Cfa::Deref { reg, offset, add } => {
                        e.kind = kind::CFA_DEREF;
                        e.cfa_reg = reg as u8;
                        e.cfa_off = offset;
                        e.cfa_arg = add as u32;
                    }
                }
                match rbp {
                    RbpRule::Same => e.rbp_kind = rbp_kind::SAME,
                    RbpRule::AtCfa(offset) => {
                        e.rbp_kind = rbp_kind::AT_CFA;
                        e.rbp_off = offset;
                    }
                    RbpRule::AtRbp(offset) => {
                        e.rbp_kind = rbp_kind::AT_RBP;
                        e.rbp_off = offset;
                    }
                }
            }
        }
        e
    }
}
