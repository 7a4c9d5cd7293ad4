//! What the in-process path counted in each process, and how: the allocators the
//! preloaded library's wrappers reached and those it hooked, the hooks refused (one
//! warning line) and `--bpf-stats`' account of them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use preload::{HookOutcome, HookReport};
use profile::{AllocatorCounted, CountedBy};

use crate::alloc::allocators::allocator_named;
use crate::alloc::hooks::{Named, DEBUG_STATE};
use crate::symbolize::SymbolMapping;

/// The object the wrappers' calls of a process reach, as `mappings` show it: the first
/// mapped of a library that replaces malloc (jemalloc's, mimalloc's) and libc.
pub fn wrapped_object(mappings: Option<&Vec<SymbolMapping>>) -> Option<PathBuf> {
    let mut objects: Vec<(u64, &Path)> = mappings
        .into_iter()
        .flatten()
        .filter(|m| m.names.name.starts_with('/'))
        .map(|m| (m.start, Path::new(m.names.name.as_str())))
        .filter(|(_, path)| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|file| {
                    ["libjemalloc", "libmimalloc", "libc.so", "libc-"]
                        .iter()
                        .any(|known| file.starts_with(known))
                })
        })
        .collect();
    objects.sort_unstable();
    // a replacement of malloc comes before libc in the lookup order
    objects
        .iter()
        .find(|(_, path)| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|file| !file.starts_with("libc"))
        })
        .or(objects.first())
        .map(|(_, path)| path.to_path_buf())
}

/// The allocators counted in process `pid`: the one its wrappers reach (`wrapped`, libc
/// where not known) unless they pass every call through (`named`'s session), and those
/// hooked in it, by object; and why some of its calls were not counted, if any were left
/// unhooked or the allocator named was not found.
pub fn counted_in(
    pid: u32,
    wrapped: Option<&Path>,
    hooks: &[HookReport],
    named: Option<&Named>,
) -> (BTreeSet<AllocatorCounted>, Option<String>) {
    let mut counted = BTreeSet::new();
    if named.is_none_or(Named::wrappers_count) {
        let wrapped = wrapped.unwrap_or(Path::new("libc.so.6")).to_path_buf();
        let file = wrapped.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let name = if file.starts_with("libjemalloc") {
            "jemalloc"
        } else if file.starts_with("libmimalloc") {
            "mimalloc"
        } else {
            "libc"
        };
        counted.insert(AllocatorCounted {
            name: name.to_string(),
            prefix: None,
            object: wrapped.display().to_string(),
            counted_by: CountedBy::Wrappers,
        });
    }
    let mine: Vec<&HookReport> = hooks
        .iter()
        .filter(|h| h.pid == pid && h.name != DEBUG_STATE)
        .collect();
    let mut objects: Vec<&Path> = mine.iter().map(|h| h.object.as_path()).collect();
    objects.sort_unstable();
    objects.dedup();
    for object in objects {
        let names: Vec<&str> = mine
            .iter()
            .filter(|h| h.object == object && h.outcome == HookOutcome::Hooked)
            .map(|h| h.name.as_str())
            .collect();
        if names.is_empty() {
            continue;
        }
        let (name, prefix) = allocator_named(object, &names);
        counted.insert(AllocatorCounted {
            name: name.to_string(),
            prefix,
            object: object.display().to_string(),
            counted_by: CountedBy::Hooks,
        });
    }
    let unresolved = named
        .and_then(|named| named.unresolved(pid))
        .map(|why| format!("its allocator was not found ({why})"));
    let missed = hooks
        .iter()
        .filter(|h| h.pid == pid && h.outcome != HookOutcome::Hooked)
        .map(|h| format!("{} of {} not hooked", h.name, h.object.display()))
        .next()
        .or(unresolved);
    (counted, missed)
}

/// The one line that names the allocator functions left unhooked, if any were: their
/// calls are not counted.
pub fn unhooked_warning(hooks: &[HookReport]) -> Option<String> {
    let missed: Vec<&HookReport> = hooks
        .iter()
        .filter(|h| h.outcome != HookOutcome::Hooked)
        .collect();
    let first = missed.first()?;
    let why = match &first.outcome {
        HookOutcome::Refused(why) => why.clone(),
        _ => "no room for its hook within reach, or its code could not be written".to_string(),
    };
    let mut processes: Vec<u32> = missed.iter().map(|h| h.pid).collect();
    processes.sort_unstable();
    processes.dedup();
    let more = match missed.len() {
        1 => String::new(),
        n => format!(" and {} more", n - 1),
    };
    let missed_calls = if first.name == DEBUG_STATE {
        "the allocators that dlopen brings are not hooked, their calls not counted"
    } else {
        "the calls to it are not counted"
    };
    Some(format!(
        "{} of {} could not be hooked in process {} ({why}){more}, in {} process(es): \
         {missed_calls} (--no-preload probes them from the kernel)",
        first.name,
        first.object.display(),
        first.pid,
        processes.len(),
    ))
}

/// `--bpf-stats`' account of the hooks: functions hooked (the allocators', and the dynamic
/// linker's `_dl_debug_state` in each process) in how many processes, refused and why.
pub fn hooks_line(hooks: &[HookReport]) -> String {
    let hooked: Vec<&HookReport> = hooks
        .iter()
        .filter(|h| h.outcome == HookOutcome::Hooked)
        .collect();
    let mut processes: Vec<u32> = hooked.iter().map(|h| h.pid).collect();
    processes.sort_unstable();
    processes.dedup();
    let mut refused: std::collections::BTreeMap<String, usize> = Default::default();
    for hook in hooks {
        match &hook.outcome {
            HookOutcome::Hooked => {}
            HookOutcome::Refused(why) => {
                *refused.entry(format!("{}: {why}", hook.name)).or_default() += 1
            }
            HookOutcome::NotPlaced => {
                *refused
                    .entry(format!("{}: not placed", hook.name))
                    .or_default() += 1
            }
        }
    }
    let refused = if refused.is_empty() {
        "none refused".to_string()
    } else {
        let reasons: Vec<String> = refused
            .iter()
            .map(|(why, n)| format!("{why} ({n})"))
            .collect();
        format!("refused: {}", reasons.join("; "))
    };
    format!(
        "in-process: hooks: {} functions hooked in {} processes, {refused}",
        hooked.len(),
        processes.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(pid: u32, name: &str, outcome: HookOutcome) -> HookReport {
        HookReport {
            pid,
            entry: 0x1000,
            name: name.to_string(),
            object: "/usr/bin/prog".into(),
            outcome,
        }
    }

    /// Every function hooked: no warning, and `--bpf-stats` counts them by process.
    #[test]
    fn hooked_functions_are_counted() {
        let hooks = [
            report(1, "mi_malloc", HookOutcome::Hooked),
            report(1, "mi_free", HookOutcome::Hooked),
            report(2, "_dl_debug_state", HookOutcome::Hooked),
        ];
        assert_eq!(unhooked_warning(&hooks), None);
        assert_eq!(
            hooks_line(&hooks),
            "in-process: hooks: 3 functions hooked in 2 processes, none refused"
        );
    }

    /// A function refused or not placed is named in one warning line, with what is not
    /// counted, and in `--bpf-stats` with its reason.
    #[test]
    fn unhooked_functions_are_named() {
        let hooks = [
            report(1, "mi_malloc", HookOutcome::Hooked),
            report(
                7,
                "je_mallocx",
                HookOutcome::Refused("it is shorter than the 5-byte jump".into()),
            ),
            report(8, "je_free", HookOutcome::NotPlaced),
        ];
        let warning = unhooked_warning(&hooks).unwrap();
        assert!(
            warning.starts_with("je_mallocx of /usr/bin/prog could not be hooked in process 7")
                && warning.contains("and 1 more, in 2 process(es)")
                && warning.contains("not counted"),
            "{warning}"
        );
        let line = hooks_line(&hooks);
        assert!(
            line.contains("1 functions hooked in 1 processes")
                && line.contains("je_mallocx: it is shorter than the 5-byte jump (1)")
                && line.contains("je_free: not placed (1)"),
            "{line}"
        );
    }
}
