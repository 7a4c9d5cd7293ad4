//! The crate's system calls that need `unsafe`: shared memory (memfd, mmap) and
//! descriptors passed over a Unix socket (`SCM_RIGHTS`).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A new memfd of `bytes` bytes, close-on-exec.
pub fn memfd(name: &CStr, bytes: u64) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid C string; the flags are plain values.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by no one else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    set_len(&fd, bytes)?;
    Ok(fd)
}

pub fn set_len(fd: &OwnedFd, bytes: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(bytes).map_err(|_| io::Error::other("size too large"))?;
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The size of the file behind `fd`.
pub fn file_len(fd: &OwnedFd) -> io::Result<u64> {
    let file = std::fs::File::from(fd.try_clone()?);
    Ok(file.metadata()?.len())
}

/// A shared mapping of a file, unmapped on drop.
pub struct Shared {
    addr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; every access through it is volatile or atomic
// (see `Shared::read`), and the pointer is never handed out.
unsafe impl Send for Shared {}

impl Shared {
    /// Maps `len` bytes of `fd` from offset 0, shared, readable and writable if `write`.
    pub fn map(fd: &OwnedFd, len: usize, write: bool) -> io::Result<Shared> {
        let prot = libc::PROT_READ | if write { libc::PROT_WRITE } else { 0 };
        // SAFETY: a new mapping chosen by the kernel; the file is ours to map.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Shared {
            addr: addr.cast(),
            len,
        })
    }

    /// A copy of the `T` at `offset` (volatile: another process writes the memory).
    pub fn read<T: crate::layout::Pod>(&self, offset: usize) -> T {
        assert!(offset
            .checked_add(size_of::<T>())
            .is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (checked); `T: Pod` accepts any bytes; unaligned read.
        unsafe { std::ptr::read_volatile(self.addr.add(offset).cast::<T>()) }
    }

    /// Asks the CPU for the line at `offset`, ahead of a read.
    pub fn prefetch(&self, offset: usize) {
        if offset < self.len {
            // SAFETY: a prefetch is a hint that never faults; the address is inside the
            // mapping.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    self.addr.add(offset).cast(),
                )
            };
        }
    }

    /// Reads the u64 at `offset` (8-aligned) with acquire ordering.
    pub fn load_acquire(&self, offset: usize) -> u64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: in bounds and aligned (checked); AtomicU64 has u64's layout, and the
        // memory lives as long as `self`.
        let atomic = unsafe { &*self.addr.add(offset).cast::<std::sync::atomic::AtomicU64>() };
        atomic.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Writes `value` at `offset` (8-aligned) with release ordering.
    pub fn store_release(&self, offset: usize, value: u64) {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: as in `load_acquire`.
        let atomic = unsafe { &*self.addr.add(offset).cast::<std::sync::atomic::AtomicU64>() };
        atomic.store(value, std::sync::atomic::Ordering::Release);
    }

    /// Writes the u32 at `offset` (4-aligned) with release ordering.
    pub fn store_u32_release(&self, offset: usize, value: u32) {
        assert!(offset.is_multiple_of(4) && offset + 4 <= self.len);
        // SAFETY: as in `load_acquire`, for a u32.
        let atomic = unsafe { &*self.addr.add(offset).cast::<std::sync::atomic::AtomicU32>() };
        atomic.store(value, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// Sends `bytes` as one message on `socket`, with `fd` attached if given.
pub fn send(socket: RawFd, bytes: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = [0u64; 4]; // CMSG_SPACE(sizeof(int)), 8-aligned
                                 // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `space` bytes (<= size of `control`), so the
        // first header and its data lie inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        }
    }
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let sent = unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != bytes.len() {
        return Err(io::Error::other("short send"));
    }
    Ok(())
}

/// Receives one message from `socket` into `buf` (without waiting if `nonblocking`):
/// its length (0: the peer closed) and the descriptor attached, if any (others closed).
pub fn receive(
    socket: RawFd,
    buf: &mut [u8],
    nonblocking: bool,
) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control);
    let flags = libc::MSG_CMSG_CLOEXEC | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let got = unsafe { libc::recvmsg(socket, &mut msg, flags) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut received = None;
    // SAFETY: the kernel filled msg_control with valid headers up to msg_controllen;
    // CMSG_NXTHDR stays inside it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count =
                    ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if received.is_none() {
                        received = Some(fd);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((got as usize, received))
}

/// The peer of a connected Unix socket: its pid.
pub fn peer_pid(socket: RawFd) -> io::Result<u32> {
    // SAFETY: an all-zero ucred is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            socket,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.pid as u32)
}

/// A listening `SOCK_SEQPACKET` Unix socket bound at `path`, close-on-exec, non-blocking.
pub fn listen_seqpacket(path: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned by no one else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::other("socket path too long"));
    }
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    // SAFETY: `addr` is a valid sockaddr_un of the size given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a bound socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A connection waiting on `listener`, close-on-exec; `None` if none is.
pub fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: a listening socket we own; no address wanted.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return match error.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            _ if error.raw_os_error() == Some(libc::EINTR) => Ok(None),
            _ => Err(error),
        };
    }
    // SAFETY: just returned by accept4, owned by no one else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Waits until one of `fds` is readable (or hung up), at most `timeout_ms`; which are.
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `polls` is a valid array of its length.
    let rc = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::EINTR) {
            return Ok(vec![false; fds.len()]);
        }
        return Err(error);
    }
    Ok(polls.iter().map(|p| p.revents != 0).collect())
}

/// `fd` opened again, read-only (a new open file description of the same file).
pub fn reopen_read_only(fd: &OwnedFd) -> io::Result<OwnedFd> {
    let file = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    Ok(OwnedFd::from(file))
}

/// Eight random bytes, hex encoded, from the kernel.
pub fn random_name() -> io::Result<String> {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into `bytes`.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Reads the clock the library stamps events with (`CLOCK_MONOTONIC`), in ns.
pub fn monotonic_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The time stamp counter, as the library reads it.
pub fn ticks() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64.
    unsafe { std::arch::x86_64::_rdtsc() }
}
