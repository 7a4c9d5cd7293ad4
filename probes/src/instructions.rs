//! Where x86-64 instructions start in a function's code.
//!
//! A uprobe replaces the first byte of the probed instruction with `int3` in the page
//! cache, so in every process that runs the file. Placed inside an instruction, it
//! corrupts that instruction's operand bytes: the processes crash, traced or not. The
//! only safe places are instruction boundaries, and the only way to know them is to
//! decode the function from its start (x86 instructions are 1 to 15 bytes long and
//! their lengths depend on every preceding byte).

use iced_x86::{Decoder, DecoderOptions};

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
