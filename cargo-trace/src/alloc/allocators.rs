//! Which functions an `alloc` probe attaches, and where they are: the allocators known by
//! name (their functions and argument kinds, one table), and finding the one a process
//! uses.
//!
//! `alloc` alone probes libc and, when the executable carries an allocator of its own
//! (tikv-jemallocator links jemalloc statically with the `_rjem_` prefix, the mimalloc
//! crate links `mi_*`), that one too: blocks are paired by address, so allocators side by
//! side keep their blocks apart.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bpf_prog::AllocKind;
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

/// jemalloc's non-standard API (`xallocx` resizes in place and is not tracked).
const JEMALLOC_API: &[(&str, AllocKind)] = &[
    ("mallocx", AllocKind::SizeArg0),
    ("rallocx", AllocKind::Realloc),
    ("sdallocx", AllocKind::Free),
    ("dallocx", AllocKind::Free),
];

/// mimalloc's API, as the mimalloc crate and C programs call it.
const MIMALLOC_API: &[(&str, AllocKind)] = &[
    ("mi_malloc", AllocKind::SizeArg0),
    ("mi_zalloc", AllocKind::SizeArg0),
    ("mi_calloc", AllocKind::Calloc),
    ("mi_realloc", AllocKind::Realloc),
    ("mi_reallocarray", AllocKind::ReallocArray),
    ("mi_malloc_aligned", AllocKind::SizeArg0),
    ("mi_zalloc_aligned", AllocKind::SizeArg0),
    ("mi_realloc_aligned", AllocKind::Realloc),
    ("mi_free", AllocKind::Free),
    ("mi_free_size", AllocKind::Free),
    ("mi_free_aligned", AllocKind::Free),
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

/// One function to probe: where, and how its arguments read.
#[derive(Clone, Debug)]
pub struct AllocFunction {
    pub target: UprobeTarget,
    pub kind: AllocKind,
}

/// The functions to probe for `allocator` in process `pid`. `prefix` (`--alloc-prefix`)
/// names the malloc API with a prefix in the executable, or in the library named.
pub fn resolve(
    allocator: &Allocator,
    prefix: Option<&str>,
    pid: u32,
) -> Result<Vec<AllocFunction>> {
    let mut found = Vec::new();
    match allocator {
        Allocator::Auto => {
            if let Some(prefix) = prefix {
                add_api(&mut found, None, prefix, MALLOC_API, pid)?;
                add_api(&mut found, None, prefix, JEMALLOC_API, pid)?;
            } else {
                add_executables_own(&mut found, pid)?;
            }
            add_api(&mut found, Some("libc"), "", MALLOC_API, pid)?;
        }
        Allocator::Libc => add_api(&mut found, Some("libc"), "", MALLOC_API, pid)?,
        Allocator::Jemalloc => {
            let prefixes: Vec<&str> = match prefix {
                Some(prefix) => vec![prefix],
                None => JEMALLOC_PREFIXES.to_vec(),
            };
            for (binary, prefix) in prefixes
                .iter()
                .map(|p| (None, *p))
                .chain(prefixes.iter().map(|p| (Some("libjemalloc"), *p)))
            {
                if has_symbol(binary, &format!("{prefix}mallocx"), pid)? {
                    add_api(&mut found, binary, prefix, MALLOC_API, pid)?;
                    add_api(&mut found, binary, prefix, JEMALLOC_API, pid)?;
                    break;
                }
            }
        }
        Allocator::Mimalloc => {
            for binary in [None, Some("libmimalloc")] {
                if has_symbol(binary, "mi_malloc", pid)? {
                    add_api(&mut found, binary, "", MIMALLOC_API, pid)?;
                    break;
                }
            }
        }
        Allocator::Binary(path) => {
            let prefix = prefix.unwrap_or("");
            add_api(&mut found, Some(path), prefix, MALLOC_API, pid)?;
            add_api(&mut found, Some(path), prefix, JEMALLOC_API, pid)?;
        }
    }
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
    // Aliases (glibc's aligned_alloc and memalign may share an address) are probed once:
    // two probes on one instruction would count each call twice.
    let mut seen = HashSet::new();
    found.retain(|f| seen.insert((f.target.path.clone(), f.target.file_offset)));
    Ok(found)
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

/// jemalloc or mimalloc linked into the executable.
fn add_executables_own(found: &mut Vec<AllocFunction>, pid: u32) -> Result<()> {
    for prefix in JEMALLOC_PREFIXES.iter().filter(|p| !p.is_empty()) {
        if has_symbol(None, &format!("{prefix}mallocx"), pid)? {
            add_api(found, None, prefix, MALLOC_API, pid)?;
            return add_api(found, None, prefix, JEMALLOC_API, pid);
        }
    }
    if has_symbol(None, "mi_malloc", pid)? {
        return add_api(found, None, "", MIMALLOC_API, pid);
    }
    // A statically linked allocator without prefix (jemalloc, or libc itself).
    if has_symbol(None, "malloc", pid)? {
        add_api(found, None, "", MALLOC_API, pid)?;
        add_api(found, None, "", JEMALLOC_API, pid)?;
    }
    Ok(())
}

/// Adds the functions of `api` with `prefix` that `binary` (`None`: the executable)
/// defines.
fn add_api(
    found: &mut Vec<AllocFunction>,
    binary: Option<&str>,
    prefix: &str,
    api: &[(&str, AllocKind)],
    pid: u32,
) -> Result<()> {
    for &(name, kind) in api {
        if let Some(target) = find(binary, &format!("{prefix}{name}"), pid)? {
            found.push(AllocFunction { target, kind });
        }
    }
    Ok(())
}

fn has_symbol(binary: Option<&str>, name: &str, pid: u32) -> Result<bool> {
    Ok(find(binary, name, pid)?.is_some())
}

/// Where function `name` of `binary` is, `None` if the binary has no such function (or
/// no such library is mapped or installed).
fn find(binary: Option<&str>, name: &str, pid: u32) -> Result<Option<UprobeTarget>> {
    let spec = UprobeSpec {
        retprobe: false,
        target: binary.map(str::to_string),
        lang: None,
        location: UprobeLocation::Symbol {
            name: name.to_string(),
            offset: 0,
        },
    };
    match probes::resolve_uprobe(&spec, Some(pid)) {
        Ok(mut targets) => Ok(targets.pop()),
        Err(
            ResolveError::SymbolNotFound { .. }
            | ResolveError::Stripped { .. }
            | ResolveError::InLibc { .. },
        ) => Ok(None),
        Err(ResolveError::LibraryNotFound { .. }) if binary != Some("libc") => Ok(None),
        Err(error) => Err(error).with_context(|| {
            format!(
                "looking for {name} in {}",
                binary
                    .map_or_else(|| PathBuf::from("the executable"), PathBuf::from)
                    .display()
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
