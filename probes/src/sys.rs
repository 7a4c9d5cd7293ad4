//! The crate's raw system calls: perf_event_open(2), mount(2) and the open files limit. Every `unsafe` block
//! of the crate is in this module.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

use perf_event_open_sys::bindings::{
    perf_event_attr, PERF_FLAG_FD_CLOEXEC, PERF_SAMPLE_READ, PERF_SAMPLE_TID,
};

use crate::spec::Sampling;

/// Opens a sampling perf event, disabled (libbpf enables it once the program is attached,
/// so no sample is taken before the program can see it).
///
/// `pid` -1 with a `cpu` counts everything on that CPU; `pid` 0 with `cpu` -1 counts
/// the calling thread wherever it runs.
pub(crate) fn perf_event_open(
    type_: u32,
    config: u64,
    sampling: Sampling,
    pid: i32,
    cpu: i32,
) -> io::Result<OwnedFd> {
    let mut attr = perf_event_attr {
        type_,
        size: std::mem::size_of::<perf_event_attr>() as u32,
        config,
        ..Default::default()
    };
    match sampling {
        Sampling::Period(period) => attr.__bindgen_anon_1.sample_period = period,
        Sampling::Frequency(frequency) => {
            attr.set_freq(1);
            attr.__bindgen_anon_1.sample_freq = frequency;
        }
    }
    attr.set_disabled(1);
    // SAFETY: `attr` is a fully initialised perf_event_attr whose `size` field is its
    // own size, and it outlives the call; the kernel only reads it (and may write back
    // `size` on E2BIG, which stays within the struct).
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative return of perf_event_open is a new file descriptor that
    // nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens tracepoint `id` (a tracefs event's) on thread `tid`; with `inherit`, every thread
/// and process `tid` creates from now on gets a copy, before it runs. Disabled: a program
/// attached to a tracepoint runs whatever the state of the event (so only the one the
/// program attaches to is enabled, by libbpf), and a disabled event records nothing.
pub(crate) fn open_tracepoint(id: u64, tid: i32, inherit: bool) -> io::Result<OwnedFd> {
    let mut attr = perf_event_attr {
        type_: perf_event_open_sys::bindings::PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<perf_event_attr>() as u32,
        config: id,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = 1;
    attr.set_disabled(1);
    attr.set_inherit(inherit.into());
    if inherit {
        // A task's events move to another task when the scheduler switches between a
        // parent and a child whose events are copies of each other (perf's context
        // swap); the uprobe filter goes by each event's own task, so a child that exits
        // with its parent's events would take the parent out of the filter. Inherited
        // events that sample READ (with TID, as the kernel requires) keep their task:
        // the kernel never swaps their contexts (6.12 and later; older kernels refuse
        // the pair, and the event is opened without it).
        attr.sample_type = u64::from(PERF_SAMPLE_READ | PERF_SAMPLE_TID);
        match open_attr(&mut attr, tid) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => attr.sample_type = 0,
            opened => return opened,
        }
    }
    open_attr(&mut attr, tid)
}

fn open_attr(attr: &mut perf_event_attr, tid: i32) -> io::Result<OwnedFd> {
    // SAFETY: as in perf_event_open above.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            attr,
            tid,
            -1,
            -1,
            PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Raises this process's soft limit of open files to its hard limit: a bound uprobe
/// holds a perf event per thread of the traced processes. Whether it was raised.
pub(crate) fn raise_open_files_limit() -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit(2) read and write the rlimit on our stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max
        {
            return false;
        }
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
    }
}

/// `mount -t tracefs nodev TARGET`.
pub(crate) fn mount_tracefs(target: &Path) -> io::Result<()> {
    let target = CString::new(target.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call, and
    // tracefs takes no mount data (NULL).
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Forks a process that holds a copy of every descriptor of this one until the returned
/// descriptor is closed, then closes them all (the kernel's release of the last copy of
/// each runs there, on that process's time) and writes `removal.1` to `removal.0` (a
/// tracefs control file), retried while busy. Nobody waits for it: a middle process
/// forks it and exits, so that it is reparented.
pub(crate) fn spawn_holder(removal: Option<(&Path, &str)>) -> io::Result<OwnedFd> {
    // Made before the fork: the holder allocates nothing.
    let removal = match removal {
        Some((control, command)) => Some((
            CString::new(control.as_os_str().as_encoded_bytes())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            command.as_bytes().to_vec(),
        )),
        None => None,
    };
    let mut ends = [0; 2];
    // SAFETY: pipe2(2) fills the two descriptors of the array on our stack.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read_end, write_end] = ends;
    // SAFETY: fork(2) of a process that may have threads: the children call only
    // async-signal-safe functions (close, fork, read, nanosleep, open, write, the
    // close_range system call, _exit) on memory prepared before the fork.
    let middle = unsafe { libc::fork() };
    if middle == 0 {
        // SAFETY: as above.
        unsafe {
            libc::close(write_end);
            if libc::fork() == 0 {
                hold(read_end, removal.as_ref());
            }
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the read end, a descriptor we own.
    unsafe { libc::close(read_end) };
    if middle < 0 {
        let error = io::Error::last_os_error();
        // SAFETY: as above, the write end.
        unsafe { libc::close(write_end) };
        return Err(error);
    }
    // SAFETY: reaps the middle process, our child, which exits at once.
    unsafe { libc::waitpid(middle, std::ptr::null_mut(), 0) };
    // SAFETY: the write end is ours and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(write_end) })
}

/// The holder's life (see [`spawn_holder`]).
///
/// # Safety
///
/// Only in a child just forked; `removal`'s memory was made before the fork.
unsafe fn hold(release: libc::c_int, removal: Option<&(CString, Vec<u8>)>) -> ! {
    // SAFETY: the caller's; every call below is async-signal-safe.
    unsafe {
        // No terminal, no pipe held open: whoever reads cargo-trace's output sees its end.
        for fd in 0..3 {
            libc::close(fd);
        }
        let mut byte = 0u8;
        while libc::read(release, (&raw mut byte).cast(), 1) < 0
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        if let Some((control, command)) = removal {
            let delay = libc::timespec {
                tv_sec: 0,
                tv_nsec: 5_000_000,
            };
            for _ in 0..400 {
                let fd = libc::open(control.as_ptr(), libc::O_WRONLY | libc::O_APPEND);
                if fd < 0 {
                    break;
                }
                let written = libc::write(fd, command.as_ptr().cast(), command.len());
                let busy = written < 0 && *libc::__errno_location() == libc::EBUSY;
                libc::close(fd);
                if !busy {
                    break;
                }
                libc::nanosleep(&delay, std::ptr::null_mut());
            }
        }
        libc::_exit(0)
    }
}
