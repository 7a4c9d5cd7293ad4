//! Differential test: the compact table against gimli's full CFI evaluation.
//!
//! For every FDE row of real binaries, at the row's first and last byte and at random pcs
//! inside it, one unwind step is computed twice on a synthetic machine (registers with
//! distinct values, memory whose every word is a hash of its address):
//! - from gimli's row, evaluating CFA and register rules, DWARF expressions included, with
//!   gimli's own expression evaluator;
//! - from the compact rule the table gives for that pc, following docs/walk.md: the rule of
//!   the pc's row as stored, merged push/pop rows ([`Cfa::RspSteps`]) evaluated at the pc's
//!   offset in the row, as the walkers do.
//!
//! The caller's rip, rsp (= CFA) and rbp must agree, or the compact rule must be explicitly
//! `Unsupported`. Because memory words are address hashes, reading the right value means
//! reading the right address. Each pc is checked with two register sets, so an offset
//! confused between rsp and rbp cannot agree by chance.

use std::cmp::Reverse;
use std::ops::Range;
use std::path::{Path, PathBuf};

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, EndianSlice, EvaluationResult, LittleEndian,
    Location, Register, RegisterRule, UnwindContext, UnwindExpression, UnwindSection,
    UnwindTableRow, Value,
};
use object::{Object, ObjectSection, ObjectSegment, SegmentFlags};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use unwind_tables::walk::{unwind_step, Memory, Registers, WalkEnd};
use unwind_tables::{compile_file, Cfa, CompactTable, RbpRule, Rule};

type Slice<'a> = EndianSlice<'a, LittleEndian>;

const RBP: Register = gimli::X86_64::RBP;
const RA: Register = gimli::X86_64::RA;

/// Registers and memory of the synthetic machine. rip is the pc under test.
struct Machine {
    regs: [u64; 17],
    memory_seed: u64,
}

impl Machine {
    fn new(variant: u64) -> Machine {
        let mut regs = [0u64; 17];
        for (number, reg) in regs.iter_mut().enumerate() {
            *reg = 0x5500_0000_0000 + (number as u64) * 0x1_0000 + variant * 0x777_0000;
        }
        // Plausible, 16-aligned stack and frame pointers, different per variant.
        regs[7] = 0x7ffc_1234_0000 + variant * 0x1_2340;
        regs[6] = 0x7ffc_1234_8000 + variant * 0x2_3450;
        Machine {
            regs,
            memory_seed: 0x9e37_79b9_7f4a_7c15 ^ variant,
        }
    }

    fn reg(&self, reg: Register, pc: u64) -> Option<u64> {
        match reg.0 {
            16 => Some(pc),
            n => self.regs.get(usize::from(n)).copied(),
        }
    }

    /// The u64 at `addr`: a hash of the address (splitmix64), so distinct addresses read
    /// distinct values.
    fn read(&self, addr: u64) -> u64 {
        let mut z = addr ^ self.memory_seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// One unwind step's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Outermost frame.
    End,
    Caller {
        rip: u64,
        rsp: u64,
        rbp: u64,
    },
}

impl Memory for Machine {
    fn read_u64(&self, addr: u64) -> Option<u64> {
        Some(self.read(addr))
    }
}

/// The compact rule's step, by the walkers' own rule semantics
/// ([`unwind_tables::walk::unwind_step`]); `row_offset` is how far `pc` lies past its row's
/// start (capped as `CompactTable::lookup_in_row` caps it). `Err` carries the rule when it
/// ends the walk without a caller (a gap, an unsupported row).
fn compact_step(rule: Rule, row_offset: u32, m: &Machine, pc: u64) -> Result<Step, Rule> {
    // The machine is a first frame: rdi is known.
    let regs = Registers {
        rip: pc,
        rsp: m.regs[7],
        rbp: m.regs[6],
        rdi: Some(m.regs[5]),
    };
    match unwind_step(rule, row_offset, regs, m) {
        Ok(caller) => Ok(Step::Caller {
            rip: caller.regs.rip,
            rsp: caller.regs.rsp,
            rbp: caller.regs.rbp,
        }),
        Err(WalkEnd::Complete) => Ok(Step::End),
        Err(_) => Err(rule),
    }
}

/// Evaluates a DWARF expression with gimli on the machine; `initial` is pushed first (as for
/// DW_CFA_expression, which starts with the CFA on the stack).
fn evaluate(
    expression: &UnwindExpression<usize>,
    section: &EhFrame<Slice<'_>>,
    encoding: gimli::Encoding,
    m: &Machine,
    pc: u64,
    initial: Option<u64>,
) -> Result<u64, String> {
    let expression = expression.get(section).map_err(|e| e.to_string())?;
    let mut evaluation = expression.evaluation(encoding);
    if let Some(value) = initial {
        evaluation.set_initial_value(value);
    }
    let mut state = evaluation.evaluate().map_err(|e| e.to_string())?;
    loop {
        state = match state {
            EvaluationResult::Complete => break,
            EvaluationResult::RequiresRegister { register, .. } => {
                let value = m.reg(register, pc).ok_or("unknown register")?;
                evaluation
                    .resume_with_register(Value::Generic(value))
                    .map_err(|e| e.to_string())?
            }
            EvaluationResult::RequiresMemory { address, .. } => evaluation
                .resume_with_memory(Value::Generic(m.read(address)))
                .map_err(|e| e.to_string())?,
            other => return Err(format!("expression needs {other:?}")),
        };
    }
    let pieces = evaluation.result();
    match pieces.first().map(|piece| &piece.location) {
        Some(Location::Address { address }) if pieces.len() == 1 => Ok(*address),
        other => Err(format!("expression result {other:?}")),
    }
}

/// gimli's step for `row`; an error for rules the comparison cannot evaluate.
fn gimli_step(
    row: &UnwindTableRow<usize>,
    section: &EhFrame<Slice<'_>>,
    encoding: gimli::Encoding,
    m: &Machine,
    pc: u64,
) -> Result<Step, String> {
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => m
            .reg(*register, pc)
            .ok_or("CFA register")?
            .wrapping_add_signed(*offset),
        CfaRule::Expression(expression) => evaluate(expression, section, encoding, m, pc, None)?,
    };
    let value = |rule: RegisterRule<usize>, register: Register| -> Result<Option<u64>, String> {
        Ok(Some(match rule {
            RegisterRule::Undefined => return Ok(None),
            RegisterRule::SameValue => m.reg(register, pc).ok_or("register")?,
            RegisterRule::Offset(offset) => m.read(cfa.wrapping_add_signed(offset)),
            RegisterRule::ValOffset(offset) => cfa.wrapping_add_signed(offset),
            RegisterRule::Register(other) => m.reg(other, pc).ok_or("register")?,
            RegisterRule::Expression(expression) => {
                m.read(evaluate(&expression, section, encoding, m, pc, Some(cfa))?)
            }
            RegisterRule::ValExpression(expression) => {
                evaluate(&expression, section, encoding, m, pc, Some(cfa))?
            }
            other => return Err(format!("register rule {other:?}")),
        }))
    };
    let Some(rip) = value(row.register(RA), RA)? else {
        return Ok(Step::End);
    };
    // No rule for rbp: unchanged (the convention the compiler documents and libgcc follows).
    let rbp = value(row.register(RBP), RBP)?.unwrap_or(m.regs[6]);
    Ok(Step::Caller { rip, rsp: cfa, rbp })
}

/// Per-binary tallies.
#[derive(Default, Debug)]
struct Tally {
    pcs: u64,
    agree: u64,
    unsupported: u64,
    gaps_checked: u64,
    /// Gaps where the table has a frame rule read from the instructions, not from CFI
    /// (see the compiler's `prologue` module and its tests): nothing here to check it by.
    gaps_with_rows: u64,
    mismatch_count: u64,
    /// The first few mismatches, for the failure message.
    mismatches: Vec<String>,
}

impl Tally {
    fn mismatch(&mut self, message: String) {
        self.mismatch_count += 1;
        if self.mismatches.len() < 20 {
            self.mismatches.push(message);
        }
    }
}

struct Fde<'a> {
    fde: gimli::FrameDescriptionEntry<Slice<'a>>,
    /// The addresses this FDE governs under the documented overlap policy, clipped to code.
    owned: Range<u64>,
}

fn code_ranges(file: &object::File<'_>) -> Vec<Range<u64>> {
    let mut ranges: Vec<Range<u64>> = file
        .segments()
        .filter(|segment| matches!(segment.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
        .map(|segment| segment.address()..segment.address() + segment.size())
        .collect();
    ranges.sort_by_key(|range| range.start);
    ranges
}

/// Compares `table` with gimli's evaluation of the `.eh_frame` in `data`.
fn compare_with_gimli(data: &[u8], table: &CompactTable, samples_per_row: usize) -> Tally {
    let file = object::File::parse(data).expect("parse ELF");
    let eh_section = file.section_by_name(".eh_frame").expect(".eh_frame");
    let mut bases = BaseAddresses::default().set_eh_frame(eh_section.address());
    if let Some(hdr) = file.section_by_name(".eh_frame_hdr") {
        bases = bases.set_eh_frame_hdr(hdr.address());
    }
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let eh_data = eh_section.data().expect(".eh_frame data");
    let section = EhFrame::new(eh_data, LittleEndian);

    // Every FDE, then ownership: earliest start wins, then the longest, then section order.
    let mut fdes = Vec::new();
    let mut entries = section.entries(&bases);
    while let Some(entry) = entries.next().expect("well-formed .eh_frame") {
        if let CieOrFde::Fde(partial) = entry {
            let fde = partial
                .parse(UnwindSection::cie_from_offset)
                .expect("FDE parses");
            if fde.len() > 0 {
                fdes.push(Fde { owned: 0..0, fde });
            }
        }
    }
    fdes.sort_by_key(|fde| (fde.fde.initial_address(), Reverse(fde.fde.end_address())));
    let code = code_ranges(&file);
    let mut covered_until = 0;
    for fde in &mut fdes {
        let (start, end) = (fde.fde.initial_address(), fde.fde.end_address());
        let from = start.max(covered_until);
        covered_until = covered_until.max(end);
        if let Some(range) = code
            .iter()
            .find(|range| range.start < end && from < range.end)
        {
            fde.owned = from.max(range.start)..end.min(range.end);
        }
    }

    let mut ctx = UnwindContext::new();
    let machines = [Machine::new(1), Machine::new(2)];
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut tally = Tally::default();
    for fde in fdes.iter().filter(|fde| !fde.owned.is_empty()) {
        let encoding = fde.fde.cie().encoding();
        let mut rows = fde
            .fde
            .rows(&section, &bases, &mut ctx)
            .expect("FDE evaluates");
        while let Some(row) = rows.next_row().expect("row evaluates") {
            let start = row.start_address().max(fde.owned.start);
            let end = row.end_address().min(fde.owned.end);
            if start >= end {
                continue;
            }
            let mut pcs = vec![start, end - 1];
            if matches!(
                table.lookup(start),
                Rule::Frame {
                    cfa: Cfa::Plt { .. },
                    ..
                }
            ) {
                // The PLT rule depends on pc & 15: check every pc of the row.
                pcs = (start..end).collect();
            } else {
                pcs.extend((0..samples_per_row).map(|_| rng.gen_range(start..end)));
            }
            for pc in pcs {
                tally.pcs += 1;
                let (rule, row_offset) = table.lookup_in_row(pc);
                // What `lookup` resolves the row to must step the same way.
                let resolved = table.lookup(pc);
                let mut verdict = Verdict::Agree;
                for m in &machines {
                    let expected = gimli_step(row, &section, encoding, m, pc);
                    let ours = compact_step(rule, row_offset, m, pc);
                    if compact_step(resolved, 0, m, pc) != ours {
                        verdict = Verdict::Mismatch(format!(
                            "pc {pc:#x}: compact {rule:?} at row offset {row_offset} resolves to {resolved:?}, which steps differently"
                        ));
                        break;
                    }
                    match (ours, expected) {
                        (Err(Rule::Unsupported(_)), _) => verdict = Verdict::Unsupported,
                        (Ok(ours), Ok(theirs)) if ours == theirs => continue,
                        (ours, theirs) => {
                            verdict = Verdict::Mismatch(format!(
                                "pc {pc:#x}: compact {rule:?} at row offset {row_offset} gives {ours:?}, gimli {:?} gives {theirs:?}",
                                row.cfa()
                            ))
                        }
                    }
                    break;
                }
                match verdict {
                    Verdict::Agree => tally.agree += 1,
                    Verdict::Unsupported => tally.unsupported += 1,
                    Verdict::Mismatch(message) => tally.mismatch(message),
                }
            }
        }
    }

    // Where no FDE owns the next byte, the table must say Gap, or give a plain frame rule
    // it read from the instructions there.
    let mut owned: Vec<Range<u64>> = fdes
        .iter()
        .map(|fde| fde.owned.clone())
        .filter(|r| !r.is_empty())
        .collect();
    owned.sort_by_key(|range| range.start);
    for (index, range) in owned.iter().enumerate() {
        let next_start = owned.get(index + 1).map(|next| next.start);
        if next_start != Some(range.end) {
            tally.gaps_checked += 1;
            let rule = table.lookup(range.end);
            if matches!(
                rule,
                Rule::Frame {
                    cfa: Cfa::Rsp(_) | Cfa::RspSteps { .. } | Cfa::Rbp(_),
                    rbp: RbpRule::Same | RbpRule::AtCfa(_),
                }
            ) {
                tally.gaps_with_rows += 1;
            } else if rule != Rule::Gap {
                let message = format!(
                    "{:#x}: expected Gap, got {:?}",
                    range.end,
                    table.lookup(range.end)
                );
                tally.mismatch(message);
            }
        }
        if index == 0 && table.lookup(range.start.wrapping_sub(1)) != Rule::Gap {
            tally.mismatch(format!(
                "before first FDE: {:?}",
                table.lookup(range.start - 1)
            ));
        }
    }
    tally
}

enum Verdict {
    Agree,
    Unsupported,
    Mismatch(String),
}

/// Checks one binary; returns the compiled object's stats for the coverage assertion.
fn check_binary(path: &Path, samples_per_row: usize) -> unwind_tables::Stats {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let object = compile_file(path).unwrap_or_else(|e| panic!("compile {}: {e}", path.display()));
    object.table.check().expect("table invariants");
    let tally = compare_with_gimli(&data, &object.table, samples_per_row);
    let stats = &object.stats;
    println!(
        "{}: {} rows, {:.2} B/row, {:.3}% of {} code bytes supported; \
         {} pcs checked (x2 machines): {} agree, {} unsupported, {} mismatches; {} gap boundaries, \
         {} with rows read from the instructions\n  {}",
        path.display(),
        stats.rows,
        stats.bytes_per_row(),
        stats.supported_share() * 100.0,
        stats.code_bytes_with_cfi,
        tally.pcs,
        tally.agree,
        tally.unsupported,
        tally.mismatch_count,
        tally.gaps_checked,
        tally.gaps_with_rows,
        stats
    );
    assert!(
        tally.mismatch_count == 0,
        "{}: {} mismatches:\n{}",
        path.display(),
        tally.mismatch_count,
        tally.mismatches.join("\n")
    );
    assert_eq!(tally.agree + tally.unsupported, tally.pcs);
    assert!(tally.pcs > 0, "{}: nothing checked", path.display());
    object.stats
}

fn first_existing(paths: &[&str]) -> Option<PathBuf> {
    paths.iter().map(PathBuf::from).find(|path| path.exists())
}

/// The toolchain's `cargo` (a Rust release binary without frame pointers). Cargo sets
/// `CARGO` for the tests it runs.
fn cargo_binary() -> Option<PathBuf> {
    std::env::var_os("CARGO")
        .map(PathBuf::from)
        .filter(|path| path.exists())
}

const MIN_SUPPORTED_SHARE: f64 = 0.999;

#[test]
fn libc_matches_gimli() {
    let libc = first_existing(&[
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ])
    .expect("libc.so.6 is required for this test");
    let stats = check_binary(&libc, 3);
    assert!(
        stats.supported_share() >= MIN_SUPPORTED_SHARE,
        "libc supported share {}",
        stats.supported_share()
    );
}

#[test]
fn ld_so_and_libgcc_match_gimli() {
    let ld_so =
        first_existing(&["/lib64/ld-linux-x86-64.so.2"]).expect("ld-linux-x86-64.so.2 is required");
    check_binary(&ld_so, 3);
    match first_existing(&[
        "/lib/x86_64-linux-gnu/libgcc_s.so.1",
        "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
    ]) {
        Some(libgcc) => {
            check_binary(&libgcc, 3);
        }
        None => println!("SKIP libgcc_s.so.1: not installed"),
    }
}

/// cargo links OpenSSL, whose perlasm leaf functions (SHA, AES, ChaCha with AVX) realign
/// rsp and name the CFA from rax, rsi, rdi, r9 or r11: 0.2% of cargo's code. No rule can
/// express that for non-leaf frames; see the crate docs. A floor still catches regressions.
const MIN_SUPPORTED_SHARE_CARGO: f64 = 0.995;

#[test]
fn rust_binaries_match_gimli() {
    let this = std::env::current_exe().expect("current exe");
    let stats = check_binary(&this, 2);
    assert!(
        stats.supported_share() >= MIN_SUPPORTED_SHARE,
        "this test binary: {}",
        stats.supported_share()
    );
    let Some(cargo) = cargo_binary() else {
        println!("SKIP toolchain binaries: CARGO is not set (run under cargo test)");
        return;
    };
    // Pure Rust release binaries of the toolchain that runs this test.
    for name in ["rustc", "rustdoc", "rustfmt"] {
        let path = cargo.with_file_name(name);
        if !path.exists() {
            println!("SKIP {}: not installed", path.display());
            continue;
        }
        let stats = check_binary(&path, 1);
        assert!(
            stats.supported_share() >= MIN_SUPPORTED_SHARE,
            "{name}: {}",
            stats.supported_share()
        );
    }
    let stats = check_binary(&cargo, 1);
    assert!(
        stats.supported_share() >= MIN_SUPPORTED_SHARE_CARGO,
        "cargo: {}",
        stats.supported_share()
    );
}

/// The fixture programs the end-to-end tests trace (Rust release and C `-O2`, both
/// without frame pointers; C++ with exceptions), and the cargo-trace binary itself.
#[test]
fn fixtures_and_cargo_trace_match_gimli() {
    use cargo_trace_tests::fixtures::{self, Lang};
    for (lang, name, floor) in [
        (Lang::Rust, "chains", MIN_SUPPORTED_SHARE),
        (Lang::Rust, "cpu_split", MIN_SUPPORTED_SHARE),
        (Lang::C, "chains_c", MIN_SUPPORTED_SHARE),
        (Lang::C, "storm", MIN_SUPPORTED_SHARE),
        (Lang::C, "signals", MIN_SUPPORTED_SHARE),
        (Lang::Cpp, "cxx_exceptions", MIN_SUPPORTED_SHARE),
    ] {
        let path = fixtures::fixture(lang, name);
        let stats = check_binary(&path, 3);
        assert!(
            stats.supported_share() >= floor,
            "{name}: {}",
            stats.supported_share()
        );
    }
    // target/<profile>/deps/differential-* → target/<profile>/cargo-trace, which
    // `cargo test --workspace` builds before running any test.
    let this = std::env::current_exe().expect("current exe");
    let cargo_trace = this
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("cargo-trace"))
        .filter(|path| path.exists());
    match cargo_trace {
        Some(path) => {
            let stats = check_binary(&path, 2);
            assert!(
                stats.supported_share() >= MIN_SUPPORTED_SHARE,
                "cargo-trace: {}",
                stats.supported_share()
            );
        }
        None => println!(
            "SKIP the cargo-trace binary: not built next to {} (run cargo test --workspace)",
            this.display()
        ),
    }
}

#[test]
fn system_binaries_match_gimli() {
    let mut checked = 0;
    for name in ["ls", "bash", "perl", "gdb", "python3"] {
        let path = Path::new("/usr/bin").join(name);
        let Ok(resolved) = std::fs::canonicalize(&path) else {
            println!("SKIP {}: not installed", path.display());
            continue;
        };
        check_binary(&resolved, 2);
        checked += 1;
    }
    assert!(checked > 0, "no /usr/bin binary found to check");
}

fn vaddr_of_bytes(data: &[u8], needle: &[u8]) -> Option<u64> {
    let file = object::File::parse(data).ok()?;
    for segment in file.segments() {
        if !matches!(segment.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0)
        {
            continue;
        }
        let bytes = segment.data().ok()?;
        if let Some(at) = bytes
            .windows(needle.len())
            .position(|window| window == needle)
        {
            return Some(segment.address() + at as u64);
        }
    }
    None
}

#[test]
fn libc_restore_rt_is_a_signal_frame() {
    let libc = first_existing(&["/lib/x86_64-linux-gnu/libc.so.6"]).expect("libc.so.6 is required");
    let data = std::fs::read(&libc).unwrap();
    // __restore_rt: mov $15 (rt_sigreturn), %rax; syscall. Found by its code, not its CFI,
    // so the test does not trust what it tests (libc's symtab is stripped).
    let restore_rt = vaddr_of_bytes(&data, &[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05])
        .expect("__restore_rt");
    let table: CompactTable = compile_file(&libc).unwrap().table;
    assert_eq!(table.lookup(restore_rt), Rule::Signal);
    assert_eq!(table.lookup(restore_rt + 8), Rule::Signal);
    // The walker looks up return addresses at pc - 1: glibc's FDE starts one byte early
    // (a nop before __restore_rt) for exactly this.
    assert_eq!(table.lookup(restore_rt - 1), Rule::Signal);
}

#[test]
fn pie_entry_point_is_end_of_stack() {
    let mut binaries = vec![std::env::current_exe().unwrap()];
    binaries.extend(first_existing(&["/usr/bin/ls"]));
    for path in binaries {
        let data = std::fs::read(&path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        assert_eq!(
            file.kind(),
            object::ObjectKind::Dynamic,
            "{} is PIE",
            path.display()
        );
        let table = compile_file(&path).unwrap().table;
        // e_entry is _start, whose CFI marks the return address undefined.
        assert_eq!(table.lookup(file.entry()), Rule::End, "{}", path.display());
    }
}

/// ld.so's `_start` is hand-written without CFI; it calls `_dl_start` and `_dl_init`, and
/// walks from either must end there complete: the compiler gives the entry End up to the
/// next FDE, and nothing more.
#[test]
fn dynamic_loader_entry_is_end_of_stack() {
    let ld_so = first_existing(&["/lib64/ld-linux-x86-64.so.2"]).expect("ld.so is required");
    let data = std::fs::read(&ld_so).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let table = compile_file(&ld_so).unwrap().table;
    let entry = file.entry();
    let (start, rule) = table
        .iter()
        .take_while(|(start, _)| *start <= entry)
        .last()
        .expect("a row at the entry");
    assert_eq!((start, rule), (entry, Rule::End));
    let end = table
        .iter()
        .map(|(start, _)| start)
        .find(|start| *start > entry)
        .expect("a row after the entry");
    // _start is a few dozen bytes: both return addresses lie inside, the next FDE follows.
    assert!(end - entry < 0x100, "End runs {:#x} bytes", end - entry);
    assert_ne!(table.lookup(end), Rule::End);
    assert_eq!(table.lookup(entry - 1), Rule::Gap, "before _start");
}

/// The comparison must be able to fail: a table with one rule off by 8, a merged push/pop
/// rule missing a push, or one row turned into a gap, is caught.
#[test]
fn differential_catches_a_wrong_table() {
    let libc = first_existing(&["/lib/x86_64-linux-gnu/libc.so.6"]).expect("libc.so.6 is required");
    let data = std::fs::read(&libc).unwrap();
    let good = compile_file(&libc).unwrap().table;
    assert_eq!(compare_with_gimli(&data, &good, 1).mismatch_count, 0);

    // Shift the CFA offset of the most used rsp rule by 8.
    let mut uses = vec![0usize; good.rules.len()];
    for row in &good.rows {
        uses[usize::from(row.rule)] += 1;
    }
    // The index of the most used rule that `wanted` picks.
    let most_used = |wanted: &dyn Fn(&Rule) -> bool, what: &str| {
        (0..good.rules.len())
            .filter(|&index| wanted(&good.rules[index]))
            .max_by_key(|&index| uses[index])
            .unwrap_or_else(|| panic!("no {what} in libc"))
    };
    let index = most_used(
        &|rule| {
            matches!(
                rule,
                Rule::Frame {
                    cfa: Cfa::Rsp(_),
                    ..
                }
            )
        },
        "rsp rule",
    );
    let mut shifted = good.clone();
    if let Rule::Frame {
        cfa: Cfa::Rsp(offset),
        ..
    } = &mut shifted.rules[index]
    {
        *offset += 8;
    }
    let tally = compare_with_gimli(&data, &shifted, 1);
    assert!(tally.mismatch_count >= uses[index] as u64, "{tally:?}");

    // Forget the first push of the most used merged push/pop rule: from that push on, every
    // row with the rule is 8 short.
    let index = most_used(
        &|rule| {
            matches!(
                rule,
                Rule::Frame {
                    cfa: Cfa::RspSteps { pushes, .. },
                    ..
                } if *pushes != 0
            )
        },
        "merged push/pop rule",
    );
    let mut forgot_push = good.clone();
    if let Rule::Frame {
        cfa: Cfa::RspSteps { pushes, .. },
        ..
    } = &mut forgot_push.rules[index]
    {
        *pushes &= *pushes - 1;
    }
    let tally = compare_with_gimli(&data, &forgot_push, 1);
    assert!(tally.mismatch_count >= uses[index] as u64, "{tally:?}");

    // Turn the rbp rule of an rbp-saving rule into Same.
    let (index, _) = good
        .rules
        .iter()
        .enumerate()
        .find(|(index, rule)| {
            matches!(
                rule,
                Rule::Frame {
                    rbp: RbpRule::AtCfa(_),
                    ..
                }
            ) && uses[*index] > 0
        })
        .expect("an rbp-saving rule");
    let mut forgetful = good.clone();
    if let Rule::Frame { rbp, .. } = &mut forgetful.rules[index] {
        *rbp = RbpRule::Same;
    }
    assert!(compare_with_gimli(&data, &forgetful, 1).mismatch_count > 0);

    // One row's rule replaced by the gap rule.
    let gap = good
        .rules
        .iter()
        .position(|rule| *rule == Rule::Gap)
        .expect("a gap rule") as u16;
    let mut holed = good.clone();
    let victim = holed.rows.iter().position(|row| row.rule != gap).unwrap() + 1000;
    holed.rows[victim].rule = gap;
    assert!(compare_with_gimli(&data, &holed, 1).mismatch_count > 0);
}
