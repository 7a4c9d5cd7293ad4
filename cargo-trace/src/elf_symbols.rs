//! Function symbols of an ELF file with their sizes, for addresses DWARF does
//! not cover: a pc inside a sized symbol is that function; a pc in a PLT
//! section is a PLT stub; anything else is unknown rather than the nearest
//! symbol below it (which would name, say, `_init` for every PLT call).

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
    /// `(start, end, raw name)`, sorted by start.
    functions: Vec<(u64, u64, String)>,
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
        let mut functions: Vec<(u64, u64, String)> = elf
            .symbols()
            .chain(elf.dynamic_symbols())
            .filter(|symbol| symbol.kind() == SymbolKind::Text)
            .filter_map(|symbol| {
                let name = symbol.name().ok()?;
                // Assembly often leaves a size of 0 (e.g. libc's __restore_rt): such a
                // symbol names its first byte only.
                let size = symbol.size().max(1);
                Some((symbol.address(), symbol.address() + size, name.to_string()))
            })
            .collect();
        // Aliases share a start: keep one, the widest (then the first: .symtab's,
        // which names static functions precisely).
        functions.sort_by_key(|&(start, end, _)| (start, std::cmp::Reverse(end)));
        functions.dedup_by_key(|(start, _, _)| *start);
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
        ElfSymbols { functions, plt }
    }

    /// The function whose symbol covers `address`, or the PLT.
    pub fn lookup(&self, address: u64) -> Option<SymbolHit<'_>> {
        let index = self
            .functions
            .partition_point(|&(start, _, _)| start <= address);
        let covering = index
            .checked_sub(1)
            .map(|i| &self.functions[i])
            .filter(|&&(_, end, _)| address < end);
        if let Some((_, _, name)) = covering {
            return Some(SymbolHit::Function(name));
        }
        self.plt
            .iter()
            .any(|range| range.contains(&address))
            .then_some(SymbolHit::Plt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_symbols_plt_and_gaps() {
        let symbols = ElfSymbols {
            functions: vec![(0x1000, 0x1010, "a".into()), (0x1020, 0x1030, "b".into())],
            plt: vec![0x500..0x600, 0x700..0x710],
        };
        assert_eq!(symbols.lookup(0x1000), Some(SymbolHit::Function("a")));
        assert_eq!(symbols.lookup(0x100f), Some(SymbolHit::Function("a")));
        assert_eq!(symbols.lookup(0x1010), None);
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
