//! Function names from ELF symbol tables, for checking walked stacks.
//!
//! Deliberately simpler than cargo-trace's symbolizer (no DWARF, no inline
//! frames): a test that checks the unwinder should not depend on the code it
//! will later check too. Sources: the object's `.symtab` and `.dynsym`, and the
//! `.symtab` of its separate debug file (Debian's `libc6-dbg` provides libc's),
//! found as unwind-tables finds it. Names are demangled as everywhere else in the
//! project ([`process_image::demangle`]): Rust without its hash (`chains::recurse`).

use std::collections::BTreeMap;
use std::path::Path;

use object::{Object, ObjectSymbol, SymbolKind};

/// The function symbols of one object, by ELF virtual address.
#[derive(Clone, Debug, Default)]
pub struct Symbols {
    /// `(start, end)` → every name of a function symbol with exactly that range.
    functions: BTreeMap<(u64, u64), Vec<String>>,
    /// Every function symbol's address by name, sized or not (`__restore_rt` has size 0).
    addresses: BTreeMap<String, u64>,
    /// A separate debug file contributed symbols.
    pub has_debug_file: bool,
}

impl Symbols {
    /// Reads `file`'s symbols and, when it was read from `path` and has a separate
    /// debug file in the system's debug directories, that file's too.
    pub fn from_elf(file: &object::File<'_>, path: Option<&Path>) -> Symbols {
        let mut symbols = Symbols::default();
        symbols.add(file);
        let search = unwind_tables::DebugSearch::default();
        if let Some(path) = path.and_then(|path| unwind_tables::find_debug_file_path(path, &search))
        {
            if let Ok(data) = std::fs::read(&path) {
                if let Ok(debug) = object::File::parse(&*data) {
                    symbols.add(&debug);
                    symbols.has_debug_file = true;
                }
            }
        }
        symbols
    }

    fn add(&mut self, file: &object::File<'_>) {
        for symbol in file.symbols().chain(file.dynamic_symbols()) {
            if symbol.kind() != SymbolKind::Text || symbol.is_undefined() {
                continue;
            }
            let Ok(raw) = symbol.name() else { continue };
            // Versioned dynamic names (`raise@@GLIBC_2.2.5`) are plain names here.
            let raw = raw.split('@').next().unwrap_or(raw);
            let name = process_image::demangle(raw);
            self.addresses
                .entry(name.clone())
                .or_insert(symbol.address());
            if symbol.size() == 0 {
                continue;
            }
            let names = self
                .functions
                .entry((symbol.address(), symbol.address() + symbol.size()))
                .or_default();
            if !names.contains(&name) {
                names.push(name);
                names.sort();
            }
        }
    }

    /// The names of the innermost (latest-starting) function symbol whose
    /// range contains ELF address `addr`; empty when none does.
    pub fn names_at(&self, addr: u64) -> Vec<String> {
        self.functions
            .range(..=(addr, u64::MAX))
            .rev()
            .find(|((start, end), _)| *start <= addr && addr < *end)
            .map(|(_, names)| names.clone())
            .unwrap_or_default()
    }

    /// The ELF address of the function named `name` (also one without a size).
    pub fn address_of(&self, name: &str) -> Option<u64> {
        self.addresses.get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn innermost_symbol_wins() {
        let mut symbols = Symbols::default();
        symbols
            .functions
            .insert((0x1000, 0x1100), vec!["outer".into()]);
        symbols
            .functions
            .insert((0x1040, 0x1060), vec!["inner".into(), "inner_alias".into()]);
        symbols.addresses.insert("inner_alias".into(), 0x1040);
        symbols
            .functions
            .insert((0x1200, 0x1300), vec!["next".into()]);
        assert_eq!(symbols.names_at(0x1000), ["outer"]);
        assert_eq!(symbols.names_at(0x1050), ["inner", "inner_alias"]);
        assert_eq!(symbols.names_at(0x1060), ["outer"]);
        assert!(symbols.names_at(0x1100).is_empty());
        assert!(symbols.names_at(0xfff).is_empty());
        assert_eq!(symbols.names_at(0x12ff), ["next"]);
        assert_eq!(symbols.address_of("inner_alias"), Some(0x1040));
    }
}
