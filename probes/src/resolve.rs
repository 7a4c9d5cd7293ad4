//! From a uprobe or USDT spec to (file, file offset) pairs the kernel can probe.
//!
//! The binary is found first (path, library short name, program on `PATH`, or the `-p`
//! process's executable), then the symbol in its .symtab and .dynsym, and the symbol's
//! virtual address becomes a file offset through the PT_LOAD segment that holds it.

use std::io;
use std::path::PathBuf;

use crate::elf::ElfInfo;
use crate::spec::{Lang, UprobeLocation, UprobeSpec, UsdtSpec};
use crate::wildcard::{has_wildcard, matches};

mod binary;
mod symbols;

pub use binary::resolve_binary;
use binary::{find_library, library_matches, looks_like_library, process_executable};
use symbols::{display_name, find_functions};

/// How many candidates or suggestions an error lists.
const MAX_LISTED: usize = 5;

/// A place to put one uprobe.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UprobeTarget {
    /// The file to probe, as this process can open it (through `/proc/PID/root` when
    /// the target process lives in another mount namespace).
    pub path: PathBuf,
    /// Offset of the probed instruction in the file: what the kernel's uprobe API takes.
    pub file_offset: u64,
    /// Virtual address of the probed instruction in the ELF file (not in the process).
    pub address: u64,
    /// Human-readable name: demangled symbol (`myprog::parse`, `malloc+0x4`),
    /// `provider:name` for USDT, or the address.
    pub symbol: String,
    /// File offset of a USDT semaphore, which the kernel increments while the probe is
    /// attached (`ref_ctr_offset`).
    pub ref_ctr_offset: Option<u64>,
}

/// Why a uprobe or USDT spec does not resolve. One line each, naming the file and
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("'{spec}' names no binary; write it as {form}, or attach to a process with -p PID")]
    MissingTarget { spec: String, form: &'static str },
    #[error("no such file: {}", path.display())]
    FileNotFound { path: PathBuf },
    #[error("library '{name}' not found in {searched}; give its path")]
    LibraryNotFound { name: String, searched: String },
    #[error(
        "'{name}' is neither a file in the current directory nor a program on PATH; give its path"
    )]
    ProgramNotFound { name: String },
    #[error("{}", match source.kind() {
        io::ErrorKind::NotFound => format!("no process {pid}"),
        _ => format!("process {pid} cannot be inspected through /proc/{pid}"),
    })]
    NoProcess {
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not an ELF file", path.display())]
    NotElf { path: PathBuf },
    #[error("cannot probe {}: {reason}", path.display())]
    UnsupportedElf { path: PathBuf, reason: String },
    #[error("no function '{symbol}' in {}{}", path.display(), did_you_mean(suggestions))]
    SymbolNotFound {
        symbol: String,
        path: PathBuf,
        suggestions: Vec<String>,
    },
    #[error(
        "no function '{symbol}' in {}: the binary is stripped (no .symtab) and '{symbol}' \
         is not among its {exported} exported functions (.dynsym){}",
        path.display(), did_you_mean(suggestions)
    )]
    Stripped {
        symbol: String,
        path: PathBuf,
        exported: usize,
        suggestions: Vec<String>,
    },
    #[error(
        "'{symbol}' matches {count} functions at different addresses in {}: {}{}; \
         give one's mangled name, or '{symbol}*' to probe them all",
        path.display(), candidates.join(", "),
        if *count > candidates.len() { ", ..." } else { "" }
    )]
    AmbiguousSymbol {
        symbol: String,
        path: PathBuf,
        candidates: Vec<String>,
        count: usize,
    },
    #[error(
        "no function '{symbol}' in {library}, but libc has it (glibc 2.34 merged libpthread, \
         libdl and librt into libc); use {suggested}"
    )]
    InLibc {
        symbol: String,
        library: String,
        suggested: String,
    },
    #[error("offset {offset:#x} is past the end of {symbol} ({size} bytes) in {}", path.display())]
    OffsetOutOfRange {
        symbol: String,
        offset: u64,
        size: u64,
        path: PathBuf,
    },
    #[error("address {address:#x} is not in an executable segment of {}", path.display())]
    AddressNotInCode { address: u64, path: PathBuf },
    #[error("no USDT probe '{probe}' in {}{}", path.display(), usdt_listing(available, *total))]
    UsdtNotFound {
        probe: String,
        path: PathBuf,
        available: Vec<String>,
        total: usize,
    },
}

fn did_you_mean(suggestions: &[String]) -> String {
    if suggestions.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", suggestions.join(", "))
    }
}

fn usdt_listing(available: &[String], total: usize) -> String {
    match total {
        0 => " (it has no USDT probes)".to_string(),
        _ => format!(
            " (it has {total}: {}{})",
            available.join(", "),
            if total > available.len() { ", ..." } else { "" }
        ),
    }
}

/// Resolves a uprobe spec to the places to probe.
///
/// `pid` is the process the probe is for, if known: library short names are looked up
/// in its mappings first, an omitted binary means its executable, and paths are read
/// through its mount namespace.
///
/// One target, except for patterns (`*`) and `cpp:` specs, which yield one per distinct
/// address. A name matching several functions at different addresses is an error
/// listing them; several symbols at one address (aliases) are one target.
pub fn resolve_uprobe(
    spec: &UprobeSpec,
    pid: Option<u32>,
) -> Result<Vec<UprobeTarget>, ResolveError> {
    let path = match &spec.target {
        Some(target) => resolve_binary(target, pid)?,
        None => process_executable(pid, || {
            (
                spec.to_string(),
                if spec.retprobe {
                    "uretprobe:PATH:SYMBOL"
                } else {
                    "uprobe:PATH:SYMBOL"
                },
            )
        })?,
    };
    let info = ElfInfo::load(&path)?;
    match &spec.location {
        UprobeLocation::Address(address) => {
            let file_offset =
                info.file_offset(*address, true)
                    .ok_or_else(|| ResolveError::AddressNotInCode {
                        address: *address,
                        path: path.clone(),
                    })?;
            let symbol = match info.function_at(*address) {
                Some((function, 0)) => display_name(&function.name),
                Some((function, offset)) => {
                    format!("{}+{offset:#x}", display_name(&function.name))
                }
                None => format!("{address:#x}"),
            };
            Ok(vec![UprobeTarget {
                path,
                file_offset,
                address: *address,
                symbol,
                ref_ctr_offset: None,
            }])
        }
        UprobeLocation::Symbol { name, offset } => {
            let all = has_wildcard(name) || spec.lang == Some(Lang::Cpp);
            let functions = match find_functions(&info, name, all) {
                Err(e @ (ResolveError::SymbolNotFound { .. } | ResolveError::Stripped { .. })) => {
                    return Err(in_libc_instead(spec, name).unwrap_or(e))
                }
                result => result?,
            };
            functions
                .into_iter()
                .map(|(function, display)| {
                    if *offset > 0 && function.size > 0 && *offset >= function.size {
                        return Err(ResolveError::OffsetOutOfRange {
                            symbol: display,
                            offset: *offset,
                            size: function.size,
                            path: path.clone(),
                        });
                    }
                    let address = function.address.wrapping_add(*offset);
                    let file_offset = info.file_offset(address, true).ok_or_else(|| {
                        ResolveError::AddressNotInCode {
                            address,
                            path: path.clone(),
                        }
                    })?;
                    let symbol = if *offset == 0 {
                        display
                    } else {
                        format!("{display}+{offset:#x}")
                    };
                    Ok(UprobeTarget {
                        path: path.clone(),
                        file_offset,
                        address,
                        symbol,
                        ref_ctr_offset: None,
                    })
                })
                .collect()
        }
    }
}

/// glibc 2.34 moved libpthread, libdl, librt and libutil into libc, leaving stub
/// libraries behind: a function missing from a library named by short name may be
/// in libc, and the error says so.
fn in_libc_instead(spec: &UprobeSpec, name: &str) -> Option<ResolveError> {
    let target = spec.target.as_deref()?;
    if target.contains('/') || !looks_like_library(target) || library_matches("libc", target) {
        return None;
    }
    let libc = find_library("libc", None).ok()?;
    let info = ElfInfo::load(&libc).ok()?;
    find_functions(&info, name, true).ok()?;
    let mut suggested = spec.clone();
    suggested.target = Some("libc".into());
    Some(ResolveError::InLibc {
        symbol: name.to_string(),
        library: target.to_string(),
        suggested: suggested.to_string(),
    })
}

/// Resolves a USDT spec to the places to probe: every site of every matching probe
/// (a probe in inlined code has several), with its semaphore if it has one.
pub fn resolve_usdt(spec: &UsdtSpec, pid: Option<u32>) -> Result<Vec<UprobeTarget>, ResolveError> {
    let path = match &spec.target {
        Some(target) => resolve_binary(target, pid)?,
        None => process_executable(pid, || (spec.to_string(), "usdt:PATH:PROVIDER:NAME"))?,
    };
    let info = ElfInfo::load(&path)?;
    let mut targets = Vec::new();
    for note in &info.usdt {
        let provider_matches = spec
            .provider
            .as_deref()
            .is_none_or(|p| matches(p, &note.provider));
        if !provider_matches || !matches(&spec.name, &note.name) {
            continue;
        }
        let file_offset =
            info.file_offset(note.pc, true)
                .ok_or_else(|| ResolveError::AddressNotInCode {
                    address: note.pc,
                    path: path.clone(),
                })?;
        let ref_ctr_offset = match note.semaphore {
            0 => None,
            semaphore => Some(info.file_offset(semaphore, false).ok_or_else(|| {
                ResolveError::UnsupportedElf {
                    path: path.clone(),
                    reason: format!(
                        "the semaphore of USDT probe {}:{} ({semaphore:#x}) is in no loaded segment",
                        note.provider, note.name
                    ),
                }
            })?),
        };
        targets.push(UprobeTarget {
            path: path.clone(),
            file_offset,
            address: note.pc,
            symbol: format!("{}:{}", note.provider, note.name),
            ref_ctr_offset,
        });
    }
    if targets.is_empty() {
        let mut available: Vec<String> = info
            .usdt
            .iter()
            .map(|n| format!("{}:{}", n.provider, n.name))
            .collect();
        available.sort();
        available.dedup();
        let total = available.len();
        available.truncate(MAX_LISTED);
        let probe = match &spec.provider {
            Some(provider) => format!("{provider}:{}", spec.name),
            None => spec.name.clone(),
        };
        return Err(ResolveError::UsdtNotFound {
            probe,
            path,
            available,
            total,
        });
    }
    Ok(targets)
}

#[cfg(test)]
mod tests;
