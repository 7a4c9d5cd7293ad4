//! End to end: faults survived. cargo-trace SIGKILLed at any moment (during start-up,
//! while a child is held for registration, mid-run) leaves no BPF program, link, map or
//! uprobe behind once it is gone, and no process of the session stopped; a target that
//! crashes, and a session ended by SIGTERM, end with every output written and the exit
//! code a shell would give.
//!
//! What a session leaves behind is checked from the outside: the ids of the BPF objects
//! cargo-trace held (read from its `/proc/PID/fdinfo` while it ran) must no longer exist
//! in the kernel, a uprobe on a file of the test's own (a private copy of a fixture,
//! so that no other session on the machine probes it) must no longer patch the file's
//! code in the processes of the session that map it, and no tracefs uprobe event of the
//! session may be left.
//!
//! Covered elsewhere: a target that aborts or is killed (`lifecycle.rs`), SIGINT
//! (`lifecycle.rs`), SIGHUP and a daemon left running (`security.rs`), SIGKILL and the
//! temporary directory (`security.rs`).

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cargo_trace_tests::fixtures::{self, Lang};
use cargo_trace_tests::process::{mapped_code_byte, process_state};
use common::{binary, bpf_available, quoted, Folded, Scratch};

/// The kinds of BPF object a process holds a descriptor of, by the `*_id:` line of
/// its fdinfo, and the bpf(2) command that opens one by id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum BpfObject {
    Program,
    Map,
    Link,
}

impl BpfObject {
    const ALL: [BpfObject; 3] = [BpfObject::Program, BpfObject::Map, BpfObject::Link];

    fn fdinfo_key(self) -> &'static str {
        match self {
            BpfObject::Program => "prog_id:",
            BpfObject::Map => "map_id:",
            BpfObject::Link => "link_id:",
        }
    }

    /// BPF_PROG_GET_FD_BY_ID, BPF_MAP_GET_FD_BY_ID, BPF_LINK_GET_FD_BY_ID.
    fn get_fd_by_id(self) -> libc::c_long {
        match self {
            BpfObject::Program => 13,
            BpfObject::Map => 14,
            BpfObject::Link => 30,
        }
    }

    /// Whether the kernel still has the object with this id.
    fn exists(self, id: u32) -> bool {
        // The attribute of the *_GET_FD_BY_ID commands: the id first, then flags.
        let attr: [u32; 4] = [id, 0, 0, 0];
        // SAFETY: bpf(2) reads `attr` (16 bytes, the size passed) and returns a new
        // descriptor or -1; the descriptor is closed at once.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                self.get_fd_by_id(),
                attr.as_ptr(),
                std::mem::size_of_val(&attr) as libc::c_uint,
            )
        };
        if fd >= 0 {
            // SAFETY: the descriptor bpf(2) just returned, ours alone.
            unsafe { libc::close(fd as libc::c_int) };
            return true;
        }
        std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT)
    }
}

/// The BPF objects process `pid` holds descriptors of (empty once it is gone).
fn bpf_objects_of(pid: u32) -> BTreeSet<(BpfObject, u32)> {
    let mut found = BTreeSet::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return found;
    };
    for fd in fds.flatten() {
        let Ok(info) = std::fs::read_to_string(fd.path()) else {
            continue;
        };
        for line in info.lines() {
            for kind in BpfObject::ALL {
                if let Some(id) = line.strip_prefix(kind.fdinfo_key()) {
                    if let Ok(id) = id.trim().parse() {
                        found.insert((kind, id));
                    }
                }
            }
        }
    }
    found
}

/// The processes descended from `pid`, found through `/proc/PID/task/*/children`.
fn descendants_of(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut pending = vec![pid];
    while let Some(parent) = pending.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                pending.push(child);
            }
        }
    }
    found
}

/// What a running cargo-trace was seen to hold and to have started, sampled every few
/// milliseconds until it is killed.
#[derive(Default)]
struct Seen {
    /// The cargo-trace process.
    tracer: u32,
    objects: BTreeSet<(BpfObject, u32)>,
    processes: BTreeSet<u32>,
}

/// Watches a cargo-trace process from another thread until stopped.
struct Watcher {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    fn start(pid: u32) -> Watcher {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let objects = bpf_objects_of(pid);
                    let processes = descendants_of(pid);
                    let mut seen = seen.lock().unwrap();
                    seen.objects.extend(objects);
                    seen.processes.extend(processes);
                    drop(seen);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        Watcher {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// SIGKILLs the watched cargo-trace and reaps it; what it held and started. It is
    /// frozen first (SIGSTOP) for a last look: nothing it created just before the kill
    /// escapes the count.
    fn kill(mut self, child: &mut Child) -> Seen {
        let pid = child.id();
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        assert!(eventually(|| process_state(pid) == Some('T')));
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        let mut seen = std::mem::take(&mut *self.seen.lock().unwrap());
        seen.tracer = pid;
        let held = bpf_objects_of(pid);
        // The check that they are gone later must be able to fail: held, they exist.
        assert!(held.iter().all(|(kind, id)| kind.exists(*id)), "{held:?}");
        seen.objects.extend(held);
        seen.processes.extend(descendants_of(pid));
        child.kill().unwrap();
        child.wait().unwrap();
        seen
    }
}

/// A private copy of a fixture whose function `FUNCTION` the sessions probe: no other
/// session on the machine probes this file, so a breakpoint in its code is ours.
struct ProbedFile {
    path: PathBuf,
    /// Offset of the probed instruction in the file, and its byte there.
    offset: u64,
    byte: u8,
}

const FUNCTION: &str = "deep_leaf";

impl ProbedFile {
    fn new(scratch: &Scratch) -> ProbedFile {
        let path = scratch.path("probed_copy");
        std::fs::copy(fixtures::c_fixture("chains_c"), &path).unwrap();
        let spec = match probes::parse(&format!("uprobe:{}:{FUNCTION}", path.display())) {
            Ok(probes::ProbeSpec::Uprobe(spec)) => spec,
            other => panic!("not a uprobe: {other:?}"),
        };
        let target = probes::resolve_uprobe(&spec, None).unwrap().remove(0);
        let offset = target.file_offset;
        let byte = std::fs::read(&path).unwrap()[offset as usize];
        assert_ne!(byte, 0xcc, "{FUNCTION} starts with int3");
        ProbedFile { path, offset, byte }
    }

    fn probe(&self) -> String {
        format!("uprobe:{}:{FUNCTION}", self.path.display())
    }

    /// Whether the uprobe patched the probed instruction in process `pid` (int3,
    /// 0xcc, where it maps the file). The session's uprobes are bound to its
    /// processes: the kernel patches no other.
    fn probed_in(&self, pid: u32) -> bool {
        mapped_code_byte(pid, &self.path, self.offset) == Some(0xcc)
    }

    /// Whether the uprobe patched the instruction in some process started by `tracer`.
    fn probed_under(&self, tracer: u32) -> bool {
        descendants_of(tracer)
            .into_iter()
            .any(|pid| self.probed_in(pid))
    }

    /// Whether process `pid`, if it still maps the file, runs its own code again.
    fn unpatched_in(&self, pid: u32) -> bool {
        mapped_code_byte(pid, &self.path, self.offset).is_none_or(|byte| byte == self.byte)
    }
}

/// The tracefs uprobe events of the bound uprobes of cargo-trace process `tracer`.
fn uprobe_events_of(tracer: u32) -> Vec<String> {
    let group = format!("{}/", probes::bound::group_name(tracer));
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .find_map(|root| std::fs::read_to_string(format!("{root}/uprobe_events")).ok())
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains(&group))
        .map(str::to_string)
        .collect()
}

/// Polls `condition` every 20 ms for up to 20 s; whether it came true.
fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if condition() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigkill(pid: u32) {
    // SAFETY: kill(2) on a process this test started (or its session did).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// After cargo-trace was SIGKILLed and reaped: none of the BPF objects it held exists,
/// the uprobe it set is gone, and none of its processes is left stopped. Kills what of
/// the session still runs, whatever the verdict.
fn assert_nothing_left(moment: &str, seen: &Seen, file: &ProbedFile) {
    let count = |kind| seen.objects.iter().filter(|(k, _)| *k == kind).count();
    eprintln!(
        "{moment}: cargo-trace held {} programs, {} maps, {} links; {} processes",
        count(BpfObject::Program),
        count(BpfObject::Map),
        count(BpfObject::Link),
        seen.processes.len()
    );
    let objects_gone = eventually(|| seen.objects.iter().all(|(kind, id)| !kind.exists(*id)));
    let left: Vec<_> = seen
        .objects
        .iter()
        .filter(|(kind, id)| kind.exists(*id))
        .collect();
    let uprobe_gone = eventually(|| {
        seen.processes.iter().all(|pid| file.unpatched_in(*pid))
            && uprobe_events_of(seen.tracer).is_empty()
    });
    let events_left = uprobe_events_of(seen.tracer);
    let stopped_gone = eventually(|| {
        seen.processes
            .iter()
            .all(|pid| !matches!(process_state(*pid), Some('T' | 't')))
    });
    let stopped: Vec<_> = seen
        .processes
        .iter()
        .map(|pid| (*pid, process_state(*pid)))
        .filter(|(_, state)| matches!(state, Some('T' | 't')))
        .collect();
    for pid in &seen.processes {
        sigkill(*pid);
    }
    assert!(objects_gone, "{moment}: BPF objects left behind: {left:?}");
    assert!(
        uprobe_gone,
        "{moment}: the uprobe on {FUNCTION} is still set (tracefs events left: {events_left:?})"
    );
    assert!(
        stopped_gone,
        "{moment}: processes left stopped: {stopped:?}"
    );
}

/// cargo-trace with the private uprobe and a profile, on `command`.
fn start_session(file: &ProbedFile, scratch: &Scratch, command: &str) -> Child {
    Command::new(binary())
        .arg(file.probe())
        .arg("profile:hz:99")
        .args(["-q", "-c", command, "-o"])
        .arg(scratch.path("out.svg"))
        .current_dir(scratch.dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Killed at moments spread over the start-up: while the programs load (the verifier
/// runs), once the guard exists, while the target is held at its entry point under
/// ptrace, while the probes attach. Whatever the moment, nothing is left.
#[test]
fn sigkill_during_start_up_leaves_nothing_behind() {
    if !bpf_available("sigkill start-up") {
        return;
    }
    let scratch = Scratch::new("faults-start");
    let file = ProbedFile::new(&scratch);
    let command = format!("{} run", quoted(&file.path));
    // Moments picked by what cargo-trace has done so far, not by time: the first BPF
    // object, the first child (the guard), the target stopped under ptrace, the first
    // link; and "uprobe set" (the probes being attached).
    type Moment = (&'static str, fn(u32, &ProbedFile) -> bool);
    let moments: &[Moment] = &[
        ("programs loading", |pid, _| !bpf_objects_of(pid).is_empty()),
        ("guard forked", |pid, _| !descendants_of(pid).is_empty()),
        ("target held at its entry", |pid, _| {
            descendants_of(pid)
                .iter()
                .any(|child| process_state(*child) == Some('t'))
        }),
        ("probes attaching", |pid, _| {
            bpf_objects_of(pid)
                .iter()
                .any(|(kind, _)| *kind == BpfObject::Link)
        }),
        ("uprobe set", |pid, file| file.probed_under(pid)),
    ];
    for (moment, reached) in moments {
        let mut child = start_session(&file, &scratch, &command);
        let watcher = Watcher::start(child.id());
        let deadline = Instant::now() + Duration::from_secs(30);
        while !reached(child.id(), &file) {
            assert!(Instant::now() < deadline, "{moment}: never reached");
            assert!(
                child.try_wait().unwrap().is_none(),
                "{moment}: cargo-trace ended first"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let seen = watcher.kill(&mut child);
        assert!(!seen.objects.is_empty(), "{moment}: no BPF object seen");
        assert_nothing_left(moment, &seen, &file);
    }
}

/// Killed while the target runs: the uprobe was set (checked first, so the check can
/// fail), and once cargo-trace is gone nothing of the session is left, and the target,
/// no longer traced, runs on.
#[test]
fn sigkill_mid_run_leaves_nothing_behind() {
    if !bpf_available("sigkill mid-run") {
        return;
    }
    let scratch = Scratch::new("faults-mid-run");
    let file = ProbedFile::new(&scratch);
    let mut child = start_session(&file, &scratch, "sh -c 'echo $$; exec sleep 60'");
    let watcher = Watcher::start(child.id());
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let target: u32 = line.trim().parse().expect("the target's pid");
    assert!(
        !uprobe_events_of(child.id()).is_empty(),
        "no tracefs uprobe event while the session runs"
    );
    let seen = watcher.kill(&mut child);
    let running = process_state(target).is_some_and(|state| state == 'S' || state == 'R');
    assert_nothing_left("mid-run", &seen, &file);
    assert!(running, "the target did not run on after cargo-trace died");
}

/// The program stops a traced child at its exec until the session has registered its
/// mappings. If cargo-trace dies then (SIGKILL), its guard must resume the child, which
/// would otherwise stay stopped for good, and nothing of the session may be left.
#[test]
fn sigkill_while_a_child_is_held_for_registration_leaves_nothing_behind() {
    if !bpf_available("sigkill registration") {
        return;
    }
    let scratch = Scratch::new("faults-held");
    let file = ProbedFile::new(&scratch);
    let mut child = start_session(
        &file,
        &scratch,
        "sh -c 'echo ready; read line; /bin/echo child ran; echo done'",
    );
    let tracer = child.id();
    let watcher = Watcher::start(tracer);
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");

    // Frozen, cargo-trace cannot resume the child the program is about to stop.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(tracer as i32, libc::SIGSTOP) }, 0);
    assert!(eventually(|| process_state(tracer) == Some('T')));
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let held = eventually(|| {
        descendants_of(tracer).iter().any(|pid| {
            process_state(*pid) == Some('T')
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "echo")
        })
    });
    assert!(held, "the shell's child was never stopped at its exec");
    assert!(
        !uprobe_events_of(tracer).is_empty(),
        "no tracefs uprobe event while the session runs"
    );

    let seen = watcher.kill(&mut child);
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stdout.read_to_string(&mut rest);
        let _ = sender.send(rest);
    });
    let rest = receiver.recv_timeout(Duration::from_secs(20));
    assert_nothing_left("a child held for registration", &seen, &file);
    assert_eq!(
        rest.as_deref().map_err(|_| "timed out"),
        Ok("child ran\ndone\n"),
        "the held child did not run to its end"
    );
}

/// A target that crashes for real (a null pointer read): cargo-trace ends with 128 +
/// SIGSEGV, says so, and writes every output.
#[test]
fn a_target_that_crashes_yields_every_output_and_its_exit_code() {
    if !bpf_available("segv") {
        return;
    }
    let scratch = Scratch::new("faults-segv");
    let source = scratch.path("crash.c");
    std::fs::write(
        &source,
        "int main(void) { volatile int *p = 0; return *p; }\n",
    )
    .unwrap();
    let crash = fixtures::build_source(Lang::C, &source, "faults_crash", &[]).unwrap();
    let out = Scratch::new("faults-segv-out");
    let output = Command::new(binary())
        .args(["uprobe:libc:malloc", "profile:hz:99", "-c"])
        .arg(quoted(&crash))
        .args(outputs(&out))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(128 + libc::SIGSEGV), "{stderr}");
    assert!(stderr.contains("killed by SIGSEGV"), "{stderr}");
    assert_outputs_written(&out, &stderr);
}

/// SIGTERM ends the session like Ctrl-C: the target gets it (128 + SIGTERM, passed on)
/// and every output is written, with the samples taken so far.
#[test]
fn sigterm_ends_the_session_with_every_output_written() {
    if !bpf_available("sigterm") {
        return;
    }
    let out = Scratch::new("faults-sigterm");
    let cpu_split = fixtures::rust_fixture("cpu_split");
    let mut child = Command::new(binary())
        .args(["profile:hz:99", "-c"])
        .arg(format!(
            "sh -c 'echo ready; exec {} 60'",
            quoted(&cpu_split)
        ))
        .args(outputs(&out))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    // Some samples in cpu_split first: the outputs must hold what was taken.
    let mut stderr = child.stderr.take().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    let mut text = String::new();
    stderr.read_to_string(&mut text).unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{text}");
    assert_outputs_written(&out, &text);
    let folded = Folded::read(&out.path("out.folded"));
    assert!(folded.count_with("cpu_split::main") > 0, "{text}");
}

/// Every output format, into `out`.
fn outputs(out: &Scratch) -> Vec<std::ffi::OsString> {
    let mut args = Vec::new();
    for (flag, name) in [
        ("-o", "out.svg"),
        ("--folded", "out.folded"),
        ("--pprof", "out.pb.gz"),
        ("--json", "out.json"),
        ("--speedscope", "out.speedscope.json"),
        ("--report", "out.html"),
    ] {
        args.push(flag.into());
        args.push(out.path(name).into_os_string());
    }
    args
}

/// Every file [`outputs`] names exists, whole: the SVG and HTML end their documents,
/// the JSON files parse, the pprof file is gzip.
fn assert_outputs_written(out: &Scratch, stderr: &str) {
    let read = |name: &str| {
        std::fs::read(out.path(name)).unwrap_or_else(|e| panic!("no {name}: {e}\n{stderr}"))
    };
    let svg = String::from_utf8(read("out.svg")).unwrap();
    assert!(svg.trim_end().ends_with("</svg>"), "{stderr}");
    let html = String::from_utf8(read("out.html")).unwrap();
    assert!(html.trim_end().ends_with("</html>"), "{stderr}");
    for json in ["out.json", "out.speedscope.json"] {
        let text = read(json);
        assert!(
            std::str::from_utf8(&text).is_ok_and(|t| t.trim_end().ends_with('}')),
            "{json} incomplete: {stderr}"
        );
    }
    assert_eq!(read("out.pb.gz")[..2], [0x1f, 0x8b], "{stderr}");
    Folded::read(&out.path("out.folded"));
}
