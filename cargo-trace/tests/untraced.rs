//! End to end: untraced processes pay nothing. A session's uprobes are bound to the
//! traced process and everything it starts (threads, forks, fork+exec): the kernel
//! patches the probed instruction (int3) in their code only. Another process running
//! the very same binary, started before or during the session, keeps its own code, so
//! it never traps; and the traced process's children are still counted exactly.
//!
//! Checked through each process's memory (`/proc/PID/mem`), never through time. The
//! probed function is in a fixture of the test's own: no other session on the machine
//! probes it.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

use cargo_trace_tests::fixtures;
use cargo_trace_tests::process::mapped_code_byte;
use common::{binary, bpf_available, Folded, Scratch};

/// work() calls per task of the traced program (four tasks).
const CALLS: u64 = 5000;

/// The file offset of `work` in `fixture` and the byte the file has there.
fn probed_instruction(fixture: &Path) -> (u64, u8) {
    let spec = match probes::parse(&format!("uprobe:{}:work", fixture.display())) {
        Ok(probes::ProbeSpec::Uprobe(spec)) => spec,
        other => panic!("not a uprobe: {other:?}"),
    };
    let offset = probes::resolve_uprobe(&spec, None).unwrap()[0].file_offset;
    let byte = std::fs::read(fixture).unwrap()[offset as usize];
    assert_ne!(byte, 0xcc, "work starts with int3");
    (offset, byte)
}

/// Reads lines from `stdout` until one starts with `prefix`; the pid after it.
fn pid_after(stdout: &mut BufReader<ChildStdout>, prefix: &str) -> u32 {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "no '{prefix}' line"
        );
        if let Some(pid) = line.strip_prefix(prefix) {
            return pid.trim().parse().expect("a pid");
        }
    }
}

/// The fixture in "untraced" mode, outside any session: its pid once it runs.
struct Untraced {
    child: Child,
    pid: u32,
}

impl Untraced {
    fn start(fixture: &Path) -> Untraced {
        let mut child = Command::new(fixture)
            .arg("untraced")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let pid = pid_after(&mut stdout, "running ");
        Untraced { child, pid }
    }
}

impl Drop for Untraced {
    fn drop(&mut self) {
        // Its stdin closed, it returns.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Events whose innermost frame satisfies `leaf` and whose stack holds `work`.
fn count_from_work(folded: &Folded, leaf: impl Fn(&str) -> bool) -> u64 {
    folded
        .stacks
        .iter()
        .filter(|(frames, _)| {
            frames.last().is_some_and(|f| leaf(f)) && frames.iter().any(|f| f == "work")
        })
        .map(|(_, count)| count)
        .sum()
}

#[test]
fn a_process_the_session_does_not_trace_keeps_its_code_unpatched() {
    if !bpf_available("untraced processes") {
        return;
    }
    let fixture = fixtures::c_fixture("bound_children");
    let (offset, byte) = probed_instruction(&fixture);
    let before = Untraced::start(&fixture);

    let scratch = Scratch::new("untraced");
    let folded_path = scratch.path("out.folded");
    let mut session = Command::new(binary())
        .arg(format!("uprobe:{}:work", fixture.display()))
        .arg("uprobe:libc:malloc")
        .arg("-q")
        .arg("-c")
        // Under a shell that forks it: the tasks counted are the target's children and
        // grandchildren, whose uprobe events are copies of copies.
        .arg(format!(
            "sh -c '{} traced {CALLS}; true'",
            fixture.display()
        ))
        .arg("--folded")
        .arg(&folded_path)
        .arg("--no-svg")
        .current_dir(scratch.dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(session.stdout.take().unwrap());
    let traced = pid_after(&mut stdout, "ready ");
    let after = Untraced::start(&fixture);

    let traced_byte = mapped_code_byte(traced, &fixture, offset);
    let before_byte = mapped_code_byte(before.pid, &fixture, offset);
    let after_byte = mapped_code_byte(after.pid, &fixture, offset);

    // The traced program ends once its stdin closes.
    session.stdin.take().unwrap().flush().unwrap();
    let output = session.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");

    // The check can fail: in the traced process, the uprobe is there.
    assert_eq!(
        traced_byte,
        Some(0xcc),
        "work is not patched in the traced process"
    );
    assert_eq!(
        before_byte,
        Some(byte),
        "work is patched in a process started before the session"
    );
    assert_eq!(
        after_byte,
        Some(byte),
        "work is patched in a process started during the session"
    );

    // Threads, forks and fork+exec still followed, exactly.
    let folded = Folded::read(&folded_path);
    assert_eq!(
        count_from_work(&folded, |leaf| leaf == "work"),
        4 * CALLS,
        "{stderr}"
    );
    assert_eq!(
        count_from_work(&folded, |leaf| leaf.contains("malloc")),
        4 * CALLS,
        "{stderr}"
    );
}

/// With `-p`: the uprobes are bound to every thread of the running process (one that
/// existed before the session attached included) and to what it starts after (a
/// thread, a fork, a fork+exec): five tasks counted exactly; a process running the same
/// binary beside it keeps its code.
#[test]
fn an_attached_process_is_followed_exactly_and_no_other_is_patched() {
    if !bpf_available("untraced processes, -p") {
        return;
    }
    let fixture = fixtures::c_fixture("bound_children");
    let (offset, byte) = probed_instruction(&fixture);
    let mut target = Command::new(&fixture)
        .args(["attached", &CALLS.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut target_out = BufReader::new(target.stdout.take().unwrap());
    let pid = pid_after(&mut target_out, "waiting ");
    let bystander = Untraced::start(&fixture);

    let scratch = Scratch::new("untraced-attach");
    let folded_path = scratch.path("out.folded");
    let mut session = Command::new(binary())
        .arg(format!("uprobe:{}:work", fixture.display()))
        .args(["-p", &pid.to_string(), "--no-svg", "--folded"])
        .arg(&folded_path)
        .current_dir(scratch.dir())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(session.stderr.take().unwrap());
    let said = common::await_tracing(&mut stderr);
    let mut stdin = target.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
    assert_eq!(pid_after(&mut target_out, "ready "), pid);
    let traced_byte = mapped_code_byte(pid, &fixture, offset);
    let bystander_byte = mapped_code_byte(bystander.pid, &fixture, offset);

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(session.id() as i32, libc::SIGINT) }, 0);
    let status = session.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let stderr = format!("{said}{rest}");
    drop(stdin);
    target.wait().unwrap();
    assert!(status.success(), "{stderr}");

    assert_eq!(
        traced_byte,
        Some(0xcc),
        "work is not patched in the attached process"
    );
    assert_eq!(
        bystander_byte,
        Some(byte),
        "work is patched in a process the session does not trace"
    );
    let folded = Folded::read(&folded_path);
    assert_eq!(
        count_from_work(&folded, |leaf| leaf == "work"),
        5 * CALLS,
        "{stderr}"
    );
}
