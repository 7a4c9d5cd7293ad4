//! Bad input is an error value, never a panic: truncated and corrupt ELF, missing CFI,
//! garbage CFI, other architectures; and a seeded mutation stress test (the stable stand-in
//! for the cargo-fuzz target in /fuzz, which runs the same `compile`).

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use common::{elf_with_eh_frame, op, standard_cie, Cfa as Cfi, EhFrame, Elf};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use unwind_tables::{compile, compile_file, Error};

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const LD_SO: &str = "/lib64/ld-linux-x86-64.so.2";

fn read_or_skip(path: &str) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            eprintln!("SKIP part of this test: cannot read {path}: {error}");
            None
        }
    }
}

#[test]
fn not_elf() {
    assert!(matches!(compile(&[]), Err(Error::NotElf(_))));
    assert!(matches!(compile(b"hello world"), Err(Error::NotElf(_))));
    assert!(matches!(compile(b"\x7fELF"), Err(Error::NotElf(_))));
    assert!(matches!(
        compile_file("/nonexistent/file"),
        Err(Error::Io { .. })
    ));
    // A directory: open succeeds, mapping fails.
    assert!(matches!(compile_file("/"), Err(Error::Io { .. })));
}

#[test]
fn other_architectures() {
    let mut aarch64 = Elf::new(0x1000, 0x100);
    aarch64.machine = 183;
    assert!(matches!(
        compile(&aarch64.build()),
        Err(Error::UnsupportedArchitecture(name)) if name == "aarch64"
    ));
    let mut elf32 = Elf::new(0x1000, 0x100).build();
    elf32[4] = 1; // ELFCLASS32
    assert!(matches!(
        compile(&elf32),
        Err(Error::UnsupportedArchitecture(_))
    ));
    let mut big_endian = Elf::new(0x1000, 0x100).build();
    big_endian[5] = 2; // ELFDATA2MSB
    assert!(matches!(
        compile(&big_endian),
        Err(Error::UnsupportedArchitecture(_))
    ));
}

#[test]
fn no_unwind_information() {
    assert!(matches!(
        compile(&Elf::new(0x1000, 0x100).build()),
        Err(Error::NoUnwindInfo)
    ));
    // An .eh_frame with a CIE and no FDE.
    let mut eh = EhFrame::new();
    eh.cie("zR", &standard_cie());
    assert!(matches!(
        compile(&elf_with_eh_frame(eh)),
        Err(Error::NoUnwindInfo)
    ));
}

#[test]
fn truncated_elf() {
    let elf = {
        let mut eh = EhFrame::new();
        let cie = eh.cie("zR", &standard_cie());
        eh.fde(
            cie,
            0x1000,
            0x10,
            &Cfi::new().def_cfa_expression(&op::plt(11)),
        );
        elf_with_eh_frame(eh)
    };
    compile(&elf).expect("the whole file compiles");
    for len in 0..elf.len() {
        // Section headers sit at the end: every truncation must be an error.
        assert!(compile(&elf[..len]).is_err(), "truncated to {len} bytes");
    }
    if let Some(libc) = read_or_skip(LIBC) {
        for len in (0..libc.len())
            .step_by(libc.len() / 97)
            .chain([64, 65, 120, libc.len() - 1])
        {
            assert!(
                compile(&libc[..len]).is_err(),
                "libc truncated to {len} bytes"
            );
        }
    }
}

#[test]
fn corrupt_headers() {
    let elf = Elf::new(0x1000, 0x100).build();
    let mut bad_shoff = elf.clone();
    bad_shoff[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(compile(&bad_shoff), Err(Error::Elf(_))));
    let mut bad_phnum = elf.clone();
    bad_phnum[56..58].copy_from_slice(&0xffffu16.to_le_bytes());
    assert!(compile(&bad_phnum).is_err());
}

#[test]
fn compressed_debug_frame() {
    let mut debug = common::DebugFrame::new();
    let cie = debug.cie(&standard_cie());
    debug.fde(cie, 0x1000, 0x20, &Cfi::new().def_cfa_offset(24));
    let debug_frame = debug.finish();
    let stream = common::zlib_stored(&debug_frame);
    let elf = |claimed: u64| {
        Elf::new(0x1000, 0x2000)
            .compressed_section(".debug_frame", 1, claimed, &stream)
            .build()
    };
    // A well-formed compressed section is read.
    let object = compile(&elf(debug_frame.len() as u64)).expect("compiles");
    assert_eq!(
        object.table.lookup(0x1000).kind(),
        unwind_tables::RuleKind::CfaRsp
    );
    // A header claiming petabytes is refused before anything is allocated (found by the
    // fuzzer: the claimed size is reserved up front).
    assert!(matches!(
        compile(&elf(0x9_0000_0000_0000)),
        Err(Error::CompressedSize { .. })
    ));
    // A plausible but wrong size is an error from the decoder, not a panic.
    assert!(compile(&elf(debug_frame.len() as u64 + 1)).is_err());
}

#[test]
fn garbage_cfi() {
    // A length field that runs past the section.
    let garbage = Elf::new(0x1000, 0x100).eh_frame(vec![0xff; 64]).build();
    assert!(matches!(
        compile(&garbage),
        Err(Error::Cfi {
            section: ".eh_frame",
            ..
        })
    ));
    // An FDE whose CIE pointer points at nothing: all FDEs unparsable is an error too.
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    eh.fde(cie, 0x1000, 0x10, &Cfi::new());
    let mut bytes = eh.finish();
    let cie_len = 4 + u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    bytes[cie_len + 4..cie_len + 8].copy_from_slice(&0x7777u32.to_le_bytes());
    let elf = Elf::new(0x1000, 0x100).eh_frame(bytes).build();
    assert!(
        matches!(compile(&elf), Err(Error::Cfi { .. })),
        "{:?}",
        compile(&elf)
    );
    // Random bytes: any error, no panic.
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..2000 {
        let len = rng.gen_range(0..256);
        let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let _ = compile(&Elf::new(0x1000, 0x100).eh_frame(bytes).build());
    }
}

/// Mutates `original` with a seeded RNG `iterations` times (1–8 random bytes each, mostly
/// inside `focus`), compiling each; returns how many compiled successfully. A panic fails
/// the test with the seed and iteration that caused it.
fn mutate_and_compile(
    original: &[u8],
    focus: std::ops::Range<usize>,
    seed: u64,
    budget: Duration,
) -> (u64, u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut data = original.to_vec();
    let start = Instant::now();
    let (mut runs, mut ok) = (0u64, 0u64);
    while start.elapsed() < budget {
        data.copy_from_slice(original);
        for _ in 0..rng.gen_range(1..=8) {
            let at = if rng.gen_bool(0.8) && !focus.is_empty() {
                rng.gen_range(focus.clone())
            } else {
                rng.gen_range(0..data.len())
            };
            data[at] = match rng.gen_range(0..4) {
                0 => rng.gen(),
                1 => data[at] ^ (1 << rng.gen_range(0..8)),
                2 => 0,
                _ => 0xff,
            };
        }
        let result = catch_unwind(AssertUnwindSafe(|| compile(&data)));
        match result {
            Ok(result) => ok += u64::from(result.is_ok()),
            Err(_) => panic!("compile panicked: seed {seed}, iteration {runs}"),
        }
        runs += 1;
    }
    (runs, ok)
}

fn section_range(elf: &[u8], name: &str) -> std::ops::Range<usize> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(elf).expect("parses");
    file.section_by_name(name)
        .and_then(|section| section.file_range())
        .map(|(offset, size)| offset as usize..(offset + size) as usize)
        .unwrap_or(0..0)
}

/// Seconds of mutation per input; `UNWIND_STRESS_SECS` raises it for a long run.
fn stress_budget() -> Duration {
    let secs = std::env::var("UNWIND_STRESS_SECS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// A small ELF with every CFI shape the compiler knows: standard frame, PLT, DRAP, signal
/// trampoline, and a .debug_frame fill.
fn synthetic_seed() -> Vec<u8> {
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    let signal = eh.cie("zRS", &Cfi::new());
    eh.fde(
        cie,
        0x1000,
        0x40,
        &Cfi::new()
            .advance(1)
            .def_cfa_offset(16)
            .offset(6, 2)
            .advance(3)
            .def_cfa_register(6),
    );
    eh.fde(
        cie,
        0x1040,
        0x10,
        &Cfi::new().def_cfa_expression(&op::plt(11)),
    );
    let mut deref = op::breg(6, -8);
    deref.push(op::DEREF);
    eh.fde(
        cie,
        0x1050,
        0x10,
        &Cfi::new()
            .def_cfa_expression(&deref)
            .expression(6, &op::breg(6, 0)),
    );
    let mut sigcfa = op::breg(7, 160);
    sigcfa.push(op::DEREF);
    eh.fde(
        signal,
        0x1060,
        0x10,
        &Cfi::new().def_cfa_expression(&sigcfa),
    );
    let mut debug = common::DebugFrame::new();
    let dcie = debug.cie(&standard_cie());
    debug.fde(dcie, 0x1000, 0x200, &Cfi::new().def_cfa_offset(24));
    Elf::new(0x1000, 0x2000)
        .eh_frame(eh.finish())
        .debug_frame(debug.finish())
        .build_id(&[1, 2, 3, 4])
        .build()
}

/// Writes a seed corpus for the cargo-fuzz target to `$UNWIND_FUZZ_SEEDS` (see fuzz/README.md):
/// the synthetic seed and small system libraries. Seeds are generated, never checked in.
#[test]
#[ignore = "writes files; run by hand before fuzzing"]
fn write_fuzz_seeds() {
    let dir = std::path::PathBuf::from(
        std::env::var_os("UNWIND_FUZZ_SEEDS").expect("set UNWIND_FUZZ_SEEDS"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("synthetic"), synthetic_seed()).unwrap();
    let mut written = 1;
    let mut libraries: Vec<_> = std::fs::read_dir("/usr/lib/x86_64-linux-gnu")
        .unwrap()
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    libraries.sort();
    for path in libraries {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        if bytes.len() <= 64 * 1024 && compile(&bytes).is_ok() {
            std::fs::write(dir.join(path.file_name().unwrap()), bytes).unwrap();
            written += 1;
            if written == 8 {
                break;
            }
        }
    }
    println!("{written} seeds in {}", dir.display());
}

#[test]
fn mutation_stress_never_panics() {
    let budget = stress_budget();
    let synthetic = synthetic_seed();
    let mut inputs = vec![("synthetic", synthetic.clone(), 0..synthetic.len())];
    for path in [LD_SO, LIBC] {
        if let Some(bytes) = read_or_skip(path) {
            let focus = section_range(&bytes, ".eh_frame");
            inputs.push((path, bytes, focus));
        }
    }
    for (seed, (name, bytes, focus)) in inputs.into_iter().enumerate() {
        let (runs, ok) = mutate_and_compile(&bytes, focus, seed as u64, budget);
        println!("{name}: {runs} mutated inputs in {budget:?}, {ok} compiled, none panicked");
        assert!(runs > 0);
    }
}
