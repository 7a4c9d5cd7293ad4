//! Rows for code no FDE describes, read from its instructions.
//!
//! Every executable and shared library GCC links starts with `crtbegin.o`'s
//! `deregister_tm_clones`, `register_tm_clones`, `__do_global_dtors_aux` and
//! `frame_dummy`, built without unwind tables, and with `crti.o`'s `_init` and `_fini`.
//! `__do_global_dtors_aux` is on the stack of everything a library's destructors do when
//! it is unloaded (its `__cxa_finalize`: C++ static destructors, their frees), and of an
//! executable's at exit: a walk through it ended "no row".
//!
//! Such code is followed instruction by instruction from the start of each gap, taking
//! a function to start wherever no path leads (after a `ret` or a jump, past padding),
//! with `CFA = rsp + 8` there. Only what a prologue and an epilogue do is understood:
//! pushes and pops, `sub`/`add`/`lea` of rsp, `mov rbp, rsp`, `mov rsp, rbp`, `leave`;
//! a branch carries its state to its target, and a target two paths reach in different
//! states, an instruction that cannot be decoded, or any other write to rsp (or to an
//! rbp the rows rely on) leaves the whole function without rows, as before: a wrong row
//! would walk on into garbage where a missing one stops the walk and says so.

use std::collections::HashMap;
use std::ops::Range;

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, OpKind, Register,
};

use crate::cfi::Piece;
use crate::rule::{Cfa, RbpRule, Rule};

/// Code bytes at an address: an executable section.
pub(crate) type Section<'a> = (u64, &'a [u8]);

/// What is known at an instruction, before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    /// CFA − rsp, while known.
    rsp: Option<i32>,
    /// CFA − rbp, once `mov rbp, rsp` made rbp the frame pointer: the CFA is then
    /// described from rbp, as compilers do.
    rbp: Option<i32>,
    /// Where the caller's rbp was saved, from the CFA; `None` while rbp is the caller's.
    rbp_at: Option<i32>,
}

impl State {
    /// At a function's first instruction: the return address at rsp.
    const ENTRY: State = State {
        rsp: Some(8),
        rbp: None,
        rbp_at: None,
    };

    fn rule(self) -> Option<Rule> {
        let cfa = match (self.rbp, self.rsp) {
            (Some(offset), _) => Cfa::Rbp(offset),
            (None, Some(offset)) => Cfa::Rsp(offset),
            (None, None) => return None,
        };
        Some(Rule::Frame {
            cfa,
            rbp: self.rbp_at.map_or(RbpRule::Same, RbpRule::AtCfa),
        })
    }
}

/// Where the instructions in order stand.
#[derive(Clone, Copy)]
enum Flow {
    /// On a path, in this state.
    At(State),
    /// In a function not understood: its rows are dropped.
    Lost,
    /// Where no path goes on (after a `ret`, a jump): what follows starts a function,
    /// unless a branch leads there.
    Ended,
}

/// Whether no path goes on past `instruction`.
fn path_ends(instruction: &Instruction) -> bool {
    matches!(
        instruction.flow_control(),
        FlowControl::Return
            | FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Interrupt
            | FlowControl::Exception
    ) || instruction.mnemonic() == Mnemonic::Hlt
}

/// What an instruction leaves.
enum Step {
    Next(State),
    /// No path goes on to the next instruction (`ret`, a jump, a trap).
    End,
    /// Something these rows cannot describe.
    Unknown,
}

/// `pieces` (sorted, disjoint) with rows added for the code in `code` none of them covers.
pub(crate) fn fill(pieces: Vec<Piece>, code: &[Section<'_>]) -> Vec<Piece> {
    let mut info = InstructionInfoFactory::new();
    let mut found = Vec::new();
    for &(address, bytes) in code {
        let section = address..address + bytes.len() as u64;
        for gap in gaps(&pieces, section) {
            let at = (gap.start - address) as usize..(gap.end - address) as usize;
            found.extend(rows_for(&bytes[at], gap.start, &mut info));
        }
    }
    if found.is_empty() {
        return pieces;
    }
    // Both sorted, and disjoint from each other: merged in order.
    found.sort_by_key(|piece| piece.start);
    let mut all = Vec::with_capacity(pieces.len() + found.len());
    let mut found = found.into_iter().peekable();
    for piece in pieces {
        while let Some(row) = found.next_if(|row| row.start < piece.start) {
            all.push(row);
        }
        all.push(piece);
    }
    all.extend(found);
    all
}

/// The parts of `range` no piece covers.
fn gaps(pieces: &[Piece], range: Range<u64>) -> Vec<Range<u64>> {
    let mut gaps = Vec::new();
    let mut at = range.start;
    let first = pieces.partition_point(|piece| piece.end <= range.start);
    for piece in &pieces[first..] {
        if piece.start >= range.end {
            break;
        }
        if piece.start > at {
            gaps.push(at..piece.start);
        }
        at = at.max(piece.end);
    }
    if at < range.end {
        gaps.push(at..range.end);
    }
    gaps
}

/// Rows for the functions in `code` (at `address`) whose every instruction is understood;
/// none for padding alone (the gaps between functions, mostly), where no pc can be.
fn rows_for(code: &[u8], address: u64, info: &mut InstructionInfoFactory) -> Vec<Piece> {
    let instructions: Vec<Instruction> = Decoder::with_ip(64, code, address, DecoderOptions::NONE)
        .iter()
        .collect();
    if instructions
        .iter()
        .all(|instruction| matches!(instruction.mnemonic(), Mnemonic::Nop | Mnemonic::Int3))
    {
        return Vec::new();
    }
    // Instructions are in address order.
    let index_of = |ip: u64| instructions.binary_search_by_key(&ip, Instruction::ip).ok();
    let mut states: Vec<Option<State>> = vec![None; instructions.len()];
    // States branches carry forward to their targets.
    let mut carried: HashMap<usize, State> = HashMap::new();
    let mut rows = Vec::new();
    let mut function = 0..0;
    let mut understood = true;
    let mut flow = Flow::Ended;
    for (index, instruction) in instructions.iter().enumerate() {
        let state = match (flow, carried.remove(&index)) {
            (Flow::At(state), Some(other)) => {
                understood &= state == other;
                state
            }
            (Flow::At(state), None) | (Flow::Ended, Some(state)) => state,
            (Flow::Lost, _) => {
                // The rest of a function not understood, up to where its path ends.
                function.end = index + 1;
                if path_ends(instruction) {
                    flow = Flow::Ended;
                }
                continue;
            }
            (Flow::Ended, None) => {
                // No path leads here: a function starts.
                if understood {
                    rows.extend(pieces_of(&instructions, &states, function.clone()));
                }
                function = index..index;
                understood = true;
                State::ENTRY
            }
        };
        function.end = index + 1;
        states[index] = Some(state);
        if instruction.code() == Code::INVALID {
            understood = false;
            flow = Flow::Lost;
            continue;
        }
        if let Some(target) = branch_target(instruction) {
            match index_of(target) {
                Some(target) if target <= index => {
                    understood &= states[target] == Some(state);
                }
                Some(target) => {
                    if let Some(&other) = carried.get(&target) {
                        understood &= other == state;
                    }
                    carried.insert(target, state);
                }
                // A jump out of the gap: a tail call.
                None => {}
            }
        }
        flow = match step(state, instruction, info) {
            Step::Next(next) => Flow::At(next),
            Step::End => Flow::Ended,
            Step::Unknown => {
                understood = false;
                if path_ends(instruction) {
                    Flow::Ended
                } else {
                    Flow::Lost
                }
            }
        };
    }
    // A target never reached in order (past the end, or inside an instruction).
    understood &= carried.is_empty();
    if understood {
        rows.extend(pieces_of(&instructions, &states, function.clone()));
    }
    rows
}

/// One piece per instruction of the function at `range`, equal neighbours merged.
fn pieces_of(
    instructions: &[Instruction],
    states: &[Option<State>],
    range: Range<usize>,
) -> Vec<Piece> {
    let mut pieces: Vec<Piece> = Vec::new();
    for index in range {
        let (instruction, Some(state)) = (&instructions[index], states[index]) else {
            continue;
        };
        let Some(rule) = state.rule() else {
            continue;
        };
        match pieces.last_mut() {
            Some(last) if last.rule == rule && last.end == instruction.ip() => {
                last.end = instruction.next_ip();
            }
            _ => pieces.push(Piece {
                start: instruction.ip(),
                end: instruction.next_ip(),
                rule,
            }),
        }
    }
    pieces
}

/// Where a direct jump or conditional branch goes.
fn branch_target(instruction: &Instruction) -> Option<u64> {
    match instruction.flow_control() {
        FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch => matches!(
            instruction.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        )
        .then(|| instruction.near_branch_target()),
        _ => None,
    }
}

/// The state after `instruction`, run in `state`.
fn step(state: State, instruction: &Instruction, info: &mut InstructionInfoFactory) -> Step {
    let reg = |operand| instruction.op_register(operand).full_register();
    let is_reg = |operand, register| {
        instruction.op_kind(operand) == OpKind::Register && reg(operand) == register
    };
    let mut next = state;
    match instruction.mnemonic() {
        Mnemonic::Ret | Mnemonic::Int3 | Mnemonic::Hlt | Mnemonic::Ud2 | Mnemonic::Jmp => {
            return Step::End;
        }
        Mnemonic::Endbr64 | Mnemonic::Nop | Mnemonic::Call => {}
        Mnemonic::Push => {
            next.rsp = state.rsp.map(|rsp| rsp + 8);
            if is_reg(0, Register::RBP) && state.rbp_at.is_none() {
                // Where the caller's rbp goes must be known.
                let Some(rsp) = next.rsp else {
                    return Step::Unknown;
                };
                next.rbp_at = Some(-rsp);
            }
        }
        Mnemonic::Pop => {
            next.rsp = state.rsp.map(|rsp| rsp - 8);
            if is_reg(0, Register::RBP) {
                // The caller's rbp comes back only from where it was saved.
                let (Some(rsp), Some(at)) = (state.rsp, state.rbp_at) else {
                    return Step::Unknown;
                };
                if at != -rsp {
                    return Step::Unknown;
                }
                next.rbp = None;
                next.rbp_at = None;
            }
        }
        Mnemonic::Leave => {
            let Some(rbp) = state.rbp else {
                return Step::Unknown;
            };
            if state.rbp_at != Some(-rbp) {
                return Step::Unknown;
            }
            next = State {
                rsp: Some(rbp - 8),
                rbp: None,
                rbp_at: None,
            };
        }
        Mnemonic::Sub | Mnemonic::Add if is_reg(0, Register::RSP) => {
            let amount = match instruction.op1_kind() {
                OpKind::Immediate8to64
                | OpKind::Immediate32to64
                | OpKind::Immediate8
                | OpKind::Immediate32 => i32::try_from(instruction.immediate(1) as i64).ok(),
                _ => None,
            };
            let Some(amount) = amount else {
                return Step::Unknown;
            };
            let amount = if instruction.mnemonic() == Mnemonic::Sub {
                amount
            } else {
                -amount
            };
            next.rsp = state.rsp.map(|rsp| rsp + amount);
        }
        Mnemonic::Lea if is_reg(0, Register::RSP) => {
            let Ok(displacement) = i32::try_from(instruction.memory_displacement64() as i64) else {
                return Step::Unknown;
            };
            if instruction.memory_index() != Register::None {
                return Step::Unknown;
            }
            next.rsp = match instruction.memory_base() {
                Register::RSP => state.rsp.map(|rsp| rsp - displacement),
                Register::RBP => state.rbp.map(|rbp| rbp - displacement),
                _ => None,
            };
        }
        Mnemonic::Mov if is_reg(0, Register::RBP) && is_reg(1, Register::RSP) => {
            // rbp becomes the frame pointer; the caller's must have been saved.
            if state.rbp_at.is_none() || state.rsp.is_none() {
                return Step::Unknown;
            }
            next.rbp = state.rsp;
        }
        Mnemonic::Mov if is_reg(0, Register::RSP) && is_reg(1, Register::RBP) => {
            next.rsp = state.rbp;
        }
        _ => {
            // Anything else must leave rsp alone, and rbp too while the rows need it.
            let rbp_needed = state.rbp.is_some() || state.rbp_at.is_none();
            let writes = info.info(instruction).used_registers().iter().any(|used| {
                let written = matches!(
                    used.access(),
                    OpAccess::Write
                        | OpAccess::CondWrite
                        | OpAccess::ReadWrite
                        | OpAccess::ReadCondWrite
                );
                let register = used.register().full_register();
                written && (register == Register::RSP || (rbp_needed && register == Register::RBP))
            });
            if writes {
                return Step::Unknown;
            }
            if instruction.flow_control() == FlowControl::IndirectBranch {
                // A tail call through a register.
                return Step::End;
            }
        }
    }
    if next.rule().is_none() {
        return Step::Unknown;
    }
    Step::Next(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `crtbegin.o`'s functions as GCC 12 links them (Debian 12's `/bin/true`, 0x23f2 to
    /// 0x24c0: padding, `deregister_tm_clones`, `register_tm_clones`,
    /// `__do_global_dtors_aux`, `frame_dummy`), where no FDE covers them.
    const CRTBEGIN: [u8; 206] = [
        0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0f, 0x1f, 0x40, 0x00, 0x48,
        0x8d, 0x3d, 0xd9, 0x6d, 0x00, 0x00, 0x48, 0x8d, 0x05, 0xd2, 0x6d, 0x00, 0x00, 0x48, 0x39,
        0xf8, 0x74, 0x15, 0x48, 0x8b, 0x05, 0xa6, 0x6b, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x74, 0x09,
        0xff, 0xe0, 0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00, 0xc3, 0x0f, 0x1f, 0x80, 0x00, 0x00,
        0x00, 0x00, 0x48, 0x8d, 0x3d, 0xa9, 0x6d, 0x00, 0x00, 0x48, 0x8d, 0x35, 0xa2, 0x6d, 0x00,
        0x00, 0x48, 0x29, 0xfe, 0x48, 0x89, 0xf0, 0x48, 0xc1, 0xee, 0x3f, 0x48, 0xc1, 0xf8, 0x03,
        0x48, 0x01, 0xc6, 0x48, 0xd1, 0xfe, 0x74, 0x14, 0x48, 0x8b, 0x05, 0x75, 0x6b, 0x00, 0x00,
        0x48, 0x85, 0xc0, 0x74, 0x08, 0xff, 0xe0, 0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3, 0x0f,
        0x1f, 0x80, 0x00, 0x00, 0x00, 0x00, 0xf3, 0x0f, 0x1e, 0xfa, 0x80, 0x3d, 0x8d, 0x6d, 0x00,
        0x00, 0x00, 0x75, 0x2b, 0x55, 0x48, 0x83, 0x3d, 0x52, 0x6b, 0x00, 0x00, 0x00, 0x48, 0x89,
        0xe5, 0x74, 0x0c, 0x48, 0x8b, 0x3d, 0xd6, 0x6c, 0x00, 0x00, 0xe8, 0x29, 0xfe, 0xff, 0xff,
        0xe8, 0x64, 0xff, 0xff, 0xff, 0xc6, 0x05, 0x65, 0x6d, 0x00, 0x00, 0x01, 0x5d, 0xc3, 0x0f,
        0x1f, 0x00, 0xc3, 0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00, 0xf3, 0x0f, 0x1e, 0xfa, 0xe9,
        0x77, 0xff, 0xff, 0xff, 0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00,
    ];
    const AT: u64 = 0x23f2;

    fn rule_at(pieces: &[Piece], pc: u64) -> Option<Rule> {
        pieces
            .iter()
            .find(|piece| piece.start <= pc && pc < piece.end)
            .map(|piece| piece.rule)
    }

    fn frame(cfa: Cfa, rbp: RbpRule) -> Option<Rule> {
        Some(Rule::Frame { cfa, rbp })
    }

    #[test]
    fn crtbegin_functions_get_the_rows_their_instructions_imply() {
        let pieces = fill(Vec::new(), &[(AT, &CRTBEGIN)]);
        let entry = frame(Cfa::Rsp(8), RbpRule::Same);
        // deregister_tm_clones and register_tm_clones touch neither rsp nor rbp.
        assert_eq!(rule_at(&pieces, 0x2400), entry);
        assert_eq!(rule_at(&pieces, 0x2460), entry);
        // __do_global_dtors_aux: after `push rbp`, after `mov rbp, rsp` (the calls of
        // __cxa_finalize and deregister_tm_clones), after `pop rbp`, and the early `ret`
        // its `jne` reaches.
        assert_eq!(rule_at(&pieces, 0x2470), entry);
        assert_eq!(
            rule_at(&pieces, 0x247e),
            frame(Cfa::Rsp(16), RbpRule::AtCfa(-16))
        );
        assert_eq!(
            rule_at(&pieces, 0x2492),
            frame(Cfa::Rbp(16), RbpRule::AtCfa(-16))
        );
        assert_eq!(
            rule_at(&pieces, 0x2497),
            frame(Cfa::Rbp(16), RbpRule::AtCfa(-16))
        );
        assert_eq!(rule_at(&pieces, 0x24a4), entry);
        assert_eq!(rule_at(&pieces, 0x24a8), entry);
        // frame_dummy's tail jump.
        assert_eq!(rule_at(&pieces, 0x24b4), entry);
    }

    #[test]
    fn code_already_described_keeps_its_rows() {
        let described = Piece {
            start: 0x2470,
            end: 0x24b0,
            rule: Rule::Gap,
        };
        let pieces = fill(vec![described], &[(AT, &CRTBEGIN)]);
        assert_eq!(rule_at(&pieces, 0x2492), Some(Rule::Gap));
        assert_eq!(rule_at(&pieces, 0x2400), frame(Cfa::Rsp(8), RbpRule::Same));
        assert!(pieces.windows(2).all(|pair| pair[0].end <= pair[1].start));
    }

    #[test]
    fn functions_with_what_rows_cannot_say_get_none() {
        let cases: [&[u8]; 4] = [
            // push rbp; mov rbp, rsp; and rsp, -16; call .; leave; ret
            &[
                0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xe4, 0xf0, 0xe8, 0, 0, 0, 0, 0xc9, 0xc3,
            ],
            // test edi, edi; je +1; push rbx; call .; ret (two states meet at the call)
            &[0x85, 0xff, 0x74, 0x01, 0x53, 0xe8, 0, 0, 0, 0, 0xc3],
            // mov rbp, rdi; call .; ret (the caller's rbp overwritten, never saved)
            &[0x48, 0x89, 0xfd, 0xe8, 0, 0, 0, 0, 0xc3],
            // push rbx; (undecodable) 0x06; pop rbx; ret
            &[0x53, 0x06, 0x5b, 0xc3],
        ];
        for code in cases {
            assert_eq!(fill(Vec::new(), &[(0x1000, code)]), Vec::new(), "{code:x?}");
        }
        // The same function without the realignment is understood.
        let plain = [0x55, 0x48, 0x89, 0xe5, 0xe8, 0, 0, 0, 0, 0xc9, 0xc3];
        let pieces = fill(Vec::new(), &[(0x1000, &plain)]);
        assert_eq!(
            rule_at(&pieces, 0x1004),
            frame(Cfa::Rbp(16), RbpRule::AtCfa(-16))
        );
        assert_eq!(rule_at(&pieces, 0x100a), frame(Cfa::Rsp(8), RbpRule::Same));
    }
}
