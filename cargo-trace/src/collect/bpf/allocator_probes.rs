//! The allocators of every process the target starts, found before it allocates.
//!
//! An `alloc` probe finds its allocator in each process image as it finds it in the
//! launched target ([`allocators::resolve`]): when a traced process is held after an
//! exec, once ld.so has mapped its libraries, and after a dlopen
//! ([`super::children`]), the objects it maps that no process mapped before are looked
//! at, and the functions of an allocator one of them carries are attached, bound to every
//! traced process (so that those they start later inherit the probes), before the process
//! is let go. An object is looked at once a session (by device and inode): a shell
//! loop of `/bin/true` costs a query of each child's mappings and a read of one byte.
//!
//! That byte is the check that a process really carries the probes of its allocators:
//! bound uprobes reach a process through the perf events its parent held when it forked,
//! and a process forked while an allocator's probes were being attached may have missed
//! them. The kernel patches a probed instruction (an `int3`) only in the processes whose
//! events say so: where the first probed function of an allocator lacks it, the
//! allocator's functions are attached again for that process and those it starts.
//!
//! A process found another way (polling: a static executable, another ld.so, a process
//! attached with `-p` that dlopens) may have allocated before its allocator was probed:
//! it is named, with the frees of blocks it allocated unseen, in the profile
//! ([`profile::ProcessAllocators::missed`]) and in a warning.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bpf_prog::Tracer;
use probes::Attachment;
use process_image::MapsEntry;
use profile::{AllocatorCounted, AllocatorsMissed, CountedBy, ProcessAllocators, MERGED_PID};

use super::attach::UprobeScope;
use crate::alloc::allocators::{self, Allocator, ObjectAllocator};
use crate::alloc::{attach_functions, AllocProbe};
use crate::settings::HeapSettings;

/// The instruction a uprobe puts at the probed address.
const INT3: u8 = 0xcc;

/// A file as the kernel knows it: device (`major << 20 | minor`) and inode.
type FileId = (u64, u64);

/// An allocator found in an object, with its probes.
struct Found {
    counted: AllocatorCounted,
    object: ObjectAllocator,
    id: FileId,
}

/// What is known of one traced process's allocators.
#[derive(Clone, Debug, Default)]
struct Process {
    executable: Option<String>,
    /// Indexes into [`AllocatorProbes::found`].
    allocators: BTreeSet<usize>,
    missed: Option<String>,
}

/// The heap probe's allocators in every traced process.
pub struct AllocatorProbes {
    allocator: Allocator,
    probe_id: u32,
    heap: HeapSettings,
    found: Vec<Found>,
    /// Every object looked at, and the allocator it carries if it does.
    objects: HashMap<FileId, Option<usize>>,
    processes: HashMap<u32, Process>,
    /// Processes that exec'd and are not checked yet, since when: one whose libraries
    /// ld.so never reports (a static executable) is checked by polling after a while.
    loading: HashMap<u32, Instant>,
    /// Exited processes counted together, by executable.
    merged: BTreeMap<String, (u64, BTreeSet<usize>, Vec<String>)>,
    links: Vec<Attachment>,
}

/// How a process came to be checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Held before it could run the objects checked (at its entry, after an exec or a
    /// dlopen).
    Yes,
    /// Found running (polling): it may have allocated already.
    No,
}

impl AllocatorProbes {
    pub fn new(probe: &AllocProbe, probe_id: u32, heap: &HeapSettings) -> AllocatorProbes {
        AllocatorProbes {
            allocator: probe.allocator().clone(),
            probe_id,
            heap: heap.clone(),
            found: Vec::new(),
            objects: HashMap::new(),
            processes: HashMap::new(),
            loading: HashMap::new(),
            merged: BTreeMap::new(),
            links: Vec::new(),
        }
    }

    /// Finds the allocators of the target `pid`, held at its entry point (or attached
    /// with `-p`), and attaches them. An allocator that cannot be found or attached there
    /// is the session's error, as it always was.
    pub fn attach_target(&mut self, tracer: &Tracer, pid: u32, scope: &UprobeScope) -> Result<()> {
        self.check(tracer, pid, Held::Yes, scope, pid)
    }

    /// Checks process `pid` (traced, in the session of `target`) for allocators no
    /// traced process carried before, attaches theirs, and makes sure it carries the
    /// probes of every allocator it maps. A failure is the process's: named in the
    /// profile, the session goes on.
    pub fn check_process(
        &mut self,
        tracer: &Tracer,
        pid: u32,
        held: Held,
        scope: &UprobeScope,
        target: u32,
    ) {
        self.loading.remove(&pid);
        if let Err(error) = self.check(tracer, pid, held, scope, target) {
            // Gone meanwhile: nothing ran, nothing missed.
            if !crate::process::alive(pid) {
                self.processes.remove(&pid);
                return;
            }
            let process = self.processes.entry(pid).or_default();
            process.missed = Some(format!("its allocators could not be probed ({error:#})"));
        }
    }

    /// Process `pid` exec'd: its new image is checked once ld.so has mapped it.
    pub fn exec_started(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.loading.insert(pid, Instant::now());
    }

    /// Whether polling should check process `pid`: never checked, or exec'd long enough
    /// ago that ld.so will not report it (`refresh`: how often polling comes).
    pub fn wants_check(&self, pid: u32, refresh: Duration) -> bool {
        match self.loading.get(&pid) {
            Some(since) => since.elapsed() >= refresh,
            None => !self.processes.contains_key(&pid),
        }
    }

    /// Process `pid` exited; `apart`: its counts stay under its own pid (else they are
    /// added up under [`MERGED_PID`], and so is what it counted with).
    pub fn exited(&mut self, pid: u32, apart: bool) {
        self.loading.remove(&pid);
        if apart {
            return;
        }
        let Some(process) = self.processes.remove(&pid) else {
            return;
        };
        let executable = process.executable.unwrap_or_else(|| "?".to_string());
        let merged = self.merged.entry(executable).or_default();
        merged.0 += 1;
        merged.1.extend(process.allocators);
        merged.2.extend(process.missed);
    }

    /// The links of the attached allocators, to be detached with the others'.
    pub fn take_links(&mut self) -> Vec<Attachment> {
        std::mem::take(&mut self.links)
    }

    /// Which allocators were counted in which process; `unknown_frees` gives each
    /// process's frees of blocks never seen allocated, the count a late probe missed.
    pub fn counted(&self, unknown_frees: &HashMap<u32, u64>) -> Vec<ProcessAllocators> {
        let counted = |indexes: &BTreeSet<usize>| -> Vec<AllocatorCounted> {
            let mut counted: Vec<AllocatorCounted> = indexes
                .iter()
                .map(|&index| self.found[index].counted.clone())
                .collect();
            counted.sort();
            counted
        };
        let mut entries: Vec<ProcessAllocators> = self
            .processes
            .iter()
            .map(|(&pid, process)| ProcessAllocators {
                pid,
                executable: process.executable.clone(),
                processes: 1,
                allocators: counted(&process.allocators),
                missed: process.missed.as_ref().map(|reason| AllocatorsMissed {
                    reason: reason.clone(),
                    count: unknown_frees.get(&pid).copied().unwrap_or(0),
                }),
            })
            .collect();
        entries.sort_by_key(|entry| entry.pid);
        for (executable, (processes, allocators, missed)) in &self.merged {
            entries.push(ProcessAllocators {
                pid: MERGED_PID,
                executable: Some(executable.clone()),
                processes: *processes,
                allocators: counted(allocators),
                missed: (!missed.is_empty()).then(|| AllocatorsMissed {
                    reason: format!("{} of them: {}", missed.len(), missed[0]),
                    count: unknown_frees.get(&MERGED_PID).copied().unwrap_or(0),
                }),
            });
        }
        entries
    }

    fn check(
        &mut self,
        tracer: &Tracer,
        pid: u32,
        held: Held,
        scope: &UprobeScope,
        target: u32,
    ) -> Result<()> {
        let mappings: Vec<MapsEntry> = process_image::executable_mappings(pid)
            .with_context(|| format!("reading the mappings of process {pid}"))?
            .into_iter()
            .filter(|m| m.name.starts_with('/') && !m.name.ends_with(" (deleted)"))
            .collect();
        let ids: BTreeSet<FileId> = mappings.iter().filter_map(file_id).collect();
        let mut attached_late = Vec::new();
        if ids.iter().any(|id| !self.objects.contains_key(id)) {
            attached_late.extend(self.find_new(tracer, pid, scope, target)?);
            for id in &ids {
                self.objects.entry(*id).or_insert(None);
            }
        }
        let allocators: BTreeSet<usize> = ids
            .iter()
            .filter_map(|id| self.objects.get(id).copied().flatten())
            .collect();
        // Every allocator it maps has its probes in it, or gets them now (the target got
        // every one attached for it, and keeps them across its execs).
        if let (UprobeScope::Bound(group), false) = (scope, pid == target) {
            for &index in &allocators {
                let found = &self.found[index];
                if carries_probe(pid, &mappings, found) {
                    continue;
                }
                let processes = [pid];
                let fire = probes::Fire::InDescendants {
                    group,
                    processes: &processes,
                };
                let links = attach_functions(
                    tracer,
                    &self.heap,
                    &found.object.functions,
                    fire,
                    self.probe_id,
                )?;
                self.links.extend(links);
                attached_late.push(index);
            }
        }
        let missed = match held {
            Held::No if !attached_late.is_empty() => Some(format!(
                "{} probed only after the process had run (it was found by polling)",
                attached_late
                    .iter()
                    .map(|&index| self.found[index].counted.label())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            _ => None,
        };
        let executable = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|path| path.display().to_string());
        self.processes.insert(
            pid,
            Process {
                executable,
                allocators,
                missed,
            },
        );
        Ok(())
    }

    /// Resolves the probe's allocator in process `pid`, and attaches the allocators of
    /// objects no process carried before, for every traced process; returns their
    /// indexes.
    fn find_new(
        &mut self,
        tracer: &Tracer,
        pid: u32,
        scope: &UprobeScope,
        target: u32,
    ) -> Result<Vec<usize>> {
        let functions =
            allocators::resolve(&self.allocator, self.heap.alloc_prefix.as_deref(), pid)?;
        let mut new = Vec::new();
        for object in allocators::by_object(functions) {
            let id = path_id(&object.path)
                .with_context(|| format!("reading {}", object.path.display()))?;
            if let Some(Some(_)) = self.objects.get(&id) {
                continue;
            }
            let processes = tracer.filtered_pids();
            let links = attach_functions(
                tracer,
                &self.heap,
                &object.functions,
                scope.fire(target, &processes),
                self.probe_id,
            )?;
            self.links.extend(links);
            let counted = AllocatorCounted {
                name: object.name.to_string(),
                prefix: object.prefix.clone(),
                object: object.path.display().to_string(),
                counted_by: CountedBy::Functions,
            };
            self.found.push(Found {
                counted,
                object,
                id,
            });
            let index = self.found.len() - 1;
            self.objects.insert(id, Some(index));
            new.push(index);
        }
        Ok(new)
    }
}

/// Whether process `pid` has the breakpoint of `found`'s first function in place (a
/// process whose memory cannot be read is taken to have it: it is exiting).
fn carries_probe(pid: u32, mappings: &[MapsEntry], found: &Found) -> bool {
    let Some(function) = found.object.functions.first() else {
        return true;
    };
    let offset = function.target.file_offset;
    let Some(mapping) = mappings.iter().find(|m| {
        file_id(m) == Some(found.id) && offset >= m.offset && offset - m.offset < m.end - m.start
    }) else {
        // Not mapped where it runs code: nothing to probe.
        return true;
    };
    let address = mapping.start + (offset - mapping.offset);
    let mut byte = [0u8; 1];
    let read = std::fs::File::open(format!("/proc/{pid}/mem"))
        .and_then(|mem| mem.read_exact_at(&mut byte, address));
    read.is_err() || byte[0] == INT3
}

/// The file a mapping maps, as the kernel numbers it.
fn file_id(mapping: &MapsEntry) -> Option<FileId> {
    Some((mapping.kernel_dev()?, mapping.inode))
}

/// The file at `path`, as the kernel numbers it in mappings.
fn path_id(path: &Path) -> std::io::Result<FileId> {
    let metadata = std::fs::metadata(path)?;
    let dev = metadata.dev();
    let (major, minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
    Ok((major << 20 | minor, metadata.ino()))
}
