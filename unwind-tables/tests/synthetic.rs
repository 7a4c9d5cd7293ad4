//! Hand-written CFI → the rules the compiler must produce (or refuse). Each test builds the
//! exact CFI bytes of one shape found in real binaries.

mod common;

use common::{
    elf_with_eh_frame, op, standard_cie, Cfa as Cfi, DebugFrame, EhFrame, Elf, R10, RA, RBP, RSP,
};
use unwind_tables::{
    compile, compile_file_with, Cfa, DebugSearch, Error, RbpRule, Reg, Rule, UnsupportedReason,
};

fn frame(cfa: Cfa, rbp: RbpRule) -> Rule {
    Rule::Frame { cfa, rbp }
}

fn rsp(offset: i32) -> Rule {
    frame(Cfa::Rsp(offset), RbpRule::Same)
}

fn unsupported(reason: UnsupportedReason) -> Rule {
    Rule::Unsupported(reason)
}

/// The rule at 0x1000 of a one-FDE object whose FDE (0x1000..0x1040) runs `instructions`.
fn single(cie: Cfi, instructions: Cfi) -> unwind_tables::CompiledObject {
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &cie);
    eh.fde(cie, 0x1000, 0x40, &instructions);
    compile(&elf_with_eh_frame(eh)).expect("compiles")
}

fn rule_of(instructions: Cfi) -> Rule {
    single(standard_cie(), instructions).table.lookup(0x1000)
}

#[test]
fn standard_prologue_and_epilogue() {
    // push %rbp; mov %rsp,%rbp; ...; pop %rbp; ret
    let fde = Cfi::new()
        .advance(1)
        .def_cfa_offset(16)
        .offset(RBP, 2)
        .advance(3)
        .def_cfa_register(RBP)
        .advance(0x20)
        .def_cfa(RSP, 8);
    let object = single(standard_cie(), fde);
    let table = &object.table;
    assert_eq!(table.lookup(0xfff), Rule::Gap);
    assert_eq!(table.lookup(0x1000), rsp(8));
    assert_eq!(
        table.lookup(0x1001),
        frame(Cfa::Rsp(16), RbpRule::AtCfa(-16))
    );
    assert_eq!(
        table.lookup(0x1003),
        frame(Cfa::Rsp(16), RbpRule::AtCfa(-16))
    );
    assert_eq!(
        table.lookup(0x1004),
        frame(Cfa::Rbp(16), RbpRule::AtCfa(-16))
    );
    assert_eq!(
        table.lookup(0x1024),
        frame(Cfa::Rsp(8), RbpRule::AtCfa(-16))
    );
    assert_eq!(
        table.lookup(0x103f),
        frame(Cfa::Rsp(8), RbpRule::AtCfa(-16))
    );
    assert_eq!(table.lookup(0x1040), Rule::Gap);
    assert_eq!(object.stats.eh_frame_fdes, 1);
    assert_eq!(object.stats.code_bytes_with_cfi, 0x40);
    assert_eq!(object.stats.code_bytes_supported, 0x40);
    table.check().expect("valid table");
}

#[test]
fn plt_expressions() {
    for threshold in [11, 10] {
        let rule = rule_of(Cfi::new().def_cfa_expression(&op::plt(threshold)));
        assert_eq!(rule, rsp_plt(threshold));
    }
    // Same shape with another mask is not the PLT rule.
    let mut wrong = op::plt(11);
    wrong[4] = op::lit(7);
    assert_eq!(
        rule_of(Cfi::new().def_cfa_expression(&wrong)),
        unsupported(UnsupportedReason::CfaExpression)
    );
}

fn rsp_plt(threshold: u8) -> Rule {
    frame(Cfa::Plt { threshold }, RbpRule::Same)
}

#[test]
fn drap_dereference() {
    let deref = |tail: &[u8]| {
        let mut expr = op::breg(RBP, -8);
        expr.push(op::DEREF);
        expr.extend_from_slice(tail);
        Cfi::new()
            .def_cfa_expression(&expr)
            .expression(RBP, &op::breg(RBP, 0))
    };
    assert_eq!(
        rule_of(deref(&[])),
        frame(
            Cfa::Deref {
                reg: Reg::Rbp,
                offset: -8,
                add: 0
            },
            RbpRule::AtRbp(0)
        )
    );
    assert_eq!(
        rule_of(deref(&op::plus_uconst(16))),
        frame(
            Cfa::Deref {
                reg: Reg::Rbp,
                offset: -8,
                add: 16
            },
            RbpRule::AtRbp(0)
        )
    );
    let mut minus = op::consts(-8);
    minus.push(op::PLUS);
    assert_eq!(
        rule_of(deref(&minus)),
        frame(
            Cfa::Deref {
                reg: Reg::Rbp,
                offset: -8,
                add: -8
            },
            RbpRule::AtRbp(0)
        )
    );
    // Dereferencing a register the walker does not track.
    let mut r10 = op::breg(R10, 0);
    r10.push(op::DEREF);
    assert_eq!(
        rule_of(Cfi::new().def_cfa_expression(&r10)),
        unsupported(UnsupportedReason::CfaRegister)
    );
    // An add that does not fit i32 is marked, not wrapped.
    assert_eq!(
        rule_of(deref(&op::plus_uconst(1 << 31))),
        unsupported(UnsupportedReason::OffsetOverflow)
    );
}

#[test]
fn expressions_in_other_encodings() {
    // The PLT expression with DW_OP_bregx, DW_OP_const1u and DW_OP_constu instead of the
    // short forms means the same.
    let mut plt = vec![
        0x92,
        RSP,
        8,
        0x92,
        RA,
        0,
        0x08,
        15,
        op::AND,
        0x10,
        11,
        op::GE,
    ];
    plt.extend([op::lit(3), op::SHL, op::PLUS]);
    assert_eq!(rule_of(Cfi::new().def_cfa_expression(&plt)), rsp_plt(11));
    // DW_OP_deref_size 8 is DW_OP_deref; size 4 is not.
    let mut deref8 = op::breg(RSP, 16);
    deref8.extend([0x94, 8]);
    assert_eq!(
        rule_of(Cfi::new().def_cfa_expression(&deref8)),
        frame(
            Cfa::Deref {
                reg: Reg::Rsp,
                offset: 16,
                add: 0
            },
            RbpRule::Same
        )
    );
    let mut deref4 = op::breg(RSP, 16);
    deref4.extend([0x94, 4]);
    assert_eq!(
        rule_of(Cfi::new().def_cfa_expression(&deref4)),
        unsupported(UnsupportedReason::CfaExpression)
    );
    // DW_OP_piece with a size whose bit count overflows (gimli's parser panics on it in
    // overflow-checked builds; found by fuzzing).
    let piece = [
        0x93, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
    ];
    assert_eq!(
        rule_of(Cfi::new().def_cfa_expression(&piece)),
        unsupported(UnsupportedReason::CfaExpression)
    );
    // An SLEB128 offset that does not fit i64.
    let huge = [
        0x77,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0x7e,
        op::DEREF,
    ];
    assert_eq!(
        rule_of(Cfi::new().def_cfa_expression(&huge)),
        unsupported(UnsupportedReason::CfaExpression)
    );
}

#[test]
fn cfa_rules_the_walker_cannot_execute() {
    assert_eq!(
        rule_of(Cfi::new().def_cfa(R10, 0)),
        unsupported(UnsupportedReason::CfaRegister)
    );
    assert_eq!(
        rule_of(Cfi::new().def_cfa_expression(&op::breg(RSP, 8))),
        unsupported(UnsupportedReason::CfaExpression)
    );
    // A malformed expression (truncated SLEB) is not guessed at either.
    assert_eq!(
        rule_of(Cfi::new().def_cfa_expression(&[0x77, 0x80])),
        unsupported(UnsupportedReason::CfaExpression)
    );
}

#[test]
fn offsets_never_wrap() {
    // rustup has a CFA offset of 49,856: fits i32, and must stay exact.
    assert_eq!(rule_of(Cfi::new().def_cfa_offset(49_856)), rsp(49_856));
    assert_eq!(
        rule_of(Cfi::new().def_cfa_offset(i32::MAX as u64)),
        rsp(i32::MAX)
    );
    assert_eq!(
        rule_of(Cfi::new().def_cfa_offset(1 << 31)),
        unsupported(UnsupportedReason::OffsetOverflow)
    );
    assert_eq!(
        rule_of(Cfi::new().offset(RBP, 1 << 29)),
        unsupported(UnsupportedReason::OffsetOverflow)
    );
}

#[test]
fn return_address_rules() {
    // Saved somewhere other than CFA-8.
    assert_eq!(
        rule_of(Cfi::new().offset(RA, 2)),
        unsupported(UnsupportedReason::ReturnAddress)
    );
    assert_eq!(
        rule_of(Cfi::new().register(RA, R10)),
        unsupported(UnsupportedReason::ReturnAddress)
    );
    // Explicitly undefined: the outermost frame.
    assert_eq!(rule_of(Cfi::new().undefined(RA)), Rule::End);
    // Never defined at all (a CIE without the RA rule): broken CFI, not an end of stack.
    let object = single(Cfi::new().def_cfa(RSP, 8), Cfi::new());
    assert_eq!(
        object.table.lookup(0x1000),
        unsupported(UnsupportedReason::ReturnAddress)
    );
}

#[test]
fn rbp_rules() {
    assert_eq!(rule_of(Cfi::new().same_value(RBP)), rsp(8));
    assert_eq!(
        rule_of(Cfi::new().offset(RBP, 2)),
        frame(Cfa::Rsp(8), RbpRule::AtCfa(-16))
    );
    assert_eq!(
        rule_of(Cfi::new().expression(RBP, &op::breg(RBP, -16))),
        frame(Cfa::Rsp(8), RbpRule::AtRbp(-16))
    );
    for instructions in [
        Cfi::new().val_offset(RBP, 2),
        Cfi::new().register(RBP, R10),
        Cfi::new().expression(RBP, &op::breg(RSP, 8)),
        Cfi::new().undefined(RBP),
    ] {
        assert_eq!(
            rule_of(instructions),
            unsupported(UnsupportedReason::RbpRule)
        );
    }
}

/// glibc's `__restore_rt` CFI (sysdeps/unix/sysv/linux/x86_64/libc_sigaction.c), with the
/// given ucontext offsets for rsp, rip and rbp.
fn signal_object(rsp_at: i64, rip_at: i64, rbp_at: i64) -> unwind_tables::CompiledObject {
    let mut cfa = op::breg(RSP, rsp_at);
    cfa.push(op::DEREF);
    let mut eh = EhFrame::new();
    let cie = eh.cie("zRS", &Cfi::new());
    let fde = Cfi::new()
        .def_cfa_expression(&cfa)
        .expression(8, &op::breg(RSP, 40))
        .expression(RBP, &op::breg(RSP, rbp_at))
        .expression(RA, &op::breg(RSP, rip_at));
    eh.fde(cie, 0x1000, 0x10, &fde);
    compile(&elf_with_eh_frame(eh)).expect("compiles")
}

#[test]
fn signal_trampoline() {
    assert_eq!(
        signal_object(160, 168, 120).table.lookup(0x1008),
        Rule::Signal
    );
    assert_eq!(
        signal_object(152, 168, 120).table.lookup(0x1008),
        unsupported(UnsupportedReason::CfaExpression)
    );
    assert_eq!(
        signal_object(160, 176, 120).table.lookup(0x1008),
        unsupported(UnsupportedReason::ReturnAddress)
    );
    assert_eq!(
        signal_object(160, 168, 112).table.lookup(0x1008),
        unsupported(UnsupportedReason::RbpRule)
    );
}

#[test]
fn gaps_adjacency_and_merging() {
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    eh.fde(cie, 0x1000, 0x10, &Cfi::new());
    // Adjacent, same rule at the seam: one row.
    eh.fde(cie, 0x1010, 0x10, &Cfi::new().advance(4).def_cfa_offset(16));
    // After a gap.
    eh.fde(cie, 0x1030, 0x10, &Cfi::new());
    let object = compile(&elf_with_eh_frame(eh)).expect("compiles");
    let rows: Vec<(u64, Rule)> = object.table.iter().collect();
    assert_eq!(
        rows,
        vec![
            (0x1000, rsp(8)),
            (0x1014, rsp(16)),
            (0x1020, Rule::Gap),
            (0x1030, rsp(8)),
            (0x1040, Rule::Gap),
        ]
    );
    assert_eq!(object.stats.rules, 3);
    assert_eq!(object.stats.code_bytes_with_cfi, 0x30);
}

#[test]
fn overlapping_fdes_earliest_then_longest_wins() {
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    eh.fde(cie, 0x1010, 0x10, &Cfi::new().def_cfa_offset(32)); // shorter, same start
    eh.fde(cie, 0x1010, 0x20, &Cfi::new().def_cfa_offset(16)); // longer: wins 0x1010..0x1030
    eh.fde(cie, 0x1000, 0x18, &Cfi::new()); // earliest: wins 0x1000..0x1018
    let object = compile(&elf_with_eh_frame(eh)).expect("compiles");
    let rows: Vec<(u64, Rule)> = object.table.iter().collect();
    assert_eq!(
        rows,
        vec![(0x1000, rsp(8)), (0x1018, rsp(16)), (0x1030, Rule::Gap)]
    );
    assert_eq!(object.stats.shadowed_fdes, 1);
}

#[test]
fn bad_instruction_inside_an_fde() {
    // Rows before the bad opcode stay; the rest of the FDE is BadCfi.
    let object = single(
        standard_cie(),
        Cfi::new()
            .advance(4)
            .def_cfa_offset(16)
            .advance(4)
            .raw(&[0x3c]),
    );
    let table = &object.table;
    assert_eq!(table.lookup(0x1000), rsp(8));
    assert_eq!(table.lookup(0x1004), rsp(16));
    assert_eq!(table.lookup(0x1008), unsupported(UnsupportedReason::BadCfi));
    assert_eq!(table.lookup(0x103f), unsupported(UnsupportedReason::BadCfi));
    assert_eq!(table.lookup(0x1040), Rule::Gap);
}

#[test]
fn fdes_outside_code_are_dropped() {
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    // A discarded function's FDE, tombstoned at address 0.
    eh.fde(cie, 0, 0x20, &Cfi::new());
    eh.fde(cie, 0x1000, 0x20, &Cfi::new());
    let object = compile(&elf_with_eh_frame(eh)).expect("compiles");
    assert_eq!(object.table.lookup(0x10), Rule::Gap);
    assert_eq!(object.table.lookup(0x1000), rsp(8));
    assert_eq!(object.stats.outside_code_fdes, 1);
    assert_eq!(object.table.first_page, 0);
}

#[test]
fn debug_frame_fills_what_eh_frame_lacks() {
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    eh.fde(cie, 0x1000, 0x10, &Cfi::new());
    let mut debug = DebugFrame::new();
    let cie = debug.cie(&standard_cie());
    debug.fde(cie, 0x1000, 0x100, &Cfi::new().def_cfa_offset(16));
    let elf = Elf::new(0x1000, 0x2000)
        .eh_frame(eh.finish())
        .debug_frame(debug.finish())
        .build();
    let object = compile(&elf).expect("compiles");
    assert_eq!(object.table.lookup(0x1008), rsp(8));
    assert_eq!(object.table.lookup(0x1010), rsp(16));
    assert_eq!(object.table.lookup(0x10ff), rsp(16));
    assert_eq!(object.table.lookup(0x1100), Rule::Gap);
    assert_eq!(object.stats.debug_frame_fdes, 1);
    assert!(!object.stats.separate_debug_file);
}

fn debug_file(build_id: Option<&[u8]>) -> Vec<u8> {
    let mut debug = DebugFrame::new();
    let cie = debug.cie(&standard_cie());
    debug.fde(cie, 0x1000, 0x20, &Cfi::new().def_cfa_offset(24));
    let mut elf = Elf::new(0x1000, 0x2000).debug_frame(debug.finish());
    if let Some(id) = build_id {
        elf = elf.build_id(id);
    }
    elf.build()
}

#[test]
fn separate_debug_file_by_build_id() {
    let dir = tempfile::tempdir().expect("temp dir");
    let id = [0xab, 0xcd, 0xef, 0x01];
    let main = dir.path().join("main");
    std::fs::write(&main, Elf::new(0x1000, 0x2000).build_id(&id).build()).unwrap();
    let search = DebugSearch {
        debug_dirs: vec![dir.path().join("debug")],
    };
    // Without the debug file: no CFI at all.
    assert!(matches!(
        compile_file_with(&main, &search),
        Err(Error::NoUnwindInfo)
    ));

    let by_id = dir.path().join("debug/.build-id/ab/cdef01.debug");
    std::fs::create_dir_all(by_id.parent().unwrap()).unwrap();
    // A debug file of another build: ignored.
    std::fs::write(&by_id, debug_file(Some(&[1, 2, 3, 4]))).unwrap();
    assert!(matches!(
        compile_file_with(&main, &search),
        Err(Error::NoUnwindInfo)
    ));

    std::fs::write(&by_id, debug_file(Some(&id))).unwrap();
    let object = compile_file_with(&main, &search).expect("compiles from the debug file");
    assert_eq!(object.table.lookup(0x1000), rsp(24));
    assert!(object.stats.separate_debug_file);
    assert_eq!(object.build_id.as_deref(), Some(&id[..]));
    // compile() never searches.
    assert!(matches!(
        compile(&std::fs::read(&main).unwrap()),
        Err(Error::NoUnwindInfo)
    ));
}

#[test]
fn separate_debug_file_by_debuglink() {
    let dir = tempfile::tempdir().expect("temp dir");
    let debug = debug_file(None);
    let crc = crc32(&debug);
    std::fs::create_dir_all(dir.path().join(".debug")).unwrap();
    std::fs::write(dir.path().join(".debug/main.debug"), &debug).unwrap();
    let main = dir.path().join("main");
    let search = DebugSearch::none();

    std::fs::write(
        &main,
        Elf::new(0x1000, 0x2000)
            .debuglink("main.debug", crc ^ 1)
            .build(),
    )
    .unwrap();
    assert!(matches!(
        compile_file_with(&main, &search),
        Err(Error::NoUnwindInfo)
    ));

    std::fs::write(
        &main,
        Elf::new(0x1000, 0x2000)
            .debuglink("main.debug", crc)
            .build(),
    )
    .unwrap();
    let object = compile_file_with(&main, &search).expect("compiles from the debuglink file");
    assert_eq!(object.table.lookup(0x1010), rsp(24));
    assert!(object.stats.separate_debug_file);
}

/// The reference CRC-32 (bitwise), independent of the crate's table-driven one.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn more_than_65536_distinct_rules_is_an_error() {
    // Steps of 16: no push/pop merging.
    let mut instructions = Cfi::new();
    for row in 0..70_000u64 {
        instructions = instructions.def_cfa_offset(8 + row * 16).advance(1);
    }
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    eh.fde(cie, 0x1000, 80_000, &instructions);
    let elf = Elf::new(0x1000, 0x20000).eh_frame(eh.finish()).build();
    assert!(matches!(
        compile(&elf),
        Err(Error::TooManyRules { count: 65537 })
    ));
}

#[test]
fn merged_rules_beyond_65536_fall_back_to_unmerged_rows() {
    // 4200 frame sizes, each followed by one push at 16 distances, then a row that ends the
    // run: 67200 distinct merged rules, but only 4202 distinct unmerged ones.
    let (sizes, distances) = (4200u64, 16u64);
    let mut instructions = Cfi::new();
    for group in 0..sizes * distances {
        let (size, distance) = (8 + 8 * (group / distances), 1 + group % distances);
        instructions = instructions
            .def_cfa_offset(size)
            .advance(distance as u8)
            .def_cfa_offset(size + 8)
            .advance(1)
            .def_cfa_offset(4)
            .advance(1);
    }
    let length = sizes * (distances * (distances + 1) / 2 + 2 * distances);
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    eh.fde(cie, 0x1000, length, &instructions);
    let elf = Elf::new(0x1000, 0x20_0000).eh_frame(eh.finish()).build();
    let object = compile(&elf).expect("compiles unmerged");
    object.table.check().expect("valid table");
    assert_eq!(object.stats.rules, sizes + 3); // sizes, the last size + 8, 4, the gap
    assert_eq!(object.table.lookup(0x1000), rsp(8));
    assert_eq!(object.table.lookup(0x1001), rsp(16));
    assert_eq!(object.table.lookup(0x1002), rsp(4));
    assert_eq!(object.table.lookup(0x1003), rsp(8));
    assert_eq!(object.table.lookup(0x1005), rsp(16));
}

#[test]
fn cfi_spanning_more_than_4_gib_is_an_error() {
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    eh.fde(cie, 0x1000, 0x10, &Cfi::new());
    eh.fde(cie, 0x10_0000_1000, 0x10, &Cfi::new());
    let elf = Elf::new(0x1000, 0x20_0000_0000)
        .eh_frame(eh.finish())
        .build();
    assert!(matches!(compile(&elf), Err(Error::TableTooLarge { .. })));
}
