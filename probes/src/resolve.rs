//! From a uprobe or USDT spec to (file, file offset) pairs the kernel can probe.
//!
//! The binary is found first (path, library short name, program on `PATH`, or the `-p`
//! process's executable), then the symbol in its .symtab and .dynsym, and the symbol's
//! virtual address becomes a file offset through the PT_LOAD segment that holds it.

use std::path::{Path, PathBuf};

use crate::elf::{ElfInfo, Function};
use crate::error::ResolveError;
use crate::instructions::{
    branch_targets, first_emulated, has_computed_jumps, hazard_for_uprobes, placement,
    rip_relative_targets, Hazard, HazardKind, Placement,
};
use crate::notice::Notice;
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

/// How a uprobe spec is resolved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResolveOptions {
    /// The process the probe is for, if known: library short names are looked up in
    /// its mappings first, an omitted binary means its executable, and paths are read
    /// through its mount namespace.
    pub pid: Option<u32>,
    /// Accept a raw address that lies in no known function, or in code that does not
    /// decode, without knowing that it starts an instruction (bpftrace's `--unsafe`).
    /// An address known to be inside an instruction is refused all the same.
    pub unsafe_addresses: bool,
}

/// Resolves a uprobe spec to the places to probe, with [`ResolveOptions`]'s defaults
/// but `pid`; see [`resolve_uprobe_with`].
pub fn resolve_uprobe(
    spec: &UprobeSpec,
    pid: Option<u32>,
) -> Result<Vec<UprobeTarget>, ResolveError> {
    let options = ResolveOptions {
        pid,
        ..ResolveOptions::default()
    };
    Ok(resolve_uprobe_with(spec, &options)?.targets)
}

/// What a uprobe spec resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    pub targets: Vec<UprobeTarget>,
    /// What the user should know about them (an IFUNC's implementations probed in its
    /// place).
    pub notices: Vec<Notice>,
}

/// Resolves a uprobe spec to the places to probe.
///
/// One target, except for patterns (`*`) and `cpp:` specs, which yield one per distinct
/// address. A name matching several functions at different addresses is an error
/// listing them; several symbols at one address (aliases) are one target.
///
/// A probe never lands inside an instruction: an offset or address past a function's
/// start is checked against the instructions decoded from that start.
///
/// A probe on an IFUNC symbol (`strlen`, `memcpy` in glibc) goes to the implementation
/// its resolver selected in process `pid` (read from the slot ld.so filled for the
/// file's own calls), else to every implementation the resolver can return: the
/// resolver itself runs once per process, not once per call.
pub fn resolve_uprobe_with(
    spec: &UprobeSpec,
    options: &ResolveOptions,
) -> Result<Resolution, ResolveError> {
    let pid = options.pid;
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
    let mut info = ElfInfo::load(&path)?;
    match &spec.location {
        UprobeLocation::Address(address) => {
            let address = *address;
            // Every function known, static ones included, for the instruction check.
            info.add_debug_file_symbols();
            let file_offset =
                info.file_offset(address, true)
                    .ok_or_else(|| ResolveError::AddressNotInCode {
                        address,
                        path: path.clone(),
                    })?;
            let symbol = match info.function_at(address) {
                Some((function, 0)) => display_name(&function.name),
                Some((function, offset)) => {
                    let name = display_name(&function.name);
                    let location = format!("address {address:#x} ({name}+{offset:#x})");
                    let shown = |boundary: u64| {
                        format!("{boundary:#x} ({name}+{:#x})", boundary - function.address)
                    };
                    check_boundary(&info, function, address, options, location, shown)?;
                    format!("{name}+{offset:#x}")
                }
                None if options.unsafe_addresses => format!("{address:#x}"),
                None => {
                    return Err(ResolveError::OutsideFunctions {
                        address,
                        path: path.clone(),
                    })
                }
            };
            if let Some(hazard) = hazard_at(&info, address) {
                return Err(ResolveError::Hazard {
                    location: format!("address {address:#x} ({symbol})"),
                    kind: hazard.kind,
                    instruction: hazard.instruction,
                    path: path.clone(),
                    next: format!("{:#x}", address + hazard.length),
                });
            }
            Ok(Resolution {
                targets: vec![UprobeTarget {
                    path,
                    file_offset,
                    address,
                    symbol,
                    ref_ctr_offset: None,
                }],
                notices: Vec::new(),
            })
        }
        UprobeLocation::Symbol { name, offset } => {
            let all = has_wildcard(name) || spec.lang == Some(Lang::Cpp);
            // The debug file's names too for a pattern, a name the file lacks, and an
            // IFUNC (its implementations are static functions).
            let more_names = has_wildcard(name)
                || find_functions(&info, name, all)
                    .map_or(true, |found| found.iter().any(|(f, _)| f.resolver));
            if more_names {
                info.add_debug_file_symbols();
            }
            let functions = match find_functions(&info, name, all) {
                Err(e @ (ResolveError::SymbolNotFound { .. } | ResolveError::Stripped { .. })) => {
                    return Err(in_libc_instead(spec, name).unwrap_or(e))
                }
                result => result?,
            };
            let mut notices = Vec::new();
            let mut targets = Vec::new();
            let mut moved = Vec::new();
            let mut skipped = Vec::new();
            for (function, display) in functions {
                if function.resolver && *offset == 0 {
                    let (implementations, notice) =
                        ifunc_implementations(&info, function, &display, pid);
                    notices.push(notice);
                    for (entry, name) in implementations {
                        let (address, symbol) = entry_site(&info, entry, name, &mut moved)?;
                        let file_offset = info.file_offset(address, true).ok_or_else(|| {
                            ResolveError::AddressNotInCode {
                                address,
                                path: path.clone(),
                            }
                        })?;
                        targets.push(UprobeTarget {
                            path: path.clone(),
                            file_offset,
                            address,
                            symbol,
                            ref_ctr_offset: None,
                        });
                    }
                    continue;
                }
                if *offset > 0 && function.size > 0 && *offset >= function.size {
                    return Err(ResolveError::OffsetOutOfRange {
                        symbol: display,
                        offset: *offset,
                        size: function.size,
                        path: path.clone(),
                    });
                }
                let address = function.address.wrapping_add(*offset);
                info.file_offset(address, true)
                    .ok_or_else(|| ResolveError::AddressNotInCode {
                        address,
                        path: path.clone(),
                    })?;
                let (address, symbol) = if *offset > 0 {
                    let location = format!("offset {offset:#x}");
                    let shown =
                        |boundary: u64| format!("{display}+{:#x}", boundary - function.address);
                    check_boundary(&info, function, address, options, location, shown)?;
                    if let Some(hazard) = hazard_at(&info, address) {
                        return Err(ResolveError::Hazard {
                            location: format!("{display}+{offset:#x}"),
                            kind: hazard.kind,
                            instruction: hazard.instruction,
                            path: path.clone(),
                            next: format!("{display}+{:#x}", offset + hazard.length),
                        });
                    }
                    (address, format!("{display}+{offset:#x}"))
                } else {
                    match entry_site(&info, address, display, &mut moved) {
                        // One function of a pattern is not worth the others.
                        Err(ResolveError::HazardEntry { function, kind, .. }) if all => {
                            skipped.push((kind, function));
                            continue;
                        }
                        site => site?,
                    }
                };
                let file_offset = info.file_offset(address, true).ok_or_else(|| {
                    ResolveError::AddressNotInCode {
                        address,
                        path: path.clone(),
                    }
                })?;
                targets.push(UprobeTarget {
                    path: path.clone(),
                    file_offset,
                    address,
                    symbol,
                    ref_ctr_offset: None,
                });
            }
            // An IFUNC's implementation may also have been matched by name (patterns).
            let mut seen = std::collections::HashSet::new();
            targets.retain(|t| seen.insert(t.address));
            if notices.len() > 1 {
                notices = vec![Notice::Ifuncs {
                    pattern: name.clone(),
                    path: path.clone(),
                    ifuncs: notices,
                }];
            }
            for (kind, moved) in by_kind(moved) {
                notices.push(Notice::PastHazard {
                    path: path.clone(),
                    kind,
                    moved,
                });
            }
            for (kind, functions) in by_kind(skipped) {
                notices.push(Notice::SkippedHazard {
                    pattern: name.clone(),
                    path: path.clone(),
                    kind,
                    functions,
                });
            }
            Ok(Resolution { targets, notices })
        }
    }
}

/// The implementations to probe for IFUNC `resolver` (named `display`), with names,
/// and the notice that says which: the one ld.so selected in `pid` when it can be read,
/// else every function the resolver refers to, else the resolver itself.
fn ifunc_implementations(
    info: &ElfInfo,
    resolver: &Function,
    display: &str,
    pid: Option<u32>,
) -> (Vec<(u64, String)>, Notice) {
    let notice = |implementations: &[(u64, String)], selected_in: Option<u32>| Notice::Ifunc {
        symbol: display.to_string(),
        path: info.path.clone(),
        implementations: implementations.iter().map(|(_, n)| n.clone()).collect(),
        selected_in,
    };
    if let Some(pid) = pid {
        if let Some(address) = selected_implementation(info, resolver, pid) {
            let chosen = vec![(address, implementation_name(info, address, display))];
            let notice = notice(&chosen, Some(pid));
            return (chosen, notice);
        }
    }
    let code = info.code_from(resolver.address).unwrap_or_default();
    let code = &code[..code.len().min(resolver.size as usize)];
    let candidates: Vec<(u64, String)> = rip_relative_targets(code, resolver.address)
        .into_iter()
        .filter(|&address| {
            address != resolver.address
                && info
                    .functions
                    .iter()
                    .any(|f| f.address == address && !f.resolver)
        })
        .map(|address| (address, implementation_name(info, address, display)))
        .collect();
    if candidates.is_empty() {
        let resolver_only = vec![(resolver.address, display.to_string())];
        return (resolver_only, notice(&[], None));
    }
    let notice = notice(&candidates, None);
    (candidates, notice)
}

/// The implementation of IFUNC `resolver` that process `pid` calls: what ld.so wrote in
/// the slot of the file's own IRELATIVE relocation for it, as a virtual address of the
/// file. `None` when the file has no such slot or the process does not map it.
fn selected_implementation(info: &ElfInfo, resolver: &Function, pid: u32) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let slot = info
        .irelative
        .iter()
        .find(|(target, _)| *target == resolver.address)?
        .1;
    let mapped = crate::maps::MappedFiles::of(pid)?;
    let bias = mapped.load_bias(&info.path, &info.segments)?;
    let memory = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut word = [0u8; 8];
    memory
        .read_exact_at(&mut word, slot.wrapping_add(bias))
        .ok()?;
    let address = u64::from_le_bytes(word).wrapping_sub(bias);
    info.file_offset(address, true)?;
    Some(address)
}

/// The name of the function at `address`: of several aliases, preferably one that
/// names the IFUNC (`__memcpy_evex_unaligned_erms` rather than `__memmove_...` for
/// `memcpy`).
fn implementation_name(info: &ElfInfo, address: u64, ifunc: &str) -> String {
    let mut names: Vec<&Function> = info
        .functions
        .iter()
        .filter(|f| f.address == address && !f.resolver)
        .collect();
    // An old symbol version of the IFUNC's own name (`memcpy@GLIBC_2.2.5`) says less
    // than the implementation's own name.
    names.sort_by_key(|f| {
        let name = f.name.as_str();
        let versioned = f.hidden_version || name.contains('@') || name == ifunc;
        (
            versioned,
            !name.contains(ifunc),
            f.dynamic,
            name.len(),
            name,
        )
    });
    names
        .first()
        .map(|f| display_name(&f.name))
        .unwrap_or_else(|| format!("{address:#x}"))
}

/// Where a function's entry probe costs least (see [`cheaper_entries`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheaperEntry {
    pub address: u64,
    /// For each integer argument register (rdi, rsi, rdx, rcx, r8, r9 in order), the
    /// index of the argument whose value at the entry it holds at `address`, if any: a
    /// probe moved past `mov %rdi,%rsi; mov (%rax),%rdi` finds the first argument in
    /// rsi and no argument in rdi.
    pub holds: [Option<usize>; 6],
}

impl CheaperEntry {
    /// The entry itself, every argument in its register.
    fn at(address: u64) -> CheaperEntry {
        CheaperEntry {
            address,
            holds: [0, 1, 2, 3, 4, 5].map(Some),
        }
    }
}

/// Where entry probes of functions of the file at `path` cost least: for each function
/// entry in `entries`, the address to probe instead and where the arguments are there,
/// or the entry itself. The caller tells whether its program can read the arguments
/// where they are, and keeps the entry when it cannot.
///
/// The kernel emulates a few instructions under a uprobe (jumps, calls, conditional
/// jumps, `push` of a register, `nop`) and single-steps the others, which costs ~22 µs a
/// hit on the machines measured, against under 1 µs. When a function starts with
/// instructions that only compare, or move values between and into general registers
/// (jemalloc's malloc: `cmp $0x1000,%rdi; ja`; the mimalloc crate's
/// `mi_malloc_aligned`: `mov %rsi,%rdx; mov %rdi,%rsi; ...; jmp`), the probe sits on
/// the first emulated instruction instead and sees what it would have seen at the
/// entry, the arguments followed through their moves: rsp, rbp and memory unchanged,
/// the return address still at rsp (so a return probe placed there works as at the
/// entry, and the stack is walked as from the entry). Those instructions run straight
/// on, so every call reaches the probe; it must reach it once: not when a branch
/// anywhere in the file lands past the entry and up to there, nor when the function
/// (or the `.cold` part the compiler split off it) has a jump whose target is computed.
/// A move never lands on an instruction no uprobe may sit on (see [`HazardKind`]):
/// neither kind is emulated or looked past. An entry given is kept as it is, so entries
/// come from [`resolve_uprobe`], which already moved them past such an instruction.
pub fn cheaper_entries(path: &Path, entries: &[u64]) -> Result<Vec<CheaperEntry>, ResolveError> {
    let info = ElfInfo::load(path)?;
    let mut cheaper: Vec<CheaperEntry> = entries
        .iter()
        .map(|&address| cheaper_entry(&info, address).unwrap_or(CheaperEntry::at(address)))
        .collect();
    if cheaper
        .iter()
        .zip(entries)
        .all(|(c, &entry)| c.address == entry)
    {
        return Ok(cheaper);
    }
    // Another function may jump into one's first instructions (a tail shared by
    // several, hand-written assembly): every branch of the file's code is looked at.
    let mut targets: Vec<u64> = info
        .segments
        .iter()
        .filter(|segment| segment.executable)
        .filter_map(|segment| Some((segment.vaddr, info.code_from(segment.vaddr)?)))
        .flat_map(|(start, code)| branch_targets(code, start))
        .collect();
    targets.sort_unstable();
    for (entry, &address) in cheaper.iter_mut().zip(entries) {
        let skipped = address + 1..=entry.address;
        let first = targets.partition_point(|target| target < skipped.start());
        if targets
            .get(first)
            .is_some_and(|target| skipped.contains(target))
        {
            *entry = CheaperEntry::at(address);
        }
    }
    Ok(cheaper)
}

fn cheaper_entry(info: &ElfInfo, address: u64) -> Option<CheaperEntry> {
    let (function, offset) = info.function_at(address)?;
    let code = info.code_from(function.address)?;
    let code = &code[..code.len().min(usize::try_from(function.size).ok()?)];
    let moved = first_emulated(code.get(usize::try_from(offset).ok()?..)?, address)?;
    // The function's own branches, and those of the parts the compiler split off it
    // (`malloc.cold`, jumped to and back from), decoded from their starts.
    let cold = format!("{}.cold", function.name);
    let mut parts = vec![(function.address, code)];
    for part in info.functions.iter().filter(|f| f.name.starts_with(&cold)) {
        let part_code = info.code_from(part.address)?;
        let size = usize::try_from(part.size).ok()?;
        parts.push((part.address, &part_code[..part_code.len().min(size)]));
    }
    let reached_otherwise = parts.iter().any(|&(start, code)| {
        has_computed_jumps(code, start)
            || branch_targets(code, start)
                .iter()
                .any(|target| (address + 1..=moved.address).contains(target))
    });
    (!reached_otherwise).then_some(CheaperEntry {
        address: moved.address,
        holds: moved.holds,
    })
}

/// The instruction at `address` if no uprobe may sit on it (see [`HazardKind`]).
fn hazard_at(info: &ElfInfo, address: u64) -> Option<Hazard> {
    hazard_for_uprobes(info.code_from(address)?, address)
}

/// What was said of each kind of hazard, in the order first said, for one line each.
fn by_kind<T>(items: Vec<(HazardKind, T)>) -> Vec<(HazardKind, Vec<T>)> {
    let mut grouped: Vec<(HazardKind, Vec<T>)> = Vec::new();
    for (kind, item) in items {
        match grouped.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, same)) => same.push(item),
            None => grouped.push((kind, vec![item])),
        }
    }
    grouped
}

/// Where to probe the entry of function `symbol` at `address`: there, unless no uprobe
/// may sit on its first instruction (see [`HazardKind`]: an AVX instruction the kernel
/// would skip instead of running, corrupting every process that calls the function; a
/// 5-byte nop the kernel would turn into a call that crashes the process's forked
/// children); then at the next instruction, which every call reaches once when nothing
/// jumps to it, with the registers and stack of the entry (neither instruction touches
/// rsp or what a probe's program reads, so a return probe hijacks the same return
/// address). What moved is added to `moved` (kind, then name, instruction, offset).
fn entry_site(
    info: &ElfInfo,
    address: u64,
    symbol: String,
    moved: &mut Vec<(HazardKind, (String, String, u64))>,
) -> Result<(u64, String), ResolveError> {
    let Some(hazard) = hazard_at(info, address) else {
        return Ok((address, symbol));
    };
    let next = address + hazard.length;
    let refuse = |reason: &str| ResolveError::HazardEntry {
        function: symbol.clone(),
        kind: hazard.kind,
        instruction: hazard.instruction.clone(),
        path: info.path.clone(),
        reason: reason.to_string(),
    };
    let function = info
        .functions
        .iter()
        .filter(|f| f.address == address && f.size > 0)
        .max_by_key(|f| f.size)
        .ok_or_else(|| refuse("cannot be checked (the function's size is unknown)"))?;
    if hazard.length >= function.size {
        return Err(refuse("is past its end"));
    }
    let code = info.code_from(address).unwrap_or_default();
    let code = &code[..code.len().min(function.size as usize)];
    if branch_targets(code, address).contains(&next) {
        return Err(refuse(
            "is a branch target, reached more than once per call",
        ));
    }
    if hazard_at(info, next).is_some() {
        return Err(refuse("is no place for a uprobe either"));
    }
    let site = format!("{symbol}+{:#x}", hazard.length);
    moved.push((hazard.kind, (symbol, hazard.instruction, hazard.length)));
    Ok((next, site))
}

/// Refuses `address`, past the start of `function`, unless an instruction starts
/// there. `location` names the address in errors, `shown` a boundary.
fn check_boundary(
    info: &ElfInfo,
    function: &Function,
    address: u64,
    options: &ResolveOptions,
    location: String,
    shown: impl Fn(u64) -> String,
) -> Result<(), ResolveError> {
    let mut code = info.code_from(function.address).unwrap_or_default();
    if function.size > 0 {
        code = &code[..code.len().min(function.size as usize)];
    }
    match placement(code, function.address, address) {
        Placement::Boundary => Ok(()),
        Placement::Inside { before, after } => Err(ResolveError::InsideInstruction {
            location,
            function: display_name(&function.name),
            path: info.path.clone(),
            before: shown(before),
            after: shown(after),
        }),
        Placement::Undecodable { .. } if options.unsafe_addresses => Ok(()),
        Placement::Undecodable { at } => Err(ResolveError::Undecodable {
            location,
            function: display_name(&function.name),
            path: info.path.clone(),
            at,
        }),
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
        // The site is the note's instruction, placed by the program's author: it is
        // refused, not moved, as an address would be.
        if let Some(hazard) = hazard_at(&info, note.pc) {
            return Err(ResolveError::Hazard {
                location: format!(
                    "USDT probe {}:{} at {:#x}",
                    note.provider, note.name, note.pc
                ),
                kind: hazard.kind,
                instruction: hazard.instruction,
                path: path.clone(),
                next: format!("{:#x}", note.pc + hazard.length),
            });
        }
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
