//! Function symbols of an ELF file with their sizes, for addresses DWARF does
//! not cover: a pc inside a sized symbol is that function (a label of size 0 runs to
//! the next symbol of its section); a pc in a PLT section is a PLT stub; anything else
//! is unknown rather than the nearest symbol below it (which would name, say, `_init`
//! for every PLT call).

use std::ops::Range;
use std::path::Path;

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

/// What the symbol table says about an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SymbolHit<'a> {
    Function(&'a str),
    Plt,
}

/// The sized function symbols (`.symtab` and `.dynsym`) and PLT sections of one file.
#[derive(Debug, Default)]
pub struct ElfSymbols {
    /// `(start, end, raw name)` of the sized symbols, sorted by start.
    functions: Vec<(u64, u64, String)>,
    /// The same for the symbols of size 0, each running to the next symbol.
    labels: Vec<(u64, u64, String)>,
    plt: Vec<Range<u64>>,
}

impl ElfSymbols {
    pub fn load(path: &Path) -> Option<ElfSymbols> {
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: a read-only private map of a file we only read.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let elf = object::File::parse(&*map).ok()?;
        Some(ElfSymbols::from_object(&elf))
    }

    pub fn from_object(elf: &object::File<'_>) -> ElfSymbols {
        let executable = |section: &object::Section<'_, '_>| match section.flags() {
            object::SectionFlags::Elf { sh_flags } => {
                sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0
            }
            _ => false,
        };
        // (start, size, name, end of its section): functions, and the untyped labels
        // hand-written assembly leaves in code (ld.so's _start, _dl_start_user).
        let mut symbols: Vec<(u64, u64, String, u64)> = elf
            .symbols()
            .chain(elf.dynamic_symbols())
            .filter_map(|symbol| {
                let section = elf.section_by_index(symbol.section_index()?).ok()?;
                let code = match symbol.kind() {
                    SymbolKind::Text => true,
                    SymbolKind::Unknown => executable(&section),
                    _ => false,
                };
                let name = symbol.name().ok().filter(|name| code && !name.is_empty())?;
                let section_end = section.address() + section.size();
                Some((
                    symbol.address(),
                    symbol.size(),
                    name.to_string(),
                    section_end,
                ))
            })
            .collect();
        // Aliases share a start: keep one, the widest (then the first: .symtab's,
        // which names static functions precisely).
        symbols.sort_by_key(|&(start, size, _, _)| (start, std::cmp::Reverse(size)));
        symbols.dedup_by_key(|(start, _, _, _)| *start);
        // A symbol of size 0 (assembly often leaves one: ld.so's _start, libc's
        // __restore_rt) is a label: it runs to the next symbol, within its section, and
        // names only what no sized symbol covers.
        let mut functions = Vec::new();
        let mut labels = Vec::new();
        for index in 0..symbols.len() {
            let (start, size, ref name, section_end) = symbols[index];
            if size > 0 {
                functions.push((start, start + size, name.clone()));
            } else {
                let next = symbols.get(index + 1).map_or(section_end, |next| next.0);
                labels.push((start, next.min(section_end).max(start + 1), name.clone()));
            }
        }
        let plt = elf
            .sections()
            .filter(|section| {
                matches!(
                    section.name(),
                    Ok(".plt" | ".plt.sec" | ".plt.got" | ".iplt")
                )
            })
            .map(|section| section.address()..section.address() + section.size())
            .collect();
        ElfSymbols {
            functions,
            labels,
            plt,
        }
    }

    /// The function whose symbol covers `address` (a sized one, else a label), or the PLT.
    pub fn lookup(&self, address: u64) -> Option<SymbolHit<'_>> {
        if let Some(name) =
            covering(&self.functions, address).or_else(|| covering(&self.labels, address))
        {
            return Some(SymbolHit::Function(name));
        }
        self.plt
            .iter()
            .any(|range| range.contains(&address))
            .then_some(SymbolHit::Plt)
    }
}

/// The name of the symbol of `symbols` (sorted by start) whose range holds `address`.
fn covering(symbols: &[(u64, u64, String)], address: u64) -> Option<&str> {
    let index = symbols.partition_point(|&(start, _, _)| start <= address);
    let (_, end, name) = &symbols[index.checked_sub(1)?];
    (address < *end).then_some(name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_symbols_plt_and_gaps() {
        let symbols = ElfSymbols {
            functions: vec![(0x1000, 0x1010, "a".into()), (0x1020, 0x1030, "b".into())],
            labels: vec![
                (0x1008, 0x1020, "in_a".into()),
                (0x1040, 0x1050, "c".into()),
            ],
            plt: vec![0x500..0x600, 0x700..0x710],
        };
        assert_eq!(symbols.lookup(0x1000), Some(SymbolHit::Function("a")));
        assert_eq!(symbols.lookup(0x100f), Some(SymbolHit::Function("a")));
        // A label names what no sized symbol covers, up to the next symbol.
        assert_eq!(symbols.lookup(0x1009), Some(SymbolHit::Function("a")));
        assert_eq!(symbols.lookup(0x1010), Some(SymbolHit::Function("in_a")));
        assert_eq!(symbols.lookup(0x104f), Some(SymbolHit::Function("c")));
        assert_eq!(symbols.lookup(0x1050), None);
        assert_eq!(symbols.lookup(0x1025), Some(SymbolHit::Function("b")));
        assert_eq!(symbols.lookup(0x550), Some(SymbolHit::Plt));
        assert_eq!(symbols.lookup(0x10), None);
        assert_eq!(symbols.lookup(0x70f), Some(SymbolHit::Plt));
    }

    #[test]
    fn libc_malloc_is_found_by_its_dynamic_symbol() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let symbols = ElfSymbols::load(libc).expect("libc parses");
        let bytes = std::fs::read(libc).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        let malloc = elf
            .dynamic_symbols()
            .find(|s| s.name() == Ok("malloc"))
            .expect("malloc is exported");
        match symbols.lookup(malloc.address() + 1) {
            Some(SymbolHit::Function(name)) => assert!(name.contains("malloc"), "{name}"),
            other => panic!("{other:?}"),
        }
    }
}
