//! What the wait loop sleeps on: the target's end (a pidfd), a descriptor that says
//! more work has come (the children's ring buffer), a signal, or a timeout, whichever
//! comes first. A target that exits at once ends the session at once, not at the next
//! tick of the loop.

use std::cell::Cell;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// The target's pidfd, when the kernel has them (Linux 5.3).
pub struct Wakeup {
    pidfd: Option<OwnedFd>,
    /// The pidfd said the target ended: it is readable for good, and left out of the
    /// sleeps that follow (should the loop go on, they would not sleep at all).
    ended: Cell<bool>,
}

impl Wakeup {
    /// Wakes up when process `pid` exits (a launched target, or one attached to).
    pub fn new(pid: u32) -> Wakeup {
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let pidfd = (fd >= 0).then(|| {
            // SAFETY: the descriptor was just opened and nothing else owns it.
            unsafe { OwnedFd::from_raw_fd(fd as i32) }
        });
        Wakeup {
            pidfd,
            ended: Cell::new(false),
        }
    }

    /// Sleeps until the target exits, one of `also` is readable, a signal is handled,
    /// or `timeout` passes. Without a pidfd, the timeout alone ends a sleep in which
    /// nothing else happens.
    pub fn wait(&self, also: &[BorrowedFd<'_>], timeout: Duration) {
        let pidfd = self
            .pidfd
            .as_ref()
            .filter(|_| !self.ended.get())
            .map(|fd| fd.as_raw_fd());
        let mut fds: Vec<libc::pollfd> = [pidfd]
            .into_iter()
            .flatten()
            .chain(also.iter().map(|fd| fd.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let timeout_ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: poll(2) on a buffer of fds.len() pollfd structures that outlives the
        // call. An interruption (EINTR) is a wake-up like any other.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if pidfd.is_some() && fds[0].revents != 0 {
            self.ended.set(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_child_that_exits_ends_the_wait_at_once() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .unwrap();
        let wakeup = Wakeup::new(child.id());
        let started = Instant::now();
        wakeup.wait(&[], Duration::from_secs(10));
        assert!(started.elapsed() < Duration::from_secs(5));
        child.wait().unwrap();
    }
}
