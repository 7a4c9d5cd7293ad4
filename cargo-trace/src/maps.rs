//! The executable mappings of a process, with the load bias of each ELF object.

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

/// Parse the executable mappings of `/proc/PID/maps`.
pub fn executable_mappings(pid: u32) -> Result<Vec<ExecMapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("reading /proc/{pid}/maps"))?;
    Ok(parse_maps(&text))
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
    let object = if name == "[vdso]" {
        MappedObject::Vdso
    } else if name.starts_with('/') {
        MappedObject::File(PathBuf::from(name))
    } else {
        MappedObject::Anonymous(name.to_string())
    };
    Some(ExecMapping {
        start,
        end,
        offset,
        dev,
        inode,
        object,
    })
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
