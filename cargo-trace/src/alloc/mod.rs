//! Heap profiling's probe: `alloc[:ALLOCATOR]`, the allocator's functions it finds
//! ([`allocators`]) and how the BPF collector attaches them, and the library a launched
//! target is preloaded with ([`preload`]).
//!
//! An `alloc` probe expands into uprobes on the allocator's functions: each allocating
//! function's entry and return, each freeing function's entry, all with the probe's id
//! in their cookies, so that it keeps its counts apart from the session's other probes.
//! The kernel aggregates per (stack, process, probe) (`bpf-prog/src/bpf/alloc.bpf.h`);
//! the session turns those statistics into samples with the heap's value types
//! (`session/values.rs`, `profile::heap`). Nothing of the writers knows where the events
//! came from.

pub mod allocators;
pub mod hooks;

use anyhow::{Context, Result};
use bpf_prog::{alloc_cookie, AllocKind, EventProgram, Tracer};
use probes::{Attachment, Fire, UprobeTarget};

use crate::settings::HeapSettings;
use allocators::Allocator;

/// The programs an `alloc` probe attaches.
pub const PROGRAMS: [EventProgram; 5] = [
    EventProgram::AllocEntry,
    EventProgram::ResizeEntry,
    EventProgram::AllocReturn,
    EventProgram::Free,
    EventProgram::FreeArg1,
];

/// The bit of a probe id under which the BPF heap programs count a probe's anonymous
/// mappings apart from its heap blocks.
pub const MAPPED: u32 = 1 << 30;

/// An `alloc[:ALLOCATOR]` probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocProbe {
    allocator: Allocator,
}

impl AllocProbe {
    /// The probe `text` names if it is an `alloc` probe, `None` if it is another kind.
    pub fn parse(text: &str) -> Option<Result<AllocProbe>> {
        let rest = match text.strip_prefix("alloc") {
            Some("") => None,
            Some(rest) => Some(rest.strip_prefix(':')?),
            None => return None,
        };
        Some(Allocator::parse(rest).map(|allocator| AllocProbe { allocator }))
    }

    /// Whether and how the preloaded library records this probe's allocator in a
    /// launched `executable`: libc's through its wrappers, and every allocator function
    /// the executable carries of its own through a hook on its entry ([`hooks`]), when
    /// each can be hooked; an allocator named, by hooks on its own functions
    /// ([`hooks::Named`]). (A library's allocator is hooked when the process maps it; one
    /// that cannot be is named in a warning.)
    pub fn in_process(&self, heap: &HeapSettings, executable: &std::path::Path) -> InProcess {
        if !heap.preload {
            return InProcess::Bpf;
        }
        if let Some(named) = hooks::Named::new(&self.allocator, heap.alloc_prefix.as_deref()) {
            return match named.check(executable) {
                Ok(()) => InProcess::Recorded(Some(named)),
                Err(why) => InProcess::BpfNamed(why),
            };
        }
        let hookable = || {
            hooks::check_executable(executable)
                .is_ok_and(|functions| functions.iter().all(|(_, hookable)| hookable.is_ok()))
        };
        if !allocators::carries_allocator(executable).unwrap_or(true) || hookable() {
            InProcess::Recorded(None)
        } else {
            InProcess::Bpf
        }
    }

    /// The allocator the probe names (`alloc`: found in each process).
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }
}

/// Whether and how the preloaded library records an `alloc` probe in a launched target.
pub enum InProcess {
    /// In the process: `alloc`'s allocators (`None`), or the one named.
    Recorded(Option<hooks::Named>),
    /// On the BPF path (`--no-preload`, or an allocator of the executable's own that
    /// cannot be hooked).
    Bpf,
    /// On the BPF path: a function of the allocator named cannot be hooked (why).
    BpfNamed(String),
}

/// Attaches `functions` (found by [`allocators::resolve`] in a process) firing where
/// `fire` says, with probe id `probe_id`: each allocating function's entry and return, each freeing
/// function's entry.
pub fn attach_functions(
    tracer: &Tracer,
    heap: &HeapSettings,
    functions: &[allocators::AllocFunction],
    fire: Fire<'_>,
    probe_id: u32,
) -> Result<Vec<Attachment>> {
    // Functions of a kind share their programs and cookie: attached together (bound
    // to processes, they are one event of the kernel's, attached and detached at once).
    let mut by_kind: Vec<(AllocKind, Vec<UprobeTarget>)> = Vec::new();
    for function in functions {
        match by_kind.iter_mut().find(|(kind, _)| *kind == function.kind) {
            Some((_, targets)) => targets.push(function.target.clone()),
            None => by_kind.push((function.kind, vec![function.target.clone()])),
        }
    }
    let mut links = Vec::new();
    for (kind, targets) in &by_kind {
        // Mappings apart from the heap's blocks: their statistics under a probe id
        // of their own.
        let probe_id = match kind {
            AllocKind::Mmap | AllocKind::Munmap if !heap.count_mmap => probe_id | MAPPED,
            _ => probe_id,
        };
        let cookie = alloc_cookie(probe_id, *kind);
        for &(program, retprobe) in kind.programs() {
            let attached =
                probes::attach_uprobes_in(tracer.program(program), targets, fire, retprobe, cookie)
                    .with_context(|| {
                        let names: Vec<&str> = targets.iter().map(|t| t.symbol.as_str()).collect();
                        format!("attaching {} to {}", program.name(), names.join(", "))
                    })?;
            links.extend(attached);
        }
    }
    Ok(links)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_probes_parse() {
        assert_eq!(
            AllocProbe::parse("alloc").unwrap().unwrap().allocator,
            Allocator::Auto
        );
        assert_eq!(
            AllocProbe::parse("alloc:jemalloc")
                .unwrap()
                .unwrap()
                .allocator,
            Allocator::Jemalloc
        );
        assert!(AllocProbe::parse("allocate").is_none());
        assert!(AllocProbe::parse("uprobe:libc:malloc").is_none());
        assert!(AllocProbe::parse("alloc:nonsense").unwrap().is_err());
    }
}
