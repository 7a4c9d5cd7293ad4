//! Evaluates every FDE of a CFI section with gimli and reduces each row to a [`Rule`].
//!
//! gimli does the DWARF evaluation (CIE initial instructions, remember/restore state,
//! advance_loc); this module only decides which of gimli's rows the walker can execute.
//! Whatever it does not recognize exactly becomes `Unsupported(reason)`.

use std::collections::HashMap;
use std::ops::Range;

use gimli::{
    BaseAddresses, CallFrameInstruction, CfaRule, CieOrFde, CommonInformationEntry, EndianSlice,
    LittleEndian, Register, RegisterRule, UnwindContext, UnwindExpression, UnwindOffset,
    UnwindSection, UnwindTableRow, X86_64,
};

use crate::error::Error;
use crate::rule::{sigframe, Cfa, RbpRule, Reg, Rule, UnsupportedReason};

pub(crate) type Slice<'data> = EndianSlice<'data, LittleEndian>;

/// A run of addresses `[start, end)` governed by one rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub start: u64,
    pub end: u64,
    pub rule: Rule,
}

/// One FDE's address range and its pieces (an index range into [`Collected::pieces`]).
#[derive(Clone, Debug)]
pub(crate) struct FdeSpan {
    pub start: u64,
    pub end: u64,
    pub pieces: Range<usize>,
}

/// The evaluated FDEs of one section.
#[derive(Default)]
pub(crate) struct Collected {
    pub fdes: Vec<FdeSpan>,
    pub pieces: Vec<Piece>,
    /// FDEs seen, including those that could not be parsed.
    pub fde_count: u64,
    /// FDEs whose header could not be parsed (bad CIE pointer, unknown augmentation, …);
    /// their address range is unknown, so they contribute nothing.
    pub unparsable: u64,
    /// The first FDE header error and the offset of that FDE.
    pub first_error: Option<(u64, gimli::Error)>,
    /// Rows gimli produced.
    pub cfi_rows: u64,
}

/// Evaluates every FDE of `section` into `out`.
///
/// A broken entry structure (a length that runs past the section, …) means nothing after it
/// can be trusted, so it is an error. An FDE whose header fails to parse is skipped and
/// counted. An FDE whose instructions fail to evaluate keeps the rows evaluated before the
/// failure; the rest of its range becomes `Unsupported(BadCfi)`.
pub(crate) fn collect<'data, S>(
    section: &S,
    section_name: &'static str,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    out: &mut Collected,
) -> Result<(), Error>
where
    S: UnwindSection<Slice<'data>>,
{
    // Parsed CIEs by section offset: a CIE is shared by many FDEs and parsing it (augmentation,
    // personality pointer) each time would dominate small FDEs.
    let mut cies: HashMap<usize, CommonInformationEntry<Slice<'data>>> = HashMap::new();
    let mut entries = section.entries(bases);
    // Start of the last entry that parsed, to locate a structural error.
    let mut last_good = None;
    loop {
        let entry = entries.next().map_err(|source| Error::Cfi {
            section: section_name,
            after: last_good,
            source,
        })?;
        let partial = match entry {
            None => break,
            Some(CieOrFde::Cie(cie)) => {
                last_good = Some(cie.offset() as u64);
                cies.insert(cie.offset(), cie);
                continue;
            }
            Some(CieOrFde::Fde(partial)) => partial,
        };
        last_good = Some(partial.offset() as u64);
        out.fde_count += 1;
        let parsed = partial.parse(|section, bases, offset| {
            let key = UnwindOffset::into(offset);
            if let Some(cie) = cies.get(&key) {
                return Ok(cie.clone());
            }
            let cie = section.cie_from_offset(bases, offset)?;
            cies.insert(key, cie.clone());
            Ok(cie)
        });
        let fde = match parsed {
            Ok(fde) => fde,
            Err(error) => {
                out.unparsable += 1;
                out.first_error
                    .get_or_insert((partial.offset() as u64, error));
                continue;
            }
        };
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()) else {
            out.unparsable += 1;
            continue;
        };
        if start == end {
            continue;
        }
        let first_piece = out.pieces.len();
        evaluate_fde(section, bases, ctx, &fde, start..end, out);
        out.fdes.push(FdeSpan {
            start,
            end,
            pieces: first_piece..out.pieces.len(),
        });
    }
    Ok(())
}

type Fde<'data> = gimli::FrameDescriptionEntry<Slice<'data>>;

fn evaluate_fde<'data, S>(
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    fde: &Fde<'data>,
    range: Range<u64>,
    out: &mut Collected,
) where
    S: UnwindSection<Slice<'data>>,
{
    let first_piece = out.pieces.len();
    let push = |pieces: &mut Vec<Piece>, start: u64, end: u64, rule: Rule| {
        // Rows that run past the FDE (an advance_loc beyond its end) are cut to it.
        let start = start.max(range.start);
        let end = end.min(range.end);
        if start >= end {
            return;
        }
        if pieces.len() > first_piece {
            if let Some(last) = pieces.last_mut() {
                if last.end == start && last.rule == rule {
                    last.end = end;
                    return;
                }
            }
        }
        pieces.push(Piece { start, end, rule });
    };

    let reducer = Reducer {
        return_address: fde.cie().return_address_register(),
        signal: fde.is_signal_trampoline(),
    };
    // Whether an undefined rule was written explicitly takes a second pass over the
    // instructions: done once per FDE, at the first row where rbp or the return address has
    // no rule (most FDEs have such a row: few mention rbp).
    let mut explicit: Option<ExplicitUndefined> = None;
    let mut explicit_undefined =
        || *explicit.get_or_insert_with(|| scan_undefined(section, bases, fde));

    let mut table = match fde.rows(section, bases, ctx) {
        Ok(table) => table,
        Err(_) => {
            push(
                &mut out.pieces,
                range.start,
                range.end,
                Rule::Unsupported(UnsupportedReason::BadCfi),
            );
            return;
        }
    };
    let mut next = range.start;
    loop {
        match table.next_row() {
            Ok(Some(row)) => {
                out.cfi_rows += 1;
                let rule = reducer.reduce(row, section, &mut explicit_undefined);
                next = row.end_address();
                push(
                    &mut out.pieces,
                    row.start_address(),
                    row.end_address(),
                    rule,
                );
            }
            Ok(None) => break,
            Err(_) => {
                push(
                    &mut out.pieces,
                    next,
                    range.end,
                    Rule::Unsupported(UnsupportedReason::BadCfi),
                );
                break;
            }
        }
    }
}

/// Whether an FDE (or its CIE) sets rbp or the return address to `DW_CFA_undefined`
/// explicitly. gimli reports a register without any rule as `Undefined` too, and the two
/// mean different things here: no rule for rbp means "unchanged" (the x86-64 convention for
/// a callee-saved register the CFI does not mention, as libgcc's unwinder treats it), while
/// an explicit undefined rbp means it cannot be recovered; an explicitly undefined return
/// address marks the outermost frame, a missing one is broken CFI.
#[derive(Clone, Copy, Default)]
struct ExplicitUndefined {
    rbp: bool,
    return_address: bool,
}

fn scan_undefined<'data, S>(
    section: &S,
    bases: &BaseAddresses,
    fde: &Fde<'data>,
) -> ExplicitUndefined
where
    S: UnwindSection<Slice<'data>>,
{
    let return_address = fde.cie().return_address_register();
    let mut found = ExplicitUndefined::default();
    let mut scan = |mut instructions: gimli::CallFrameInstructionIter<'_, Slice<'data>>| {
        // A parse error stops the scan; the evaluation itself reports it as BadCfi.
        while let Ok(Some(instruction)) = instructions.next() {
            if let CallFrameInstruction::Undefined { register } = instruction {
                found.rbp |= register == X86_64::RBP;
                found.return_address |= register == return_address;
            }
        }
    };
    scan(fde.cie().instructions(section, bases));
    scan(fde.instructions(section, bases));
    found
}

struct Reducer {
    return_address: Register,
    signal: bool,
}

const RETURN_ADDRESS_OFFSET: i64 = -8;

impl Reducer {
    fn reduce<'data, S>(
        &self,
        row: &UnwindTableRow<usize>,
        section: &S,
        explicit_undefined: &mut impl FnMut() -> ExplicitUndefined,
    ) -> Rule
    where
        S: UnwindSection<Slice<'data>>,
    {
        match self.reduce_inner(row, section, explicit_undefined) {
            Ok(rule) => rule,
            Err(reason) => Rule::Unsupported(reason),
        }
    }

    fn reduce_inner<'data, S>(
        &self,
        row: &UnwindTableRow<usize>,
        section: &S,
        explicit_undefined: &mut impl FnMut() -> ExplicitUndefined,
    ) -> Result<Rule, UnsupportedReason>
    where
        S: UnwindSection<Slice<'data>>,
    {
        use UnsupportedReason::{CfaExpression, CfaRegister, OffsetOverflow, ReturnAddress};
        if self.signal {
            return self.reduce_signal(row, section);
        }
        // The walker reads the return address at CFA-8 and knows no other place.
        if self.return_address != X86_64::RA {
            return Err(ReturnAddress);
        }
        match row.register(self.return_address) {
            RegisterRule::Offset(RETURN_ADDRESS_OFFSET) => {}
            RegisterRule::Undefined if explicit_undefined().return_address => return Ok(Rule::End),
            // glibc's vfork: the return address popped into rdi, rbp untouched.
            RegisterRule::Register(X86_64::RDI) => {
                let CfaRule::RegisterAndOffset {
                    register: X86_64::RSP,
                    offset,
                } = *row.cfa()
                else {
                    return Err(ReturnAddress);
                };
                let rbp_kept = match row.register(X86_64::RBP) {
                    RegisterRule::SameValue => true,
                    RegisterRule::Undefined => !explicit_undefined().rbp,
                    _ => false,
                };
                if !rbp_kept {
                    return Err(UnsupportedReason::RbpRule);
                }
                let offset = i32::try_from(offset).map_err(|_| OffsetOverflow)?;
                return Ok(Rule::ReturnInRdi(offset));
            }
            _ => return Err(ReturnAddress),
        }

        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                let offset = i32::try_from(*offset).map_err(|_| OffsetOverflow)?;
                match *register {
                    X86_64::RSP => Cfa::Rsp(offset),
                    X86_64::RBP => Cfa::Rbp(offset),
                    _ => return Err(CfaRegister),
                }
            }
            CfaRule::Expression(expression) => {
                let ops = Ops::parse(expression, section).ok_or(CfaExpression)?;
                cfa_expression(ops.as_slice())?
            }
        };

        let rbp = match row.register(X86_64::RBP) {
            RegisterRule::SameValue => RbpRule::Same,
            RegisterRule::Undefined if !explicit_undefined().rbp => RbpRule::Same,
            RegisterRule::Offset(offset) => {
                RbpRule::AtCfa(i32::try_from(offset).map_err(|_| OffsetOverflow)?)
            }
            RegisterRule::Expression(expression) => {
                let ops = Ops::parse(&expression, section).ok_or(UnsupportedReason::RbpRule)?;
                match *ops.as_slice() {
                    [Op::Breg(X86_64::RBP, offset)] => {
                        RbpRule::AtRbp(i32::try_from(offset).map_err(|_| OffsetOverflow)?)
                    }
                    _ => return Err(UnsupportedReason::RbpRule),
                }
            }
            _ => return Err(UnsupportedReason::RbpRule),
        };
        Ok(Rule::Frame { cfa, rbp })
    }

    /// A signal trampoline (CIE augmentation 'S'): the walker restores rip, rsp and rbp from
    /// the ucontext at fixed offsets from rsp ([`sigframe`]). Accept the FDE only if its CFI
    /// says exactly that, so a trampoline with another frame layout is never misread.
    fn reduce_signal<'data, S>(
        &self,
        row: &UnwindTableRow<usize>,
        section: &S,
    ) -> Result<Rule, UnsupportedReason>
    where
        S: UnwindSection<Slice<'data>>,
    {
        use UnsupportedReason::{CfaExpression, ReturnAddress};
        let at_rsp = |rule: RegisterRule<usize>, offset: u64| -> bool {
            let RegisterRule::Expression(expression) = rule else {
                return false;
            };
            Ops::parse(&expression, section)
                .is_some_and(|ops| ops.as_slice() == [Op::Breg(X86_64::RSP, offset as i64)])
        };
        // CFA = the interrupted rsp, read from the ucontext.
        let CfaRule::Expression(cfa) = row.cfa() else {
            return Err(CfaExpression);
        };
        let cfa_ops = Ops::parse(cfa, section).ok_or(CfaExpression)?;
        if cfa_ops.as_slice() != [Op::Breg(X86_64::RSP, sigframe::RSP as i64), Op::Deref] {
            return Err(CfaExpression);
        }
        if !at_rsp(row.register(self.return_address), sigframe::RIP) {
            return Err(ReturnAddress);
        }
        if !at_rsp(row.register(X86_64::RBP), sigframe::RBP) {
            return Err(UnsupportedReason::RbpRule);
        }
        Ok(Rule::Signal)
    }
}

/// The CFA expressions the walker knows.
fn cfa_expression(ops: &[Op]) -> Result<Cfa, UnsupportedReason> {
    use UnsupportedReason::{CfaExpression, CfaRegister, OffsetOverflow};
    // GCC's PLT stubs: CFA = rsp + 8 + ((rip & 15) >= threshold) << 3, threshold 11 for
    // 16-byte .plt entries and 10 for the IBT .plt.sec layout.
    if let [Op::Breg(X86_64::RSP, 8), Op::Breg(X86_64::RA, 0), Op::Const(15), Op::And, Op::Const(threshold), Op::Ge, Op::Const(3), Op::Shl, Op::Plus] =
        *ops
    {
        let threshold = u8::try_from(threshold).map_err(|_| CfaExpression)?;
        return Ok(Cfa::Plt { threshold });
    }
    // Stack realignment with a DRAP register: the CFA was saved in the frame, CFA =
    // *(reg + offset) (+ add).
    let (register, offset, add) = match *ops {
        [Op::Breg(register, offset), Op::Deref] => (register, offset, 0),
        [Op::Breg(register, offset), Op::Deref, Op::PlusConst(add)] => {
            (register, offset, i128::from(add))
        }
        [Op::Breg(register, offset), Op::Deref, Op::Const(add), Op::Plus] => {
            (register, offset, add)
        }
        _ => return Err(CfaExpression),
    };
    let reg = match register {
        X86_64::RSP => Reg::Rsp,
        X86_64::RBP => Reg::Rbp,
        _ => return Err(CfaRegister),
    };
    Ok(Cfa::Deref {
        reg,
        offset: i32::try_from(offset).map_err(|_| OffsetOverflow)?,
        add: i32::try_from(add).map_err(|_| OffsetOverflow)?,
    })
}

/// The DWARF operations the recognized expressions use; anything else is `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Breg(Register, i64),
    /// A full 8-byte dereference.
    Deref,
    PlusConst(u64),
    /// A literal or constant, signed or unsigned (widened so both compare alike).
    Const(i128),
    Plus,
    And,
    Ge,
    Shl,
    Other,
}

/// A short expression's operations, without allocating.
struct Ops {
    ops: [Op; Ops::MAX],
    len: usize,
}

impl Ops {
    /// Longer than the longest recognized expression (the 9-operation PLT one).
    const MAX: usize = 10;

    /// None if the expression is malformed or longer than any recognized one.
    ///
    /// A decoder of its own for the dozen opcodes the patterns use, rather than gimli's
    /// `Operation::parse`: that one panics on some malformed operands in builds with
    /// overflow checks (found by fuzzing: `DW_OP_piece` with a huge size), and decoding
    /// every opcode is wasted work when the first unknown one already rules out every
    /// pattern: decoding stops there with `Op::Other`.
    fn parse<'data, S>(expression: &UnwindExpression<usize>, section: &S) -> Option<Ops>
    where
        S: UnwindSection<Slice<'data>>,
    {
        let bytes = expression.get(section).ok()?.0.slice();
        let mut input = Bytes(bytes);
        let mut ops = Ops {
            ops: [Op::Other; Ops::MAX],
            len: 0,
        };
        while let Some(opcode) = input.u8() {
            if ops.len == Ops::MAX {
                return None;
            }
            let op = match opcode {
                0x06 => Op::Deref,                                            // DW_OP_deref
                0x94 if input.u8()? == 8 => Op::Deref,                        // DW_OP_deref_size 8
                0x08 => Op::Const(input.u8()?.into()),                        // DW_OP_const1u
                0x09 => Op::Const((input.u8()? as i8).into()),                // DW_OP_const1s
                0x0a => Op::Const(u16::from_le_bytes(input.array()?).into()), // DW_OP_const2u
                0x0b => Op::Const(i16::from_le_bytes(input.array()?).into()), // DW_OP_const2s
                0x0c => Op::Const(u32::from_le_bytes(input.array()?).into()), // DW_OP_const4u
                0x0d => Op::Const(i32::from_le_bytes(input.array()?).into()), // DW_OP_const4s
                0x0e => Op::Const(u64::from_le_bytes(input.array()?).into()), // DW_OP_const8u
                0x0f => Op::Const(i64::from_le_bytes(input.array()?).into()), // DW_OP_const8s
                0x10 => Op::Const(input.uleb()?.into()),                      // DW_OP_constu
                0x11 => Op::Const(input.sleb()?.into()),                      // DW_OP_consts
                0x1a => Op::And,
                0x22 => Op::Plus,
                0x23 => Op::PlusConst(input.uleb()?), // DW_OP_plus_uconst
                0x24 => Op::Shl,
                0x2a => Op::Ge,
                0x30..=0x4f => Op::Const((opcode - 0x30).into()), // DW_OP_lit0..31
                0x70..=0x8f => Op::Breg(Register((opcode - 0x70).into()), input.sleb()?), // DW_OP_bregN
                0x92 => {
                    // DW_OP_bregx
                    let register = u16::try_from(input.uleb()?).ok()?;
                    Op::Breg(Register(register), input.sleb()?)
                }
                _ => Op::Other,
            };
            ops.ops[ops.len] = op;
            ops.len += 1;
            if op == Op::Other {
                break;
            }
        }
        Some(ops)
    }

    fn as_slice(&self) -> &[Op] {
        &self.ops[..self.len]
    }
}

/// A cursor over expression bytes; every read is checked.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let head = self.0.get(..N)?;
        let mut array = [0u8; N];
        array.copy_from_slice(head);
        self.0 = &self.0[N..];
        Some(array)
    }

    /// An unsigned LEB128 that fits u64.
    fn uleb(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return None;
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// A signed LEB128 that fits i64.
    fn sleb(&mut self) -> Option<i64> {
        let mut value = 0i64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            // The tenth byte may only carry the sign: anything else does not fit i64.
            if shift == 63 && byte & 0x7f != 0 && byte & 0x7f != 0x7f {
                return None;
            }
            value |= i64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                if shift < 57 && byte & 0x40 != 0 {
                    value |= -1i64 << (shift + 7);
                }
                return Some(value);
            }
        }
        None
    }
}
