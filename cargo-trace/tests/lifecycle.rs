//! End to end: how a session ends. A target that aborts, is killed or is
//! interrupted still yields its flamegraph; attaching to a running process
//! leaves it running; bad input is one clear line and a non-zero exit.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use cargo_trace_tests::expected;
use cargo_trace_tests::fixtures::{self, Lang};
use cargo_trace_tests::process::process_state;
use common::{binary, bpf_available, quoted, run_args, trace, Folded, Scratch};

fn assert_svg(path: &std::path::Path) {
    let svg = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no flamegraph at {}: {e}", path.display()));
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
}

#[test]
fn a_target_that_aborts_still_yields_its_flamegraph() {
    if !bpf_available("abort") {
        return;
    }
    let path = fixtures::c_fixture("chains_c");
    let run = trace(
        "abort",
        &["uprobe:libc:malloc"],
        &format!("{} abort", quoted(&path)),
        &[],
    );
    // 128 + SIGABRT, like a shell.
    assert_eq!(run.status.code(), Some(134), "{}", run.stderr);
    assert!(run.stderr.contains("killed by SIGABRT"), "{}", run.stderr);
    assert_svg(&run.svg);
    let printed = expected::parse_site_counts(&run.stdout).expect("site lines");
    let deep_leaf = expected::chains_sites(Lang::C).remove(0);
    let traced: u64 = run
        .folded()
        .stacks
        .iter()
        .filter(|(frames, _)| frames.iter().rev().nth(1) == Some(&deep_leaf.function))
        .map(|(_, count)| count)
        .sum();
    let counted = printed
        .iter()
        .find(|p| p.function == deep_leaf.function)
        .unwrap();
    assert_eq!(traced, counted.calls);
}

#[test]
fn a_target_killed_by_a_signal_still_yields_its_flamegraph() {
    if !bpf_available("killed") {
        return;
    }
    let run = trace("killed", &["profile:hz:99"], "sh -c 'kill -KILL $$'", &[]);
    assert_eq!(run.status.code(), Some(137), "{}", run.stderr);
    assert_svg(&run.svg);
    // The folded file exists, even if no sample landed in so short a run.
    run.folded();
}

/// Sends SIGINT to cargo-trace (not to its process group, as `kill` would).
fn interrupt_after(child: &std::process::Child, delay: Duration) {
    std::thread::sleep(delay);
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(rc, 0);
}

#[test]
fn sigint_reaches_the_target_and_the_profile_is_written() {
    if !bpf_available("sigint") {
        return;
    }
    let scratch = Scratch::new("sigint");
    let folded_path = scratch.path("out.folded");
    let svg = scratch.path("out.svg");
    let cpu_split = fixtures::rust_fixture("cpu_split");
    let child = Command::new(binary())
        .args(["profile:hz:99", "-c"])
        .arg(format!("{} 60", quoted(&cpu_split)))
        .arg("-o")
        .arg(&svg)
        .arg("--folded")
        .arg(&folded_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The target runs (leaves its ptrace stop) once the probes are live: a loaded
    // machine may take seconds to get there.
    wait_until("the target runs", || {
        children_of(child.id()).iter().any(|(pid, comm)| {
            comm == "cpu_split" && process_state(*pid).is_some_and(|s| s != 't' && s != 'T')
        })
    });
    interrupt_after(&child, Duration::from_millis(1500));
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The target died of the forwarded SIGINT: 128 + 2.
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert_svg(&svg);
    let folded = Folded::read(&folded_path);
    let hot = folded.count_with("cpu_split::hot");
    // About 1 s of sampling, 2/3 of it in hot, at whatever share of a CPU the
    // target gets while other tests run.
    assert!(hot >= 5, "{hot} hot samples in 1.5 s: {stderr}");
}

#[test]
fn attaching_to_a_running_process_profiles_it_and_leaves_it_running() {
    if !bpf_available("attach") {
        return;
    }
    let scratch = Scratch::new("attach");
    let folded_path = scratch.path("out.folded");
    let cpu_split = fixtures::rust_fixture("cpu_split");
    let mut target = Command::new(&cpu_split)
        .arg("60")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Let it get past its start-up: attaching is to a process already in main.
    std::thread::sleep(Duration::from_millis(200));
    let mut child = Command::new(binary())
        .args([
            "profile:hz:99",
            "-p",
            &target.id().to_string(),
            "--no-svg",
            "--folded",
        ])
        .arg(&folded_path)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupted once it says tracing began (a loaded machine may take seconds).
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let said = common::await_tracing(&mut stderr);
    interrupt_after(&child, Duration::from_millis(1500));
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let stderr = format!("{said}{rest}");
    assert!(status.success(), "{stderr}");
    assert!(
        target.try_wait().unwrap().is_none(),
        "the target must keep running"
    );
    target.kill().unwrap();
    let status = target.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    let folded = Folded::read(&folded_path);
    for (frames, _) in &folded.stacks {
        assert_eq!(frames[0], "_start", "incomplete stack: {frames:?}");
    }
    let in_main = folded.count_with("cpu_split::main");
    assert!(in_main >= 5, "{in_main} samples in main in 1.5 s: {stderr}");
}

#[test]
fn a_stripped_binary_is_unwound_from_its_eh_frame() {
    if !bpf_available("stripped") {
        return;
    }
    let scratch = Scratch::new("stripped");
    let stripped = scratch.path("chains_stripped");
    let status = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(fixtures::c_fixture("chains_c"))
        .status()
        .expect("run strip");
    assert!(status.success());
    let run = trace(
        "stripped",
        &["uprobe:libc:malloc"],
        &format!("{} run", quoted(&stripped)),
        &[],
    );
    assert!(run.status.success(), "{}", run.stderr);
    run.assert_every_walk_complete();
    let printed = expected::parse_site_counts(&run.stdout).expect("site lines");
    let calls: u64 = printed.iter().map(|p| p.calls).sum();
    assert!(run.folded().total() >= calls);

    // A symbol it no longer has is a clear error.
    let probe = format!("uprobe:{}:deep_leaf", stripped.display());
    let (status, stderr) = run_args(&[&probe, "-c", &stripped.display().to_string()]);
    assert_one_line_error(status, &stderr, "deep_leaf");
}

fn assert_one_line_error(status: std::process::ExitStatus, stderr: &str, mentions: &str) {
    assert!(!status.success(), "must fail: {stderr}");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected, got: {stderr}");
    assert!(lines[0].starts_with("cargo-trace: error: "), "{stderr}");
    assert!(lines[0].contains(mentions), "'{mentions}' not in: {stderr}");
}

#[test]
fn bad_input_is_one_clear_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["frobnicate:x:y", "-c", "true"], "frobnicate"),
        (
            &["uprobe:/no/such/lib.so:malloc", "-c", "true"],
            "/no/such/lib.so",
        ),
        (
            &["profile:hz:99", "-c", "/no/such/program"],
            "/no/such/program",
        ),
        (&["profile:hz:99", "-c", "/etc/passwd"], "/etc/passwd"),
        (&["profile:hz:99", "-c", "'unbalanced"], "split"),
        (&["profile:hz:99", "-p", "999999999"], "999999999"),
    ];
    for (args, mentions) in cases {
        let (status, stderr) = run_args(args);
        assert_one_line_error(status, &stderr, mentions);
    }
    if bpf_available("missing symbol") {
        let (status, stderr) = run_args(&["uprobe:libc:no_such_function_xyz", "-c", "true"]);
        assert_one_line_error(status, &stderr, "no_such_function_xyz");
    }
}

#[test]
fn a_temporary_directory_that_cannot_hold_the_stack_storage_is_one_clear_line() {
    if !bpf_available("stack storage's file") {
        return;
    }
    let scratch = Scratch::new("tmpdir");
    let marker = scratch.path("target-ran");
    let output = Command::new(binary())
        .args(["profile:hz:99", "-c"])
        .arg(format!("touch {}", marker.display()))
        .env("TMPDIR", "/no/such/tmpdir")
        .current_dir(scratch.dir())
        .stdin(Stdio::null())
        .output()
        .expect("run cargo-trace");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_one_line_error(output.status, &stderr, "/no/such/tmpdir");
    assert!(!marker.exists(), "the target must not start: {stderr}");
}

#[test]
fn kprobes_work_where_the_kernel_has_them_and_say_so_where_not() {
    if !bpf_available("kprobe") {
        return;
    }
    match probes::kprobe_support() {
        Err(error) => {
            eprintln!("this kernel has no kprobes ({error}): checking the error line");
            let (status, stderr) = run_args(&["kprobe:do_nanosleep", "-c", "sleep 0.1"]);
            assert_one_line_error(status, &stderr, "kprobes are not available on this kernel");
        }
        Ok(()) => {
            let run = trace("kprobe", &["kprobe:do_nanosleep"], "sleep 0.1", &[]);
            assert!(run.status.success(), "{}", run.stderr);
            assert!(run.folded().total() >= 1, "{}", run.stderr);
        }
    }
}

#[test]
fn hardware_events_say_so_where_there_is_no_pmu() {
    if !bpf_available("hardware") {
        return;
    }
    match probes::hardware_support() {
        Err(error) => {
            eprintln!("this machine has no hardware PMU ({error}): checking the error line");
            let (status, stderr) = run_args(&["hardware:cycles:1000000", "-c", "true"]);
            assert_one_line_error(status, &stderr, "hardware");
        }
        Ok(()) => {
            let cpu_split = fixtures::rust_fixture("cpu_split");
            let command = format!("{} 0.5", quoted(&cpu_split));
            let run = trace("hardware", &["hardware:cycles:1000000"], &command, &[]);
            assert!(run.status.success(), "{}", run.stderr);
            assert!(run.folded().total() >= 1, "{}", run.stderr);
        }
    }
}

#[test]
fn a_second_sigint_kills_a_target_that_ignores_the_first() {
    if !bpf_available("second sigint") {
        return;
    }
    let scratch = Scratch::new("sigint2");
    let svg = scratch.path("out.svg");
    let mut child = Command::new(binary())
        .args(["profile:hz:99", "-c"])
        .arg(r#"perl -e '$| = 1; $SIG{INT} = "IGNORE"; print "ready\n"; sleep 60'"#)
        .arg("-o")
        .arg(&svg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first SIGINT once the target ignores it (a loaded machine may take seconds to
    // get there), the second soon after.
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready, "ready\n");
    interrupt_after(&child, Duration::from_millis(100));
    interrupt_after(&child, Duration::from_millis(300));
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(137), "{stderr}");
    assert_svg(&svg);
}

#[test]
fn a_duration_ends_tracing_and_leaves_the_target_running() {
    if !bpf_available("duration") {
        return;
    }
    let cpu_split = fixtures::rust_fixture("cpu_split");
    let command = format!("{} 3", quoted(&cpu_split));
    let run = trace(
        "duration",
        &["profile:hz:99"],
        &command,
        &["--duration", "0.5"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert!(run.stderr.contains("runs on"), "{}", run.stderr);
    let folded = run.folded();
    assert!(folded.count_with("cpu_split::main") >= 3, "{}", run.stderr);
    assert!(
        folded.total() < 200,
        "sampling went on past the duration: {}",
        run.stderr
    );
}

/// The children of process `pid` with their command names.
fn children_of(pid: u32) -> Vec<(u32, String)> {
    let list =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    list.split_whitespace()
        .filter_map(|child| child.parse().ok())
        .filter_map(|child: u32| {
            let comm = std::fs::read_to_string(format!("/proc/{child}/comm")).ok()?;
            Some((child, comm.trim().to_string()))
        })
        .collect()
}

/// Polls `condition` every 20 ms for up to 20 s.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if condition() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting until {what}");
}

/// A loop of exec'd children under a fast profile. It must finish: a child once stayed
/// stopped for good when the session's SIGCONT overtook the program's SIGSTOP. And a
/// sample taken inside execve once the calling image is gone, or before the new one is
/// registered, has no user stack to walk: it is counted as such, with its kernel stack,
/// never as a failed walk.
#[test]
fn an_exec_loop_under_a_fast_profile_finishes_with_execve_samples_kernel_only() {
    if !bpf_available("exec loop") {
        return;
    }
    let scratch = Scratch::new("exec-loop");
    let folded_path = scratch.path("out.folded");
    let mut child = Command::new(binary())
        .args(["profile:hz:4999", "--no-svg", "-c"])
        .arg("sh -c 'for i in $(seq 200); do /bin/true; done'")
        .arg("--folded")
        .arg(&folded_path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the session did not finish: a child was left stopped?");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = reader.join().unwrap();
    assert!(status.success(), "{stderr}");
    let summary = stderr
        .lines()
        .find(|line| line.contains(" events, "))
        .unwrap_or_else(|| panic!("no summary: {stderr}"));
    let in_exec: u64 = summary
        .split("; ")
        .find_map(|part| {
            part.strip_suffix(" in execve with no user stack left to walk (kernel stack only)")
        })
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no sample inside execve in 200 execs at 4999 Hz: {summary}"));
    assert!(in_exec > 0);
    // A read fault may happen outside execve: a sample taken while the kernel
    // copies a stack page after fork (its entry cleared for the copy) cannot
    // read it. Inside execve none may (the folded stacks below).
    assert!(!summary.contains("no process"), "{summary}");
    let folded = std::fs::read_to_string(&folded_path).unwrap();
    for line in folded.lines() {
        assert!(
            !(line.contains("execve") && line.contains("[truncated")),
            "a sample inside execve with a failed walk: {line}"
        );
        // The session's own uprobe on ld.so's _dl_debug_state fires twice in
        // each child: a sample in its trap (rip past the one-byte ret) or in
        // its single step (rip in the [uprobes] page) walks from the probed
        // instruction.
        let lost_at_first_frame =
            line.contains("[truncated: no row]") || line.contains("[truncated: no mapping]");
        assert!(
            !(lost_at_first_frame
                && (line.contains("[[uprobes]]") || line.contains("[ld-linux-x86-64.so.2+0x"))),
            "a sample at the session's own uprobe with a failed walk: {line}"
        );
    }
}

/// `--timings` says where a session's time went, every phase once, and the summary
/// still counts every event of a target that exits at once.
#[test]
fn timings_name_every_phase_of_a_short_session() {
    if !bpf_available("timings") {
        return;
    }
    let run = trace(
        "timings",
        &["uprobe:libc:malloc"],
        "sh -c true",
        &["--timings"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let report: Vec<&str> = run
        .stderr
        .lines()
        .skip_while(|line| !line.starts_with("cargo-trace: timings"))
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(
        report,
        [
            "load",
            "verify",
            "guard",
            "launch",
            "tables",
            "attach",
            "run",
            "read",
            "symbolize",
            "write",
            "teardown",
            "total"
        ],
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("peak RSS"), "{}", run.stderr);
    // The shell's mallocs are counted, though it exits as soon as it runs.
    let folded = run.folded();
    assert!(folded.total() > 0, "{}", run.stderr);
}
