//! The heap recorded in the process never harms the target: cargo-trace killed mid-run
//! (SIGKILL: no teardown of its own runs) leaves the target running to its end, its
//! library a pass-through, and the next session removes what the killed one left in its
//! private directory.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cargo_trace_tests::fixtures;
use common::{binary, bpf_available, quoted};

/// The session directories under /run/cargo-trace that `pid` made.
fn directories_of(pid: u32) -> Vec<String> {
    std::fs::read_dir("/run/cargo-trace")
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(&format!("heap-{pid}-")))
                .collect()
        })
        .unwrap_or_default()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn killing_cargo_trace_leaves_the_target_running_to_its_end() {
    if !bpf_available("killing cargo-trace under in-process recording") {
        return;
    }
    let storm = quoted(&fixtures::c_fixture("heap_storm"));
    // The shell says its pid, then storms for long enough that cargo-trace dies in the
    // middle, then says it got to the end.
    let script = format!("echo $$; {storm} 3000000 10; echo done");
    let mut session = Command::new(binary())
        .args([
            "alloc",
            "-c",
            &format!("sh -c {}", common::shell_quote(&script)),
        ])
        .args(["--no-svg", "-q"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(session.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let shell: u32 = line.trim().parse().expect("the shell's pid");
    let made = directories_of(session.id());
    assert_eq!(made.len(), 1, "the session's private directory: {made:?}");
    session.kill().unwrap();
    session.wait().unwrap();
    // The target goes on, recording nothing: its library finds its connection gone.
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while alive(shell) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(shell),
        "the target did not finish after cargo-trace died"
    );
    assert!(
        rest.contains("heap storm allocs 3000000") && rest.ends_with("done\n"),
        "the target did not run to its end: {rest}"
    );
    // Killed, cargo-trace could not remove its directory; the next session does (or
    // another session on the machine did already: any session removes a dead one's).
    let left = directories_of(session.id());
    assert!(left.is_empty() || left == made, "{left:?}");
    let next = Command::new(binary())
        .args(["alloc", "-c", "/bin/true", "--no-svg", "-q"])
        .output()
        .unwrap();
    assert!(
        next.status.success(),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert_eq!(directories_of(session.id()), Vec::<String>::new());
}
