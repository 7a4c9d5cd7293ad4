//! A process's mappings, from `/proc/PID/maps`.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// Where x86-64 user space ends (with 5-level paging; 4-level ends lower).
pub const USER_ADDRESS_END: u64 = 1 << 56;

/// One mapping of a process, as a line of `/proc/PID/maps` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    /// `r-xp` and the like.
    pub perms: String,
    /// File offset of `start`.
    pub offset: u64,
    /// `major:minor` in hex, as the maps file writes it.
    pub dev: String,
    pub inode: u64,
    /// A path (maybe ending in ` (deleted)`), a pseudo-name like `[vdso]`, or empty for
    /// anonymous memory.
    pub name: String,
}

/// What a mapping maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MappedObject {
    /// A file, by the path the kernel reports (may end in " (deleted)").
    File(PathBuf),
    /// The kernel's vDSO image.
    Vdso,
    /// Anonymous memory, or a pseudo-file other than the vDSO (`[heap]`, JIT code).
    Anonymous(String),
}

impl MapsEntry {
    pub fn is_executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    /// The device as the kernel numbers it inside (`major << 20 | minor`, a
    /// superblock's `s_dev`), from `dev`; `None` if `dev` is not `major:minor`.
    pub fn kernel_dev(&self) -> Option<u64> {
        let (major, minor) = self.dev.split_once(':')?;
        let major = u64::from_str_radix(major, 16).ok()?;
        let minor = u64::from_str_radix(minor, 16).ok()?;
        (minor < 1 << 20).then_some(major << 20 | minor)
    }

    pub fn object(&self) -> MappedObject {
        if self.name == "[vdso]" {
            MappedObject::Vdso
        } else if self.name.starts_with('/') {
            MappedObject::File(PathBuf::from(&self.name))
        } else {
            MappedObject::Anonymous(self.name.clone())
        }
    }
}

/// Parses `/proc/PID/maps` text; lines that do not parse are skipped.
pub fn parse_maps(text: &str) -> Vec<MapsEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MapsEntry> {
    // start-end perms offset dev inode [name]; the name may contain spaces.
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.to_string();
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let dev = fields.next()?.to_string();
    let inode = fields.next()?.parse().ok()?;
    Some(MapsEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms,
        offset,
        dev,
        inode,
        name: fields.next().unwrap_or("").trim_start().to_string(),
    })
}

/// The executable mappings of process `pid` in user space, in address order: asked of
/// the kernel one by one (PROCMAP_QUERY, Linux 6.11+) where it can, else parsed from
/// `/proc/PID/maps`. The query skips formatting every mapping of the process as text,
/// which is most of the cost of reading them. `[vsyscall]` lives in the kernel half and
/// is left out: no user pc is ever there.
pub fn executable_mappings(pid: u32) -> io::Result<Vec<MapsEntry>> {
    let mut file = File::open(format!("/proc/{pid}/maps"))?;
    if let Some(mappings) = query_executable(&file) {
        return Ok(mappings);
    }
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(parse_maps(&text)
        .into_iter()
        .filter(|m| m.is_executable() && m.end <= USER_ADDRESS_END)
        .collect())
}

/// The files process `pid` maps, in address order, each once (deleted files left out).
pub fn mapped_files(pid: u32) -> io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in parse_maps(&text) {
        if !entry.name.starts_with('/') || entry.name.ends_with(" (deleted)") {
            continue;
        }
        let path = PathBuf::from(entry.name);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    Ok(files)
}

/// The state letter of process `pid` (`R`, `S`, `T` for stopped, `Z` for a zombie...),
/// `None` once it is gone.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": comm may hold any byte, so the state follows the last ')'.
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// `struct procmap_query` of linux/fs.h.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// _IOWR('f', 17, struct procmap_query)
const PROCMAP_QUERY: libc::c_ulong = (3 << 30)
    | ((size_of::<ProcmapQuery>() as libc::c_ulong) << 16)
    | ((b'f' as libc::c_ulong) << 8)
    | 17;
const PROCMAP_QUERY_VMA_READABLE: u64 = 0x01;
const PROCMAP_QUERY_VMA_WRITABLE: u64 = 0x02;
const PROCMAP_QUERY_VMA_EXECUTABLE: u64 = 0x04;
const PROCMAP_QUERY_VMA_SHARED: u64 = 0x08;
const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;

/// The executable mappings through PROCMAP_QUERY on an open `/proc/PID/maps`;
/// None where the query does not answer (a kernel without it, above all): the
/// maps text is read instead.
fn query_executable(maps: &File) -> Option<Vec<MapsEntry>> {
    let mut mappings = Vec::new();
    let mut name = vec![0u8; libc::PATH_MAX as usize];
    let mut address = 0;
    while address < USER_ADDRESS_END {
        let mut query = ProcmapQuery {
            size: size_of::<ProcmapQuery>() as u64,
            query_flags: PROCMAP_QUERY_COVERING_OR_NEXT_VMA | PROCMAP_QUERY_VMA_EXECUTABLE,
            query_addr: address,
            vma_name_size: name.len() as u32,
            vma_name_addr: name.as_mut_ptr() as u64,
            ..ProcmapQuery::default()
        };
        // SAFETY: the kernel reads and writes `query` (its size in `size`) and writes
        // at most vma_name_size bytes at vma_name_addr, a buffer that outlives the call.
        if unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY, &mut query) } != 0 {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                // No executable mapping at or after `address`.
                Some(libc::ENOENT) => Some(mappings),
                // A kernel without the query, a name longer than the buffer, or
                // anything else the maps text may still answer.
                _ => None,
            };
        }
        if query.vma_end > USER_ADDRESS_END {
            break;
        }
        // The name's size counts its terminating NUL; 0 when the mapping has none.
        let len = (query.vma_name_size as usize)
            .saturating_sub(1)
            .min(name.len());
        let flag = |bit, letter| {
            if query.vma_flags & bit != 0 {
                letter
            } else {
                '-'
            }
        };
        let perms: String = [
            flag(PROCMAP_QUERY_VMA_READABLE, 'r'),
            flag(PROCMAP_QUERY_VMA_WRITABLE, 'w'),
            flag(PROCMAP_QUERY_VMA_EXECUTABLE, 'x'),
            if query.vma_flags & PROCMAP_QUERY_VMA_SHARED != 0 {
                's'
            } else {
                'p'
            },
        ]
        .into_iter()
        .collect();
        mappings.push(MapsEntry {
            start: query.vma_start,
            end: query.vma_end,
            perms,
            offset: query.vma_offset,
            dev: format!("{:02x}:{:02x}", query.dev_major, query.dev_minor),
            inode: query.inode,
            name: String::from_utf8_lossy(&name[..len]).into_owned(),
        });
        address = query.vma_end;
    }
    Some(mappings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_line_and_names_objects() {
        let text = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 fe:01 123 /usr/bin/prog
55d0c8a01000-55d0c8a02000 r-xp 00001000 fe:01 123 /usr/bin/prog
7f0000000000-7f0000001000 r-xp 00000000 00:00 0 [vdso]
7f0000002000-7f0000003000 rwxp 00000000 00:00 0 
7f0000004000-7f0000005000 r-xp 00028000 fe:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
55d0c0a05000-55d0c0a09000 r-xp 00005000 08:01 1234                       /usr/bin/my prog
garbage
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 7);
        assert_eq!(maps[6].name, "/usr/bin/my prog");
        assert!(!maps[0].is_executable() && maps[1].is_executable());
        assert_eq!(maps[1].start, 0x55d0c8a01000);
        assert_eq!(maps[1].offset, 0x1000);
        assert_eq!(maps[1].dev, "fe:01");
        assert_eq!(maps[1].kernel_dev(), Some(0xfe << 20 | 1));
        assert_eq!(maps[1].object(), MappedObject::File("/usr/bin/prog".into()));
        assert_eq!(maps[2].object(), MappedObject::Vdso);
        assert_eq!(maps[3].object(), MappedObject::Anonymous(String::new()));
        assert_eq!(maps[4].inode, 77);
        assert_eq!(maps[5].name, "[vsyscall]");
    }

    /// The kernel's answers to PROCMAP_QUERY are the executable user lines of the maps
    /// file, field for field.
    #[test]
    fn query_agrees_with_the_maps_text() {
        let file = File::open("/proc/self/maps").unwrap();
        let Some(queried) = query_executable(&file) else {
            eprintln!("SKIPPED query_agrees_with_the_maps_text: no PROCMAP_QUERY in this kernel");
            return;
        };
        let parsed: Vec<MapsEntry> =
            parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap())
                .into_iter()
                .filter(|m| m.is_executable() && m.end <= USER_ADDRESS_END)
                .collect();
        assert!(parsed.len() >= 2, "{parsed:?}");
        assert_eq!(queried, parsed);
    }

    #[test]
    fn our_own_state_and_files() {
        assert!(matches!(process_state(std::process::id()), Some('R' | 'S')));
        assert_eq!(process_state(u32::MAX), None);
        let exe = std::env::current_exe().unwrap();
        assert!(mapped_files(std::process::id()).unwrap().contains(&exe));
    }
}
