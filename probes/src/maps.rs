//! The files a process maps, told apart by device and inode (the same file may be
//! named differently here and in the process: symlinks, another mount namespace).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use process_image::{LoadSegment, MapsEntry};

use crate::elf::Segment;

/// (major, minor, inode) of the file at `path`.
fn file_key(path: &Path) -> Option<(u32, u32, u64)> {
    let metadata = fs::metadata(path).ok()?;
    let device = metadata.dev();
    Some((libc::major(device), libc::minor(device), metadata.ino()))
}

/// The files mapped by one process.
pub(crate) struct MappedFiles {
    /// Each mapping of a file, with the file's (major, minor, inode).
    mappings: Vec<((u32, u32, u64), MapsEntry)>,
    /// A mapped path looks like a shared library (`*.so*`).
    shared_libraries: bool,
}

impl MappedFiles {
    /// Reads `/proc/PID/maps`; `None` when the process cannot be read.
    pub fn of(pid: u32) -> Option<MappedFiles> {
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        Some(Self::parse(&maps))
    }

    fn parse(maps: &str) -> MappedFiles {
        let mut mappings = Vec::new();
        let mut shared_libraries = false;
        for entry in process_image::parse_maps(maps) {
            let Some((major, minor)) = entry.dev.split_once(':') else {
                continue;
            };
            let (Ok(major), Ok(minor)) = (
                u32::from_str_radix(major, 16),
                u32::from_str_radix(minor, 16),
            ) else {
                continue;
            };
            if entry.inode == 0 {
                continue;
            }
            let name = entry.name.rsplit('/').next().unwrap_or("");
            shared_libraries |= name.contains(".so");
            mappings.push(((major, minor, entry.inode), entry));
        }
        MappedFiles {
            mappings,
            shared_libraries,
        }
    }

    /// Whether the file at `path` (as this process sees it) is mapped.
    pub fn contains(&self, path: &Path) -> bool {
        match file_key(path) {
            Some(key) => self.mappings.iter().any(|(file, _)| *file == key),
            // Unknown: say nothing rather than something wrong.
            None => true,
        }
    }

    /// The load bias of the file at `path` (process address minus the file's virtual
    /// address), from one of its executable mappings ([`process_image::load_bias`]).
    pub fn load_bias(&self, path: &Path, segments: &[Segment]) -> Option<u64> {
        let key = file_key(path)?;
        let segments: Vec<LoadSegment> = segments
            .iter()
            .map(|s| LoadSegment {
                file_offset: s.offset,
                file_size: s.filesz,
                vaddr: s.vaddr,
                executable: s.executable,
            })
            .collect();
        self.mappings
            .iter()
            .filter(|(file, entry)| *file == key && entry.is_executable())
            .find_map(|(_, entry)| process_image::load_bias(&segments, entry.start, entry.offset))
    }

    pub fn has_shared_libraries(&self) -> bool {
        self.shared_libraries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_maps_its_own_executable_and_not_an_unrelated_file() {
        let mapped = MappedFiles::of(std::process::id()).unwrap();
        assert!(mapped.contains(&std::env::current_exe().unwrap()));
        assert!(!mapped.contains(Path::new("/etc/passwd")));
    }

    #[test]
    fn a_static_executable_maps_no_shared_library() {
        let maps = "\
00400000-00401000 r--p 00000000 fd:01 1234 /tmp/static
00401000-00402000 r-xp 00001000 fd:01 1234 /tmp/static
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
";
        let mapped = MappedFiles::parse(maps);
        assert!(!mapped.has_shared_libraries());
        let files: Vec<(u32, u32, u64)> = mapped.mappings.iter().map(|(file, _)| *file).collect();
        assert_eq!(files, [(0xfd, 1, 1234), (0xfd, 1, 1234)]);
        let dynamic = format!("{maps}7f0000000000-7f0000001000 r-xp 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6\n");
        assert!(MappedFiles::parse(&dynamic).has_shared_libraries());
    }
}
