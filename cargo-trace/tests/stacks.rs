//! End to end: cargo-trace launches the fixtures (built without frame
//! pointers), unwinds their stacks in the kernel and writes folded stacks whose
//! counts and call chains must be exactly what the fixtures did.

mod common;

use cargo_trace_tests::expected::{self, Root, Site};
use cargo_trace_tests::fixtures::{self, Lang};
use common::{bpf_available, quoted, trace, Folded};

/// Frames leaf first.
fn leaf_first(frames: &[String]) -> Vec<&str> {
    frames.iter().rev().map(String::as_str).collect()
}

/// libc's malloc entry, whatever name the symbolizer found for it.
fn is_malloc_frame(frame: &str) -> bool {
    frame.contains("malloc")
}

fn is_truncated(frames: &[String]) -> bool {
    frames.iter().any(|f| f.starts_with("[truncated"))
}

/// A sample the timer took while the kernel emulated a probed instruction for a uprobe
/// (tests running beside this one probe libc's malloc, and a uprobe traps in every process
/// mapping the file). The kernel moves rsp and then rip; a sample between the two sees user
/// registers no unwinder can follow, and its walk rightly ends truncated. It says nothing
/// about the tables under test. The sample may also land on the way out of the uprobe's
/// trap (`asm_exc_int3`), with the same half-moved registers, or inside the kernel's
/// uretprobe trampoline (`[uprobes]`, code with no unwind table) as a uretprobe of such a
/// session returns.
fn taken_mid_emulation(frames: &[String]) -> bool {
    frames.iter().any(|f| {
        f.starts_with("arch_uprobe_skip_sstep")
            || f.starts_with("asm_exc_int3")
            || f == "[[uprobes]]"
    })
}

/// The stack above the fixture's chain reaches the process's or thread's entry.
fn assert_root(frames: &[String], root: Root) {
    match root {
        Root::Process => {
            assert_eq!(
                frames[0], "_start",
                "process stack must start at _start: {frames:?}"
            );
            assert!(
                frames.iter().any(|f| f == "__libc_start_call_main"),
                "libc's start is missing: {frames:?}"
            );
        }
        Root::Thread => {
            assert!(
                frames[0].ends_with("clone3"),
                "thread stack must start at clone3: {frames:?}"
            );
            assert_eq!(frames[1], "start_thread", "{frames:?}");
        }
    }
}

/// Every malloc the fixture counted at a site is counted under that site, and
/// every one of those stacks holds the site's whole chain up to the entry.
fn check_sites(folded: &Folded, sites: &[Site], printed: &[expected::SiteCount], skip: usize) {
    for site in sites {
        let fixture_count = printed
            .iter()
            .find(|p| p.function == site.function)
            .unwrap_or_else(|| panic!("the fixture printed no count for {}", site.function))
            .calls;
        assert_eq!(fixture_count, site.calls, "{}", site.function);
        let mut traced = 0;
        for (frames, count) in &folded.stacks {
            let frames = &frames[skip..];
            let leaf = leaf_first(frames);
            let caller = leaf.iter().position(|f| !is_malloc_frame(f)).unwrap_or(0);
            if leaf.get(caller) != Some(&site.function.as_str()) {
                continue;
            }
            traced += count;
            assert!(
                !is_truncated(frames),
                "truncated stack at {}: {frames:?}",
                site.function
            );
            let chain: Vec<&str> = site.chain.iter().map(String::as_str).collect();
            assert_eq!(
                leaf.get(caller..caller + chain.len()),
                Some(&chain[..]),
                "wrong chain above {}: {frames:?}",
                site.function
            );
            assert_root(frames, site.root);
        }
        assert_eq!(
            traced, fixture_count,
            "events traced at {} vs calls the fixture counted",
            site.function
        );
    }
}

fn malloc_sites(lang: Lang, fixture: &str, test: &str) {
    if !bpf_available(test) {
        return;
    }
    let path = fixtures::fixture(lang, fixture);
    let run = trace(
        test,
        &["uprobe:libc:malloc"],
        &format!("{} run", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let printed = expected::parse_site_counts(&run.stdout).expect("site lines");
    let folded = run.folded();
    check_sites(&folded, &expected::chains_sites(lang), &printed, 0);
    assert_eq!(run.summary_events(), folded.total());
    run.assert_every_walk_complete();
}

#[test]
fn malloc_sites_of_a_rust_program_have_exact_counts_and_full_chains() {
    malloc_sites(Lang::Rust, "chains", "rust malloc sites");
}

#[test]
fn malloc_sites_of_a_c_program_have_exact_counts_and_full_chains() {
    malloc_sites(Lang::C, "chains_c", "c malloc sites");
}

#[test]
fn profile_samples_split_as_the_cpu_time_did() {
    if !bpf_available("profile split") {
        return;
    }
    let path = fixtures::rust_fixture("cpu_split");
    let run = trace(
        "profile",
        &["profile:hz:99"],
        &format!("{} 3", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let (hot_s, cold_s) = expected::parse_cpu_split(&run.stdout).expect("time line");
    let folded = run.folded();
    let (mut hot, mut cold, mut elsewhere) = (0u64, 0u64, 0u64);
    for (frames, count) in &folded.stacks {
        // A sample in the exit path after the process's memory is gone has no user
        // stack to walk, only the kernel's.
        let exiting = frames.iter().all(|f| f.ends_with("_[k]"));
        if taken_mid_emulation(frames) || exiting {
            elsewhere += count;
            continue;
        }
        assert!(!is_truncated(frames), "truncated sample: {frames:?}");
        assert_root(frames, Root::Process);
        let has = |name: &str| frames.iter().any(|f| f == name);
        if has("cpu_split::hot") || has("cpu_split::cold") {
            assert!(
                has("cpu_split::main"),
                "sample does not reach main: {frames:?}"
            );
        }
        match (has("cpu_split::hot"), has("cpu_split::cold")) {
            (true, false) => hot += count,
            (false, true) => cold += count,
            _ => elsewhere += count,
        }
    }
    // Start-up before main and exit after it take microseconds: a sample there is
    // possible but rare.
    assert!(elsewhere <= 2, "{elsewhere} samples outside hot and cold");
    let n = (hot + cold) as f64;
    assert!(n >= 200.0, "only {n} samples in 3 s of CPU at 99 Hz");
    let p = hot_s / (hot_s + cold_s);
    let sigma = (n * p * (1.0 - p)).sqrt();
    let deviation = hot as f64 - n * p;
    eprintln!(
        "hot {hot} cold {cold}: expected hot {:.1} ± {sigma:.1}",
        n * p
    );
    assert!(
        deviation.abs() <= 3.0 * sigma,
        "hot {hot} of {n} samples; the fixture's time says {:.1} ± {sigma:.1}",
        n * p
    );
}

#[test]
fn a_rust_function_is_probed_by_its_demangled_path() {
    if !bpf_available("rust path probe") {
        return;
    }
    let path = fixtures::rust_fixture("chains");
    let probe = format!("uprobe:{}:chains::recurse", path.display());
    let run = trace(
        "rust-path",
        &[&probe],
        &format!("{} run", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let folded = run.folded();
    assert_eq!(folded.total(), expected::RECURSION_DEPTH as u64);
    for (frames, _) in &folded.stacks {
        let leaf = leaf_first(frames);
        assert_eq!(leaf[0], "chains::recurse", "{frames:?}");
        let above: Vec<&str> = leaf
            .iter()
            .copied()
            .skip_while(|f| *f == "chains::recurse")
            .take(3)
            .collect();
        assert_eq!(above, ["chains::beta", "chains::alpha", "chains::main"]);
        assert_root(frames, Root::Process);
    }
    // One call per depth: every depth is its own stack.
    assert_eq!(folded.stacks.len(), expected::RECURSION_DEPTH);
}

#[test]
fn uretprobe_counts_equal_entry_counts() {
    if !bpf_available("uretprobe") {
        return;
    }
    let path = fixtures::c_fixture("chains_c");
    let probes = ["uprobe:libc:malloc", "uretprobe:libc:malloc"];
    let run = trace("uretprobe", &probes, &format!("{} run", quoted(&path)), &[]);
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let folded = run.folded();
    // With several probes each stack is rooted at its probe.
    let total = |probe: &str| -> u64 {
        folded
            .stacks
            .iter()
            .filter(|(frames, _)| frames[0] == probe)
            .map(|(_, count)| count)
            .sum()
    };
    let (entries, returns) = (total(probes[0]), total(probes[1]));
    assert!(entries >= 2000, "{entries} malloc entries");
    assert_eq!(entries, returns);
    assert_eq!(entries + returns, folded.total());
    // At the return, the pc is in the site itself: its chain is complete too.
    let printed = expected::parse_site_counts(&run.stdout).expect("site lines");
    let returns_only = Folded {
        stacks: folded
            .stacks
            .iter()
            .filter(|(frames, _)| frames[0] == probes[1])
            .cloned()
            .collect(),
    };
    check_sites(&returns_only, &expected::chains_sites(Lang::C), &printed, 1);
}

#[test]
fn the_svg_opens_and_the_folded_stacks_round_trip_through_inferno() {
    if !bpf_available("svg") {
        return;
    }
    let path = fixtures::c_fixture("chains_c");
    let run = trace(
        "svg",
        &["uprobe:libc:malloc"],
        &format!("{} run", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let svg = std::fs::read_to_string(&run.svg).expect("the SVG exists");
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    for function in [
        "deep_leaf",
        "recurse",
        "beta",
        "alpha",
        "worker_leaf",
        "start_thread",
    ] {
        assert!(
            svg.contains(&format!("<title>{function} (")),
            "no {function} in the SVG"
        );
    }
    let events = run.summary_events();
    assert!(svg.contains(&format!(
        "<title>all ({} events, 100%)</title>",
        thousands(events)
    )));

    // inferno renders the folded file to the same totals.
    let text = std::fs::read_to_string(&run.folded_path).unwrap();
    let mut options = inferno::flamegraph::Options::default();
    options.count_name = "events".into();
    let mut rendered = Vec::new();
    inferno::flamegraph::from_lines(&mut options, text.lines(), &mut rendered)
        .expect("inferno reads the folded stacks");
    let rendered = String::from_utf8(rendered).unwrap();
    assert!(rendered.contains(&format!(
        "<title>all ({} events, 100%)</title>",
        thousands(events)
    )));
    // Each folded line is one distinct stack, root first.
    let folded = run.folded();
    let mut seen = std::collections::HashSet::new();
    for (frames, _) in &folded.stacks {
        assert!(
            seen.insert(frames.clone()),
            "stack listed twice: {frames:?}"
        );
    }
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn tracepoints_count_the_targets_events_with_user_and_kernel_stacks() {
    if !bpf_available("tracepoint") {
        return;
    }
    // dash's echo is one write(2) each.
    let run = trace(
        "tracepoint",
        &["tracepoint:syscalls:sys_enter_write"],
        "sh -c 'echo a; echo b; echo c'",
        &[],
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "a\nb\nc\n");
    let folded = run.folded();
    assert_eq!(folded.total(), 3, "{}", run.stderr);
    for (frames, _) in &folded.stacks {
        assert!(!is_truncated(frames), "{frames:?}");
        assert!(
            frames[0].starts_with("[dash") || frames[0] == "_start",
            "{frames:?}"
        );
        let write = frames
            .iter()
            .position(|f| f.ends_with("libc_write") || f == "write")
            .unwrap_or_else(|| panic!("no write frame: {frames:?}"));
        // Below libc's write: the kernel's syscall path, and none of the BPF machinery.
        let kernel = &frames[write + 1..];
        assert!(
            !kernel.is_empty() && kernel.iter().all(|f| f.ends_with("_[k]")),
            "{frames:?}"
        );
        assert!(!kernel.iter().any(|f| f.starts_with("bpf_")), "{frames:?}");
    }
}

#[test]
fn a_cargo_target_is_built_and_profiled() {
    if !bpf_available("cargo target") {
        return;
    }
    let scratch = common::Scratch::new("cargo");
    let folded_path = scratch.path("out.folded");
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let output = std::process::Command::new(common::binary())
        .args(["profile:hz:99", "--manifest-path", manifest])
        .args(["--package", "cargo-trace-demo", "--no-svg", "--folded"])
        .arg(&folded_path)
        .args(["--", "1"])
        .current_dir(scratch.dir())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("demo: "));
    let folded = Folded::read(&folded_path);
    let in_pipeline = folded.count_with("demo::pipeline");
    // The demo runs for 1 s of wall time, nearly all of it in the pipeline (its
    // share of the CPU depends on what else runs: tests run in parallel).
    assert!(
        in_pipeline >= 10,
        "{in_pipeline} samples in demo::pipeline: {stderr}"
    );
    // Samples taken while the kernel emulated an instruction under another session's
    // uprobe (tests run in parallel, and a uprobe is in every process mapping its
    // file) have no user stack to place: they are the other session's cost, not the
    // demo's, and left out of the share.
    let emulating: u64 = folded
        .stacks
        .iter()
        .filter(|(frames, _)| is_truncated(frames) && taken_mid_emulation(frames))
        .map(|(_, count)| count)
        .sum();
    assert!(
        in_pipeline * 10 >= (folded.total() - emulating) * 9,
        "{in_pipeline} of {} samples ({emulating} mid-emulation) in demo::pipeline: {stderr}",
        folded.total()
    );
    for (frames, _) in &folded.stacks {
        assert!(
            !is_truncated(frames) || taken_mid_emulation(frames),
            "{frames:?}"
        );
    }
}

#[test]
fn line_numbers_name_each_frames_source_line() {
    if !bpf_available("line numbers") {
        return;
    }
    let path = fixtures::c_fixture("chains_c");
    let command = format!("{} run", quoted(&path));
    let run = trace(
        "lines",
        &["uprobe:libc:malloc"],
        &command,
        &["--line-numbers"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let folded = run.folded();
    let delta: Vec<_> = folded
        .stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f.starts_with("delta (")))
        .collect();
    assert_eq!(delta.iter().map(|(_, count)| count).sum::<u64>(), 200);
    for (frames, _) in delta {
        let frame = frames.iter().find(|f| f.starts_with("delta (")).unwrap();
        assert!(frame.contains("chains_c.c:"), "{frame}");
    }
}

#[test]
fn bpf_stats_report_runs_and_time_per_run() {
    if !bpf_available("bpf stats") {
        return;
    }
    let path = fixtures::c_fixture("chains_c");
    let command = format!("{} run", quoted(&path));
    let run = trace(
        "bpf-stats",
        &["uprobe:libc:malloc"],
        &command,
        &["--bpf-stats"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let line = run
        .stderr
        .lines()
        .find_map(|line| line.strip_prefix("cargo-trace: bpf on_uprobe: "))
        .unwrap_or_else(|| panic!("no statistics line: {}", run.stderr));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[1], "runs,", "{line}");
    // The uprobe fires in every process mapping libc (children are followed);
    // the program counts the target's events only.
    assert!(
        words[0].parse::<u64>().unwrap() >= run.summary_events(),
        "{line}"
    );
    assert!(words[2].parse::<u64>().unwrap() > 0, "{line}");
    let memo = run
        .stderr
        .lines()
        .find_map(|line| line.strip_prefix("cargo-trace: walk memo: "))
        .unwrap_or_else(|| panic!("no walk memo line: {}", run.stderr));
    let words: Vec<&str> = memo.split_whitespace().collect();
    assert_eq!(words[1..], ["of", words[2], "walks", "answered"], "{memo}");
    let (answered, walks): (u64, u64) = (words[0].parse().unwrap(), words[2].parse().unwrap());
    // Each site of chains_c mallocs in a loop: the same stack over and over.
    assert!(answered > 0 && answered <= walks, "{memo}");
}

#[test]
fn children_the_target_starts_are_traced_from_main_on() {
    if !bpf_available("children") {
        return;
    }
    let path = quoted(&fixtures::c_fixture("chains_c"));
    // Two children that exec, one after the other, and the shell itself.
    let command = format!("sh -c '{path} run; {path} run'");
    let run = trace("children", &["uprobe:libc:malloc"], &command, &[]);
    assert!(run.status.success(), "{}", run.stderr);
    run.assert_every_walk_complete();
    let printed = expected::parse_site_counts(&run.stdout).expect("site lines");
    assert_eq!(printed.len(), 8, "two runs of four sites: {}", run.stdout);
    let folded = run.folded();
    for site in expected::chains_sites(Lang::C) {
        let counted: u64 = printed
            .iter()
            .filter(|p| p.function == site.function)
            .map(|p| p.calls)
            .sum();
        let traced: u64 = folded
            .stacks
            .iter()
            .filter(|(frames, _)| frames.iter().rev().nth(1) == Some(&site.function))
            .map(|(_, count)| count)
            .sum();
        assert_eq!(traced, counted, "{}", site.function);
    }

    // Without following, only the shell's own mallocs are seen.
    let run = trace(
        "no-children",
        &["uprobe:libc:malloc"],
        &command,
        &["--no-follow-forks"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.folded().count_with("deep_leaf"), 0);
}

#[test]
fn stacks_cross_signal_frames() {
    if !bpf_available("signal frames") {
        return;
    }
    let path = fixtures::c_fixture("signals");
    let run = trace(
        "signals",
        &["uprobe:libc:malloc"],
        &format!("{} 20", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let printed = expected::parse_site_counts(&run.stdout).expect("site line");
    assert_eq!(printed[0].calls, 200);
    let folded = run.folded();
    let mut in_handler = 0;
    for (frames, count) in &folded.stacks {
        let leaf = leaf_first(frames);
        if leaf.get(1) != Some(&"on_signal") {
            continue;
        }
        in_handler += count;
        assert!(!is_truncated(frames), "{frames:?}");
        // The handler returns into the signal trampoline; above it, the
        // interrupted code: raise's innards, then the fixture's chain.
        assert_eq!(leaf[2], "__restore_rt", "{frames:?}");
        let chain: Vec<&str> = leaf
            .iter()
            .copied()
            .skip_while(|f| *f != "inner")
            .take(3)
            .collect();
        assert_eq!(chain, ["inner", "outer", "main"], "{frames:?}");
        assert_root(frames, Root::Process);
    }
    assert_eq!(in_handler, 200);
}

/// An event in rt_sigreturn has rip past the signal trampoline's last instruction (its
/// syscall) and outside its unwind info: the walk starts from the syscall instead, and
/// crosses the signal frame into the interrupted code.
#[test]
fn events_in_rt_sigreturn_walk_through_the_signal_frame() {
    if !bpf_available("rt_sigreturn") {
        return;
    }
    let path = fixtures::c_fixture("signals");
    let run = trace(
        "rt_sigreturn",
        &["tracepoint:syscalls:sys_enter_rt_sigreturn"],
        &format!("{} 20", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let folded = run.folded();
    assert_eq!(folded.total(), 20, "one per signal: {}", run.stderr);
    for (frames, _) in &folded.stacks {
        assert!(!is_truncated(frames), "{frames:?}");
        let user: Vec<&str> = leaf_first(frames)
            .into_iter()
            .filter(|f| !f.ends_with("_[k]"))
            .collect();
        assert_eq!(user[0], "__restore_rt", "{frames:?}");
        let chain: Vec<&str> = user
            .iter()
            .copied()
            .skip_while(|f| *f != "inner")
            .take(3)
            .collect();
        assert_eq!(chain, ["inner", "outer", "main"], "{frames:?}");
        assert_root(frames, Root::Process);
    }
}

/// A uprobe program runs with interrupts on: profile samples land in the middle of its walks
/// (a malloc storm under `profile:hz:4999` puts thousands there), and each walk must keep
/// its own scratch. Every malloc is counted once under its full chain, and no stack is
/// mangled into a hash collision or a truncation.
#[test]
fn profile_samples_inside_uprobe_walks_leave_them_intact() {
    if !bpf_available("nested walks") {
        return;
    }
    let path = fixtures::c_fixture("storm");
    let run = trace(
        "nested",
        &["uprobe:libc:malloc", "profile:hz:4999"],
        &format!("{} 300000", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let printed = expected::parse_site_counts(&run.stdout).expect("site line");
    assert_eq!(printed[0].calls, 300_000);
    let folded = run.folded();
    let mut mallocs = 0;
    let mut samples_in_uprobes = 0;
    let chain: Vec<String> = (1..=10)
        .rev()
        .map(|level| format!("storm_{level}"))
        .chain(["main".to_string()])
        .collect();
    for (frames, count) in &folded.stacks {
        match frames[0].as_str() {
            "uprobe:libc:malloc" => {
                let frames = &frames[1..];
                assert!(!is_truncated(frames), "{frames:?}");
                assert_root(frames, Root::Process);
                let leaf = leaf_first(frames);
                assert!(is_malloc_frame(leaf[0]), "{frames:?}");
                // The storm's mallocs, and stdio's buffer for its output.
                if leaf[1] == "storm_10" {
                    mallocs += count;
                    assert_eq!(leaf[1..=chain.len()], chain, "{frames:?}");
                }
            }
            "profile:hz:4999" => {
                if frames.iter().any(|f| f == "uprobe_notify_resume_[k]") {
                    samples_in_uprobes += count;
                }
            }
            other => panic!("unknown probe {other}"),
        }
    }
    assert_eq!(mallocs, 300_000, "{}", run.stderr);
    assert!(
        samples_in_uprobes > 0,
        "no sample in a uprobe: {}",
        run.stderr
    );
    for lost in [
        "hash collision",
        "stack not stored",
        "stack ring full",
        "count lost",
        "too nested",
    ] {
        assert!(!run.stderr.contains(lost), "{}", run.stderr);
    }
}

/// A child's library constructors run before its `main`, while ld.so starts it (here
/// libstdc++'s, which allocates its exception arena): the child stops once ld.so has
/// mapped its libraries, before any constructor runs, so those stacks are complete too,
/// from the allocation up through `_dl_init` to ld.so's entry.
#[test]
fn library_constructors_in_a_child_have_complete_stacks() {
    if !bpf_available("constructors") {
        return;
    }
    let path = quoted(&fixtures::cpp_fixture("cxx_exceptions"));
    let run = trace(
        "constructors",
        &["uprobe:libc:malloc"],
        &format!("sh -c '{path} 3'"),
        &[],
    );
    assert!(run.status.success(), "{}", run.stderr);
    run.assert_every_walk_complete();
    let folded = run.folded();
    let in_constructors: Vec<_> = folded
        .stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f == "_dl_init"))
        .collect();
    assert!(!in_constructors.is_empty(), "{:?}", folded.stacks);
    for (frames, _) in in_constructors {
        // ld.so's hand-written start, named by libc6-dbg's symbols (a label of size 0).
        assert_eq!(frames[0], "_dl_start_user", "{frames:?}");
        assert!(is_malloc_frame(frames.last().unwrap()), "{frames:?}");
    }
}

/// A library the target dlopens is registered before its constructor runs (the process
/// stops when ld.so's link map turns consistent): the constructor's allocations have
/// complete stacks, down from `main` through `dlopen` and `_dl_init`.
#[test]
fn a_dlopened_librarys_constructor_has_complete_stacks() {
    if !bpf_available("dlopen") {
        return;
    }
    let path = fixtures::c_fixture("dlopen_cxx");
    let run = trace("dlopen", &["uprobe:libc:malloc"], &quoted(&path), &[]);
    assert!(run.status.success(), "{}", run.stderr);
    run.assert_every_walk_complete();
    let folded = run.folded();
    let constructor = folded
        .stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f == "_dl_init"))
        .inspect(|(frames, _)| {
            assert_root(frames, Root::Process);
            assert!(frames.iter().any(|f| f == "main"), "{frames:?}");
        })
        .count();
    assert!(constructor > 0, "{:?}", folded.stacks);
    assert_eq!(folded.count_with("after_dlopen"), 1);
}

/// glibc's vfork keeps its return address in rdi around the syscall (dash runs every
/// external command through it): uprobes right after the `pop %rdi` and right after the
/// syscall, in the shell and in its vforked children, walk to the end of the stack.
#[test]
fn stacks_through_vfork_return_through_rdi() {
    if !bpf_available("vfork") {
        return;
    }
    let run = trace(
        "vfork",
        &["uprobe:libc:vfork+1", "uprobe:libc:vfork+9"],
        "sh -c '/bin/true; /bin/true; echo done'",
        &[],
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "done\n");
    run.assert_every_walk_complete();
    let folded = run.folded();
    for probe in ["uprobe:libc:vfork+1", "uprobe:libc:vfork+9"] {
        let stacks: Vec<_> = folded
            .stacks
            .iter()
            .filter(|(frames, _)| frames[0] == probe)
            .collect();
        assert!(!stacks.is_empty(), "no {probe} event: {:?}", folded.stacks);
        for (frames, _) in stacks {
            // The shell's frames above vfork; the last is the probe's own pc. In a child
            // (vfork+9 returns in both), they are named through its parent's mappings.
            assert!(frames.len() > 4, "{frames:?}");
            assert!(
                !frames.iter().any(|f| f.starts_with("[unknown]")),
                "{frames:?}"
            );
            assert_eq!(frames.last().unwrap(), "__libc_vfork", "{frames:?}");
        }
    }
    // The child's return from vfork counts too: two in the shell, two in its children.
    let returns: u64 = folded
        .stacks
        .iter()
        .filter(|(frames, _)| frames[0] == "uprobe:libc:vfork+9")
        .map(|(_, count)| count)
        .sum();
    assert_eq!(returns, 4, "{:?}", folded.stacks);
}

/// A file deleted during the session can leave its inode number to the next file created
/// (ext4 hands it out again at once): a binary that gets it must be unwound with its own
/// table, not with the one loaded for the deleted file. That binary is deleted too before
/// the session ends, and its frames must still be named.
#[test]
fn a_binary_on_a_reused_inode_gets_its_own_table() {
    if !bpf_available("reused inode") {
        return;
    }
    let path = quoted(&fixtures::c_fixture("chains_c"));
    let command = format!(
        "sh -c 'cp /bin/true first; ./first; stat -c \"inode %i\" first; rm first; \
         cp {path} second; stat -c \"inode %i\" second; ./second run; rm second'"
    );
    let run = trace("reused-inode", &["uprobe:libc:malloc"], &command, &[]);
    assert!(run.status.success(), "{}", run.stderr);
    let inodes: Vec<&str> = run
        .stdout
        .lines()
        .filter(|line| line.starts_with("inode "))
        .collect();
    assert_eq!(inodes.len(), 2, "{}", run.stdout);
    if inodes[0] != inodes[1] {
        eprintln!(
            "SKIPPED reused inode: this file system gave the second file a new inode ({inodes:?})"
        );
        return;
    }
    let printed = expected::parse_site_counts(&run.stdout).expect("site lines");
    check_sites(&run.folded(), &expected::chains_sites(Lang::C), &printed, 0);
    run.assert_every_walk_complete();
}

/// A uretprobe puts a trampoline in place of its function's return address while the
/// function runs (and the return goes through a system call on Linux 6.11+). Walks from
/// inside the function, and events taken in the trampoline, go on past it with the
/// return address the kernel kept.
#[test]
fn walks_cross_uretprobe_trampolines() {
    if !bpf_available("uretprobe trampolines") {
        return;
    }
    let path = fixtures::c_fixture("levels");
    let probe = |kind: &str, function: &str| format!("{kind}:{}:{function}", path.display());
    let inside = probe("uprobe", "level3");
    let returns = probe("uretprobe", "level2");
    let run = trace(
        "uretprobe-trampoline",
        &[&returns, &inside, "tracepoint:raw_syscalls:sys_enter"],
        &format!("{} 1000", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    run.assert_every_walk_complete();
    let folded = run.folded();
    let chain = ["main", "level1", "level2", "level3"];
    let mut in_level3 = 0;
    let mut returning = 0;
    for (frames, count) in &folded.stacks {
        assert!(!is_truncated(frames), "{frames:?}");
        let user: Vec<&str> = frames
            .iter()
            .map(String::as_str)
            .filter(|f| !f.ends_with("_[k]"))
            .collect();
        if frames[0] == inside {
            // level3's stack goes through level2's frame, whose return address is the
            // trampoline's while the uretprobe waits.
            assert!(user.ends_with(&chain), "{frames:?}");
            in_level3 += count;
        } else if frames[0] == "tracepoint:raw_syscalls:sys_enter" && user.ends_with(&chain[..2]) {
            // The uretprobe's system call, in the trampoline: level2 has returned, the
            // event is level1's, at the return address.
            returning += count;
        }
    }
    assert_eq!(in_level3, 1000);
    assert!(
        returning == 0 || returning == 1000,
        "{returning} system calls in the trampoline: one per return, on kernels that \
         return through a system call"
    );
}

/// A uprobe's instruction runs out of line: the kernel single-steps a copy in a slot of
/// the process's `[uprobes]` page. An event taken there, here the page fault of the
/// probed store (a fresh page at every call), walks from the probed instruction.
#[test]
fn events_in_a_uprobes_single_step_walk_from_the_probed_instruction() {
    if !bpf_available("uprobe single step") {
        return;
    }
    const PAGES: u64 = 200;
    let path = fixtures::c_fixture("xol_fault");
    let probe = format!("uprobe:{}:touch", path.display());
    let run = trace(
        "uprobe-single-step",
        &[&probe, "software:page-faults:1"],
        &format!("{} {PAGES}", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    run.assert_every_walk_complete();
    let chain = ["main", "touch_all", "touch"];
    let (mut probed, mut faults) = (0, 0);
    for (frames, count) in &run.folded().stacks {
        assert!(!is_truncated(frames), "{frames:?}");
        assert!(
            !frames.iter().any(|f| f.contains("[uprobes]")),
            "{frames:?}"
        );
        let user: Vec<&str> = frames[1..]
            .iter()
            .map(String::as_str)
            .filter(|f| !f.ends_with("_[k]"))
            .collect();
        if !user.ends_with(&chain) {
            continue;
        }
        if frames[0] == probe {
            probed += count;
        } else if frames[0] == "software:page-faults:1" {
            faults += count;
        }
    }
    assert_eq!(probed, PAGES);
    // One fault per page, and at most one more: the first fetch from the [uprobes]
    // page maps it.
    assert!(
        (PAGES..=PAGES + 1).contains(&faults),
        "{faults} faults in touch for {PAGES} pages: {}",
        run.stderr
    );
}

#[test]
fn samples_during_exit_are_counted_as_what_they_are() {
    if !bpf_available("samples during exit") {
        return;
    }
    // 1 GiB touched: the kernel takes tens of milliseconds to free it, after the
    // process's memory is released from it and before it is gone.
    let path = fixtures::c_fixture("big_exit");
    let run = trace(
        "exit-samples",
        &["profile:hz:999"],
        &format!("{} 1024", quoted(&path)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let folded = run.folded();
    let exiting: u64 = folded
        .stacks
        .iter()
        .filter(|(frames, _)| {
            frames.iter().all(|f| f.ends_with("_[k]")) && frames.iter().any(|f| f == "do_exit_[k]")
        })
        .map(|(_, count)| count)
        .sum();
    assert!(exiting > 0, "no sample during exit: {}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "with no user stack to walk: process exiting {exiting}"
        )),
        "the summary does not count the {exiting} samples during exit as such: {}",
        run.stderr
    );
}
