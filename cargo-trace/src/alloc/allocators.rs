//! Which functions an `alloc` probe attaches, and where they are: the allocators known by
//! name (their functions and argument kinds, one table), and finding the one a process
//! uses.
//!
//! `alloc` alone probes libc and, when the executable carries an allocator of its own
//! (tikv-jemallocator links jemalloc statically with the `_rjem_` prefix, the mimalloc
//! crate links `mi_*`), that one too: blocks are paired by address, so allocators side by
//! side keep their blocks apart.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{bail, Context, Result};
use bpf_prog::AllocKind;
use object::{Object, ObjectSymbol, SymbolKind};
use probes::{ResolveError, UprobeLocation, UprobeSpec, UprobeTarget};

/// The malloc API's functions, by their standard names: libc's, and jemalloc's with or
/// without a prefix.
const MALLOC_API: &[(&str, AllocKind)] = &[
    ("malloc", AllocKind::SizeArg0),
    ("calloc", AllocKind::Calloc),
    ("realloc", AllocKind::Realloc),
    ("reallocarray", AllocKind::ReallocArray),
    ("free", AllocKind::Free),
    ("posix_memalign", AllocKind::PosixMemalign),
    ("aligned_alloc", AllocKind::SizeArg1),
    ("memalign", AllocKind::SizeArg1),
    ("valloc", AllocKind::SizeArg0),
    ("pvalloc", AllocKind::SizeArg0),
];

/// Anonymous memory mapped directly: its own kind of block (large Rust Vecs go there
/// through malloc, which is counted as malloc; these are the program's own mmaps).
const MMAP_API: &[(&str, AllocKind)] = &[
    ("mmap", AllocKind::Mmap),
    ("mmap64", AllocKind::Mmap),
    ("munmap", AllocKind::Munmap),
];

/// jemalloc's non-standard API. tikv-jemallocator's `GlobalAlloc` calls malloc, calloc and
/// realloc when the alignment is malloc's, mallocx (`MALLOCX_ZERO` for zeroed blocks)
/// and rallocx otherwise, and frees every block with sdallocx, whose size and flags
/// arguments are the block's (the size counted is the one tracked since its allocation).
/// xallocx resizes in place: see [`AllocKind::Xallocx`].
const JEMALLOC_API: &[(&str, AllocKind)] = &[
    ("mallocx", AllocKind::SizeArg0),
    ("rallocx", AllocKind::Realloc),
    ("xallocx", AllocKind::Xallocx),
    ("sdallocx", AllocKind::Free),
    ("dallocx", AllocKind::Free),
];

/// mimalloc's API, as the mimalloc crate and C programs call it. The crate's
/// `GlobalAlloc` calls mi_malloc_aligned, mi_zalloc_aligned, mi_realloc_aligned and
/// mi_free; the `_aligned_at` variants take their offset after the alignment, and
/// `mi_expand` grows in place or returns NULL (a realloc that failed).
const MIMALLOC_API: &[(&str, AllocKind)] = &[
    ("mi_malloc", AllocKind::SizeArg0),
    ("mi_zalloc", AllocKind::SizeArg0),
    ("mi_calloc", AllocKind::Calloc),
    ("mi_mallocn", AllocKind::Calloc),
    ("mi_realloc", AllocKind::Realloc),
    ("mi_reallocf", AllocKind::Realloc),
    ("mi_rezalloc", AllocKind::Realloc),
    ("mi_expand", AllocKind::Realloc),
    ("mi_reallocarray", AllocKind::ReallocArray),
    ("mi_reallocn", AllocKind::ReallocArray),
    ("mi_recalloc", AllocKind::ReallocArray),
    ("mi_malloc_aligned", AllocKind::SizeArg0),
    ("mi_malloc_aligned_at", AllocKind::SizeArg0),
    ("mi_zalloc_aligned", AllocKind::SizeArg0),
    ("mi_zalloc_aligned_at", AllocKind::SizeArg0),
    ("mi_calloc_aligned", AllocKind::Calloc),
    ("mi_calloc_aligned_at", AllocKind::Calloc),
    ("mi_realloc_aligned", AllocKind::Realloc),
    ("mi_realloc_aligned_at", AllocKind::Realloc),
    ("mi_rezalloc_aligned", AllocKind::Realloc),
    ("mi_rezalloc_aligned_at", AllocKind::Realloc),
    ("mi_free", AllocKind::Free),
    ("mi_free_size", AllocKind::Free),
    ("mi_free_aligned", AllocKind::Free),
    ("mi_free_size_aligned", AllocKind::Free),
];

/// The prefixes jemalloc's symbols carry: tikv-jemallocator's, jemalloc's own
/// `--with-jemalloc-prefix=je_` builds, and none.
const JEMALLOC_PREFIXES: &[&str] = &["_rjem_", "je_", ""];

/// The allocator an `alloc` probe names: `alloc`, `alloc:libc`, `alloc:jemalloc`,
/// `alloc:mimalloc`, `alloc:/path/lib.so` (the malloc API by its standard names there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allocator {
    /// libc, and the executable's own allocator if it has one.
    Auto,
    Libc,
    Jemalloc,
    Mimalloc,
    /// The malloc API (and jemalloc's, if there) in this binary.
    Binary(String),
}

impl Allocator {
    pub fn parse(name: Option<&str>) -> Result<Allocator> {
        Ok(match name {
            None | Some("") => Allocator::Auto,
            Some("libc") => Allocator::Libc,
            Some("jemalloc") => Allocator::Jemalloc,
            Some("mimalloc") => Allocator::Mimalloc,
            Some(path) if path.contains('/') || path.contains(".so") => {
                Allocator::Binary(path.to_string())
            }
            Some(other) => bail!(
                "unknown allocator '{other}' in 'alloc:{other}' (expected libc, jemalloc, \
                 mimalloc or the path of a library)"
            ),
        })
    }
}

/// Whether the executable at `path` carries an allocator of its own (jemalloc with a
/// prefix, mimalloc, or an unprefixed malloc linked in), or calls an allocator
/// library's own API (`mi_malloc`, `je_mallocx`): calls no wrapper of the malloc API
/// sees.
pub fn carries_allocator(path: &Path) -> Result<bool> {
    let (defined, imported) =
        functions(path).with_context(|| format!("reading the symbols of {}", path.display()))?;
    fn names<'a>(
        prefix: &'a str,
        api: &'static [(&str, AllocKind)],
    ) -> impl Iterator<Item = String> + 'a {
        api.iter().map(move |(name, _)| format!("{prefix}{name}"))
    }
    let allocators = JEMALLOC_PREFIXES
        .iter()
        .filter(|prefix| !prefix.is_empty())
        .flat_map(|prefix| names(prefix, JEMALLOC_API).chain(names(prefix, MALLOC_API)))
        .chain(names("", MIMALLOC_API))
        .chain(names("", JEMALLOC_API));
    let mut own = false;
    for name in allocators {
        own |= defined.contains(&name) || imported.contains(&name);
    }
    Ok(own || defined.contains("malloc"))
}

/// Every function of the allocators' tables by name, with its kind, and whether the name
/// is one of libc's (the malloc API unprefixed), which the preloaded library's wrappers
/// interpose where the dynamic linker binds it; the others are an allocator's own API,
/// which no wrapper reaches (the in-process recorder hooks them: `alloc::hooks`).
pub(crate) fn allocator_api() -> Vec<(String, AllocKind, bool)> {
    let libc_names = MALLOC_API
        .iter()
        .map(|&(name, kind)| (name.to_string(), kind, true));
    let prefixed = JEMALLOC_PREFIXES
        .iter()
        .filter(|prefix| !prefix.is_empty())
        .flat_map(|prefix| {
            MALLOC_API
                .iter()
                .map(move |&(name, kind)| (format!("{prefix}{name}"), kind, false))
        });
    let jemalloc = JEMALLOC_PREFIXES.iter().flat_map(|prefix| {
        JEMALLOC_API
            .iter()
            .map(move |&(name, kind)| (format!("{prefix}{name}"), kind, false))
    });
    let mimalloc = MIMALLOC_API
        .iter()
        .map(|&(name, kind)| (name.to_string(), kind, false));
    libc_names
        .chain(prefixed)
        .chain(jemalloc)
        .chain(mimalloc)
        .collect()
}

/// One function to probe: where, and how its arguments read.
#[derive(Clone, Debug)]
pub struct AllocFunction {
    pub target: UprobeTarget,
    pub kind: AllocKind,
}

/// An allocator found in one object: what it is, and the functions probed for it.
#[derive(Clone, Debug)]
pub struct ObjectAllocator {
    /// `libc`, `jemalloc`, `mimalloc`, or `malloc`: an object known only by the malloc
    /// API it defines.
    pub name: &'static str,
    /// The prefix of its functions' names (`_rjem_`, `je_`), if they have one.
    pub prefix: Option<String>,
    /// The object, as this process opens it.
    pub path: std::path::PathBuf,
    pub functions: Vec<AllocFunction>,
}

/// The functions [`resolve`] found, by the object carrying them, each object named as
/// the allocator its functions tell: libc by its file name, jemalloc by its own API,
/// mimalloc by its, any other by the malloc API it defines.
pub fn by_object(functions: Vec<AllocFunction>) -> Vec<ObjectAllocator> {
    let mut objects: Vec<ObjectAllocator> = Vec::new();
    for function in functions {
        match objects.iter_mut().find(|o| o.path == function.target.path) {
            Some(object) => object.functions.push(function),
            None => objects.push(ObjectAllocator {
                name: "malloc",
                prefix: None,
                path: function.target.path.clone(),
                functions: vec![function],
            }),
        }
    }
    for object in &mut objects {
        let symbols: Vec<&str> = object
            .functions
            .iter()
            .map(|f| f.target.symbol.split('+').next().unwrap_or(""))
            .collect();
        (object.name, object.prefix) = allocator_named(&object.path, &symbols);
    }
    objects
}

/// The allocator the functions `symbols` of the object at `path` tell, and their
/// prefix: libc by its file name, jemalloc by its own API, mimalloc by its, any other
/// by the malloc API it defines (`malloc`).
pub fn allocator_named(path: &Path, symbols: &[&str]) -> (&'static str, Option<String>) {
    let file = path
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("");
    if file.starts_with("libc.so") || file.starts_with("libc-") {
        return ("libc", None);
    }
    // The prefix a name of `api` carries in `symbols`, if one does.
    let prefix_in = |api: &[(&str, AllocKind)]| {
        symbols.iter().find_map(|symbol| {
            api.iter()
                .find_map(|(name, _)| symbol.strip_suffix(name))
                .map(|prefix| (!prefix.is_empty()).then(|| prefix.to_string()))
        })
    };
    if let Some(prefix) = prefix_in(JEMALLOC_API) {
        return ("jemalloc", prefix);
    }
    if prefix_in(MIMALLOC_API).is_some() {
        return ("mimalloc", None);
    }
    ("malloc", prefix_in(MALLOC_API).flatten())
}

/// The functions to probe for `allocator` in process `pid`. `prefix` (`--alloc-prefix`)
/// names the malloc API with a prefix in the executable, or in the library named.
pub fn resolve(
    allocator: &Allocator,
    prefix: Option<&str>,
    pid: u32,
) -> Result<Vec<AllocFunction>> {
    let mut found = entries(allocator, prefix, pid)?;
    for function in found.iter_mut().filter(|f| f.kind.frees_only()) {
        skip_null_test(&mut function.target)?;
    }
    move_to_emulated_instructions(&mut found)?;
    Ok(found)
}

/// The functions [`resolve`] finds, at their entries, where a hook takes them
/// (`alloc::hooks`): [`resolve`] then moves some probes past first instructions the
/// kernel would single-step.
pub fn entries(
    allocator: &Allocator,
    prefix: Option<&str>,
    pid: u32,
) -> Result<Vec<AllocFunction>> {
    let mut finder = Finder {
        pid,
        symbols: HashMap::new(),
        found: Vec::new(),
    };
    match allocator {
        Allocator::Auto => {
            if let Some(prefix) = prefix {
                finder.add_api(None, prefix, MALLOC_API)?;
                finder.add_api(None, prefix, JEMALLOC_API)?;
            } else {
                finder.add_executables_own()?;
                finder.add_mapped_libraries()?;
            }
            finder.add_libc()?;
        }
        Allocator::Libc => finder.add_libc()?,
        Allocator::Jemalloc => {
            let prefixes: Vec<&str> = match prefix {
                Some(prefix) => vec![prefix],
                None => JEMALLOC_PREFIXES.to_vec(),
            };
            let places = prefixes
                .iter()
                .map(|p| (None, *p))
                .chain(prefixes.iter().map(|p| (Some("libjemalloc"), *p)));
            for (binary, prefix) in places {
                if finder.has_any(binary, prefix, JEMALLOC_API)? {
                    finder.add_api(binary, prefix, MALLOC_API)?;
                    finder.add_api(binary, prefix, JEMALLOC_API)?;
                    break;
                }
            }
        }
        Allocator::Mimalloc => {
            for binary in [None, Some("libmimalloc")] {
                if finder.has_any(binary, "", MIMALLOC_API)? {
                    finder.add_api(binary, "", MIMALLOC_API)?;
                    // Its malloc API when it overrides libc's (aliases, probed once).
                    finder.add_api(binary, "", MALLOC_API)?;
                    break;
                }
            }
        }
        Allocator::Binary(path) => {
            let prefix = prefix.unwrap_or("");
            finder.add_api(Some(path), prefix, MALLOC_API)?;
            finder.add_api(Some(path), prefix, JEMALLOC_API)?;
            // A libc by its path has these too.
            finder.add_api(Some(path), "", MMAP_API)?;
        }
    }
    let mut found = finder.found;
    if !found.iter().any(|f| !f.kind.frees_only()) {
        bail!(
            "found no allocating function for {} in process {pid}{}",
            describe(allocator),
            match prefix {
                Some(prefix) => format!(" with the prefix '{prefix}'"),
                None => String::new(),
            }
        );
    }
    // Aliases (glibc's aligned_alloc and memalign share an address) are probed once:
    // two probes on one instruction would count each call twice.
    let mut seen = HashSet::new();
    found.retain(|f| seen.insert((f.target.path.clone(), f.target.file_offset)));
    Ok(found)
}

/// Every name a function of `allocator` may have where it is named by `prefix`
/// (`--alloc-prefix`) or where the allocator names its own object (the executable, or
/// `alloc:PATH`'s file): what [`resolve`] can find there, and more (the prefixes it
/// would not choose). `alloc` and `alloc:libc` name none of their own.
pub fn names_of(allocator: &Allocator, prefix: Option<&str>) -> Vec<(String, AllocKind)> {
    let with = |prefix: &str, api: &[(&str, AllocKind)]| -> Vec<(String, AllocKind)> {
        api.iter()
            .map(|&(name, kind)| (format!("{prefix}{name}"), kind))
            .collect()
    };
    match (allocator, prefix) {
        (Allocator::Libc, _) | (Allocator::Auto, None) => Vec::new(),
        (Allocator::Auto, Some(prefix)) => {
            [with(prefix, MALLOC_API), with(prefix, JEMALLOC_API)].concat()
        }
        (Allocator::Jemalloc, prefix) => match prefix {
            Some(prefix) => vec![prefix],
            None => JEMALLOC_PREFIXES.to_vec(),
        }
        .into_iter()
        .flat_map(|prefix| [with(prefix, MALLOC_API), with(prefix, JEMALLOC_API)].concat())
        .collect(),
        (Allocator::Mimalloc, _) => [with("", MIMALLOC_API), with("", MALLOC_API)].concat(),
        (Allocator::Binary(_), prefix) => {
            let prefix = prefix.unwrap_or("");
            [
                with(prefix, MALLOC_API),
                with(prefix, JEMALLOC_API),
                with("", MMAP_API),
            ]
            .concat()
        }
    }
}

/// Moves each probe to the first instruction the kernel emulates, when the function's
/// first ones leave what its program reads where a program can read it (see
/// [`probes::cheaper_entries`]): jemalloc's malloc and sdallocx start with a compare the
/// kernel single-steps, which made a traced malloc/free pair 5 times as costly as
/// glibc's; the mimalloc crate's `mi_malloc_aligned` moves its size to rsi on the way to
/// its tail call, where [`AllocKind::SizeArg1`] reads it.
fn move_to_emulated_instructions(found: &mut [AllocFunction]) -> Result<()> {
    let mut paths: Vec<std::path::PathBuf> = found.iter().map(|f| f.target.path.clone()).collect();
    paths.sort();
    paths.dedup();
    for path in paths {
        let mine: Vec<&mut AllocFunction> =
            found.iter_mut().filter(|f| f.target.path == path).collect();
        let entries: Vec<u64> = mine.iter().map(|f| f.target.address).collect();
        let cheaper = probes::cheaper_entries(&path, &entries)
            .with_context(|| format!("reading the code of {}", path.display()))?;
        for (function, entry) in mine.into_iter().zip(cheaper) {
            let Some(kind) = function.kind.reading_moved(&entry.holds) else {
                continue;
            };
            function.target.file_offset += entry.address - function.target.address;
            function.target.address = entry.address;
            function.kind = kind;
        }
    }
    Ok(())
}

fn describe(allocator: &Allocator) -> String {
    match allocator {
        Allocator::Auto => "alloc".to_string(),
        Allocator::Libc => "alloc:libc".to_string(),
        Allocator::Jemalloc => "alloc:jemalloc".to_string(),
        Allocator::Mimalloc => "alloc:mimalloc".to_string(),
        Allocator::Binary(path) => format!("alloc:{path}"),
    }
}

/// Looks functions up by exact name, reading each binary's symbols once (asking the
/// probes crate about a name the binary lacks would also look for similar names).
struct Finder {
    pid: u32,
    /// The defined functions of each binary asked about (`None`: the executable), `None`
    /// for a library not found.
    symbols: HashMap<Option<String>, Option<HashSet<String>>>,
    found: Vec<AllocFunction>,
}

impl Finder {
    /// jemalloc or mimalloc linked into the executable. A static link keeps only the
    /// functions the program calls (a Rust program with the mimalloc crate has
    /// mi_malloc_aligned but no mi_malloc): any function of the allocator's own API tells
    /// it is there.
    fn add_executables_own(&mut self) -> Result<()> {
        for prefix in JEMALLOC_PREFIXES.iter().filter(|p| !p.is_empty()) {
            if self.has_any(None, prefix, JEMALLOC_API)? {
                self.add_api(None, prefix, MALLOC_API)?;
                return self.add_api(None, prefix, JEMALLOC_API);
            }
        }
        if self.has_any(None, "", MIMALLOC_API)? {
            return self.add_api(None, "", MIMALLOC_API);
        }
        // A statically linked allocator without prefix (jemalloc, or libc itself).
        if self.has(None, "malloc")? {
            self.add_api(None, "", MALLOC_API)?;
            self.add_api(None, "", JEMALLOC_API)?;
        }
        Ok(())
    }

    /// libc's malloc API and mmap.
    fn add_libc(&mut self) -> Result<()> {
        self.add_api(Some("libc"), "", MALLOC_API)?;
        self.add_api(Some("libc"), "", MMAP_API)
    }

    /// jemalloc or mimalloc as a library the process maps (linked, or LD_PRELOADed).
    fn add_mapped_libraries(&mut self) -> Result<()> {
        let mapped = process_image::mapped_files(self.pid)
            .with_context(|| format!("reading the mappings of process {}", self.pid))?;
        let maps = |library: &str| {
            mapped.iter().any(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with(&format!("{library}.so")))
            })
        };
        if maps("libjemalloc") {
            self.add_api(Some("libjemalloc"), "", MALLOC_API)?;
            self.add_api(Some("libjemalloc"), "", JEMALLOC_API)?;
        }
        if maps("libmimalloc") {
            self.add_api(Some("libmimalloc"), "", MIMALLOC_API)?;
            self.add_api(Some("libmimalloc"), "", MALLOC_API)?;
        }
        Ok(())
    }

    /// Adds the functions of `api` with `prefix` that `binary` (`None`: the executable)
    /// defines.
    fn add_api(
        &mut self,
        binary: Option<&str>,
        prefix: &str,
        api: &[(&str, AllocKind)],
    ) -> Result<()> {
        for &(name, kind) in api {
            let name = format!("{prefix}{name}");
            if !self.has(binary, &name)? {
                continue;
            }
            let spec = UprobeSpec {
                retprobe: false,
                target: Some(self.path_of(binary)?),
                lang: None,
                location: UprobeLocation::Symbol { name, offset: 0 },
            };
            if let Some(target) = probes::resolve_uprobe(&spec, Some(self.pid))?.pop() {
                self.found.push(AllocFunction { target, kind });
            }
        }
        Ok(())
    }

    fn path_of(&self, binary: Option<&str>) -> Result<String> {
        Ok(match binary {
            Some(name) => probes::resolve_binary(name, Some(self.pid))?
                .display()
                .to_string(),
            None => {
                let link = format!("/proc/{}/exe", self.pid);
                std::fs::read_link(&link)
                    .with_context(|| format!("reading {link}"))?
                    .display()
                    .to_string()
            }
        })
    }

    /// Whether `binary` defines any function of `api` with `prefix`.
    fn has_any(
        &mut self,
        binary: Option<&str>,
        prefix: &str,
        api: &[(&str, AllocKind)],
    ) -> Result<bool> {
        for (name, _) in api {
            if self.has(binary, &format!("{prefix}{name}"))? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether `binary` defines function `name`; `false` for a library not found.
    fn has(&mut self, binary: Option<&str>, name: &str) -> Result<bool> {
        let key = binary.map(str::to_string);
        if !self.symbols.contains_key(&key) {
            let symbols = match self.path_of(binary) {
                Ok(path) => Some(
                    defined_functions(Path::new(&path))
                        .with_context(|| format!("reading the symbols of {path}"))?,
                ),
                Err(error) => match error.downcast_ref::<ResolveError>() {
                    Some(ResolveError::LibraryNotFound { .. }) if binary != Some("libc") => None,
                    _ => return Err(error),
                },
            };
            self.symbols.insert(key.clone(), symbols);
        }
        Ok(self.symbols[&key]
            .as_ref()
            .is_some_and(|symbols| symbols.contains(name)))
    }
}

/// Moves a free function's probe past a leading `if (ptr == NULL) return` (`test %rdi,
/// %rdi; je ...`), when the function starts so. The kernel emulates few instructions
/// under a uprobe and single-steps the others: glibc's free starts with that test and
/// paid ~10 µs per call for it on the machines measured, where the `push` after it is
/// emulated (~0.3 µs). Past the test nothing has changed: rdi holds the address, rsp is
/// as at the entry, and a NULL, which the program ignores anyway, never gets there.
fn skip_null_test(target: &mut UprobeTarget) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut code = [0u8; 9];
    let mut file = std::fs::File::open(&target.path)
        .with_context(|| format!("reading {}", target.path.display()))?;
    file.seek(SeekFrom::Start(target.file_offset))?;
    if file.read_exact(&mut code).is_err() {
        return Ok(());
    }
    let skip = null_test_length(&code);
    target.file_offset += skip;
    target.address += skip;
    Ok(())
}

/// The length of a leading `test %rdi,%rdi; je rel8/rel32` in `code`, 0 if it has none.
fn null_test_length(code: &[u8]) -> u64 {
    match code {
        [0x48, 0x85, 0xff, 0x0f, 0x84, ..] => 9,
        [0x48, 0x85, 0xff, 0x74, ..] => 5,
        _ => 0,
    }
}

/// The names of the functions an ELF file defines (`.symtab` and `.dynsym`; a versioned
/// name also by its bare name).
/// The functions `path` defines, and those it imports by name.
fn functions(path: &Path) -> Result<(HashSet<String>, HashSet<String>)> {
    let file = std::fs::File::open(path)?;
    // SAFETY: a read-only private map of a file we only read.
    let map = unsafe { memmap2::Mmap::map(&file) }?;
    let elf = object::File::parse(&*map)?;
    let defined = defined_in(&elf);
    let imported = elf
        .dynamic_symbols()
        .filter(|symbol| symbol.is_undefined())
        .filter_map(|symbol| symbol.name().ok())
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect();
    Ok((defined, imported))
}

fn defined_functions(path: &Path) -> Result<HashSet<String>> {
    Ok(functions(path)?.0)
}

/// The functions `elf` defines, by name (versions dropped).
fn defined_in(elf: &object::File<'_>) -> HashSet<String> {
    let mut names = HashSet::new();
    for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
        if symbol.is_undefined() || symbol.kind() != SymbolKind::Text {
            continue;
        }
        if let Ok(name) = symbol.name() {
            names.insert(name.split('@').next().unwrap_or(name).to_string());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_tests_are_recognized() {
        // glibc 2.36's free: test %rdi,%rdi; je rel32; push %rbp
        assert_eq!(
            null_test_length(&[0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0, 0x55]),
            9
        );
        assert_eq!(null_test_length(&[0x48, 0x85, 0xff, 0x74, 0x10]), 5);
        // jne: the address is not NULL on the jump, so the next instruction is not past it
        assert_eq!(null_test_length(&[0x48, 0x85, 0xff, 0x75, 0x10]), 0);
        assert_eq!(null_test_length(&[0x55, 0x48, 0x89, 0xe5]), 0);
    }

    #[test]
    fn allocator_names() {
        assert_eq!(Allocator::parse(None).unwrap(), Allocator::Auto);
        assert_eq!(
            Allocator::parse(Some("jemalloc")).unwrap(),
            Allocator::Jemalloc
        );
        assert_eq!(
            Allocator::parse(Some("/opt/lib/libtcmalloc.so")).unwrap(),
            Allocator::Binary("/opt/lib/libtcmalloc.so".into())
        );
        let error = Allocator::parse(Some("tcmalloc")).unwrap_err().to_string();
        assert!(error.contains("expected libc, jemalloc"), "{error}");
    }

    /// This test process's libc has every function of the malloc API, each probed once.
    #[test]
    fn libc_functions_are_found_once_each() {
        let pid = std::process::id();
        let found = resolve(&Allocator::Libc, None, pid).unwrap();
        let symbols: Vec<&str> = found.iter().map(|f| f.target.symbol.as_str()).collect();
        for name in ["malloc", "calloc", "realloc", "free", "posix_memalign"] {
            assert!(symbols.contains(&name), "{name} not in {symbols:?}");
        }
        let offsets: HashSet<u64> = found.iter().map(|f| f.target.file_offset).collect();
        assert_eq!(offsets.len(), found.len());
    }
}
