//! End to end: probes never hurt the target and never lie. A uprobe is refused
//! inside an instruction (it would crash every process running the file), and
//! one that cannot fire says so.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use cargo_trace_tests::fixtures;
use common::{bpf_available, quoted, run_args, trace};

/// [`bpf_available`], except that under CI (`CI=true`), where BPF must work, a test
/// that cannot run fails instead of passing with nothing tested.
fn bpf_or_skip(test: &str) -> bool {
    if bpf_available(test) {
        return true;
    }
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "{test} cannot run under CI: loading BPF programs needs root"
    );
    false
}

/// Where objdump says the instructions of `function` start (virtual addresses).
fn objdump_instructions(binary: &Path, function: &str) -> Vec<(u64, String)> {
    let output = Command::new("objdump")
        .args([
            "-d",
            "--no-show-raw-insn",
            &format!("--disassemble={function}"),
        ])
        .arg(binary)
        .output()
        .expect("objdump runs");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (address, text) = line.trim_start().split_once(":\t")?;
            Some((u64::from_str_radix(address, 16).ok()?, text.to_string()))
        })
        .collect()
}

/// The `levels` fixture looping until its standard input closes, untraced.
struct Bystander(Child);

impl Bystander {
    fn start(binary: &Path) -> Bystander {
        let mut child = Command::new(binary)
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the fixture");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        Bystander(child)
    }

    /// Ends its loop; its exit and what it printed.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        drop(self.0.stdin.take());
        let output = self.0.wait_with_output().unwrap();
        (
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    }
}

#[test]
fn a_uprobe_inside_an_instruction_is_refused_and_harms_no_process() {
    if !bpf_or_skip("inside an instruction") {
        return;
    }
    let levels = fixtures::c_fixture("levels");
    let instructions = objdump_instructions(&levels, "level2");
    let (start, _) = instructions[0];
    let (call, _) = *instructions
        .iter()
        .find(|(_, text)| text.starts_with("call"))
        .expect("level2 calls level3");
    let inside = call + 1;
    let offset = inside - start;
    let bystander = Bystander::start(&levels);
    let command = format!("{} 100000", quoted(&levels));
    for probe in [
        format!("uprobe:{}:level2+{offset}", levels.display()),
        format!("uprobe:{}:{inside:#x}", levels.display()),
    ] {
        let run = trace("inside", &[&probe], &command, &[]);
        assert_eq!(run.status.code(), Some(2), "{probe}: {}", run.stderr);
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{probe}: one line expected: {}", run.stderr);
        assert!(
            lines[0].starts_with("cargo-trace: error: ")
                && lines[0].contains("inside an instruction"),
            "{probe}: {}",
            run.stderr
        );
        // The nearest boundaries: the call and the instruction after it.
        let after = instructions
            .iter()
            .find(|(address, _)| *address > call)
            .unwrap()
            .0;
        assert!(
            lines[0].ends_with(&format!(
                "level2+{:#x} and level2+{:#x}",
                call - start,
                after - start
            )) || lines[0].ends_with(&format!(
                "{call:#x} (level2+{:#x}) and {after:#x} (level2+{:#x})",
                call - start,
                after - start
            )),
            "{probe}: {}",
            run.stderr
        );
        // Nothing ran: no summary, no output of the target.
        assert!(!run.stderr.contains(" events, "), "{}", run.stderr);
        assert_eq!(run.stdout, "", "{probe}");
    }
    let (status, stdout) = bystander.finish();
    assert!(
        status.success(),
        "the untraced process: {status:?} {stdout}"
    );
    let calls: u64 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("bad output {stdout:?}"));
    assert!(calls >= 1024, "{stdout}");
}

#[test]
fn an_instruction_boundary_inside_a_function_is_probed_and_counts_exactly() {
    if !bpf_or_skip("instruction boundary") {
        return;
    }
    let levels = fixtures::c_fixture("levels");
    let instructions = objdump_instructions(&levels, "level2");
    let (start, _) = instructions[0];
    let (call, _) = *instructions
        .iter()
        .find(|(_, text)| text.starts_with("call"))
        .expect("level2 calls level3");
    let bystander = Bystander::start(&levels);
    let command = format!("{} 5000", quoted(&levels));
    for probe in [
        format!("uprobe:{}:level2+{}", levels.display(), call - start),
        format!("uprobe:{}:{call:#x}", levels.display()),
    ] {
        let run = trace("boundary", &[&probe], &command, &["--no-svg"]);
        assert_eq!(run.status.code(), Some(0), "{probe}: {}", run.stderr);
        assert_eq!(run.stdout, "calls 5000 sum 30000\n");
        assert_eq!(run.folded().count_with("level2"), 5000, "{}", run.stderr);
    }
    let (status, stdout) = bystander.finish();
    assert!(
        status.success(),
        "the untraced process: {status:?} {stdout}"
    );
}

#[test]
fn an_address_in_no_known_function_needs_unsafe() {
    if !bpf_or_skip("outside functions") {
        return;
    }
    let levels = fixtures::c_fixture("levels");
    // The PLT's first entry: code without a symbol.
    let output = Command::new("objdump")
        .args(["-h", "-w"])
        .arg(&levels)
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&output.stdout);
    let plt = headers
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(1) == Some(&".plt")).then(|| u64::from_str_radix(fields[3], 16).unwrap())
        })
        .expect("a .plt section");
    let probe = format!("uprobe:{}:{plt:#x}", levels.display());
    let command = format!("{} 10", quoted(&levels));
    let (status, stderr) = run_args(&[&probe, "-c", &command]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("in no known function") && stderr.contains("--unsafe"),
        "{stderr}"
    );
    let run = trace("unsafe", &[&probe], &command, &["--unsafe", "--no-svg"]);
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "calls 10 sum 60\n");
    assert!(run.stderr.contains(" events, "), "{}", run.stderr);
}

/// The `ifuncs` fixture, built so that gcc leaves strlen and memcpy calls alone.
fn ifuncs_fixture() -> std::path::PathBuf {
    fixtures::build(fixtures::Lang::C, "ifuncs", &["-fno-builtin"])
        .unwrap_or_else(|error| panic!("building fixture ifuncs: {error}"))
}

/// The calls per caller the `ifuncs` fixture printed.
fn printed_calls(stdout: &str) -> Vec<(String, u64)> {
    stdout
        .lines()
        .map(|line| {
            let (caller, count) = line.split_once(' ').expect("CALLER COUNT");
            (caller.to_string(), count.parse().expect("a count"))
        })
        .collect()
}

#[test]
fn ifunc_symbols_count_every_call_of_the_implementation() {
    if !bpf_or_skip("ifunc") {
        return;
    }
    let ifuncs = ifuncs_fixture();
    let run = trace(
        "ifunc",
        &["uprobe:libc:strlen", "uprobe:libc:memcpy"],
        &format!("{} 3000", quoted(&ifuncs)),
        &["--no-svg"],
    );
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    for name in ["strlen", "memcpy"] {
        assert_eq!(
            run.stderr
                .lines()
                .filter(
                    |line| line.starts_with(&format!("cargo-trace: note: {name} in "))
                        && line.contains(" is an IFUNC: probing ")
                )
                .count(),
            1,
            "one line says which {name} is probed: {}",
            run.stderr
        );
    }
    let printed = printed_calls(&run.stdout);
    assert_eq!(printed.len(), 4, "{}", run.stdout);
    let folded = run.folded();
    for (caller, calls) in printed {
        assert_eq!(calls, 3000);
        let probe = if caller.starts_with("strlen") {
            "uprobe:libc:strlen"
        } else {
            "uprobe:libc:memcpy"
        };
        let counted: u64 = folded
            .stacks
            .iter()
            .filter(|(frames, _)| frames[0] == probe && frames.contains(&caller))
            .map(|(_, count)| count)
            .sum();
        assert_eq!(counted, calls, "{caller} under {probe}: {}", run.stderr);
    }
}

#[test]
fn a_probe_on_a_file_the_target_does_not_map_is_warned_about_at_start() {
    if !bpf_or_skip("not mapped") {
        return;
    }
    let levels_static = fixtures::build(fixtures::Lang::C, "levels", &["-no-pie", "-static"])
        .unwrap_or_else(|error| panic!("building a static levels: {error}"));
    let levels = fixtures::c_fixture("levels");
    let ifuncs = ifuncs_fixture();
    let other_binary = format!("uprobe:{}:main", ifuncs.display());
    let cases = [
        (&levels_static, "uprobe:libc:getppid", "libc.so", true),
        (&levels, other_binary.as_str(), "ifuncs", false),
    ];
    for (target, probe, file, statically_linked) in cases {
        let run = trace(
            "not-mapped",
            &[probe],
            &format!("{} 10", quoted(target)),
            &["--no-svg"],
        );
        // Accepted: a library may be opened later.
        assert_eq!(run.status.code(), Some(0), "{probe}: {}", run.stderr);
        assert_eq!(run.stdout, "calls 10 sum 60\n");
        let warnings: Vec<&str> = run
            .stderr
            .lines()
            .filter(|line| line.starts_with("cargo-trace: warning: "))
            .collect();
        assert_eq!(warnings.len(), 1, "{probe}: {}", run.stderr);
        let warning = warnings[0];
        assert!(
            warning.contains(&format!("{probe} may never fire: process "))
                && warning.contains(" does not map ")
                && warning.contains(file),
            "{warning}"
        );
        assert_eq!(
            warning.contains("statically linked"),
            statically_linked,
            "{warning}"
        );
        assert_eq!(run.summary_events(), 0, "{}", run.stderr);
    }
    // A probe that can fire is not warned about.
    let run = trace(
        "mapped",
        &["uprobe:libc:getppid"],
        &format!("{} 10", quoted(&levels)),
        &["--no-svg"],
    );
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
}

#[test]
fn a_frame_name_of_the_flamegraph_is_a_probe_wildcards_included() {
    if !bpf_or_skip("frame names") {
        return;
    }
    let ifuncs = ifuncs_fixture();
    let command = format!("{} 2000", quoted(&ifuncs));
    let run = trace(
        "frame-names",
        &["uprobe:libc:strlen"],
        &command,
        &["--no-svg"],
    );
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    // The implementation, as the symbolizer names it (`__strlen_evex` on AVX-512
    // machines: a name only libc's separate debug file has).
    let leaf = run
        .folded()
        .stacks
        .iter()
        .find(|(frames, _)| frames.contains(&"strlen_direct".to_string()))
        .map(|(frames, _)| frames.last().unwrap().clone())
        .expect("a strlen_direct stack");
    assert!(leaf.starts_with("__strlen_"), "{leaf}: {}", run.stderr);
    for probe in [
        format!("uprobe:libc:{leaf}"),
        "uprobe:libc:__strlen_*".to_string(),
        "uprobe:libc:__GI_getppid".to_string(),
    ] {
        let run = trace("frame-names", &[&probe], &command, &["--no-svg"]);
        assert_eq!(run.status.code(), Some(0), "{probe}: {}", run.stderr);
        if probe.ends_with("getppid") {
            // Resolved, attached; the fixture never calls it.
            assert_eq!(run.summary_events(), 0, "{}", run.stderr);
            continue;
        }
        let folded = run.folded();
        assert_eq!(
            folded.count_with("strlen_direct"),
            2000,
            "{probe}: {}",
            run.stderr
        );
        assert_eq!(folded.count_with("strlen_through_pointer"), 2000, "{probe}");
    }
}

#[test]
fn filters_are_one_line_saying_what_to_use_instead() {
    for (probe, mentions) in [
        (
            "uprobe:libc:malloc /pid == 1/",
            "filters are not supported ('/pid == 1/'",
        ),
        (
            "uprobe:libc:malloc { @[ustack] = count(); }",
            "actions are not supported",
        ),
        (
            "uprobe:libc:malloc,uprobe:libc:free /comm == \"x\"/",
            "filters are not supported",
        ),
    ] {
        let (status, stderr) = run_args(&[probe, "-c", "true"]);
        assert_eq!(status.code(), Some(2), "{stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(
            lines[0].starts_with("cargo-trace: error: ") && lines[0].contains(mentions),
            "{stderr}"
        );
        assert!(
            lines[0].ends_with("drop the filter") || lines[0].ends_with("drop the action"),
            "says what to do: {stderr}"
        );
    }
}

#[test]
fn a_comma_list_is_several_probes_each_with_its_counts() {
    if !bpf_or_skip("comma list") {
        return;
    }
    let levels = fixtures::c_fixture("levels");
    let level1 = format!("uprobe:{}:level1", levels.display());
    let level3 = format!("uprobe:{}:level3", levels.display());
    let run = trace(
        "comma-list",
        &[&format!("{level1},{level3}")],
        &format!("{} 700", quoted(&levels)),
        &["--no-svg"],
    );
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    let folded = run.folded();
    for (probe, leaf) in [(&level1, "level1"), (&level3, "level3")] {
        let counted: u64 = folded
            .stacks
            .iter()
            .filter(|(frames, _)| frames[0] == *probe && frames.last().unwrap() == leaf)
            .map(|(_, count)| count)
            .sum();
        assert_eq!(counted, 700, "{probe}: {}", run.stderr);
    }
    assert_eq!(folded.total(), 1400);
}

#[test]
fn an_unknown_raw_tracepoint_is_one_line_and_libbpf_speaks_with_verbose_only() {
    if !bpf_or_skip("raw tracepoint") {
        return;
    }
    let (status, stderr) = run_args(&["rawtracepoint:no_such_tracepoint_xyz", "-c", "true"]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("cargo-trace: error: no raw tracepoint no_such_tracepoint_xyz"),
        "{stderr}"
    );
    let (status, stderr) = run_args(&["rawtracepoint:no_such_tracepoint_xyz", "-c", "true", "-v"]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|line| line.starts_with("cargo-trace: libbpf: ")
                && line.contains("no_such_tracepoint_xyz")),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("cargo-trace: error: "),
        "{stderr}"
    );
}

#[test]
fn an_avx_instruction_the_kernel_would_skip_is_never_probed() {
    if !bpf_or_skip("avx entry") {
        return;
    }
    let avx_entry = fixtures::c_fixture("avx_entry");
    let untraced = Command::new(&avx_entry).arg("1").output().unwrap();
    if untraced.status.code() == Some(77) {
        eprintln!("skipping avx entry: this CPU has no AVX");
        return;
    }
    let instructions = objdump_instructions(&avx_entry, "avx_first");
    let (start, first) = &instructions[0];
    let (second, _) = instructions[1];
    assert!(first.starts_with("vpcmpeqb"), "{instructions:?}");
    let command = format!("{} 1000", quoted(&avx_entry));

    // At the function: probed at its second instruction, and the first still runs.
    let run = trace(
        "avx-entry",
        &[&format!("uprobe:{}:avx_first", avx_entry.display())],
        &command,
        &["--no-svg"],
    );
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "calls 1000 bad 0\n", "{}", run.stderr);
    assert_eq!(run.summary_events(), 1000, "{}", run.stderr);
    let notes: Vec<&str> = run
        .stderr
        .lines()
        .filter(|line| line.starts_with("cargo-trace: note: avx_first in "))
        .collect();
    assert_eq!(notes.len(), 1, "{}", run.stderr);
    assert!(
        notes[0].contains("starts with vpcmpeqb")
            && notes[0].contains(&format!("avx_first+{:#x}", second - start)),
        "{}",
        notes[0]
    );

    // At the instruction itself, by address: refused.
    let (status, stderr) = run_args(&[
        &format!("uprobe:{}:{start:#x}", avx_entry.display()),
        "-c",
        &command,
    ]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("is vpcmpeqb, an AVX instruction")
            && stderr.ends_with(&format!("probe the next instruction, at {second:#x}\n")),
        "{stderr}"
    );

    // One the kernel refuses (vpxor, 0xef, reads as `out`): one clear line.
    let caller = objdump_instructions(&avx_entry, "call_avx_first");
    let (vpxor, _) = caller
        .iter()
        .find(|(_, text)| text.starts_with("vpxor"))
        .expect("call_avx_first zeroes xmm1");
    let (status, stderr) = run_args(&[
        &format!("uprobe:{}:{vpxor:#x}", avx_entry.display()),
        "-c",
        &command,
    ]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("the kernel refuses uprobe "), "{stderr}");
}

/// Linux 6.18 optimizes a uprobe on a 5-byte nop into a call to a page of the process
/// (`[uprobes-trampoline]`); a child forked afterwards inherits the call, not the page,
/// and died of SIGSEGV at its first call, whether forks were followed or not. A function
/// starting with one is probed at its next instruction: both processes run to the end
/// and every call of each is counted, for a return probe too (its breakpoint is at the
/// entry); the nop itself, by address, is refused.
#[test]
fn a_five_byte_nop_the_kernel_would_turn_into_a_call_is_never_probed() {
    if !bpf_or_skip("nop5 entry") {
        return;
    }
    let nop5_entry = fixtures::c_fixture("nop5_entry");
    let instructions = objdump_instructions(&nop5_entry, "nop5_first");
    let (start, first) = &instructions[0];
    let (second, _) = instructions[1];
    assert!(first.starts_with("nopl"), "{instructions:?}");
    assert_eq!(second - start, 5, "{instructions:?}");
    let command = format!("{} 1000", quoted(&nop5_entry));
    let calls = "parent 1000 child exited 0\n";

    for kind in ["uprobe", "uretprobe"] {
        let probe = format!("{kind}:{}:nop5_first", nop5_entry.display());
        let run = trace("nop5-entry", &[&probe], &command, &["--no-svg"]);
        assert_eq!(run.status.code(), Some(0), "{probe}: {}", run.stderr);
        assert_eq!(run.stdout, calls, "{probe}: {}", run.stderr);
        let folded = run.folded();
        assert_eq!(
            folded.count_with("in_parent"),
            1000,
            "{probe}: {}",
            run.stderr
        );
        assert_eq!(
            folded.count_with("in_child"),
            1000,
            "{probe}: {}",
            run.stderr
        );
        assert_eq!(folded.total(), 2000, "{probe}: {}", run.stderr);
        let notes: Vec<&str> = run
            .stderr
            .lines()
            .filter(|line| line.starts_with("cargo-trace: note: nop5_first in "))
            .collect();
        assert_eq!(notes.len(), 1, "{probe}: {}", run.stderr);
        assert!(
            notes[0].contains("starts with nop (0f 1f 44 00 00), a 5-byte nop")
                && notes[0].contains("probing its next instruction, nop5_first+0x5"),
            "{}",
            notes[0]
        );
    }

    // Forks not followed: the child is not counted, and is not harmed either.
    let probe = format!("uprobe:{}:nop5_first", nop5_entry.display());
    let run = trace(
        "nop5-entry",
        &[&probe],
        &command,
        &["--no-svg", "--no-follow-forks"],
    );
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, calls, "{}", run.stderr);
    assert_eq!(run.folded().count_with("in_parent"), 1000, "{}", run.stderr);

    // The nop itself, by address: refused in one line naming the next instruction.
    let (status, stderr) = run_args(&[
        &format!("uprobe:{}:{start:#x}", nop5_entry.display()),
        "-c",
        &command,
    ]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("cargo-trace: error: ")
            && stderr.contains(&format!("address {start:#x} (nop5_first) in "))
            && stderr.contains("is nop (0f 1f 44 00 00), a 5-byte nop")
            && stderr.contains("a child it forks does not inherit")
            && stderr.ends_with(&format!("probe the next instruction, at {second:#x}\n")),
        "{stderr}"
    );
}

/// The plugin `dlopen_plugin` loads: `plug_work(i)` returns `i`.
const PLUGIN_SOURCE: &str = "__attribute__((noipa)) unsigned long plug_work(unsigned long i) \
                             { return i; }\n";

/// A probe on a library no process maps yet and no library directory holds (a plugin
/// to be dlopened) is accepted with a warning and attached when the traced process maps
/// it, before it runs anything there: every call is counted.
#[test]
fn a_probe_on_a_plugin_waits_for_its_dlopen() {
    if !bpf_or_skip("plugin probe") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("plugin.c");
    std::fs::write(&source, PLUGIN_SOURCE).unwrap();
    let plugin = dir.path().join("libplug.so");
    let status = std::process::Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-o"])
        .arg(&plugin)
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success());
    let program = fixtures::c_fixture("dlopen_plugin");
    let run = trace(
        "plugin",
        &["uprobe:libplug:plug_work"],
        &format!("{} {} 1500", quoted(&program), quoted(&plugin)),
        &[],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    assert!(
        run.stdout.contains("plug_work calls 1500"),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.contains("warning: uprobe:libplug:plug_work")
            && run
                .stderr
                .contains("attached when a traced process maps it"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("uprobe:libplug:plug_work attached"),
        "{}",
        run.stderr
    );
    assert_eq!(run.summary_events(), 1500, "{}", run.stderr);
    let folded = run.folded();
    assert_eq!(folded.count_with("call_plugin"), 1500);
    run.assert_every_walk_complete();
}
