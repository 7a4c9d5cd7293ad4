//! Differential test: the BPF walk against its userspace twin
//! (`unwind_tables::walk`), on the same thread at the same moment.
//!
//! The C fixture stops itself inside `leaf` with raise(SIGSTOP). The BPF
//! program, attached to the tgkill syscall that raise makes, walks from the
//! user registers saved at syscall entry. The test then seizes the stopped
//! process with ptrace, whose registers are those same ones (the syscall has
//! returned to the same place, rsp and rbp untouched), and runs the twin
//! over the same tables with /proc/PID/mem as memory. Both must produce the
//! same frames and the same end, frame for frame, through libc's raise.
//!
//! Needs root and gcc; without BPF it prints why it is skipped.

mod common;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use bpf_prog::{EventProgram, Options, StackRef, WalkEnd};
use common::{
    chain_below, chain_fixture, register_process, serial, tracer_or_skip, Symbols, Target,
};
use libbpf_rs::{TracepointCategory, TracepointOpts};
use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use unwind_tables::walk::{walk, AddressSpace, Mapping, Memory, Registers, MAX_FRAMES};
use unwind_tables::CompactTable;

struct ProcMem(File);

impl Memory for ProcMem {
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let mut bytes = [0u8; 8];
        self.0.read_exact_at(&mut bytes, addr).ok()?;
        Some(u64::from_le_bytes(bytes))
    }
}

#[test]
fn bpf_walk_equals_the_userspace_twin() {
    let _serial = serial();
    let options = Options {
        max_rows: 1 << 20,
        ..Options::default()
    };
    let Some(mut tracer) = tracer_or_skip("bpf_walk_equals_the_userspace_twin", &options) else {
        return;
    };
    let binary = chain_fixture();
    let depth = 7;
    let target = Target::spawn(&binary, &["1".into(), depth.to_string(), "stop".into()]);
    let pid = target.pid();
    let mappings = register_process(&mut tracer, pid, |_| false);
    tracer.filter_pid(pid).unwrap();
    let link = tracer
        .program(EventProgram::Tracepoint)
        .attach_tracepoint_with_opts(
            TracepointCategory::Syscalls,
            "sys_enter_tgkill",
            TracepointOpts {
                cookie: 3,
                ..TracepointOpts::default()
            },
        )
        .expect("attach tracepoint");
    let nix_pid = Pid::from_raw(pid as i32);
    let running = target.start();
    // raise(SIGSTOP) inside leaf
    match waitpid(nix_pid, Some(WaitPidFlag::WUNTRACED)).expect("waitpid") {
        WaitStatus::Stopped(_, Signal::SIGSTOP) => {}
        other => panic!("fixture did not stop: {other:?}"),
    }
    drop(link);

    ptrace::seize(nix_pid, ptrace::Options::empty()).expect("ptrace seize");
    ptrace::interrupt(nix_pid).expect("ptrace interrupt");
    waitpid(nix_pid, None).expect("wait for the ptrace stop");
    let regs = ptrace::getregs(nix_pid).expect("ptrace getregs");
    let memory = ProcMem(File::open(format!("/proc/{pid}/mem")).expect("open /proc/PID/mem"));
    let tables: HashMap<PathBuf, CompactTable> = mappings
        .iter()
        .map(|m| {
            let table = unwind_tables::compile_file(&m.path).expect("compile").table;
            (m.path.clone(), table)
        })
        .collect();
    let space = AddressSpace::new(
        mappings
            .iter()
            .map(|m| Mapping {
                start: m.start,
                end: m.end,
                bias: m.bias,
                table: &tables[&m.path],
            })
            .collect(),
    )
    .expect("address space");
    let twin = walk(
        &space,
        Registers {
            rip: regs.rip,
            rsp: regs.rsp,
            rbp: regs.rbp,
            rdi: Some(regs.rdi),
        },
        &memory,
        MAX_FRAMES,
    );
    ptrace::detach(nix_pid, None).expect("ptrace detach");
    kill(nix_pid, Signal::SIGCONT).expect("continue the fixture");
    running.wait_for_exit();

    let counts = tracer.counts().unwrap();
    assert_eq!(counts.len(), 1, "one tgkill: {counts:?}");
    let StackRef::Hash(hash) = counts[0].0.stack else {
        panic!("no user stack: {counts:?}");
    };
    let stack = tracer.stack(hash).unwrap().expect("stored");
    let names = Symbols::default().frames(&mappings, &stack.pcs);
    println!("{} frames, {}: {names:?}", stack.pcs.len(), stack.end);
    assert_eq!(
        stack.pcs, twin.frames,
        "BPF and twin frames differ: {names:?}"
    );
    assert_eq!(stack.end, twin.end);
    assert_eq!(stack.end, WalkEnd::Complete, "{names:?}");
    // Below libc's raise machinery, the fixture's own chain.
    let chain = chain_below("leaf", depth);
    let at = names
        .iter()
        .position(|name| name == "leaf")
        .expect("leaf in the stack");
    assert!(at >= 1, "raise's frames come first: {names:?}");
    assert_eq!(&names[at..at + chain.len()], chain, "{names:?}");
}
