//! The library's walker (`c/walk.h`, built into `libctp-walk-test.so` with reads from the
//! caller) against the userspace twin (`unwind_tables::walk`) on real stacks: fixtures
//! stopped 64+ frames deep, in a signal handler (signal frames), and walks started from
//! every slot of their stacks (every way a walk ends). Frames and ends must be identical.
//!
//! Needs: ptrace of a child (no root needed without Yama restrictions), gcc and rustc.

use std::ffi::{c_int, c_void, CString};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cargo_trace_tests::fixtures::{self, Lang};
use cargo_trace_tests::process::{InspectError, ProcMemory, ProcessImage, SeizedThreads};
use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use preload::layout::{Mapping, MAPPING_NO_TABLE, MAX_FRAMES, NO_TABLE};
use preload::{encode_table, Frame};
use unwind_tables::walk::{walk, Memory, Registers, WalkEnd};
use unwind_tables::UnsupportedReason;

type Read = extern "C" fn(*mut c_void, u64, *mut u64) -> c_int;
type WalkFn = unsafe extern "C" fn(
    *const Mapping,
    u32,
    *const u8,
    Read,
    *mut c_void,
    u64,
    u64,
    u64,
    u64,
    c_int,
    *mut u64,
    *mut u16,
    *mut u16,
) -> u32;

/// The C walker, loaded from the test object build.rs made.
struct CWalker {
    walk: WalkFn,
}

impl CWalker {
    fn load() -> CWalker {
        let path = CString::new(concat!(env!("OUT_DIR"), "/libctp-walk-test.so")).unwrap();
        // SAFETY: a library built by this crate, whose initializers do nothing.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "loading libctp-walk-test.so");
        // SAFETY: a symbol of that library, looked up by a valid name.
        let symbol = unsafe { libc::dlsym(handle, c"ctp_test_walk".as_ptr()) };
        assert!(!symbol.is_null(), "ctp_test_walk");
        // SAFETY: ctp_test_walk has this signature (walk_test.c).
        CWalker {
            walk: unsafe { std::mem::transmute::<*mut c_void, WalkFn>(symbol) },
        }
    }
}

extern "C" fn read_memory(ctx: *mut c_void, addr: u64, value: *mut u64) -> c_int {
    // SAFETY: ctx is the &ProcMemory passed to ctp_test_walk, alive for the call.
    let memory = unsafe { &*(ctx as *const ProcMemory) };
    match memory.read_u64(addr) {
        Some(v) => {
            // SAFETY: value points at the walker's u64.
            unsafe { *value = v };
            0
        }
        None => -1,
    }
}

/// A process image as the library sees it: the tables blob and the mappings.
struct Encoded {
    tables: Vec<u8>,
    mappings: Vec<Mapping>,
}

fn encode(image: &ProcessImage) -> Encoded {
    let mut tables = Vec::new();
    let mut offsets = Vec::new();
    for object in &image.objects {
        offsets.push(tables.len() as u64);
        tables.extend_from_slice(&encode_table(&object.compiled.table));
    }
    let mappings = image
        .mappings
        .iter()
        .map(|m| Mapping {
            start: m.start,
            end: m.end,
            bias: m.bias,
            table: m.object.map_or(NO_TABLE, |i| offsets[i]),
            object: m.object.map_or(0, |i| i as u32 + 1),
            flags: if m.object.is_none() {
                MAPPING_NO_TABLE
            } else {
                0
            },
        })
        .collect();
    Encoded { tables, mappings }
}

/// A stored frame back to its runtime address in this image.
fn runtime(frame: u64, image: &ProcessImage) -> u64 {
    match Frame::from_stored(frame) {
        Frame::Runtime(address) => address,
        Frame::InObject { object, address } => image
            .mappings
            .iter()
            .find(|m| {
                m.object == Some(object as usize - 1)
                    && (m.start..m.end).contains(&address.wrapping_add(m.bias))
            })
            .map_or(frame, |m| address.wrapping_add(m.bias)),
    }
}

fn end_of(end: u16, reason: u16) -> WalkEnd {
    match end {
        0 => WalkEnd::Complete,
        1 => WalkEnd::NoProcess,
        2 => WalkEnd::NoMapping,
        3 => WalkEnd::NoRow,
        4 => WalkEnd::Unsupported(UnsupportedReason::from_u8(reason as u8).unwrap()),
        5 => WalkEnd::ReadFault,
        6 => WalkEnd::DepthCap,
        _ => WalkEnd::BadReturnAddress,
    }
}

/// Walks from `regs` with both walkers and requires the same frames and end; the
/// number of frames.
fn compare(
    c: &CWalker,
    image: &ProcessImage,
    encoded: &Encoded,
    memory: &ProcMemory,
    regs: Registers,
    what: &str,
) -> (usize, WalkEnd) {
    let space = image.address_space().expect("address space");
    let twin = walk(&space, regs, memory, MAX_FRAMES);
    let mut frames = vec![0u64; MAX_FRAMES];
    let (mut end, mut reason) = (0u16, 0u16);
    // SAFETY: the pointers are valid for the call: mappings and tables borrowed, the
    // output buffer MAX_FRAMES long, ctx the ProcMemory read_memory expects.
    let n = unsafe {
        (c.walk)(
            encoded.mappings.as_ptr(),
            encoded.mappings.len() as u32,
            encoded.tables.as_ptr(),
            read_memory,
            memory as *const ProcMemory as *mut c_void,
            regs.rip,
            regs.rsp,
            regs.rbp,
            regs.rdi.unwrap_or(0),
            c_int::from(regs.rdi.is_some()),
            frames.as_mut_ptr(),
            &mut end,
            &mut reason,
        )
    } as usize;
    let ours: Vec<u64> = frames[..n].iter().map(|&f| runtime(f, image)).collect();
    assert_eq!(
        (ours.as_slice(), end_of(end, reason)),
        (twin.frames.as_slice(), twin.end),
        "{what}: the C walker and the twin differ"
    );
    (n, twin.end)
}

struct Stopped(Option<Child>);

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn start_stopped(lang: Lang, mode: &str) -> Stopped {
    let path = match lang {
        Lang::Rust => fixtures::rust_fixture("chains"),
        _ => fixtures::c_fixture("chains_c"),
    };
    let child = Command::new(&path)
        .arg(mode)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the fixture");
    let pid = Pid::from_raw(child.id() as i32);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match waitpid(pid, Some(WaitPidFlag::WUNTRACED | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => break,
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            other => panic!("the fixture did not stop: {other:?}"),
        }
    }
    Stopped(Some(child))
}

fn differential(lang: Lang, mode: &str) {
    let stopped = start_stopped(lang, mode);
    let pid = stopped.0.as_ref().unwrap().id() as i32;
    let seized = match SeizedThreads::seize(pid) {
        Ok(seized) => seized,
        Err(InspectError::Ptrace {
            source: Errno::EPERM,
            what,
            ..
        }) => {
            eprintln!("skipping: ptrace {what} of a child is not permitted here");
            return;
        }
        Err(error) => panic!("seizing: {error}"),
    };
    let image = ProcessImage::load(pid).expect("loading the fixture's image");
    let encoded = encode(&image);
    let memory = ProcMemory::open(pid).expect("the fixture's memory");
    let c = CWalker::load();
    let mut ends = std::collections::BTreeMap::new();
    for thread in &seized.threads {
        let (frames, end) = compare(&c, &image, &encoded, &memory, thread.regs, "thread");
        assert_eq!(end, WalkEnd::Complete, "thread {} walks whole", thread.tid);
        assert!(frames > 3, "thread {}: {frames} frames", thread.tid);
        // walks started from every slot of the stack: every way a walk ends
        for slot in 0..400u64 {
            let rsp = thread.regs.rsp + 8 * slot;
            let Some(rip) = memory.read_u64(rsp) else {
                break;
            };
            let regs = Registers {
                rip,
                rsp: rsp + 8,
                rbp: thread.regs.rbp,
                rdi: None,
            };
            let (_, end) = compare(&c, &image, &encoded, &memory, regs, &format!("slot {slot}"));
            *ends.entry(format!("{end:?}")).or_insert(0) += 1;
        }
    }
    eprintln!("{lang:?} {mode}: walks from stack slots ended {ends:?}");
    assert!(ends.len() >= 3, "walks end several ways: {ends:?}");
    drop(seized);
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
}

#[test]
fn c_walker_equals_twin_on_a_stopped_c_fixture() {
    differential(Lang::C, "stop");
}

#[test]
fn c_walker_equals_twin_on_a_stopped_rust_fixture() {
    differential(Lang::Rust, "stop");
}

#[test]
fn c_walker_equals_twin_through_signal_frames() {
    differential(Lang::C, "signal");
    differential(Lang::Rust, "signal");
}
