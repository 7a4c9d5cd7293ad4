//! What uprobe resolution needs from an ELF file: its function symbols, its loadable
//! segments (to turn a virtual address into the file offset the kernel wants) and its
//! USDT notes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use object::elf::{self, FileHeader64};
use object::read::elf::{FileHeader, ProgramHeader, Rela, SectionHeader, Sym};
use object::Endianness;

use crate::error::ResolveError;

/// A function symbol (STT_FUNC, STT_GNU_IFUNC, or an untyped symbol in code).
#[derive(Clone, Debug)]
pub(crate) struct Function {
    /// As stored: mangled for Rust and C++.
    pub name: String,
    pub address: u64,
    pub size: u64,
    /// From .dynsym rather than .symtab.
    pub dynamic: bool,
    /// A non-default symbol version (`malloc@GLIBC_2.2.5` beside `malloc@@GLIBC_2.34`).
    pub hidden_version: bool,
    /// STT_GNU_IFUNC: the address is that of a resolver, which returns the address of
    /// the implementation to call (chosen for the CPU by ld.so at relocation).
    pub ifunc: bool,
    /// At the address of an IFUNC (the IFUNC itself, or another name of its resolver).
    pub resolver: bool,
}

/// A PT_LOAD segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub filesz: u64,
    pub executable: bool,
}

/// One `.note.stapsdt` entry, addresses already adjusted for prelinking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UsdtNote {
    pub provider: String,
    pub name: String,
    pub pc: u64,
    /// 0: the probe has no semaphore.
    pub semaphore: u64,
}

#[derive(Debug)]
pub(crate) struct ElfInfo {
    pub path: PathBuf,
    pub functions: Vec<Function>,
    pub has_symtab: bool,
    pub segments: Vec<Segment>,
    pub usdt: Vec<UsdtNote>,
    /// `R_X86_64_IRELATIVE` relocations: (resolver address, address of the slot ld.so
    /// fills with what the resolver returns). The file's own calls to an IFUNC go
    /// through such a slot.
    pub irelative: Vec<(u64, u64)>,
    /// The file's bytes, for the code of the functions probed at an offset.
    pub data: Vec<u8>,
    /// [`ElfInfo::add_debug_file_symbols`] ran.
    pub debug_file_searched: bool,
}

impl ElfInfo {
    /// Reads and indexes `path`.
    pub fn load(path: &Path) -> Result<Self, ResolveError> {
        let data = std::fs::read(path).map_err(|source| ResolveError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut info = Self::parse(path, &data)?;
        info.data = data;
        Ok(info)
    }

    /// Marks every symbol at an IFUNC's address as a resolver: glibc names the resolver
    /// itself too (`strlen_ifunc`, a plain function at `strlen`'s address), and a
    /// pattern may pick that name for the address.
    fn mark_ifunc_aliases(&mut self) {
        let resolvers: HashSet<u64> = self
            .functions
            .iter()
            .filter(|f| f.ifunc)
            .map(|f| f.address)
            .collect();
        for function in &mut self.functions {
            function.resolver = resolvers.contains(&function.address);
        }
    }

    /// Adds the functions of the file's separate debug file (found by build-id or
    /// `.gnu_debuglink`, as the symbolizer finds it), whose .symtab names the static
    /// functions a stripped library's .dynsym lacks (`__strlen_evex`, `__GI_getppid`).
    /// Only for a file without .symtab, once: for libc it costs ~20 ms, 10-20 times
    /// what reading the library's own symbols does.
    pub fn add_debug_file_symbols(&mut self) {
        if self.has_symtab || self.debug_file_searched {
            return;
        }
        self.debug_file_searched = true;
        let search = unwind_tables::DebugSearch::default();
        let Some(debug_path) = unwind_tables::find_debug_file_path(&self.path, &search) else {
            return;
        };
        let Ok(data) = std::fs::read(&debug_path) else {
            return;
        };
        let Some(debug_functions) = symtab_functions(&data) else {
            return;
        };
        if debug_functions.is_empty() {
            return;
        }
        let mut seen: HashSet<(String, u64)> = self
            .functions
            .iter()
            .map(|f| (f.name.clone(), f.address))
            .collect();
        for function in debug_functions {
            if seen.insert((function.name.clone(), function.address)) {
                self.functions.push(function);
            }
        }
        self.has_symtab = true;
        self.mark_ifunc_aliases();
    }

    /// Indexes `data`, the contents of `path`; [`ElfInfo::data`] is left empty.
    pub fn parse(path: &Path, data: &[u8]) -> Result<Self, ResolveError> {
        if !data.starts_with(&elf::ELFMAG) {
            return Err(ResolveError::NotElf {
                path: path.to_path_buf(),
            });
        }
        // e_ident[EI_CLASS]
        if data.get(4) != Some(&elf::ELFCLASS64) {
            return Err(ResolveError::UnsupportedElf {
                path: path.to_path_buf(),
                reason: "it is a 32-bit ELF file; only 64-bit binaries are supported".into(),
            });
        }
        let malformed = |error: object::read::Error| ResolveError::UnsupportedElf {
            path: path.to_path_buf(),
            reason: format!("it is a malformed ELF file ({error})"),
        };
        let header = FileHeader64::<Endianness>::parse(data).map_err(malformed)?;
        let endian = header.endian().map_err(malformed)?;
        let sections = header.sections(endian, data).map_err(malformed)?;

        let segments = header
            .program_headers(endian, data)
            .map_err(malformed)?
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .map(|ph| Segment {
                vaddr: ph.p_vaddr(endian),
                memsz: ph.p_memsz(endian),
                offset: ph.p_offset(endian),
                filesz: ph.p_filesz(endian),
                executable: ph.p_flags(endian) & elf::PF_X != 0,
            })
            .collect();

        let mut functions = Vec::new();
        let mut seen = HashSet::new();
        let symtab = sections
            .symbols(endian, data, elf::SHT_SYMTAB)
            .map_err(malformed)?;
        let dynsym = sections
            .symbols(endian, data, elf::SHT_DYNSYM)
            .map_err(malformed)?;
        let versym = sections.gnu_versym(endian, data).map_err(malformed)?;
        let versions = versym.map_or(&[][..], |(versions, _)| versions);
        collect_functions(endian, &sections, &symtab, None, &mut seen, &mut functions);
        collect_functions(
            endian,
            &sections,
            &dynsym,
            Some(versions),
            &mut seen,
            &mut functions,
        );
        let irelative = irelative_slots(endian, data, &sections).map_err(malformed)?;

        let usdt = usdt_notes(endian, data, &sections).map_err(malformed)?;

        let mut info = ElfInfo {
            path: path.to_path_buf(),
            functions,
            has_symtab: !symtab.is_empty(),
            segments,
            usdt,
            irelative,
            data: Vec::new(),
            debug_file_searched: false,
        };
        info.mark_ifunc_aliases();
        Ok(info)
    }

    /// The bytes of the file from virtual address `address` to the end of the
    /// executable segment that holds it.
    pub fn code_from(&self, address: u64) -> Option<&[u8]> {
        let segment = self.segments.iter().find(|s| {
            s.executable && address >= s.vaddr && address - s.vaddr < s.filesz.min(s.memsz)
        })?;
        let start = usize::try_from(address - segment.vaddr + segment.offset).ok()?;
        let end = usize::try_from(segment.offset + segment.filesz.min(segment.memsz)).ok()?;
        self.data.get(start..end.min(self.data.len()))
    }

    /// The file offset of a virtual address, through the PT_LOAD segment holding it.
    /// `code`: only executable segments count.
    pub fn file_offset(&self, address: u64, code: bool) -> Option<u64> {
        self.segments
            .iter()
            .filter(|s| s.executable || !code)
            .find(|s| address >= s.vaddr && address - s.vaddr < s.filesz.min(s.memsz))
            .map(|s| address - s.vaddr + s.offset)
    }

    /// The function whose range holds `address`, and the offset into it.
    pub fn function_at(&self, address: u64) -> Option<(&Function, u64)> {
        self.functions
            .iter()
            .filter(|f| address >= f.address && address - f.address < f.size.max(1))
            .min_by_key(|f| (f.dynamic, f.hidden_version))
            .map(|f| (f, address - f.address))
    }
}

/// Appends the functions of symbol table `table` not `seen` yet (a .dynsym mostly
/// repeats the .symtab). `versions`: for a .dynsym, its `.gnu.version` entries (empty
/// when it has none).
fn collect_functions(
    endian: Endianness,
    sections: &SectionTable<'_>,
    table: &SymbolTable<'_>,
    versions: Option<&[elf::Versym<Endianness>]>,
    seen: &mut HashSet<(String, u64)>,
    functions: &mut Vec<Function>,
) {
    let dynamic = versions.is_some();
    let is_code_section = |index: usize| {
        sections
            .section(object::SectionIndex(index))
            .is_ok_and(|s| s.sh_flags(endian) & u64::from(elf::SHF_EXECINSTR) != 0)
    };
    for (index, sym) in table.enumerate() {
        let shndx = sym.st_shndx(endian);
        if shndx == elf::SHN_UNDEF || sym.st_value(endian) == 0 {
            continue;
        }
        let is_function = match sym.st_type() {
            elf::STT_FUNC | elf::STT_GNU_IFUNC => true,
            // Hand-written assembly often leaves code labels untyped.
            elf::STT_NOTYPE => shndx < elf::SHN_LORESERVE && is_code_section(usize::from(shndx)),
            _ => false,
        };
        if !is_function {
            continue;
        }
        let Ok(name) = table.symbol_name(endian, sym) else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        let name = String::from_utf8_lossy(name).into_owned();
        let address = sym.st_value(endian);
        if !seen.insert((name.clone(), address)) {
            continue;
        }
        let hidden_version = versions.is_some_and(|versions| {
            versions
                .get(index.0)
                .is_some_and(|v| v.0.get(endian) & elf::VERSYM_HIDDEN != 0)
        });
        functions.push(Function {
            name,
            address,
            size: sym.st_size(endian),
            dynamic,
            hidden_version,
            ifunc: sym.st_type() == elf::STT_GNU_IFUNC,
            resolver: sym.st_type() == elf::STT_GNU_IFUNC,
        });
    }
}

/// The functions of a separate debug file's .symtab (its code sections are empty, and
/// its .dynsym too).
fn symtab_functions(data: &[u8]) -> Option<Vec<Function>> {
    let header = FileHeader64::<Endianness>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, data).ok()?;
    let symtab = sections.symbols(endian, data, elf::SHT_SYMTAB).ok()?;
    let mut functions = Vec::new();
    collect_functions(
        endian,
        &sections,
        &symtab,
        None,
        &mut HashSet::new(),
        &mut functions,
    );
    Some(functions)
}

/// The `R_X86_64_IRELATIVE` relocations of every SHT_RELA section: (addend, which is
/// the resolver's address; offset, the slot's address).
fn irelative_slots(
    endian: Endianness,
    data: &[u8],
    sections: &SectionTable<'_>,
) -> object::read::Result<Vec<(u64, u64)>> {
    let mut slots = Vec::new();
    for section in sections.iter() {
        let Some((relocations, _)) = section.rela(endian, data)? else {
            continue;
        };
        for relocation in relocations {
            if relocation.r_type(endian, false) == elf::R_X86_64_IRELATIVE {
                slots.push((
                    relocation.r_addend(endian) as u64,
                    relocation.r_offset(endian),
                ));
            }
        }
    }
    Ok(slots)
}

type SymbolTable<'data> = object::read::elf::SymbolTable<'data, FileHeader64<Endianness>>;
type SectionTable<'data> = object::read::elf::SectionTable<'data, FileHeader64<Endianness>>;

/// Parses `.note.stapsdt` (the layout of systemtap's `<sys/sdt.h>`): per probe, the
/// probe's address, the link-time address of `.stapsdt.base`, the semaphore's address,
/// then provider, name and argument strings.
fn usdt_notes(
    endian: Endianness,
    data: &[u8],
    sections: &SectionTable<'_>,
) -> object::read::Result<Vec<UsdtNote>> {
    // Prelinking moves the binary; the note keeps the old base, the section the new one.
    let base = sections
        .section_by_name(endian, b".stapsdt.base")
        .map(|(_, s)| s.sh_addr(endian));
    let mut notes = Vec::new();
    for section in sections.iter() {
        if section.sh_type(endian) != elf::SHT_NOTE
            || sections.section_name(endian, section)? != b".note.stapsdt"
        {
            continue;
        }
        let Some(mut iter) = section.notes(endian, data)? else {
            continue;
        };
        while let Some(note) = iter.next()? {
            if note.name() != b"stapsdt" || note.n_type(endian) != 3 {
                continue;
            }
            if let Some(parsed) = parse_usdt_desc(note.desc(), endian, base) {
                notes.push(parsed);
            }
        }
    }
    Ok(notes)
}

fn parse_usdt_desc(desc: &[u8], endian: Endianness, base: Option<u64>) -> Option<UsdtNote> {
    let word = |i: usize| -> Option<u64> {
        let bytes: [u8; 8] = desc.get(i * 8..i * 8 + 8)?.try_into().ok()?;
        Some(match endian {
            Endianness::Little => u64::from_le_bytes(bytes),
            Endianness::Big => u64::from_be_bytes(bytes),
        })
    };
    let (mut pc, note_base, mut semaphore) = (word(0)?, word(1)?, word(2)?);
    if let Some(base) = base {
        pc = pc.wrapping_add(base).wrapping_sub(note_base);
        if semaphore != 0 {
            semaphore = semaphore.wrapping_add(base).wrapping_sub(note_base);
        }
    }
    let mut strings = desc.get(24..)?.split(|&b| b == 0);
    let provider = String::from_utf8_lossy(strings.next()?).into_owned();
    let name = String::from_utf8_lossy(strings.next()?).into_owned();
    Some(UsdtNote {
        provider,
        name,
        pc,
        semaphore,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usdt_desc_is_adjusted_for_prelinking() {
        let mut desc = Vec::new();
        desc.extend_from_slice(&0x1100u64.to_le_bytes());
        desc.extend_from_slice(&0x2000u64.to_le_bytes());
        desc.extend_from_slice(&0x4010u64.to_le_bytes());
        desc.extend_from_slice(b"prov\0name\0-4@%edi\0");
        let note = parse_usdt_desc(&desc, Endianness::Little, Some(0x3000)).unwrap();
        assert_eq!(
            note,
            UsdtNote {
                provider: "prov".into(),
                name: "name".into(),
                pc: 0x2100,
                semaphore: 0x5010,
            }
        );
        let note = parse_usdt_desc(&desc, Endianness::Little, None).unwrap();
        assert_eq!((note.pc, note.semaphore), (0x1100, 0x4010));
    }

    #[test]
    fn truncated_usdt_desc_is_skipped() {
        assert_eq!(parse_usdt_desc(&[0; 20], Endianness::Little, None), None);
    }

    #[test]
    fn not_elf_and_32_bit_are_refused() {
        let err = ElfInfo::parse(Path::new("/x"), b"#!/bin/sh\n").unwrap_err();
        assert!(matches!(err, ResolveError::NotElf { .. }), "{err}");
        let mut elf32 = b"\x7fELF".to_vec();
        elf32.extend_from_slice(&[1, 1, 1, 0]);
        elf32.resize(64, 0);
        let err = ElfInfo::parse(Path::new("/x"), &elf32).unwrap_err();
        assert!(err.to_string().contains("32-bit"), "{err}");
    }

    #[test]
    fn file_offsets_follow_load_segments() {
        let info = ElfInfo {
            path: PathBuf::from("/x"),
            functions: vec![],
            has_symtab: true,
            segments: vec![
                Segment {
                    vaddr: 0,
                    memsz: 0x1000,
                    offset: 0,
                    filesz: 0x1000,
                    executable: false,
                },
                Segment {
                    vaddr: 0x401000,
                    memsz: 0x2000,
                    offset: 0x1000,
                    filesz: 0x2000,
                    executable: true,
                },
            ],
            usdt: vec![],
            irelative: vec![],
            data: vec![],
            debug_file_searched: false,
        };
        assert_eq!(info.file_offset(0x401234, true), Some(0x1234));
        assert_eq!(info.file_offset(0x500, true), None);
        assert_eq!(info.file_offset(0x500, false), Some(0x500));
        assert_eq!(info.file_offset(0x403000, true), None);
    }
}
