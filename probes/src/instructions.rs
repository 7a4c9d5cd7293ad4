//! Where x86-64 instructions start in a function's code.
//!
//! A uprobe replaces the first byte of the probed instruction with `int3` in the page
//! cache, so in every process that runs the file. Placed inside an instruction, it
//! corrupts that instruction's operand bytes: the processes crash, traced or not. The
//! only safe places are instruction boundaries, and the only way to know them is to
//! decode the function from its start (x86 instructions are 1 to 15 bytes long and
//! their lengths depend on every preceding byte).

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

/// Where an address falls among the instructions decoded from a function's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// An instruction starts there.
    Boundary,
    /// Inside the instruction that starts at `before` and ends at `after` (both
    /// addresses are boundaries).
    Inside { before: u64, after: u64 },
    /// The bytes before the address do not decode: `at` is the invalid instruction (or
    /// the end of the code that was given).
    Undecodable { at: u64 },
}

/// Decodes `code` (which starts at virtual address `start`) up to `target` and tells
/// where `target` falls.
pub(crate) fn placement(code: &[u8], start: u64, target: u64) -> Placement {
    if target == start {
        return Placement::Boundary;
    }
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return Placement::Undecodable {
                at: instruction.ip(),
            };
        }
        let (begin, end) = (instruction.ip(), instruction.next_ip());
        if target == end {
            return Placement::Boundary;
        }
        if target > begin && target < end {
            return Placement::Inside {
                before: begin,
                after: end,
            };
        }
    }
    Placement::Undecodable {
        at: start + code.len() as u64,
    }
}

/// An instruction Linux's x86 uprobes would not run: AVX-encoded (VEX, EVEX, XOP) with
/// an opcode byte that, read as a one-byte legacy opcode, is a jump, a call or a nop.
///
/// The kernel analyzes a probed instruction by its first opcode byte, whatever map the
/// VEX prefix selects, and emulates `jcc rel8` (0x70-0x7f), `call`/`jmp` (0xe8, 0xe9,
/// 0xeb) and `nop` (0x90) instead of single-stepping them. So `vpbroadcastb %esi,%ymm17`
/// (opcode 0x7a in map 0F38, glibc's `__strchr_evex` starts with it) becomes `jp`: the
/// instruction never runs, and `strchr` returns NULL in every process that calls it
/// (seen on Linux 6.18: cargo-trace itself then failed to attach its next probe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Misread {
    /// `vpbroadcastb`
    pub mnemonic: String,
    pub length: u64,
}

/// The one-byte legacy opcodes the kernel emulates rather than single-steps.
fn kernel_emulates(opcode: u8) -> bool {
    matches!(opcode, 0x70..=0x7f | 0xe8 | 0xe9 | 0xeb | 0x90)
}

/// Whether the instruction at the start of `bytes` is one the kernel emulates under a
/// uprobe, as its `branch_setup_xol_ops` and `push_setup_xol_ops` take it: `jcc rel8`,
/// `jcc rel32` (0x0f 0x80-0x8f), `call rel32`, `jmp rel8/rel32`, `nop`, and `push` of a
/// register (with REX 0x41 at most), with no prefix.
fn emulated_without_prefix(bytes: &[u8]) -> bool {
    match bytes {
        [opcode, ..] if kernel_emulates(*opcode) => true,
        [0x0f, 0x80..=0x8f, ..] | [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] => true,
        _ => false,
    }
}

/// Instructions looked past, at most, for an emulated one (see [`first_emulated`]).
const MAX_SKIPPED: usize = 6;

/// The address of the first instruction of `code` (at `start`) that the kernel emulates
/// under a uprobe (see [`emulated_without_prefix`]), when each instruction before it (at
/// most [`MAX_SKIPPED`]) runs straight on and changes nothing but the flags and a general
/// register neither in `kept` nor rsp nor rbp: compares and tests, and moves, loads and
/// arithmetic into such a register. A probe there sees `kept`, rsp, rbp and memory as
/// they were at `start`.
pub(crate) fn first_emulated(code: &[u8], start: u64, kept: &[Register]) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    for _ in 0..=MAX_SKIPPED {
        let offset = decoder.position();
        if !decoder.can_decode() {
            return None;
        }
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return None;
        }
        if emulated_without_prefix(&code[offset..]) {
            return Some(instruction.ip());
        }
        if !writes_only_flags_or(&instruction, kept) {
            return None;
        }
    }
    None
}

/// Whether `instruction` changes nothing but the flags and its first operand, a general
/// register outside `kept`, rsp and rbp.
fn writes_only_flags_or(instruction: &Instruction, kept: &[Register]) -> bool {
    use Mnemonic::*;
    match instruction.mnemonic() {
        Cmp | Test => true,
        Mov | Movzx | Movsx | Movsxd | Lea | Xor | And | Or | Add | Sub | Shl | Shr | Sar => {
            if instruction.op0_kind() != OpKind::Register {
                return false;
            }
            let written = instruction.op0_register().full_register();
            written.is_gpr64()
                && written != Register::RSP
                && written != Register::RBP
                && !kept.contains(&written)
        }
        _ => false,
    }
}

/// Whether the instruction at the start of `code` (at address `ip`) is one the kernel
/// misreads (see [`Misread`]).
pub(crate) fn misread_by_uprobes(code: &[u8], ip: u64) -> Option<Misread> {
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let instruction = decoder.decode();
    if instruction.is_invalid() {
        return None;
    }
    // Segment and address-size prefixes may come before the VEX prefix; a VEX prefix
    // is 2 (0xc5) or 3 bytes (0xc4, XOP's 0x8f), EVEX's 4, and the opcode follows.
    let start = code
        .iter()
        .position(|b| !matches!(b, 0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x67))?;
    // In 64-bit mode 0xc4, 0xc5 and 0x62 are always VEX and EVEX; 0x8f is XOP when
    // its next byte selects a map of 8 or more (else it is `pop`).
    let prefix = match code[start] {
        0xc5 => 2,
        0xc4 => 3,
        0x8f if code.get(start + 1).is_some_and(|b| b & 0x1f >= 8) => 3,
        0x62 => 4,
        _ => return None,
    };
    let opcode = *code.get(start + prefix)?;
    kernel_emulates(opcode).then(|| Misread {
        mnemonic: format!("{:?}", instruction.mnemonic()).to_lowercase(),
        length: instruction.len() as u64,
    })
}

/// The near branch targets (jumps, calls, conditional jumps) of the instructions of
/// `code` (at `start`).
pub(crate) fn branch_targets(code: &[u8], start: u64) -> Vec<u64> {
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut targets = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            break;
        }
        let near = matches!(
            instruction.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        );
        if near {
            targets.push(instruction.near_branch_target());
        }
    }
    targets
}

/// The addresses `code` (at `start`) refers to relative to rip (`lea f(%rip), %rax`):
/// in an IFUNC resolver, among them, the implementations it can return.
pub(crate) fn rip_relative_targets(code: &[u8], start: u64) -> Vec<u64> {
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut targets = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            break;
        }
        if instruction.is_ip_rel_memory_operand() {
            let target = instruction.ip_rel_memory_address();
            if !targets.contains(&target) {
                targets.push(target);
            }
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `push rbx; call rel32; mov eax, 1; ret` at 0x1000.
    const CODE: &[u8] = &[
        0x53, // push rbx                  0x1000
        0xe8, 0x00, 0x00, 0x00, 0x00, // call  0x1001
        0xb8, 0x01, 0x00, 0x00, 0x00, // mov   0x1006
        0xc3, // ret                       0x100b
    ];

    #[test]
    fn boundaries_are_where_instructions_start() {
        for address in [0x1000, 0x1001, 0x1006, 0x100b] {
            assert_eq!(placement(CODE, 0x1000, address), Placement::Boundary);
        }
    }

    #[test]
    fn an_address_inside_an_instruction_names_its_ends() {
        for address in 0x1002..0x1006 {
            assert_eq!(
                placement(CODE, 0x1000, address),
                Placement::Inside {
                    before: 0x1001,
                    after: 0x1006
                }
            );
        }
        assert_eq!(
            placement(CODE, 0x1000, 0x1009),
            Placement::Inside {
                before: 0x1006,
                after: 0x100b
            }
        );
    }

    #[test]
    fn probes_move_to_the_first_emulated_instruction() {
        use Register::{RCX, RDI, RDX, RSI};
        let first = |code: &[u8], kept: &[Register]| first_emulated(code, 0x1000, kept);
        // jemalloc's malloc: cmp $0x1000,%rdi; ja rel8
        let malloc = [0x48, 0x81, 0xff, 0x00, 0x10, 0x00, 0x00, 0x77, 0x77];
        assert_eq!(first(&malloc, &[RDI]), Some(0x1007));
        // its sdallocx: mov %rdi,%r9; cmp $0x1000,%rsi; ja rel32
        let sdallocx = [
            0x49, 0x89, 0xf9, 0x48, 0x81, 0xfe, 0x00, 0x10, 0x00, 0x00, 0x0f, 0x87, 0x78, 0x00,
            0x00, 0x00,
        ];
        assert_eq!(first(&sdallocx, &[RDI]), Some(0x100a));
        // its rallocx: xor %ecx,%ecx; jmp rel32 (rcx is its fourth argument)
        let rallocx = [0x31, 0xc9, 0xe9, 0x00, 0x00, 0x00, 0x00];
        assert_eq!(first(&rallocx, &[RDI, RSI]), Some(0x1002));
        assert_eq!(first(&rallocx, &[RDI, RSI, RDX, RCX]), None);
        // push %r15 first: there already
        assert_eq!(first(&[0x41, 0x57, 0x55], &[RDI]), Some(0x1000));
        // mov %rdi,%rsi changes an argument read; sub $8,%rsp the stack
        assert_eq!(first(&[0x48, 0x89, 0xfe, 0x77, 0x00], &[RDI, RSI]), None);
        assert_eq!(first(&[0x48, 0x83, 0xec, 0x08, 0x77, 0x00], &[RDI]), None);
        // a store to memory
        assert_eq!(first(&[0x48, 0x89, 0x38, 0x77, 0x00], &[RDI]), None);
        // a jcc with an operand-size prefix is single-stepped: not a place to move to
        assert_eq!(
            first(&[0x48, 0x85, 0xff, 0x66, 0x0f, 0x84, 0, 0, 0, 0], &[RDI]),
            None
        );
    }

    #[test]
    fn rip_relative_operands_are_resolved_to_addresses() {
        // lea 0x10(%rip),%rax at 0x2000 (7 bytes); lea 0x20(%rip),%rdx; ret
        let code = [
            0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00, //
            0x48, 0x8d, 0x15, 0x20, 0x00, 0x00, 0x00, //
            0xc3,
        ];
        assert_eq!(rip_relative_targets(&code, 0x2000), [0x2017, 0x202e]);
        assert_eq!(rip_relative_targets(CODE, 0x1000), Vec::<u64>::new());
    }

    #[test]
    fn avx_instructions_whose_opcode_the_kernel_takes_for_a_branch_are_found() {
        let misread = |code: &[u8]| misread_by_uprobes(code, 0x1000);
        let found = |mnemonic: &str, length: u64| {
            Some(Misread {
                mnemonic: mnemonic.to_string(),
                length,
            })
        };
        // EVEX, map 0F38, opcode 0x7a (jp): glibc's __strchr_evex starts with it.
        assert_eq!(
            misread(&[0x62, 0xe2, 0x7d, 0x28, 0x7a, 0xce]),
            found("vpbroadcastb", 6)
        );
        // VEX (2 bytes): vpcmpeqb %xmm0,%xmm0,%xmm1 is 0x74 (je); vzeroupper 0x77 (ja).
        assert_eq!(misread(&[0xc5, 0xf9, 0x74, 0xc8]), found("vpcmpeqb", 4));
        assert_eq!(misread(&[0xc5, 0xf8, 0x77]), found("vzeroupper", 3));
        // VEX (3 bytes): vpbroadcastd %xmm0,%ymm1 (0F38 0x58) is no branch.
        assert_eq!(misread(&[0xc4, 0xe2, 0x7d, 0x58, 0xc8]), None);
        // EVEX vpxorq (0xef): the kernel refuses it, it does not misread it.
        assert_eq!(misread(&[0x62, 0xa1, 0xfd, 0x00, 0xef, 0xc0]), None);
        // Real branches and nops are what the kernel emulates correctly.
        assert_eq!(misread(&[0x74, 0x05]), None);
        assert_eq!(misread(&[0x90]), None);
        assert_eq!(misread(&[0xe8, 0, 0, 0, 0]), None);
    }

    #[test]
    fn branch_targets_are_listed() {
        // call 0x1006 at 0x1001; jne back to 0x1000 at 0x100c.
        let mut code = CODE.to_vec();
        code.extend_from_slice(&[0x75, 0xf2]);
        assert_eq!(branch_targets(&code, 0x1000), [0x1006, 0x1000]);
    }

    #[test]
    fn code_that_does_not_decode_up_to_the_address_is_reported() {
        // 0x06 (push es) does not exist in 64-bit mode.
        assert_eq!(
            placement(&[0x90, 0x06, 0x90, 0x90], 0x10, 0x13),
            Placement::Undecodable { at: 0x11 }
        );
        // The code ends inside the call.
        assert_eq!(
            placement(&CODE[..3], 0x1000, 0x1006),
            Placement::Undecodable { at: 0x1001 }
        );
        // Past the end of the code.
        assert_eq!(
            placement(CODE, 0x1000, 0x2000),
            Placement::Undecodable { at: 0x100c }
        );
    }
}
