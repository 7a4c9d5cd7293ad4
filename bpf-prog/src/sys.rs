//! The one raw syscall of this crate: mmap of a `BPF_F_MMAPABLE` array map,
//! so that tables are copied into the kernel with memcpy instead of one
//! update syscall per element.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::layout::Pod;

/// A shared, writable mapping of a whole array map, seen as `[T]`.
pub struct MappedArray<T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    bytes: usize,
    _values: PhantomData<T>,
}

impl<T: Pod> MappedArray<T> {
    /// Maps the whole array map behind `fd` (`max_entries` elements of
    /// `value_size` bytes) as a flat array of `T`. The kernel stores array
    /// elements 8-byte aligned; with `value_size` a multiple of 8 there is no
    /// padding between them, so the map is one contiguous `[T]` as long as
    /// `value_size` is also a multiple of `size_of::<T>()`.
    pub fn new(fd: BorrowedFd<'_>, value_size: u32, max_entries: u32) -> io::Result<Self> {
        let value_size = value_size as usize;
        if !value_size.is_multiple_of(8) || !value_size.is_multiple_of(size_of::<T>()) {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let bytes = value_size * max_entries as usize;
        let len = bytes / size_of::<T>();
        // SAFETY: a fresh shared mapping (no address hint) of a map fd we
        // borrow for the call; the kernel checks that the map is mmapable and
        // at least `bytes` long. The mapping keeps its own reference on the map.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<T>()).ok_or_else(io::Error::last_os_error)?;
        Ok(MappedArray {
            ptr,
            len,
            bytes,
            _values: PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Copies `values` to elements `[first, first + values.len())`.
    ///
    /// Panics if that range is out of bounds (callers check capacity first).
    pub fn write(&mut self, first: usize, values: &[T]) {
        let end = first.checked_add(values.len()).expect("overflow");
        assert!(end <= self.len, "write past the end of a mapped map");
        // SAFETY: the destination range is inside the mapping (checked
        // above), page-aligned memory is aligned for T, and `values` lives in
        // our own memory, so the ranges do not overlap. BPF programs only read
        // these maps; they may see a partly written table, but no mapping
        // points at a table before `Tracer::add_table` has finished.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr(),
                self.ptr.as_ptr().add(first),
                values.len(),
            );
        }
    }
}

impl<T: Pod> Drop for MappedArray<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` created; no reference into
        // it outlives `self` (`write` copies in, nothing hands out references).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.bytes);
        }
    }
}

// SAFETY: the mapping is plain shared memory owned by this value; it may move
// to and be used from another thread like a Vec<T> of Pod data.
unsafe impl<T: Pod> Send for MappedArray<T> {}
// SAFETY: `&self` allows nothing but `len`; writes need `&mut self`.
unsafe impl<T: Pod> Sync for MappedArray<T> {}

/// A program's counters from `bpf_prog_info`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramStats {
    /// Total time spent in the program, while statistics were enabled.
    pub run_time_ns: u64,
    /// Runs counted while statistics were enabled.
    pub run_count: u64,
    /// Instructions the verifier processed to accept the program.
    pub verified_insns: u32,
}

/// Reads `bpf_prog_info` of the program behind `fd`.
pub fn program_stats(fd: BorrowedFd<'_>) -> io::Result<ProgramStats> {
    let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
    let mut len = size_of_val(&info) as u32;
    // SAFETY: `info` is a zeroed bpf_prog_info of `len` bytes, which the
    // kernel fills (and shrinks `len` to what it knows); all its pointer
    // fields are null, so the kernel writes nothing else.
    let ret = unsafe {
        libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), &mut info, &mut len)
    };
    if ret < 0 {
        return Err(io::Error::from_raw_os_error(-ret));
    }
    Ok(ProgramStats {
        run_time_ns: info.run_time_ns,
        run_count: info.run_cnt,
        verified_insns: info.verified_insns,
    })
}

/// Turns on the kernel's BPF run-time statistics (`run_time_ns`,
/// `run_cnt`) for as long as the returned fd is open, like
/// `sysctl kernel.bpf_stats_enabled=1` but undone by closing it.
pub fn enable_run_time_stats() -> io::Result<OwnedFd> {
    // SAFETY: a plain syscall wrapper with no pointer arguments.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME)
    };
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The kernel memory a map holds, as it accounts it (`memlock` in the fd's fdinfo; for a
/// map allocated on use, what its elements take now).
pub fn map_memory(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    info.lines()
        .find_map(|line| line.strip_prefix("memlock:"))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no memlock in fdinfo"))
}
