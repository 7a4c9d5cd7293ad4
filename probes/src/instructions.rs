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

/// Why a uprobe must not sit on an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HazardKind {
    /// AVX-encoded (VEX, EVEX, XOP) with an opcode byte that, read as a one-byte legacy
    /// opcode, is a jump, a call or a nop: Linux's x86 uprobes would not run it.
    ///
    /// The kernel analyzes a probed instruction by its first opcode byte, whatever map
    /// the VEX prefix selects, and emulates `jcc rel8` (0x70-0x7f), `call`/`jmp` (0xe8,
    /// 0xe9, 0xeb) and `nop` (0x90) instead of single-stepping them. So `vpbroadcastb
    /// %esi,%ymm17` (opcode 0x7a in map 0F38, glibc's `__strchr_evex` starts with it)
    /// becomes `jp`: the instruction never runs, and `strchr` returns NULL in every
    /// process that calls it (seen on Linux 6.18: cargo-trace itself then failed to
    /// attach its next probe).
    Misread,
    /// A 5-byte nop, which Linux 6.18's uprobes optimize after the first hit in a
    /// process: the nop becomes a `call` to a page the kernel maps into that process
    /// (`[uprobes-trampoline]`). A child the process forks afterwards inherits the
    /// patched code but not the page, and dies of SIGSEGV at its first call there,
    /// whether it is traced or not.
    OptimizedNop,
}

impl HazardKind {
    /// What such an instruction is and what a uprobe on it does, as a sentence goes on
    /// after the instruction's name: "starts with vpcmpeqb, {why}".
    pub fn why(self) -> &'static str {
        match self {
            HazardKind::Misread => {
                "an AVX instruction Linux's uprobes take for a jump or a nop and would skip \
                 instead of running, corrupting every process running the file"
            }
            HazardKind::OptimizedNop => {
                "a 5-byte nop Linux 6.18's uprobes turn into a call to a page of the probed \
                 process, which a child it forks does not inherit (the child would crash at \
                 its first call there)"
            }
        }
    }
}

/// An instruction no uprobe may sit on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hazard {
    pub kind: HazardKind,
    /// How messages name it: `vpbroadcastb`, `nop (0f 1f 44 00 00)`.
    pub instruction: String,
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

/// Instructions looked past, at most, for an emulated one (see [`first_emulated`]): the
/// allocators' entries seen need up to 10 (the mimalloc crate's `mi_free` finds its page
/// in 10 register-only instructions before its first `je`), and what is looked past is
/// checked one instruction at a time, so the bound only keeps the search to a
/// function's first few instructions.
const MAX_SKIPPED: usize = 16;

/// The integer argument registers, in order.
pub(crate) const ARGUMENTS: [Register; 6] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// The first instruction past a function's entry that the kernel emulates under a
/// uprobe, and where the function's arguments are when it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Emulated {
    pub address: u64,
    /// For each of [`ARGUMENTS`], the index of the argument whose value at the entry it
    /// holds there: its own, another one copied into it (`mov %rdi,%rsi`), or `None`
    /// once anything else was written to it.
    pub holds: [Option<usize>; 6],
}

/// The first instruction of `code` (at `start`) that the kernel emulates under a uprobe
/// (see [`emulated_without_prefix`]), when each instruction before it (at most
/// [`MAX_SKIPPED`]) runs straight on and changes nothing but the flags and a general
/// register other than rsp and rbp: compares and tests, and moves, loads and
/// arithmetic into a register. A probe there sees rsp, rbp and memory as they were at
/// `start`, and the arguments where [`Emulated::holds`] says.
pub(crate) fn first_emulated(code: &[u8], start: u64) -> Option<Emulated> {
    // The argument each general register holds, by register number (rax 0 to r15 15).
    let mut values: [Option<usize>; 16] = [None; 16];
    for (argument, register) in ARGUMENTS.iter().enumerate() {
        values[number(*register)] = Some(argument);
    }
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
            return Some(Emulated {
                address: instruction.ip(),
                holds: ARGUMENTS.map(|register| values[number(register)]),
            });
        }
        match effect(&instruction) {
            Effect::Flags => {}
            Effect::Copy { to, from } => values[number(to)] = values[number(from)],
            Effect::Write(register) => values[number(register)] = None,
            Effect::Other => return None,
        }
    }
    None
}

/// The number of 64-bit general register `register` (rax 0 to r15 15).
fn number(register: Register) -> usize {
    register as usize - Register::RAX as usize
}

/// What an instruction looked past on the way to an emulated one changes.
enum Effect {
    /// The flags only.
    Flags,
    /// A 64-bit general register, to the value of another one (`mov %rdi,%rsi`).
    Copy { to: Register, from: Register },
    /// A general register (all of it, for the program reading it), and the flags.
    Write(Register),
    /// Something else: memory, rsp or rbp, another register, or control flow.
    Other,
}

fn effect(instruction: &Instruction) -> Effect {
    use Mnemonic::*;
    match instruction.mnemonic() {
        Cmp | Test => Effect::Flags,
        Mov | Movzx | Movsx | Movsxd | Lea | Xor | And | Or | Add | Sub | Shl | Shr | Sar => {
            if instruction.op0_kind() != OpKind::Register {
                return Effect::Other;
            }
            let register = instruction.op0_register();
            let written = register.full_register();
            if !written.is_gpr64() || written == Register::RSP || written == Register::RBP {
                return Effect::Other;
            }
            let copied = instruction.mnemonic() == Mov
                && register.is_gpr64()
                && instruction.op1_kind() == OpKind::Register
                && instruction.op1_register().is_gpr64();
            if copied {
                Effect::Copy {
                    to: written,
                    from: instruction.op1_register(),
                }
            } else {
                Effect::Write(written)
            }
        }
        _ => Effect::Other,
    }
}

/// The instruction at the start of `code` (at address `ip`), if no uprobe may sit on
/// it (see [`HazardKind`]).
pub(crate) fn hazard_for_uprobes(code: &[u8], ip: u64) -> Option<Hazard> {
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let instruction = decoder.decode();
    if instruction.is_invalid() {
        return None;
    }
    let bytes = &code[..instruction.len()];
    let mnemonic = format!("{:?}", instruction.mnemonic()).to_lowercase();
    let (kind, instruction) = if misread_by_uprobes(bytes) {
        (HazardKind::Misread, mnemonic)
    } else if optimized_by_uprobes(bytes) {
        let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let named = format!("{mnemonic} ({})", hex.join(" "));
        (HazardKind::OptimizedNop, named)
    } else {
        return None;
    };
    Some(Hazard {
        kind,
        instruction,
        length: bytes.len() as u64,
    })
}

/// Whether `instruction` (its bytes, all of them) is AVX-encoded with an opcode byte the
/// kernel emulates (see [`HazardKind::Misread`]).
fn misread_by_uprobes(instruction: &[u8]) -> bool {
    // Segment and address-size prefixes may come before the VEX prefix; a VEX prefix
    // is 2 (0xc5) or 3 bytes (0xc4, XOP's 0x8f), EVEX's 4, and the opcode follows.
    let Some(start) = instruction
        .iter()
        .position(|b| !matches!(b, 0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x67))
    else {
        return false;
    };
    // In 64-bit mode 0xc4, 0xc5 and 0x62 are always VEX and EVEX; 0x8f is XOP when
    // its next byte selects a map of 8 or more (else it is `pop`).
    let prefix = match instruction[start] {
        0xc5 => 2,
        0xc4 => 3,
        0x8f if instruction.get(start + 1).is_some_and(|b| b & 0x1f >= 8) => 3,
        0x62 => 4,
        _ => return false,
    };
    instruction
        .get(start + prefix)
        .is_some_and(|&opcode| kernel_emulates(opcode))
}

/// Whether `instruction` (its bytes, all of them) is one Linux 6.18's uprobes optimize
/// (see [`HazardKind::OptimizedNop`]), as its `can_optimize` takes it: 5 bytes long, and
/// `nop` (0x90) or `nopl` (0x0f 0x1f with a ModRM whose reg field is 0) after any
/// prefixes (`0f 1f 44 00 00`, what assemblers pad with; `66 0f 1f 40 00`;
/// `66 66 66 66 90`). An instruction with a segment prefix other than fs and gs, or
/// with `lock`, is refused by the kernel before that, so it is not one. Nor is one
/// whose 5 bytes cross a page boundary, which the kernel leaves a breakpoint; that is
/// not told apart here: such a nop is moved past or refused all the same, and a nop
/// does nothing a probe past it would miss.
fn optimized_by_uprobes(instruction: &[u8]) -> bool {
    if instruction.len() != 5 {
        return false;
    }
    let Some(start) = instruction
        .iter()
        .position(|b| !matches!(b, 0x66 | 0x67 | 0xf2 | 0xf3 | 0x64 | 0x65 | 0x40..=0x4f))
    else {
        return false;
    };
    match instruction[start..] {
        [0x90] => true,
        [0x0f, 0x1f, modrm, ..] => (modrm >> 3) & 7 == 0,
        _ => false,
    }
}

/// The near branch targets (jumps, calls, conditional jumps) of the instructions of
/// `code` (at `start`). Bytes that do not decode (data, or padding between functions)
/// are stepped over: the decoder falls back in step with the instructions within a few
/// bytes, and a target read from data only makes the callers more careful.
pub(crate) fn branch_targets(code: &[u8], start: u64) -> Vec<u64> {
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut targets = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            continue;
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

/// Whether `code` (at `start`) jumps where a register or memory says (a switch's jump
/// table: `jmp *%rax`), other than through a slot at a fixed address (`jmp
/// *0x2fe2(%rip)`, a tail call through the GOT): where such a jump lands is unknown.
pub(crate) fn has_computed_jumps(code: &[u8], start: u64) -> bool {
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.mnemonic() != Mnemonic::Jmp {
            continue;
        }
        match instruction.op0_kind() {
            OpKind::Register => return true,
            OpKind::Memory if !instruction.is_ip_rel_memory_operand() => return true,
            _ => {}
        }
    }
    false
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

    /// Where `first_emulated` moves a probe of `code` at 0x1000, and the first `n`
    /// argument registers' values there.
    fn moved(code: &[u8], n: usize) -> Option<(u64, Vec<Option<usize>>)> {
        first_emulated(code, 0x1000).map(|e| (e.address, e.holds[..n].to_vec()))
    }

    /// Every argument register in its place.
    const IN_PLACE: [Option<usize>; 4] = [Some(0), Some(1), Some(2), Some(3)];

    #[test]
    fn probes_move_to_the_first_emulated_instruction() {
        // jemalloc's malloc: cmp $0x1000,%rdi; ja rel8
        let malloc = [0x48, 0x81, 0xff, 0x00, 0x10, 0x00, 0x00, 0x77, 0x77];
        assert_eq!(moved(&malloc, 4), Some((0x1007, IN_PLACE.to_vec())));
        // its sdallocx: mov %rdi,%r9; cmp $0x1000,%rsi; ja rel32
        let sdallocx = [
            0x49, 0x89, 0xf9, 0x48, 0x81, 0xfe, 0x00, 0x10, 0x00, 0x00, 0x0f, 0x87, 0x78, 0x00,
            0x00, 0x00,
        ];
        let e = first_emulated(&sdallocx, 0x1000).unwrap();
        assert_eq!((e.address, e.holds[5]), (0x100a, Some(0)), "r9 holds rdi's");
        // its rallocx: xor %ecx,%ecx; jmp rel32 (rcx is its fourth argument)
        let rallocx = [0x31, 0xc9, 0xe9, 0x00, 0x00, 0x00, 0x00];
        let rcx_lost = vec![Some(0), Some(1), Some(2), None];
        assert_eq!(moved(&rallocx, 4), Some((0x1002, rcx_lost)));
        // push %r15 first: there already
        assert_eq!(moved(&[0x41, 0x57, 0x55], 1), Some((0x1000, vec![Some(0)])));
        // sub $8,%rsp changes the stack, mov %rdi,%rbp the frame pointer
        assert_eq!(moved(&[0x48, 0x83, 0xec, 0x08, 0x77, 0x00], 1), None);
        assert_eq!(moved(&[0x48, 0x89, 0xfd, 0x77, 0x00], 1), None);
        // a store to memory
        assert_eq!(moved(&[0x48, 0x89, 0x38, 0x77, 0x00], 1), None);
        // a jcc with an operand-size prefix is single-stepped: not a place to move to
        assert_eq!(
            moved(&[0x48, 0x85, 0xff, 0x66, 0x0f, 0x84, 0, 0, 0, 0], 1),
            None
        );
    }

    #[test]
    fn arguments_are_followed_through_register_moves() {
        // the mimalloc crate's mi_malloc_aligned(size, alignment): mov $-0x78,%rax;
        // mov %rsi,%rdx; mov %rdi,%rsi; mov %fs:(%rax),%rax; mov %rax,%rdi; jmp rel32
        let code = [
            0x48, 0xc7, 0xc0, 0x88, 0xff, 0xff, 0xff, //
            0x48, 0x89, 0xf2, //
            0x48, 0x89, 0xfe, //
            0x64, 0x48, 0x8b, 0x00, //
            0x48, 0x89, 0xc7, //
            0xe9, 0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(
            moved(&code, 3),
            Some((0x1014, vec![None, Some(0), Some(1)]))
        );
        // through another register: mov %rdi,%rax; mov %rsi,%rdi; mov %rax,%rsi; jmp
        let swapped = [
            0x48, 0x89, 0xf8, 0x48, 0x89, 0xf7, 0x48, 0x89, 0xc6, 0xeb, 0x00,
        ];
        assert_eq!(moved(&swapped, 2), Some((0x1009, vec![Some(1), Some(0)])));
        // a 32-bit move zero-extends: not a copy (mov %edi,%esi; jmp)
        assert_eq!(
            moved(&[0x89, 0xfe, 0xeb, 0x00], 2),
            Some((0x1002, vec![Some(0), None]))
        );
        // a load through an argument is no copy of it: mov (%rdi),%rdi; jmp
        assert_eq!(
            moved(&[0x48, 0x8b, 0x3f, 0xeb, 0x00], 1),
            Some((0x1003, vec![None]))
        );
    }

    #[test]
    fn long_runs_of_register_only_instructions_are_looked_past() {
        // the mimalloc crate's mi_free: 10 instructions before its `je`, the address
        // copied to rsi before rdi is loaded with the page.
        let code = [
            0x48, 0x8b, 0x05, 0x89, 0xf1, 0x04, 0x00, // mov 0x4f189(%rip),%rax
            0x48, 0x89, 0xfa, // mov %rdi,%rdx
            0x48, 0x89, 0xfe, // mov %rdi,%rsi
            0x48, 0xc1, 0xea, 0x1d, // shr $0x1d,%rdx
            0x48, 0x8b, 0x14, 0xd0, // mov (%rax,%rdx,8),%rdx
            0x48, 0x89, 0xf8, // mov %rdi,%rax
            0x48, 0xc1, 0xe8, 0x10, // shr $0x10,%rax
            0x25, 0xff, 0x1f, 0x00, 0x00, // and $0x1fff,%eax
            0x48, 0x8b, 0x3c, 0xc2, // mov (%rdx,%rax,8),%rdi
            0x48, 0x85, 0xff, // test %rdi,%rdi
            0x74, 0x23, // je
        ];
        assert_eq!(moved(&code, 2), Some((0x1028, vec![None, Some(0)])));
        // but not past MAX_SKIPPED of them
        let mut long = [0x48, 0x85, 0xff].repeat(MAX_SKIPPED + 1);
        long.extend_from_slice(&[0x74, 0x00]);
        assert_eq!(moved(&long, 1), None);
        long.drain(..3);
        assert_eq!(
            moved(&long, 1),
            Some((0x1000 + 3 * MAX_SKIPPED as u64, vec![Some(0)]))
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

    /// The hazard [`hazard_for_uprobes`] finds at the start of `code`: kind, name, length.
    fn hazard(code: &[u8]) -> Option<(HazardKind, String, u64)> {
        hazard_for_uprobes(code, 0x1000).map(|h| (h.kind, h.instruction, h.length))
    }

    #[test]
    fn avx_instructions_whose_opcode_the_kernel_takes_for_a_branch_are_found() {
        let found =
            |mnemonic: &str, length: u64| Some((HazardKind::Misread, mnemonic.to_string(), length));
        // EVEX, map 0F38, opcode 0x7a (jp): glibc's __strchr_evex starts with it.
        assert_eq!(
            hazard(&[0x62, 0xe2, 0x7d, 0x28, 0x7a, 0xce]),
            found("vpbroadcastb", 6)
        );
        // VEX (2 bytes): vpcmpeqb %xmm0,%xmm0,%xmm1 is 0x74 (je); vzeroupper 0x77 (ja).
        assert_eq!(hazard(&[0xc5, 0xf9, 0x74, 0xc8]), found("vpcmpeqb", 4));
        assert_eq!(hazard(&[0xc5, 0xf8, 0x77]), found("vzeroupper", 3));
        // VEX (3 bytes): vpbroadcastd %xmm0,%ymm1 (0F38 0x58) is no branch.
        assert_eq!(hazard(&[0xc4, 0xe2, 0x7d, 0x58, 0xc8]), None);
        // EVEX vpxorq (0xef): the kernel refuses it, it does not misread it.
        assert_eq!(hazard(&[0x62, 0xa1, 0xfd, 0x00, 0xef, 0xc0]), None);
        // Real branches and nops are what the kernel emulates correctly.
        assert_eq!(hazard(&[0x74, 0x05]), None);
        assert_eq!(hazard(&[0x90]), None);
        assert_eq!(hazard(&[0xe8, 0, 0, 0, 0]), None);
    }

    #[test]
    fn five_byte_nops_the_kernel_turns_into_calls_are_found() {
        let found = |name: &str| Some((HazardKind::OptimizedNop, name.to_string(), 5));
        // nopl 0x0(%rax,%rax,1), what assemblers pad with, then a ret.
        assert_eq!(
            hazard(&[0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3]),
            found("nop (0f 1f 44 00 00)")
        );
        // Other 5-byte forms the kernel takes: nopw 0x0(%rax); data16 x4 nop.
        assert_eq!(
            hazard(&[0x66, 0x0f, 0x1f, 0x40, 0x00]),
            found("nop (66 0f 1f 40 00)")
        );
        assert_eq!(
            hazard(&[0x66, 0x66, 0x66, 0x66, 0x90]),
            found("nop (66 66 66 66 90)")
        );
        // Other lengths: nopl 0x0(%rax) (4), nopw 0x0(%rax,%rax,1) (6), xchg %ax,%ax (2).
        assert_eq!(hazard(&[0x0f, 0x1f, 0x40, 0x00, 0xc3]), None);
        assert_eq!(hazard(&[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00]), None);
        assert_eq!(hazard(&[0x66, 0x90, 0xc3, 0xc3, 0xc3]), None);
        // A cs prefix: the kernel refuses the probe outright (cs nopl 0x0(%rax)).
        assert_eq!(hazard(&[0x2e, 0x0f, 0x1f, 0x40, 0x00]), None);
        // 0f 1f with a reg field other than 0 is a reserved hint, not nopl.
        assert_eq!(hazard(&[0x0f, 0x1f, 0x4c, 0x00, 0x00]), None);
        // 5 bytes, no nop: mov $0,%eax; call rel32.
        assert_eq!(hazard(&[0xb8, 0, 0, 0, 0]), None);
        assert_eq!(hazard(&[0xe8, 0, 0, 0, 0]), None);
    }

    #[test]
    fn a_five_byte_nop_is_neither_emulated_nor_looked_past() {
        // A cheaper entry never sits on one: it is no instruction the kernel emulates,
        // and a probe does not move past it to one that is.
        let nop5_then_jump = [0x0f, 0x1f, 0x44, 0x00, 0x00, 0xeb, 0x00];
        assert!(!emulated_without_prefix(&nop5_then_jump));
        assert_eq!(moved(&nop5_then_jump, 1), None);
        let compare_nop5_jump = [0x48, 0x85, 0xff, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x74, 0x00];
        assert_eq!(moved(&compare_nop5_jump, 1), None);
        // Nor is a one-byte nop a hazard: it is emulated, and probes may move onto it.
        assert_eq!(
            moved(&[0x48, 0x85, 0xff, 0x90], 1),
            Some((0x1003, vec![Some(0)]))
        );
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
