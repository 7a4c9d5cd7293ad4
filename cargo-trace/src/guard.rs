//! A process that outlives cargo-trace to resume what the session stopped.
//!
//! The BPF program stops traced processes (SIGSTOP) at their start and after a
//! dlopen until the session has registered their mappings and sends SIGCONT.
//! If cargo-trace dies without doing so (SIGKILL, the OOM killer, a crash),
//! they would stay stopped for good. So a session forks a guard first: it
//! holds the read end of a pipe whose write end only cargo-trace holds, and
//! the pid filter map. A session that ends normally writes a byte, and the
//! guard leaves. End of file without that byte means cargo-trace died: its BPF
//! links died with it, so nothing stops a process any more, and the guard
//! continues every traced process that is stopped. The uprobes bound to the
//! traced processes went with cargo-trace's perf events too, but their tracefs
//! events outlive it: the guard deletes the session's group of them.
//!
//! The guard is forked, not exec'd, while cargo-trace has one thread, and
//! runs only async-signal-safe system calls (no allocation): what a fork child
//! may do in any process.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use anyhow::{bail, Result};

/// Where the guard keeps what it needs; every other descriptor is closed.
const GUARD_PIPE: libc::c_int = 3;
const GUARD_PID_FILTER: libc::c_int = 4;
/// How long after a first pass the guard looks again: a program that was
/// running on another CPU when the links went may have stopped one more.
const SECOND_PASS_DELAY_NS: libc::c_long = 100_000_000;
/// How often, and how many times, the guard tries to delete the tracefs events
/// while the kernel still releases cargo-trace's perf events (they hold them).
const REMOVAL_RETRY_NS: libc::c_long = 10_000_000;
const REMOVAL_TRIES: u32 = 500;

/// What deletes the session's tracefs uprobe events: the file and the command to
/// append, made before the fork (the guard does not allocate).
struct Removal {
    control: CString,
    command: CString,
}

/// The running guard; [`Guard::dismiss`] when every stopped process is resumed.
/// Dropped, it closes its end of the pipe (without a dismissal, the guard then
/// resumes what is stopped) and waits for the guard to finish.
pub struct Guard {
    pipe: Option<OwnedFd>,
    pid: libc::pid_t,
}

impl Guard {
    /// Forks the guard. `pid_filter`: the map of traced processes (u32 keys).
    /// `uprobes`: the tracefs file and the command that delete the session's bound
    /// uprobes. Call it while the process has a single thread.
    pub fn spawn(pid_filter: BorrowedFd<'_>, uprobes: Option<(PathBuf, String)>) -> Result<Guard> {
        let removal = match uprobes {
            Some((control, command)) => Some(Removal {
                control: CString::new(control.into_os_string().into_encoded_bytes())?,
                command: CString::new(command)?,
            }),
            None => None,
        };
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            bail!(
                "cannot create the guard's pipe: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: both descriptors were just created and are owned here only.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: the child runs guard_main only, which makes async-signal-safe
        // calls and never returns, as a fork child of any process may.
        match unsafe { libc::fork() } {
            -1 => bail!(
                "cannot fork the guard process: {}",
                std::io::Error::last_os_error()
            ),
            0 => guard_main(
                read.as_raw_fd(),
                write.as_raw_fd(),
                pid_filter.as_raw_fd(),
                removal.as_ref(),
            ),
            pid => Ok(Guard {
                pipe: Some(write),
                pid,
            }),
        }
    }

    /// Tells the guard that the session resumed every process it stopped: it
    /// leaves without touching any.
    pub fn dismiss(self) {
        if let Some(pipe) = &self.pipe {
            // SAFETY: a one-byte write from a valid buffer to our pipe.
            unsafe { libc::write(pipe.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        drop(self.pipe.take());
        // SAFETY: waitpid(2) on our own child; reaps it so it leaves no zombie.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
    }
}

/// The guard: waits for cargo-trace to end, then resumes the processes left
/// stopped if it died. Async-signal-safe calls only.
fn guard_main(
    read: libc::c_int,
    write: libc::c_int,
    pid_filter: libc::c_int,
    removal: Option<&Removal>,
) -> ! {
    // SAFETY: system calls on descriptors this process owns (its copies of
    // cargo-trace's) and on buffers that live across each call.
    unsafe {
        libc::close(write);
        // Out of the terminal's process group: Ctrl-C is for cargo-trace and
        // the target, and a terminal hang-up must not take the guard along.
        libc::setsid();
        libc::prctl(libc::PR_SET_NAME, c"cargo-trace-gd".as_ptr());
        // Keep the pipe and the map; drop every other descriptor, links above
        // all (they would keep the probes alive), and the standard streams (a
        // pipe reader must see cargo-trace's output end when it ends).
        let read = libc::fcntl(read, libc::F_DUPFD, 1000);
        let map = libc::fcntl(pid_filter, libc::F_DUPFD, 1001);
        if read < 0 || map < 0 {
            libc::_exit(1);
        }
        libc::dup2(read, GUARD_PIPE);
        libc::dup2(map, GUARD_PID_FILTER);
        if libc::close_range(GUARD_PID_FILTER as u32 + 1, u32::MAX, 0) != 0 {
            // A kernel before close_range (5.9): one by one, up to the limit.
            let limit = libc::sysconf(libc::_SC_OPEN_MAX).clamp(0, 1 << 20) as libc::c_int;
            for fd in GUARD_PID_FILTER + 1..limit {
                libc::close(fd);
            }
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for stream in 0..3 {
                libc::dup2(null, stream);
            }
            libc::close(null);
        }

        let mut byte = 0u8;
        loop {
            match libc::read(GUARD_PIPE, (&raw mut byte).cast(), 1) {
                1 => libc::_exit(0), // dismissed
                0 => break,          // cargo-trace is gone
                _ if *libc::__errno_location() == libc::EINTR => continue,
                _ => libc::_exit(1),
            }
        }
        resume_stopped(GUARD_PID_FILTER);
        if let Some(removal) = removal {
            remove_uprobes(removal);
        }
        let delay = libc::timespec {
            tv_sec: 0,
            tv_nsec: SECOND_PASS_DELAY_NS,
        };
        libc::nanosleep(&delay, std::ptr::null_mut());
        resume_stopped(GUARD_PID_FILTER);
        libc::_exit(0)
    }
}

/// Deletes the session's tracefs uprobe events. The kernel refuses (EBUSY) while
/// a perf event of one is open, and cargo-trace's are released as it exits, maybe
/// after the pipe told the guard: tried again until done (or none is left).
fn remove_uprobes(removal: &Removal) {
    let command = removal.command.as_bytes();
    let delay = libc::timespec {
        tv_sec: 0,
        tv_nsec: REMOVAL_RETRY_NS,
    };
    for _ in 0..REMOVAL_TRIES {
        // SAFETY: open(2) with a NUL-terminated path, write(2) from a buffer that
        // outlives the call, close(2) of the descriptor just opened: all
        // async-signal-safe.
        let busy = unsafe {
            let fd = libc::open(
                removal.control.as_ptr(),
                libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return;
            }
            let written = libc::write(fd, command.as_ptr().cast(), command.len());
            let busy = written < 0 && *libc::__errno_location() == libc::EBUSY;
            libc::close(fd);
            busy
        };
        if !busy {
            return;
        }
        // SAFETY: nanosleep(2) reads the timespec on our stack.
        unsafe { libc::nanosleep(&delay, std::ptr::null_mut()) };
    }
}

/// Sends SIGCONT to every process of the pid filter map that is stopped.
fn resume_stopped(map: libc::c_int) {
    let mut key: u32 = 0;
    let mut first = true;
    loop {
        let mut next: u32 = 0;
        if !next_key(map, (!first).then_some(&key), &mut next) {
            return;
        }
        first = false;
        key = next;
        if is_stopped(next) {
            // SAFETY: kill(2); at worst the process is gone.
            unsafe { libc::kill(next as libc::pid_t, libc::SIGCONT) };
        }
    }
}

/// BPF_MAP_GET_NEXT_KEY: the key after `key` (the first with None) in `next`;
/// false at the end of the map.
fn next_key(map: libc::c_int, key: Option<&u32>, next: &mut u32) -> bool {
    #[repr(C)]
    struct Attr {
        map_fd: u32,
        pad: u32,
        key: u64,
        next_key: u64,
    }
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    let attr = Attr {
        map_fd: map as u32,
        pad: 0,
        key: key.map_or(0, |key| key as *const u32 as u64),
        next_key: next as *mut u32 as u64,
    };
    // SAFETY: bpf(2) reads attr and writes 4 bytes (the map's key size) at
    // next_key; both outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_GET_NEXT_KEY,
            &attr as *const Attr,
            size_of::<Attr>() as libc::c_uint,
        ) == 0
    }
}

/// Whether process `pid` is stopped by a signal (state `T` in /proc/PID/stat).
fn is_stopped(pid: u32) -> bool {
    use std::io::Write;
    // Formatted into a buffer on the stack: no allocation.
    let mut path = [0u8; 32];
    if write!(&mut path[..], "/proc/{pid}/stat\0").is_err() {
        return false;
    }
    let mut stat = [0u8; 512];
    // SAFETY: path is NUL-terminated; read(2) writes at most stat.len() bytes
    // into stat.
    let len = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let len = libc::read(fd, stat.as_mut_ptr().cast(), stat.len());
        libc::close(fd);
        len
    };
    if len <= 0 {
        return false;
    }
    // "pid (comm) S ...": the state follows the last ')' (comm may hold any byte).
    let stat = &stat[..len as usize];
    match stat.iter().rposition(|&b| b == b')') {
        Some(close) => stat.get(close + 2) == Some(&b'T'),
        None => false,
    }
}
