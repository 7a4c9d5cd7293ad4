//! Attaching the session's probes: each with its index as the BPF cookie, uprobes where
//! the session's scope says they fire, and probes on libraries no traced process maps
//! yet kept until one does (a plugin to be dlopened).

use anyhow::Result;
use bpf_prog::Tracer;
use probes::{Attachment, Fire, UprobeGroup};

use crate::probe::{event_program, Probe, ProbeKind};

/// How the probes attach.
#[derive(Clone, Debug)]
pub struct AttachPlan {
    pub scope: UprobeScope,
    pub unsafe_addresses: bool,
}

/// Where the session's uprobes fire.
#[derive(Clone, Debug)]
pub enum UprobeScope {
    /// In the target only (`--no-follow-forks`).
    Target,
    /// In the traced processes and all they start ([`probes::bound`]): untraced
    /// processes never trap.
    Bound(UprobeGroup),
    /// In every process mapping the file, the program keeping the traced ones: where
    /// tracefs has no uprobe events to bind with.
    Everywhere,
}

impl UprobeScope {
    pub fn new(follow: bool) -> UprobeScope {
        if !follow {
            return UprobeScope::Target;
        }
        match UprobeGroup::new() {
            Ok(group) => UprobeScope::Bound(group),
            Err(error) => {
                eprintln!(
                    "cargo-trace: warning: uprobes cannot be bound to the traced processes \
                     ({error}); they trap in every process mapping their files"
                );
                UprobeScope::Everywhere
            }
        }
    }

    /// Where a uprobe attached now fires: `target` is the session's target, `processes`
    /// every process traced now.
    pub fn fire<'a>(&'a self, target: u32, processes: &'a [u32]) -> Fire<'a> {
        match self {
            UprobeScope::Target => Fire::InProcess(target),
            UprobeScope::Bound(group) => Fire::InDescendants { group, processes },
            UprobeScope::Everywhere => Fire::Everywhere,
        }
    }

    /// What deletes the bound uprobes should cargo-trace die (the guard does it).
    pub fn removal(&self) -> Option<(std::path::PathBuf, String)> {
        match self {
            UprobeScope::Bound(group) => Some(group.removal()),
            UprobeScope::Target | UprobeScope::Everywhere => None,
        }
    }
}

/// Attaches every event probe with its index as the BPF cookie: counts keep probes apart
/// by it. A uprobe on a library no traced process maps and none of the library directories
/// holds (a plugin to be dlopened) is not an error: it waits in [`Pending`].
pub fn attach_all(
    tracer: &Tracer,
    probes: &[Probe],
    pid: u32,
    plan: &AttachPlan,
) -> Result<(Vec<Attachment>, Pending)> {
    let mut links = Vec::new();
    let mut pending = Pending {
        probes: Vec::new(),
        plan: plan.clone(),
        target: pid,
    };
    for (index, probe) in probes.iter().enumerate() {
        // The heap's allocators are found in each process (`AllocatorProbes`).
        if let ProbeKind::Heap(_) = &probe.kind {
            continue;
        }
        match attach_one(tracer, probe, index, pid, plan, &[pid]) {
            Ok(attached) => links.extend(attached),
            Err(error) if waits_for_a_library(&error) => {
                eprintln!(
                    "cargo-trace: warning: {}: {error}; it is attached when a traced process \
                     maps it (dlopen)",
                    probe.text
                );
                pending.probes.push(index);
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok((links, pending))
}

/// Attaches one probe, resolving its names in process `pid`, for the traced
/// `processes`; prints its notices.
fn attach_one(
    tracer: &Tracer,
    probe: &Probe,
    index: usize,
    pid: u32,
    plan: &AttachPlan,
    processes: &[u32],
) -> Result<Vec<Attachment>, probes::Error> {
    // An alloc probe attaches as a whole (attach_all); it never waits for a library.
    let Some(spec) = probe.event_spec() else {
        return Ok(Vec::new());
    };
    let program = tracer.program(event_program(spec.program_kind()));
    let options = probes::AttachOptions {
        resolve_in: Some(pid),
        fire: plan.scope.fire(pid, processes),
        unsafe_addresses: plan.unsafe_addresses,
    };
    let attached = probes::attach_probe_with(program, spec, &options, index as u64)?;
    for notice in &attached.notices {
        eprintln!("cargo-trace: {}: {notice}", notice.level());
    }
    Ok(attached.links)
}

/// Whether a probe failed only because its library is nowhere yet.
fn waits_for_a_library(error: &probes::Error) -> bool {
    matches!(
        error,
        probes::Error::Resolve(probes::ResolveError::LibraryNotFound { .. })
    )
}

/// Uprobes on libraries no traced process had mapped when the session started.
pub struct Pending {
    /// Indexes into the session's probes.
    probes: Vec<usize>,
    plan: AttachPlan,
    /// Without following children, probes fire in the target only.
    target: u32,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.probes.is_empty()
    }

    /// Attaches the pending probes whose library process `pid` maps now, for every
    /// process traced now. `pid` is held stopped after a dlopen (except an attached
    /// process), so nothing it runs in the library goes uncounted.
    pub fn attach_in(
        &mut self,
        tracer: &Tracer,
        probes: &[Probe],
        pid: u32,
        links: &mut Vec<Attachment>,
    ) {
        let following = !matches!(self.plan.scope, UprobeScope::Target);
        if self.probes.is_empty() || (!following && pid != self.target) {
            return;
        }
        let processes = tracer.filtered_pids();
        self.probes.retain(|&index| {
            let probe = &probes[index];
            match attach_one(tracer, probe, index, pid, &self.plan, &processes) {
                Ok(attached) => {
                    eprintln!(
                        "cargo-trace: note: {} attached: process {pid} mapped its library",
                        probe.text
                    );
                    links.extend(attached);
                    false
                }
                Err(error) if waits_for_a_library(&error) => true,
                Err(error) => {
                    eprintln!("cargo-trace: warning: {}: {error}", probe.text);
                    false
                }
            }
        });
    }
}
