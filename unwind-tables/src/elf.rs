//! What the compiler needs from an ELF file: its CFI sections, where its code is, and how
//! to find its separate debug file.

use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
use object::{CompressionFormat, Object, ObjectSection, SectionFlags};

use crate::error::Error;

type Elf<'data> = ElfFile64<'data, object::LittleEndian>;

/// The most a compressed section may claim to expand (deflate's bound is about 1032:1).
const MAX_COMPRESSION_RATIO: u64 = 1032;

/// A CFI section: its bytes and the virtual address they are loaded at (pc-relative
/// pointers in `.eh_frame` are relative to it).
pub(crate) struct CfiSection<'data> {
    pub address: u64,
    pub data: Cow<'data, [u8]>,
}

/// The parts of one ELF file the compiler reads.
pub(crate) struct ElfInput<'data> {
    pub build_id: Option<&'data [u8]>,
    pub debuglink: Option<(&'data [u8], u32)>,
    pub eh_frame: Option<CfiSection<'data>>,
    pub eh_frame_hdr_address: Option<u64>,
    pub text_address: Option<u64>,
    pub got_address: Option<u64>,
    pub debug_frame: Option<CfiSection<'data>>,
    /// Executable address ranges, sorted and disjoint. CFI outside them describes no code
    /// a pc can be in (typically FDEs of discarded sections, tombstoned at address 0).
    pub code: Vec<Range<u64>>,
    /// `e_entry`: where a process running this file starts (0 if it has none).
    pub entry: u64,
    /// The bytes of the executable sections, at their addresses (code no CFI describes is
    /// read from them: see `prologue`).
    pub code_bytes: Vec<(u64, &'data [u8])>,
}

/// Checks the ELF identification before handing the bytes to `object`, so that a 32-bit or
/// big-endian file gets a clear error instead of a confusing header-size one.
fn check_ident(data: &[u8]) -> Result<(), Error> {
    // e_ident: 4 magic bytes, then EI_CLASS at 4 and EI_DATA at 5.
    let ident = data.get(..6).ok_or(Error::NotElf("file too short"))?;
    if ident[..4] != elf::ELFMAG {
        return Err(Error::NotElf("bad magic"));
    }
    match (ident[4], ident[5]) {
        (elf::ELFCLASS64, elf::ELFDATA2LSB) => Ok(()),
        (elf::ELFCLASS32, _) => Err(Error::UnsupportedArchitecture("32-bit ELF".into())),
        (_, elf::ELFDATA2MSB) => Err(Error::UnsupportedArchitecture("big-endian ELF".into())),
        _ => Err(Error::NotElf("bad class or data encoding")),
    }
}

fn machine_name(machine: u16) -> String {
    let name = match machine {
        elf::EM_386 => "i386",
        elf::EM_ARM => "arm",
        elf::EM_AARCH64 => "aarch64",
        elf::EM_RISCV => "riscv",
        elf::EM_PPC64 => "ppc64",
        elf::EM_S390 => "s390",
        elf::EM_LOONGARCH => "loongarch",
        elf::EM_BPF => "bpf",
        _ => return format!("e_machine {machine}"),
    };
    name.to_string()
}

fn parse_x86_64(data: &[u8]) -> Result<Elf<'_>, Error> {
    check_ident(data)?;
    let file = Elf::parse(data)?;
    let machine = file.elf_header().e_machine(file.endian());
    if machine != elf::EM_X86_64 {
        return Err(Error::UnsupportedArchitecture(machine_name(machine)));
    }
    Ok(file)
}

/// The build-id of an x86-64 ELF file, reading nothing else (the cache's fast path).
pub(crate) fn build_id(data: &[u8]) -> Result<Option<&[u8]>, Error> {
    Ok(parse_x86_64(data)?.build_id()?)
}

/// Parses an x86-64 ELF file. Errors for anything else.
pub(crate) fn parse(data: &[u8]) -> Result<ElfInput<'_>, Error> {
    let file = parse_x86_64(data)?;

    let section = |name: &str, compressed_ok: bool| -> Result<Option<CfiSection<'_>>, Error> {
        let Some(section) = file.section_by_name(name) else {
            return Ok(None);
        };
        // NOBITS sections (as in a separate debug file's .eh_frame) have no data: absent.
        let data = if compressed_ok {
            let compressed = section.compressed_data()?;
            // The header's uncompressed size is allocated up front: a corrupt or crafted
            // one must not make us reserve gigabytes. Deflate expands at most ~1032:1, and
            // real zstd CFI compresses far less than that.
            let limit = (compressed.data.len() as u64)
                .saturating_mul(MAX_COMPRESSION_RATIO)
                .saturating_add(4096);
            if compressed.format != CompressionFormat::None && compressed.uncompressed_size > limit
            {
                return Err(Error::CompressedSize {
                    section: name.to_string(),
                    size: compressed.uncompressed_size,
                    compressed: compressed.data.len() as u64,
                });
            }
            compressed.decompress()?
        } else {
            Cow::Borrowed(section.data()?)
        };
        if data.is_empty() {
            return Ok(None);
        }
        Ok(Some(CfiSection {
            address: section.address(),
            data,
        }))
    };
    let address = |name: &str| file.section_by_name(name).map(|section| section.address());

    Ok(ElfInput {
        build_id: file.build_id()?,
        // A malformed .gnu_debuglink only loses the debug-file fallback.
        debuglink: file.gnu_debuglink().ok().flatten(),
        eh_frame: section(".eh_frame", false)?,
        eh_frame_hdr_address: address(".eh_frame_hdr"),
        text_address: address(".text"),
        got_address: address(".got"),
        debug_frame: section(".debug_frame", true)?,
        code: code_ranges(&file),
        entry: file.entry(),
        code_bytes: code_bytes(&file),
    })
}

fn code_bytes<'data>(file: &Elf<'data>) -> Vec<(u64, &'data [u8])> {
    file.sections()
        .filter(|section| match section.flags() {
            SectionFlags::Elf { sh_flags } => {
                let wanted = u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR);
                sh_flags & wanted == wanted
            }
            _ => false,
        })
        .filter_map(|section| Some((section.address(), section.data().ok()?)))
        .filter(|(_, data)| !data.is_empty())
        .collect()
}

fn code_ranges(file: &Elf<'_>) -> Vec<Range<u64>> {
    let endian = file.endian();
    let mut ranges: Vec<Range<u64>> = file
        .elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == elf::PT_LOAD && ph.p_flags(endian) & elf::PF_X != 0)
        .filter_map(|ph| {
            let start = ph.p_vaddr(endian);
            Some(start..start.checked_add(ph.p_memsz(endian))?)
        })
        .collect();
    if ranges.is_empty() {
        // No program headers (e.g. a relocatable object): executable sections instead.
        ranges = file
            .sections()
            .filter(|section| match section.flags() {
                SectionFlags::Elf { sh_flags } => {
                    let wanted = u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR);
                    sh_flags & wanted == wanted
                }
                _ => false,
            })
            .filter_map(|section| {
                let start = section.address();
                Some(start..start.checked_add(section.size())?)
            })
            .collect();
    }
    ranges.retain(|range| range.start < range.end);
    ranges.sort_by_key(|range| range.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    merged
}

/// Where to look for separate debug files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugSearch {
    /// Global debug directories, like gdb's `debug-file-directory`: searched for
    /// `.build-id/xx/rest.debug` and for `<dir of the file>/<debuglink name>`.
    pub debug_dirs: Vec<PathBuf>,
}

impl Default for DebugSearch {
    fn default() -> Self {
        DebugSearch {
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
        }
    }
}

impl DebugSearch {
    /// Searches nowhere: only the file's own CFI is used.
    pub fn none() -> Self {
        DebugSearch {
            debug_dirs: Vec::new(),
        }
    }

    /// Candidate paths for the debug file of `path`, most specific first: by build-id, then
    /// by `.gnu_debuglink` next to the file, in its `.debug/`, and under each debug dir.
    pub(crate) fn candidates(
        &self,
        path: &Path,
        build_id: Option<&[u8]>,
        debuglink: Option<&[u8]>,
    ) -> Vec<PathBuf> {
        let mut candidates = Vec::new();
        if let Some(id) = build_id.filter(|id| id.len() >= 2) {
            let hex = hex(id);
            for dir in &self.debug_dirs {
                candidates.push(
                    dir.join(".build-id")
                        .join(&hex[..2])
                        .join(format!("{}.debug", &hex[2..])),
                );
            }
        }
        let link = debuglink.and_then(|name| std::str::from_utf8(name).ok());
        // A debuglink is a file name; one with a slash would escape the search dirs.
        if let Some(link) = link.filter(|name| !name.is_empty() && !name.contains('/')) {
            let dir = path.parent().unwrap_or(Path::new("."));
            candidates.push(dir.join(link));
            candidates.push(dir.join(".debug").join(link));
            let absolute_dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            for debug_dir in &self.debug_dirs {
                let relative = absolute_dir.strip_prefix("/").unwrap_or(&absolute_dir);
                candidates.push(debug_dir.join(relative).join(link));
            }
        }
        candidates
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// CRC-32 (IEEE 802.3, reflected), the checksum `.gnu_debuglink` records.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut crc = i as u32;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
                bit += 1;
            }
            table[i] = crc;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &byte in data {
        crc = TABLE[((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}
