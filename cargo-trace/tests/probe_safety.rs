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
