//! The files a process maps, told apart by device and inode (the same file may be
//! named differently here and in the process: symlinks, another mount namespace).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::elf::Segment;

/// (major, minor, inode) of the file at `path`.
fn file_key(path: &Path) -> Option<(u32, u32, u64)> {
    let metadata = fs::metadata(path).ok()?;
    let device = metadata.dev();
    Some((libc::major(device), libc::minor(device), metadata.ino()))
}

/// The files mapped by one process.
pub(crate) struct MappedFiles {
    /// (major, minor, inode) of each mapping of a file.
    files: Vec<(u32, u32, u64)>,
    /// (start address, file offset) of each mapping of `files`, in the same order.
    ranges: Vec<(u64, u64)>,
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
        let mut files = Vec::new();
        let mut ranges = Vec::new();
        let mut shared_libraries = false;
        for line in maps.lines() {
            // start-end perms offset major:minor inode path
            let fields: Vec<&str> = line.splitn(6, ' ').collect();
            let (Some(device), Some(inode)) = (fields.get(3), fields.get(4)) else {
                continue;
            };
            let Some((major, minor)) = device.split_once(':') else {
                continue;
            };
            let parsed = (
                u32::from_str_radix(major, 16),
                u32::from_str_radix(minor, 16),
                inode.parse::<u64>(),
            );
            let (Ok(major), Ok(minor), Ok(inode)) = parsed else {
                continue;
            };
            if inode == 0 {
                continue;
            }
            let start = fields[0].split_once('-').map(|(start, _)| start);
            let start = start.and_then(|start| u64::from_str_radix(start, 16).ok());
            let offset = fields.get(2).and_then(|o| u64::from_str_radix(o, 16).ok());
            let (Some(start), Some(offset)) = (start, offset) else {
                continue;
            };
            let path = fields.get(5).map(|p| p.trim_start()).unwrap_or("");
            let name = path.rsplit('/').next().unwrap_or("");
            shared_libraries |= name.contains(".so");
            files.push((major, minor, inode));
            ranges.push((start, offset));
        }
        MappedFiles {
            files,
            ranges,
            shared_libraries,
        }
    }

    /// Whether the file at `path` (as this process sees it) is mapped.
    pub fn contains(&self, path: &Path) -> bool {
        match file_key(path) {
            Some(key) => self.files.contains(&key),
            // Unknown: say nothing rather than something wrong.
            None => true,
        }
    }

    /// The load bias of the file at `path` (process address minus the file's virtual
    /// address), from one of its mappings and the segment that mapping starts in.
    pub fn load_bias(&self, path: &Path, segments: &[Segment]) -> Option<u64> {
        let key = file_key(path)?;
        self.files
            .iter()
            .zip(&self.ranges)
            .filter(|(file, _)| **file == key)
            .find_map(|(_, &(start, offset))| {
                let segment = segments
                    .iter()
                    .find(|s| offset >= s.offset & !0xfff && offset < s.offset + s.filesz.max(1))?;
                // The mapping of file offset `offset` starts at `start`; the segment maps
                // file offset o at s.vaddr + (o - s.offset) + bias.
                Some(
                    start
                        .wrapping_sub(offset)
                        .wrapping_sub(segment.vaddr.wrapping_sub(segment.offset)),
                )
            })
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
        assert_eq!(mapped.files, [(0xfd, 1, 1234), (0xfd, 1, 1234)]);
        let dynamic = format!("{maps}7f0000000000-7f0000001000 r-xp 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6\n");
        assert!(MappedFiles::parse(&dynamic).has_shared_libraries());
    }
}
