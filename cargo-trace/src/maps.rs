//! The executable mappings of a process, with the load bias of each ELF object.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use anyhow::{Context, Result};
use object::{Object, ObjectSegment};

/// One executable mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub dev: String,
    pub inode: u64,
    pub object: MappedObject,
}

/// What is mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MappedObject {
    /// A file, by the path the kernel reports (may be " (deleted)").
    File(PathBuf),
    /// The kernel's vDSO image.
    Vdso,
    /// Anonymous executable memory (JIT code): no unwind table.
    Anonymous(String),
}

/// Where x86-64 user space ends (with 5-level paging; 4-level ends lower).
const USER_ADDRESS_END: u64 = 1 << 56;

/// The executable mappings of process `pid`: asked of the kernel one by one
/// (PROCMAP_QUERY, Linux 6.11+) where it can, else parsed from `/proc/PID/maps`.
/// The query skips formatting every mapping of the process as text, which is
/// most of the cost of registering a process (twice per exec of a child).
pub fn executable_mappings(pid: u32) -> Result<Vec<ExecMapping>> {
    let path = format!("/proc/{pid}/maps");
    let mut file = File::open(&path).with_context(|| format!("reading {path}"))?;
    if let Some(mappings) = query_executable(&file) {
        return Ok(mappings);
    }
    let mut text = String::new();
    file.read_to_string(&mut text)
        .with_context(|| format!("reading {path}"))?;
    Ok(parse_maps(&text))
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
const PROCMAP_QUERY_VMA_EXECUTABLE: u64 = 0x04;
const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;

/// The executable mappings through PROCMAP_QUERY on an open `/proc/PID/maps`;
/// None where the query does not answer (a kernel without it, above all): the
/// maps text is read instead.
fn query_executable(maps: &File) -> Option<Vec<ExecMapping>> {
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
            let error = std::io::Error::last_os_error();
            return match error.raw_os_error() {
                // No executable mapping at or after `address`.
                Some(libc::ENOENT) => Some(mappings),
                // A kernel without the query, a name longer than the buffer, or
                // anything else the maps text may still answer.
                _ => None,
            };
        }
        // The name's size counts its terminating NUL; 0 when the mapping has none.
        let len = (query.vma_name_size as usize)
            .saturating_sub(1)
            .min(name.len());
        let text = String::from_utf8_lossy(&name[..len]);
        if query.vma_end > USER_ADDRESS_END {
            break;
        }
        mappings.push(ExecMapping {
            start: query.vma_start,
            end: query.vma_end,
            offset: query.vma_offset,
            dev: format!("{:02x}:{:02x}", query.dev_major, query.dev_minor),
            inode: query.inode,
            object: mapped_object(&text),
        });
        address = query.vma_end;
    }
    Some(mappings)
}

fn parse_maps(text: &str) -> Vec<ExecMapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<ExecMapping> {
    // start-end perms offset dev inode [path]
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let dev = fields.next()?.to_string();
    let inode = fields.next()?.parse().ok()?;
    let name = fields.next().unwrap_or("").trim_start();
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    // [vsyscall] lives in the kernel half: no user pc is ever there, and the
    // BPF program's mapping search relies on user addresses being below 2^63.
    if end > USER_ADDRESS_END {
        return None;
    }
    Some(ExecMapping {
        start,
        end,
        offset,
        dev,
        inode,
        object: mapped_object(name),
    })
}

/// What a mapping named `name` (as /proc/PID/maps names it) maps.
fn mapped_object(name: &str) -> MappedObject {
    if name == "[vdso]" {
        MappedObject::Vdso
    } else if name.starts_with('/') {
        MappedObject::File(PathBuf::from(name))
    } else {
        MappedObject::Anonymous(name.to_string())
    }
}

/// The load bias (runtime address - ELF virtual address) of an ELF whose
/// executable mapping starts at `start` from file offset `offset`. The mapping
/// belongs to the executable PT_LOAD segment whose page-aligned file range holds
/// `offset`; linkers like lld give each segment its own vaddr-offset delta, so
/// the segment must be the right one.
pub fn load_bias(elf: &object::File<'_>, start: u64, offset: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    elf.segments().find_map(|segment| {
        let executable = match segment.flags() {
            object::SegmentFlags::Elf { p_flags } => p_flags & object::elf::PF_X != 0,
            _ => true,
        };
        let (file_start, file_size) = segment.file_range();
        let aligned_start = file_start & !(PAGE - 1);
        let contains = aligned_start <= offset && offset < file_start + file_size;
        (executable && contains).then(|| {
            // Runtime address of file offset `o` is start + (o - offset); its
            // virtual address is p_vaddr + (o - p_offset).
            start
                .wrapping_sub(offset)
                .wrapping_add(file_start)
                .wrapping_sub(segment.address())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_executable_lines_only() {
        let text = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 fe:01 123 /usr/bin/prog
55d0c8a01000-55d0c8a02000 r-xp 00001000 fe:01 123 /usr/bin/prog
7f0000000000-7f0000001000 r-xp 00000000 00:00 0 [vdso]
7f0000002000-7f0000003000 rwxp 00000000 00:00 0 
7f0000004000-7f0000005000 r-xp 00028000 fe:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 4);
        assert_eq!(maps[0].start, 0x55d0c8a01000);
        assert_eq!(maps[0].offset, 0x1000);
        assert_eq!(maps[0].object, MappedObject::File("/usr/bin/prog".into()));
        assert_eq!(maps[1].object, MappedObject::Vdso);
        assert_eq!(maps[2].object, MappedObject::Anonymous(String::new()));
        assert_eq!(maps[3].inode, 77);
    }

    /// The kernel's answers to PROCMAP_QUERY are the executable lines of the maps
    /// file, field for field.
    #[test]
    fn query_agrees_with_the_maps_text() {
        let file = File::open("/proc/self/maps").unwrap();
        let Some(queried) = query_executable(&file) else {
            eprintln!("SKIPPED query_agrees_with_the_maps_text: no PROCMAP_QUERY in this kernel");
            return;
        };
        let parsed = parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
        assert!(parsed.len() >= 2, "{parsed:?}");
        assert_eq!(queried, parsed);
    }

    #[test]
    fn bias_of_our_own_text() {
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        let maps = executable_mappings(std::process::id()).unwrap();
        let ours = maps
            .iter()
            .find(|m| m.object == MappedObject::File(exe.clone()))
            .expect("our text is mapped");
        let bias = load_bias(&elf, ours.start, ours.offset).unwrap();
        let here = bias_of_our_own_text as *const () as u64;
        let symbol = elf
            .symbols()
            .find(|s| {
                use object::ObjectSymbol;
                s.name()
                    .is_ok_and(|n| n.contains("20bias_of_our_own_text17h"))
            })
            .expect("symbol present");
        use object::ObjectSymbol;
        assert_eq!(symbol.address() + bias, here);
    }
}
