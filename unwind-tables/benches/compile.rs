//! Compile-time benchmark: prints figures, asserts nothing about time.
//!
//! For libc.so.6 and the largest ELF at hand: time to read the file alone (the same run's
//! baseline), to compile it from a path and from memory, to load it from a warm cache; rows,
//! bytes per row, rules, supported share; and what push/pop row merging saves.
//!
//! Run: `cargo bench -p unwind-tables` (release). Targets: libc ≤ 15 ms, cached load ≤ 2 ms.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use unwind_tables::cache::{Cache, Outcome};
use unwind_tables::rule::STEP_WINDOW;
use unwind_tables::{compile, compile_file, Cfa, CompactTable, Rule, RuleKind};

/// Median and minimum of `runs` timings of `f`.
fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, Duration) {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed()
        })
        .collect();
    times.sort();
    (times[times.len() / 2], times[0])
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// The largest regular file under a few system and toolchain directories that compiles.
fn largest_binary() -> Option<PathBuf> {
    let mut dirs = vec![
        PathBuf::from("/usr/bin"),
        PathBuf::from("/usr/lib/x86_64-linux-gnu"),
        PathBuf::from("/usr/libexec"),
    ];
    // The toolchain running this bench (cargo sets CARGO): its lib/ has librustc_driver.
    if let Some(cargo) = std::env::var_os("CARGO").map(PathBuf::from) {
        if let Some(toolchain) = cargo.parent().and_then(Path::parent) {
            dirs.push(toolchain.join("lib"));
        }
    }
    let mut files: Vec<(u64, PathBuf)> = dirs
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let meta = std::fs::metadata(entry.path()).ok()?;
            meta.is_file().then(|| (meta.len(), entry.path()))
        })
        .collect();
    files.sort_by(|a, b| b.cmp(a));
    files.dedup_by(|a, b| a.0 == b.0);
    files
        .into_iter()
        .take(20)
        .map(|(_, path)| path)
        .find(|path| compile_file(path).is_ok())
}

/// The table as it would be without push/pop merging: every `RspSteps` row split back into
/// the `Rsp` row it starts with and one per step (the merge is lossless, so this is the
/// compiler's output before it). Returns (rows, distinct rules).
fn unmerged(table: &CompactTable) -> (usize, usize) {
    let mut rules = HashSet::new();
    let mut rows = 0;
    for (_, rule) in table.iter() {
        let step_offsets = match rule {
            Rule::Frame {
                cfa: Cfa::RspSteps { pushes, pops, .. },
                ..
            } => u32::from(pushes | pops),
            _ => 0,
        };
        for row_offset in 0..=STEP_WINDOW {
            if row_offset == 0 || step_offsets & (1 << (row_offset - 1)) != 0 {
                rows += 1;
                rules.insert(rule.at_row_offset(row_offset));
            }
        }
    }
    (rows, rules.len())
}

fn bench_file(path: &Path, runs: usize, cache_dir: &Path) {
    let read = time(runs, || std::fs::read(path).expect("read"));
    let bytes = std::fs::read(path).expect("read");
    let from_path = time(runs, || compile_file(path).expect("compile"));
    let from_memory = time(runs, || compile(&bytes).expect("compile"));
    let object = compile_file(path).expect("compile");
    let stats = &object.stats;

    let cache = Cache::new(cache_dir);
    let first = Instant::now();
    let loaded = cache.load_or_compile(path).expect("cache miss");
    let miss = first.elapsed();
    assert!(
        matches!(
            loaded.outcome,
            Outcome::Compiled {
                store_error: None,
                ..
            }
        ),
        "{:?}",
        loaded.outcome
    );
    let hit = time(runs.max(20), || {
        let loaded = cache.load_or_compile(path).expect("cache hit");
        assert!(matches!(loaded.outcome, Outcome::Hit));
        loaded
    });
    let entry_bytes: u64 = std::fs::read_dir(cache_dir)
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);

    let (plain_rows, plain_rules) = unmerged(&object.table);
    let plain_bytes = plain_rows * 4 + object.table.pages.len() * 8 + plain_rules * 16;

    println!("{} ({:.1} MB)", path.display(), bytes.len() as f64 / 1e6);
    println!(
        "  read file alone:      median {:8.3} ms  min {:8.3} ms   (baseline)",
        ms(read.0),
        ms(read.1)
    );
    println!(
        "  compile_file:         median {:8.3} ms  min {:8.3} ms   ({:.1}x reading)",
        ms(from_path.0),
        ms(from_path.1),
        from_path.0.as_secs_f64() / read.0.as_secs_f64()
    );
    println!(
        "  compile (in memory):  median {:8.3} ms  min {:8.3} ms",
        ms(from_memory.0),
        ms(from_memory.1)
    );
    println!("  cache miss (compile + store): {:8.3} ms", ms(miss));
    println!(
        "  cache hit:            median {:8.3} ms  min {:8.3} ms   (entry {} bytes)",
        ms(hit.0),
        ms(hit.1),
        entry_bytes
    );
    println!(
        "  {} FDEs, {} CFI rows -> {} rows ({} gap), {} rules, {} pages: {} kernel bytes, {:.2} B/row; {:.3}% of {} code bytes supported",
        stats.fdes(),
        stats.cfi_rows,
        stats.rows,
        stats.kind(RuleKind::Gap).rows,
        stats.rules,
        stats.pages,
        stats.kernel_bytes,
        stats.bytes_per_row(),
        stats.supported_share() * 100.0,
        stats.code_bytes_with_cfi
    );
    println!(
        "  push/pop merging: {} of the rows are merged runs; without it {} rows, {} rules, {} kernel bytes, {:.2} B/row ({:+.1}% rows, {:+.1}% kernel bytes with it)",
        stats.kind(RuleKind::CfaRspSteps).rows,
        plain_rows,
        plain_rules,
        plain_bytes,
        plain_bytes as f64 / plain_rows as f64,
        (stats.rows as f64 / plain_rows as f64 - 1.0) * 100.0,
        (stats.kernel_bytes as f64 / plain_bytes as f64 - 1.0) * 100.0
    );
}

fn main() {
    // `cargo bench` passes --bench; anything else (`cargo test --benches`, a debug build)
    // gets one quick pass so the bench is exercised without taking minutes.
    let quick = !std::env::args().any(|arg| arg == "--bench");
    let cache_root = tempfile::tempdir().expect("a temporary directory");
    let cache_root = cache_root.path();
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    if libc.exists() {
        bench_file(libc, if quick { 1 } else { 50 }, &cache_root.join("libc"));
    } else {
        println!("SKIP libc: {} not found", libc.display());
    }
    match largest_binary() {
        Some(path) => bench_file(
            &path,
            if quick { 1 } else { 5 },
            &cache_root.join("largest"),
        ),
        None => println!("SKIP largest binary: none found"),
    }
}
