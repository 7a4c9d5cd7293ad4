//! The userspace twin unwinder (`unwind_tables::walk`) on real stacks.
//!
//! A fixture built without frame pointers stops itself (SIGSTOP) 64+ frames
//! deep while its second thread blocks in libc's `read`; the test seizes
//! every thread with ptrace, reads registers and memory, compiles the unwind
//! table of every executable mapping with `unwind_tables::compile_file`, walks
//! each stack and checks it frame by frame against the fixture's known call
//! chain, from libc up to `_start` or the thread's entry, ending on the
//! end-of-stack rule. Then the fixture resumes and must finish normally.
//!
//! Needs: ptrace of a child (no root needed without Yama restrictions), gcc
//! and rustc to build the fixtures. libc's static functions are checked by
//! name when its debug symbols are installed (`libc6-dbg`), by object otherwise.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cargo_trace_tests::expected::{self, Root};
use cargo_trace_tests::fixtures::{self, Lang};
use cargo_trace_tests::process::{Frame, InspectError, ProcMemory, ProcessImage, SeizedThreads};
use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use unwind_tables::walk::{walk, WalkEnd, MAX_FRAMES};

const LIBC: &str = "libc.so.6";

/// A running fixture, killed if the test ends before it does.
struct Fixture {
    child: Option<Child>,
    exe: String,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Fixture {
    fn start(lang: Lang, mode: &str) -> Fixture {
        let path = match lang {
            Lang::Rust => fixtures::rust_fixture("chains"),
            Lang::C => fixtures::c_fixture("chains_c"),
            Lang::Cpp => unreachable!("no C++ chains fixture"),
        };
        let child = Command::new(&path)
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the fixture");
        let exe = path
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        Fixture {
            child: Some(child),
            exe,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    /// Waits until the fixture stops itself (group-stop by SIGSTOP).
    fn wait_for_stop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match waitpid(
                self.pid(),
                Some(WaitPidFlag::WUNTRACED | WaitPidFlag::WNOHANG),
            ) {
                Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => return,
                Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                other => {
                    let mut child = self.child.take().expect("running");
                    let _ = child.kill();
                    let output = child.wait_with_output();
                    panic!("the fixture did not stop: {other:?}; {output:?}");
                }
            }
        }
    }

    /// Resumes the stopped fixture and checks that it ends well and prints its counts.
    fn resume_and_check(mut self, lang: Lang) {
        kill(self.pid(), Signal::SIGCONT).expect("SIGCONT");
        let output = self
            .child
            .take()
            .expect("running")
            .wait_with_output()
            .expect("waiting for the fixture");
        assert!(
            output.status.success(),
            "fixture failed after resuming: {output:?}"
        );
        let counts = expected::parse_site_counts(&String::from_utf8_lossy(&output.stdout))
            .expect("site lines");
        let sites = expected::chains_sites(lang);
        assert_eq!(counts.len(), sites.len(), "{counts:?}");
        for (count, site) in counts.iter().zip(&sites) {
            assert_eq!((&count.function, count.calls), (&site.function, site.calls));
        }
    }
}

/// Walks a symbolized stack front to back, checking each part, and reports
/// the whole stack when a check fails.
struct Stack<'a> {
    what: String,
    frames: &'a [Frame],
    end: WalkEnd,
    at: usize,
    exe: String,
    /// libc's static functions have names (its debug file was found).
    libc_names: bool,
}

impl Stack<'_> {
    fn dump(&self) -> String {
        let mut dump = format!("{}: walk ended with {:?}:\n", self.what, self.end);
        for (index, frame) in self.frames.iter().enumerate() {
            let marker = if index == self.at { "=>" } else { "  " };
            dump.push_str(&format!("{marker} #{index:<3} {frame}\n"));
        }
        dump
    }

    fn fail(&self, message: &str) -> ! {
        panic!(
            "{}: {message} (at frame #{})\n{}",
            self.what,
            self.at,
            self.dump()
        );
    }

    fn next(&mut self, what: &str) -> &Frame {
        if self.at >= self.frames.len() {
            self.fail(&format!("stack ends where {what} was expected"));
        }
        self.at += 1;
        &self.frames[self.at - 1]
    }

    /// One frame of `object` named any of `names`. A frame of libc without any
    /// name is accepted when libc's static symbols are unavailable.
    fn one(&mut self, object: &str, names: &[&str]) {
        let libc_names = self.libc_names;
        let frame = self.next(&names.join(" or ")).clone();
        let named = names.iter().any(|n| frame.is(n));
        let unnamed_ok = object == LIBC && !libc_names && frame.names.is_empty();
        if frame.object != object || !(named || unnamed_ok) {
            self.at -= 1;
            self.fail(&format!("expected {} in {object}", names.join(" or ")));
        }
    }

    /// The fixture's own functions, in order.
    fn chain(&mut self, chain: &[String]) {
        for name in chain {
            let exe = self.exe.clone();
            self.one(&exe, &[name]);
        }
    }

    /// One or more frames in `object`; returns them.
    fn run_in(&mut self, object: &str, max: usize) -> Vec<Frame> {
        let start = self.at;
        while self.at < self.frames.len()
            && self.frames[self.at].object == object
            && self.at - start < max
        {
            self.at += 1;
        }
        if self.at == start {
            self.fail(&format!("expected frames in {object}"));
        }
        self.frames[start..self.at].to_vec()
    }

    /// libc frames on top of the stack, one of which is named `entry`.
    fn libc_call(&mut self, entry: &[&str]) {
        let start = self.at;
        let run = self.run_in(LIBC, 4);
        if !run.iter().any(|f| entry.iter().any(|n| f.is(n))) {
            self.at = start;
            self.fail(&format!(
                "none of the libc frames is {}",
                entry.join(" or ")
            ));
        }
    }

    /// Rust's runtime frames between the fixture's outermost function and
    /// `outer` (the C `main`, or libc's thread start): frames of the
    /// executable that are not the fixture's own.
    fn rust_runtime(&mut self, crate_prefix: &str) {
        let start = self.at;
        while self.at < self.frames.len()
            && self.frames[self.at].object == self.exe
            && !self.frames[self.at].is("main")
            && !self.frames[self.at]
                .names
                .iter()
                .any(|n| n.starts_with(crate_prefix))
        {
            self.at += 1;
        }
        if self.at == start {
            self.fail("expected Rust runtime frames");
        }
    }

    fn root(&mut self, lang: Lang, root: Root) {
        match root {
            Root::Process => {
                if lang == Lang::Rust {
                    self.rust_runtime("chains::");
                    let exe = self.exe.clone();
                    self.one(&exe, &["main"]);
                }
                self.one(LIBC, &["__libc_start_call_main"]);
                self.one(LIBC, &["__libc_start_main_impl", "__libc_start_main"]);
                let exe = self.exe.clone();
                self.one(&exe, &["_start"]);
            }
            Root::Thread => {
                if lang == Lang::Rust {
                    self.rust_runtime("chains::");
                }
                self.one(LIBC, &["start_thread"]);
                self.one(LIBC, &["__clone3", "clone3"]);
            }
        }
        if self.at != self.frames.len() {
            self.fail("frames after the end of the stack");
        }
        if self.end != WalkEnd::Complete {
            self.fail("the walk did not end on the end-of-stack rule");
        }
        // Shown with --nocapture: what was checked.
        eprintln!("{}", self.dump());
    }
}

/// The walked, symbolized stack of every thread of the stopped fixture.
struct Stopped {
    main: (Vec<Frame>, WalkEnd),
    worker: (Vec<Frame>, WalkEnd),
    exe: String,
    libc_names: bool,
    restore_rt: Option<u64>,
}

/// `None` (with the reason printed) when this machine forbids ptrace of a child.
fn walk_stopped(fixture: &Fixture) -> Option<Stopped> {
    let pid = fixture.pid().as_raw();
    let seized = match SeizedThreads::seize(pid) {
        Ok(seized) => seized,
        Err(InspectError::Ptrace {
            source: Errno::EPERM,
            what,
            ..
        }) => {
            eprintln!("skipping: ptrace {what} of a child is not permitted here (Yama ptrace_scope, seccomp?)");
            return None;
        }
        Err(error) => panic!("seizing the stopped fixture's threads: {error}"),
    };
    let image = ProcessImage::load(pid).expect("loading the fixture's mappings and unwind tables");
    let space = image.address_space().expect("address space");
    let memory = ProcMemory::open(pid).expect("opening the fixture's memory");
    assert_eq!(seized.threads.len(), 2, "threads: {:?}", seized.threads);
    let exe = fixture.exe.clone();
    let libc = image
        .objects
        .iter()
        .find(|o| o.short_name() == LIBC)
        .expect("libc is mapped");
    let libc_names = libc.symbols.has_debug_file;
    if !libc_names {
        eprintln!("note: no debug symbols for libc (install libc6-dbg): its static functions are checked by object only");
    }
    let mut walked = seized.threads.iter().map(|thread| {
        let result = walk(&space, thread.regs, &memory, MAX_FRAMES);
        (image.symbolize_walk(&result.frames), result.end)
    });
    let main = walked.next().expect("main thread");
    let worker = walked.next().expect("worker thread");
    assert_eq!(
        seized.threads[0].tid, pid,
        "the first thread is the main thread"
    );
    assert_eq!(seized.threads[1].name, "worker");
    Some(Stopped {
        main,
        worker,
        exe,
        libc_names,
        restore_rt: image.symbol_address(LIBC, "__restore_rt"),
    })
}

fn stack<'a>(what: &str, walked: &'a (Vec<Frame>, WalkEnd), stopped: &Stopped) -> Stack<'a> {
    Stack {
        what: what.to_string(),
        frames: &walked.0,
        end: walked.1,
        at: 0,
        exe: stopped.exe.clone(),
        libc_names: stopped.libc_names,
    }
}

fn check_stopped_in_raise(lang: Lang) {
    let mut fixture = Fixture::start(lang, "stop");
    fixture.wait_for_stop();
    let Some(stopped) = walk_stopped(&fixture) else {
        return;
    };

    // Main thread: raise(SIGSTOP) in libc, 64 frames of recursion, up to _start.
    let mut main = stack("main thread", &stopped.main, &stopped);
    main.libc_call(&["raise", "gsignal"]);
    main.chain(&expected::stopped_main_chain(lang));
    main.root(lang, Root::Process);

    // Worker thread: blocked in libc's read, up to the thread's start.
    let mut worker = stack("worker thread", &stopped.worker, &stopped);
    worker.libc_call(&["read", "__read", "__libc_read"]);
    worker.chain(&expected::stopped_worker_chain(lang));
    worker.root(lang, Root::Thread);

    fixture.resume_and_check(lang);
}

fn check_stopped_in_signal_handler(lang: Lang) {
    let mut fixture = Fixture::start(lang, "signal");
    fixture.wait_for_stop();
    let Some(stopped) = walk_stopped(&fixture) else {
        return;
    };

    // raise(SIGSTOP) in the SIGUSR1 handler, the signal frame, raise(SIGUSR1)
    // in deep_leaf, the recursion, up to _start.
    let mut main = stack("main thread", &stopped.main, &stopped);
    main.libc_call(&["raise", "gsignal"]);
    let exe = main.exe.clone();
    main.one(&exe, &[&expected::signal_handler(lang)]);
    // The handler returns to __restore_rt's first byte (symbolized at pc - 1
    // it is not __restore_rt, so check the address itself).
    let trampoline = main.next("__restore_rt").clone();
    let restore_rt = stopped.restore_rt;
    if stopped.libc_names && restore_rt.is_none() {
        main.fail("libc's debug symbols have no __restore_rt");
    }
    if trampoline.object != LIBC || restore_rt.is_some_and(|addr| addr != trampoline.pc) {
        main.at -= 1;
        main.fail(&format!(
            "expected the signal trampoline __restore_rt at {restore_rt:#x?}"
        ));
    }
    main.libc_call(&["raise", "gsignal"]);
    main.chain(&expected::stopped_main_chain(lang));
    main.root(lang, Root::Process);

    let mut worker = stack("worker thread", &stopped.worker, &stopped);
    worker.libc_call(&["read", "__read", "__libc_read"]);
    worker.chain(&expected::stopped_worker_chain(lang));
    worker.root(lang, Root::Thread);

    fixture.resume_and_check(lang);
}

#[test]
fn rust_fixture_stopped_in_raise_and_read() {
    check_stopped_in_raise(Lang::Rust);
}

#[test]
fn c_fixture_stopped_in_raise_and_read() {
    check_stopped_in_raise(Lang::C);
}

#[test]
fn rust_fixture_stopped_in_a_signal_handler() {
    check_stopped_in_signal_handler(Lang::Rust);
}

#[test]
fn c_fixture_stopped_in_a_signal_handler() {
    check_stopped_in_signal_handler(Lang::C);
}
