//! The BPF collector: the programs of `bpf-prog` walk stacks in the kernel at every
//! event of the session's probes (and the heap probes' calls), count them there, and
//! hand their counts and stacks to the session through [`Collector`].
//!
//! It owns what only it needs: the loaded programs ([`Tracer`]), the links of the
//! attached probes and those waiting for a library ([`attach`]), the allocators of every
//! traced process ([`allocator_probes`]), the following of the target's children
//! ([`children`]), the processes that exited ([`exited`]), and the guard that resumes held
//! processes should cargo-trace die.

mod allocator_probes;
mod attach;
mod children;
mod exited;
mod read;
mod store;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bpf_prog::{AllocOptions, EventProgram, Options, TableId, Tracer};
use probes::Attachment;

use crate::collect::{Collected, Collector, HeapCount, HeapNow, Target, When};
use crate::guard::Guard;
use crate::probe::{event_program, Probe, ProbeKind};
use crate::process;
use crate::settings::{HeapSettings, Settings};
use crate::tables::{ProcessTables, SharedTables, StoreId};
use crate::timings::{self, Phase};
use allocator_probes::{AllocatorProbes, Held};
use attach::{AttachPlan, Pending, UprobeScope};
use children::Children;
use exited::ExitedProcesses;
use store::KernelTables;

/// How often the traced processes' mappings are re-read (libraries opened with dlopen).
const REFRESH_INTERVAL: Duration = Duration::from_millis(200);

/// The BPF programs, what they are attached to and what they count.
pub struct BpfCollector {
    probes: Vec<Probe>,
    /// Whether it counts the heap probes too (another collector may take them).
    takes_heap: bool,
    heap: HeapSettings,
    follow: bool,
    /// The launched target's or the attached process's pid, once attached.
    target: Option<u32>,
    /// Links and children before the tracer: they reference its programs.
    links: Vec<Attachment>,
    /// Probes on a library no traced process maps yet (one to be dlopened).
    pending: Option<Pending>,
    /// The heap probes' allocators, found in each traced process.
    allocators: Vec<AllocatorProbes>,
    children: Option<Children>,
    exited: ExitedProcesses,
    keep_exited: usize,
    /// The session's tables, and those the kernel holds by the session's handles.
    tables: SharedTables,
    kernel_tables: Vec<TableId>,
    tracer: Tracer,
    plan: AttachPlan,
    /// Resumes the processes held stopped, should cargo-trace die without doing so.
    guard: Option<Guard>,
    /// BPF run-time statistics, enabled for the session (`--bpf-stats`).
    stats: Option<std::os::fd::OwnedFd>,
    bpf_stats: bool,
    /// Processes traced at the last refresh.
    processes: usize,
    last_refresh: Instant,
}

impl BpfCollector {
    /// Loads the programs the probes need (the verifier runs now) and forks the guard.
    /// `takes_heap`: it counts the heap probes (else they are left to another collector).
    pub fn load(
        settings: &Settings,
        probes: Vec<Probe>,
        takes_heap: bool,
        tables: SharedTables,
    ) -> Result<BpfCollector> {
        let follow = settings.follow_forks;
        let taken = |probe: &&Probe| takes_heap || !probe.is_heap();
        let heap_probes = probes.iter().filter(taken).filter(|p| p.is_heap()).count();
        let heap_probes = u32::try_from(heap_probes.max(1)).unwrap_or(u32::MAX);
        let capacities = &settings.capacities;
        let options = Options {
            // The kernel fires bound uprobes in the traced processes only; the program
            // still keeps the processes it follows (those past a full pid filter are
            // not).
            filter_uprobes: follow,
            programs: programs_for(probes.iter().filter(taken)),
            // The heap's totals are per process and alloc probe.
            alloc: AllocOptions {
                max_processes: capacities.max_processes.saturating_mul(heap_probes),
                ..alloc_options(&settings.heap)
            },
            max_stacks: capacities.max_stacks,
            max_counts: capacities.max_counts,
            max_rows: capacities.max_table_rows,
            max_pages: capacities.max_table_pages,
            max_rules: capacities.max_table_rules,
            max_tables: capacities.max_tables,
            record_ring_bytes: capacities.ring_buffer_bytes,
            max_procs: capacities.max_processes,
            max_filtered_pids: capacities.max_processes,
            max_files: capacities.max_files,
            off_cpu_min_block_ns: settings.min_block_ns,
            max_off_cpu_threads: capacities.max_off_cpu_threads,
            ..Options::default()
        };
        let tracer = Tracer::load(&options).map_err(|error| {
            let needs_root = error.is_permission_denied();
            let error = anyhow::Error::new(error);
            if needs_root {
                error.context("loading BPF programs needs root (or CAP_BPF and CAP_PERFMON)")
            } else {
                error
            }
        })?;
        timings::done_split(Phase::Load, Phase::Verify, tracer.load_times().verify);
        // After the load, which says first when there are no privileges for any of it.
        let scope = UprobeScope::new(follow);
        // Before anything can be stopped: resumes what is, should cargo-trace die.
        let guard = Guard::spawn(tracer.pid_filter_fd(), scope.removal())
            .context("starting the guard process")?;
        timings::done(Phase::Guard);
        Ok(BpfCollector {
            probes,
            takes_heap,
            heap: settings.heap.clone(),
            follow,
            target: None,
            links: Vec::new(),
            pending: None,
            allocators: Vec::new(),
            children: None,
            exited: ExitedProcesses::new(settings.keep_exited, 0),
            keep_exited: settings.keep_exited,
            tables,
            kernel_tables: Vec::new(),
            tracer,
            plan: AttachPlan {
                scope,
                unsafe_addresses: settings.unsafe_addresses,
            },
            guard: Some(guard),
            stats: None,
            bpf_stats: settings.bpf_stats,
            processes: 1,
            last_refresh: Instant::now(),
        })
    }

    /// The kernel's maps as a store of tables.
    fn store<'a>(tracer: &'a mut Tracer, kernel_tables: &'a mut Vec<TableId>) -> KernelTables<'a> {
        KernelTables {
            tracer,
            tables: kernel_tables,
        }
    }

    /// Registers the mappings of processes that joined the filter (children the
    /// program followed) or exec'd since, re-reads every traced process's mappings
    /// (dlopen) and forgets those that exited.
    fn track_processes(&mut self) {
        let shared = self.tables.clone();
        let tables: &mut ProcessTables = &mut shared.lock();
        let mut traced = 0;
        let mut exited = Vec::new();
        for pid in self.tracer.filtered_pids() {
            let known = tables.knows(StoreId::Kernel, pid);
            if !process::alive(pid) {
                exited.push(pid);
                continue;
            }
            traced += 1;
            if known && !self.tracer.has_mappings(pid) {
                // It exec'd: the program dropped the old image's mappings.
                tables.forget(StoreId::Kernel, pid);
            }
            // The process may be exiting: a failed read is not an error.
            let mut store = Self::store(&mut self.tracer, &mut self.kernel_tables);
            let _ = tables.sync(&mut store, pid);
            // One no stop reported (a static executable, another ld.so, a fork).
            let target = self.target.unwrap_or(pid);
            for allocators in &mut self.allocators {
                if allocators.wants_check(pid, REFRESH_INTERVAL) {
                    allocators.check_process(&self.tracer, pid, Held::No, &self.plan.scope, target);
                }
            }
        }
        for pid in exited {
            // Its filter and mappings entries are freed; its counts leave the kernel.
            let _ = self.tracer.unfilter_pid(pid);
            let _ = self.tracer.remove_process(pid);
            let apart = self.exited.exited(pid);
            tables.release(pid, apart);
            for allocators in &mut self.allocators {
                allocators.exited(pid, apart);
            }
        }
        self.exited.retire(&self.tracer, false);
        self.processes = traced;
    }
}

impl Collector for BpfCollector {
    fn attach(&mut self, target: Target) -> Result<()> {
        let pid = target.pid;
        self.target = Some(pid);
        self.exited = ExitedProcesses::new(self.keep_exited, pid);
        let mut store = Self::store(&mut self.tracer, &mut self.kernel_tables);
        self.tables.lock().sync(&mut store, pid)?;
        self.tracer
            .filter_pid(pid)
            .context("adding the target to the event filter")?;
        timings::done(Phase::Tables);
        let (links, pending) = attach::attach_all(&self.tracer, &self.probes, pid, &self.plan)?;
        self.links = links;
        self.pending = Some(pending);
        if self.takes_heap {
            for (index, probe) in self.probes.iter().enumerate() {
                if let ProbeKind::Heap(alloc) = &probe.kind {
                    let mut allocators = AllocatorProbes::new(alloc, index as u32, &self.heap);
                    allocators.attach_target(&self.tracer, pid, &self.plan.scope)?;
                    self.allocators.push(allocators);
                }
            }
        }
        if self.follow {
            let targets = [pid];
            let fire = self.plan.scope.fire(pid, &targets);
            self.children = Some(Children::follow(&self.tracer, pid, !target.launched, fire)?);
        }
        timings::done(Phase::Attach);
        Ok(())
    }

    fn start(&mut self) -> Result<()> {
        if self.bpf_stats {
            self.stats = Some(
                bpf_prog::enable_run_time_stats().context("enabling BPF run-time statistics")?,
            );
        }
        self.tracer.set_interval_target(self.target);
        self.tracer.start_free_logs();
        Ok(())
    }

    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        // A child stopped at its start is registered at once.
        self.children.as_ref().map(Children::reports_fd)
    }

    fn poll(&mut self) {
        // New stacks reach userspace through a ring buffer: drained at every wake-up so
        // that a burst of them finds it empty. A failure here loses nothing: the records
        // stay for the next drain.
        let _ = self.tracer.drain_records();
        if let Some(children) = &self.children {
            children.take_reports();
            let (links, pending, probes) = (&mut self.links, &mut self.pending, &self.probes);
            let (allocators, scope) = (&mut self.allocators, &self.plan.scope);
            let target = self.target.unwrap_or(0);
            let mut store = Self::store(&mut self.tracer, &mut self.kernel_tables);
            let mut tables = self.tables.lock();
            children.register_started(&mut store, &mut tables, |tracer, pid| {
                if let Some(pending) = pending {
                    pending.attach_in(tracer, probes, pid, links);
                }
                // Right after an exec, ld.so has not mapped the libraries yet: they are
                // checked at the next stop, once it has.
                let loading = tracer.loading(pid);
                for allocators in allocators.iter_mut() {
                    if loading {
                        allocators.exec_started(pid);
                    } else {
                        allocators.check_process(tracer, pid, Held::Yes, scope, target);
                    }
                }
            });
        }
        // Not at every wake-up: a child that execs reports itself (above), and one that
        // only forked walks with its parent's mappings meanwhile; reading the whole
        // filter map is a system call per process.
        if self.last_refresh.elapsed() >= REFRESH_INTERVAL {
            self.last_refresh = Instant::now();
            self.track_processes();
            if let Some(pending) = self.pending.as_mut().filter(|p| !p.is_empty()) {
                for pid in self.tracer.filtered_pids() {
                    pending.attach_in(&self.tracer, &self.probes, pid, &mut self.links);
                }
            }
        }
    }

    fn end(&mut self) {
        // An interval counts no more, though its timer runs until the links are
        // detached (which can take seconds with many probes).
        self.tracer.set_interval_target(None);
    }

    fn stop(&mut self) {
        // Teardown in order: no child stops any more, every child held stopped is
        // resumed; only then is the guard told it has nothing to do. The links are
        // released in the background: the release of each waits for the kernel's grace
        // periods (~20-100 ms a link here, one after the other), and nothing needs it
        // done. Until it is, their programs may still count (nothing reads it) but stop
        // no process.
        self.tracer.end_following();
        let mut links = std::mem::take(&mut self.links);
        if let Some(children) = self.children.as_mut() {
            links.extend(children.take_links());
        }
        for allocators in &mut self.allocators {
            links.extend(allocators.take_links());
        }
        let removal = self.plan.scope.removal();
        probes::detach_in_background(
            links,
            removal
                .as_ref()
                .map(|(control, command)| (control.as_path(), command.as_str())),
        );
        self.children = None;
        if let Some(guard) = self.guard.take() {
            guard.dismiss();
        }
    }

    fn collected(&mut self, when: When) -> Result<Collected> {
        // Every exited process under the pid it is counted under.
        self.exited.retire(&self.tracer, true);
        let heap = self.takes_heap.then_some(&self.heap);
        let mut collected = read::collected(&self.tracer, &self.probes, heap)?;
        collected.merged_processes = self.exited.merged();
        let unknown_frees: std::collections::HashMap<u32, u64> = collected
            .heap
            .iter()
            .flat_map(|heap| &heap.processes)
            .map(|p| (p.pid, p.unknown_frees))
            .collect();
        for allocators in &self.allocators {
            collected
                .allocators
                .extend(allocators.counted(&unknown_frees));
        }
        if when == When::Final {
            let warnings = collected.allocators.iter().filter_map(|p| p.warning());
            collected.warnings.extend(warnings.collect::<Vec<_>>());
        }
        if when == When::Final {
            if let Some((lost, error)) = self.tracer.storage_failure() {
                collected.warnings.push(format!(
                    "{lost} stacks or counters of exited processes could not be written to \
                     the stack storage's file ({error}): their stacks show as lost, their \
                     counts are missing"
                ));
            }
        }
        Ok(collected)
    }

    fn walks_so_far(&self) -> Option<(u64, u64)> {
        let walks = self.tracer.walk_ends().ok()?;
        Some((
            walks.total(),
            walks.failures().map(|(_, count)| count).sum(),
        ))
    }

    fn processes(&self) -> usize {
        self.processes
    }

    fn still_running(&self, target: u32) -> Vec<u32> {
        process::still_running(self.tracer.filtered_pids(), target)
    }

    fn heap_now(&self) -> Option<HeapNow> {
        if !self.takes_heap || !self.probes.iter().any(Probe::is_heap) {
            return None;
        }
        let mut processes = self.tracer.alloc_processes().ok()?;
        processes.retain(|p| p.probe_id & crate::alloc::MAPPED == 0);
        let mut pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
        pids.dedup();
        Some(HeapNow {
            live_bytes: processes.iter().map(|p| p.live_bytes).sum(),
            allocs: processes.iter().map(|p| p.allocs).sum(),
            frees: processes.iter().map(|p| p.frees).sum(),
            pids,
        })
    }

    fn heap_live(&self) -> Result<Vec<HeapCount>> {
        let mut stacks = read::heap_stacks(&self.tracer)?;
        stacks.retain(|count| count.probe & crate::alloc::MAPPED as usize == 0);
        Ok(stacks)
    }

    fn cost_report(&self) -> Result<Vec<String>> {
        if self.stats.is_none() {
            return Ok(Vec::new());
        }
        let stats = self
            .tracer
            .program_stats()
            .context("reading BPF statistics")?;
        let mut programs: Vec<_> = stats.iter().filter(|(_, s)| s.run_count > 0).collect();
        programs.sort_by_key(|(name, _)| *name);
        let mut lines: Vec<String> = programs
            .into_iter()
            .map(|(name, s)| {
                format!(
                    "bpf {name}: {} runs, {} ns per run",
                    s.run_count,
                    s.run_time_ns / s.run_count
                )
            })
            .collect();
        let walks = self
            .tracer
            .walk_ends()
            .context("reading the walk counters")?
            .total();
        let answered = self
            .tracer
            .memo_hits()
            .context("reading the walk memo's counter")?;
        lines.push(format!("walk memo: {answered} of {walks} walks answered"));
        Ok(lines)
    }
}

/// The heap programs' settings.
fn alloc_options(heap: &HeapSettings) -> AllocOptions {
    AllocOptions {
        max_live_blocks: heap
            .max_live_blocks
            .unwrap_or(AllocOptions::default().max_live_blocks),
        max_stacks: heap.max_stacks,
        temporary_ns: u64::try_from(heap.temporary.as_nanos()).unwrap_or(u64::MAX),
        sample_every: heap.sample_every,
        sample_bytes: heap.sample_bytes,
        min_size: heap.min_size,
        max_size: heap.max_size,
        ..AllocOptions::default()
    }
}

/// The event programs the probes attach (the others are not loaded: the verifier's time
/// is most of a session's start).
fn programs_for<'a>(
    probes: impl Iterator<Item = &'a Probe>,
) -> std::collections::BTreeSet<EventProgram> {
    probes
        .flat_map(|probe| match &probe.kind {
            ProbeKind::Event(spec) => vec![event_program(spec.program_kind())],
            ProbeKind::Heap(_) => crate::alloc::PROGRAMS.to_vec(),
        })
        .collect()
}
