//! The one raw syscall of this crate: mmap of a `BPF_F_MMAPABLE` array map,
//! so that tables are copied into the kernel with memcpy instead of one
//! update syscall per element.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::layout::Pod;

/// A shared, writable mapping of an array map, seen as `[T]`, mapped a window at a
/// time as writes reach it.
///
/// A mapping of a BPF array is populated whole as it is made (the kernel inserts every
/// page of the map's memory): mapped at once, the default table maps (38 MiB) counted
/// in cargo-trace's resident memory from the start, whatever the tables took. Windows
/// of [`WINDOW`] bytes cost only where tables were written.
pub struct MappedArray<T: Pod> {
    fd: OwnedFd,
    len: usize,
    /// The map's bytes.
    bytes: usize,
    /// Window `i` maps bytes `[i * WINDOW, (i + 1) * WINDOW)`, once written to.
    windows: Vec<Option<NonNull<u8>>>,
    _values: PhantomData<T>,
}

/// Bytes mapped at a time: a multiple of the page size.
const WINDOW: usize = 1 << 20;

impl<T: Pod> MappedArray<T> {
    /// The array map behind `fd` (`max_entries` elements of `value_size` bytes), to be
    /// seen as a flat array of `T`. The kernel stores array elements 8-byte aligned;
    /// with `value_size` a multiple of 8 there is no padding between them, so the map is
    /// one contiguous `[T]` as long as `value_size` is also a multiple of
    /// `size_of::<T>()`. Maps nothing yet, but checks that the map can be mapped.
    pub fn new(fd: BorrowedFd<'_>, value_size: u32, max_entries: u32) -> io::Result<Self> {
        let value_size = value_size as usize;
        if !value_size.is_multiple_of(8) || !value_size.is_multiple_of(size_of::<T>()) {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let bytes = value_size * max_entries as usize;
        let mut array = MappedArray {
            fd: fd.try_clone_to_owned()?,
            len: bytes / size_of::<T>(),
            bytes,
            windows: vec![None; bytes.div_ceil(WINDOW)],
            _values: PhantomData,
        };
        if !array.windows.is_empty() {
            array.window(0)?;
        }
        Ok(array)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Window `index`, mapped if it was not.
    fn window(&mut self, index: usize) -> io::Result<NonNull<u8>> {
        if let Some(ptr) = self.windows[index] {
            return Ok(ptr);
        }
        let offset = index * WINDOW;
        let length = WINDOW.min(self.bytes - offset);
        // SAFETY: a fresh shared mapping (no address hint) of part of a map fd we
        // own; the kernel checks that the map is mmapable and that the range lies
        // within it. The mapping keeps its own reference on the map.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        self.windows[index] = Some(ptr);
        Ok(ptr)
    }

    /// Copies `values` to elements `[first, first + values.len())`.
    ///
    /// Panics if that range is out of bounds (callers check capacity first); fails if a
    /// window cannot be mapped.
    pub fn write(&mut self, first: usize, values: &[T]) -> io::Result<()> {
        let end = first.checked_add(values.len()).expect("overflow");
        assert!(end <= self.len, "write past the end of a mapped map");
        // SAFETY: `values` are Pod: plain bytes, any of them valid.
        let mut source = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), size_of_val(values))
        };
        let mut at = first * size_of::<T>();
        while !source.is_empty() {
            let (index, offset) = (at / WINDOW, at % WINDOW);
            let window = self.window(index)?;
            let take = source.len().min(WINDOW - offset);
            // SAFETY: `offset + take` lies within the window (at most WINDOW, and
            // within the map: `end <= len`), mapped writable above; `source` is our
            // own memory, so the ranges do not overlap. BPF programs only read these
            // maps; they may see a partly written table, but no mapping points at a
            // table before `Tracer::add_table` has finished.
            unsafe {
                std::ptr::copy_nonoverlapping(source.as_ptr(), window.as_ptr().add(offset), take);
            }
            source = &source[take..];
            at += take;
        }
        Ok(())
    }
}

impl<T: Pod> Drop for MappedArray<T> {
    fn drop(&mut self) {
        for (index, window) in self.windows.iter().enumerate() {
            if let Some(ptr) = window {
                let length = WINDOW.min(self.bytes - index * WINDOW);
                // SAFETY: unmaps exactly a mapping `window` created; no reference
                // into it outlives `self` (`write` copies in, nothing hands out
                // references).
                unsafe { libc::munmap(ptr.as_ptr().cast(), length) };
            }
        }
    }
}

// SAFETY: the mappings are plain shared memory owned by this value; it may move to
// and be used from another thread like a Vec<T> of Pod data.
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
