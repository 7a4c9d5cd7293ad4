//! The in-process collector: a launched target's heap, recorded by the preloaded library
//! in the process itself (`preload` crate): it walks its own stacks with the session's
//! unwind tables and publishes every allocation and free in shared memory, with no
//! kernel event. This collector serves the library (the socket, the tables, the
//! mappings a thread asks for) from a thread of its own — a thread of the target that
//! waits for a table must never wait for the session's other work, nor for the launch,
//! which runs the library's first calls before the target reaches its entry point —
//! and turns what the library recorded into the seam's heap statistics.

mod hooks_report;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use preload::{
    HookCode, HookReport, HookTarget, Recorder, Server, SourceMapping, TableError, TableSource,
};
use unwind_tables::walk::WalkEnd;
use unwind_tables::CompactTable;

use super::execs::{Exec, ExecWatch};
use crate::alloc::hooks::{Named, Planner};
use crate::collect::{
    Collected, Collector, Estimated, HeapCollected, HeapCount, HeapNow, HeapStats, Target,
    UserFrame, UserStack, Walks, When,
};
use crate::frame::ObjectId;
use crate::limits::{self, Limit};
use crate::settings::HeapSettings;
use crate::tables::{
    FileKey, ProcessTables, Registered, SharedTables, StoreError, StoreId, TableRef, TableStore,
};
use hooks_report::{counted_in, hooks_line, unhooked_warning};
use profile::{AllocatorCounted, AllocatorsMissed, ProcessAllocators};

/// How long the serving thread, idle, waits for a message before it reads the regions
/// again.
const IDLE_WAIT: Duration = Duration::from_micros(500);

/// How often the processes that exited are looked for, to retire them.
const RETIRE_INTERVAL: Duration = Duration::from_millis(250);

/// What the serving thread and the session share.
struct State {
    server: Option<Server>,
    recorder: Recorder,
    store: LibraryTables,
    /// The allocator functions each process's library hooks.
    planner: Planner,
    /// What became of them, kept when the server closes.
    hooks: Vec<HookReport>,
}

/// The tables the library walks with, by the session's handles, and the mappings last
/// registered for each process.
#[derive(Default)]
struct LibraryTables {
    tables: Vec<Arc<CompactTable>>,
    mappings: HashMap<u32, Vec<Registered>>,
    /// Per process, the object its wrappers' calls reach (libc, or a library that
    /// replaces malloc), as its mappings showed when the library asked for them.
    wrapped: HashMap<u32, std::path::PathBuf>,
}

impl TableStore for LibraryTables {
    fn store_id(&self) -> StoreId {
        StoreId::InProcess
    }

    fn add_table(&mut self, table: &Arc<CompactTable>) -> Result<TableRef, StoreError> {
        self.tables.push(Arc::clone(table));
        Ok(TableRef(self.tables.len() as u32 - 1))
    }

    fn set_mappings(&mut self, pid: u32, mappings: &[Registered]) -> Result<(), StoreError> {
        self.mappings.insert(pid, mappings.to_vec());
        Ok(())
    }

    fn add_file_mapping(&mut self, _file: FileKey, _mapping: &Registered) -> Result<bool> {
        // The library asks for a pc it does not know: it never walks through code
        // before its mappings are read.
        Ok(true)
    }
}

/// The session's tables as the library's source of mappings, and of the hooks it places.
struct Source<'a> {
    tables: &'a SharedTables,
    store: &'a mut LibraryTables,
    planner: &'a mut Planner,
}

impl TableSource for Source<'_> {
    fn mappings(&mut self, pid: u32) -> Result<Vec<SourceMapping>, TableError> {
        let mut tables: MutexGuard<'_, ProcessTables> = self.tables.lock();
        // Asked when the process holds code the library does not know: read again.
        tables.forget(StoreId::InProcess, pid);
        tables
            .sync(self.store, pid)
            .map_err(|error| TableError::Maps {
                pid,
                source: std::io::Error::other(format!("{error:#}")),
            })?;
        if let Some(wrapped) = hooks_report::wrapped_object(tables.symbol_mappings().get(&pid)) {
            self.store.wrapped.insert(pid, wrapped);
        }
        let registered = self.store.mappings.get(&pid).cloned().unwrap_or_default();
        Ok(registered
            .iter()
            .map(|m| SourceMapping {
                start: m.start,
                end: m.end,
                bias: m.bias,
                object: m.object.map(ObjectId::index),
                table: m
                    .table
                    .and_then(|TableRef(index)| self.store.tables.get(index as usize).cloned()),
            })
            .collect())
    }

    fn hook_targets(&mut self, pid: u32) -> Vec<HookTarget> {
        self.planner.targets(pid)
    }

    fn plan_hook(
        &mut self,
        pid: u32,
        target: &HookTarget,
        stub: u64,
        trampoline: u64,
        room: usize,
    ) -> Result<HookCode, String> {
        self.planner
            .plan(pid, target, stub, trampoline, room)
            .map_err(|refusal| refusal.to_string())
    }
}

/// The preloaded library's recording of the heap probe `probe`.
pub struct InProcessCollector {
    state: Arc<Mutex<State>>,
    environment: Vec<(&'static str, std::ffi::OsString)>,
    serving: Option<(JoinHandle<()>, Arc<AtomicBool>)>,
    probe: usize,
    heap: HeapSettings,
    target: Option<u32>,
    /// Report what recording cost (`--bpf-stats`).
    report_cost: bool,
    /// The images the target's tree execs, to name those that ran without the library.
    execs: Option<ExecWatch>,
    tables: SharedTables,
    exited: Exited,
    target_executable: Option<String>,
}

/// The processes that exited, retired from the recorder: the target and the first
/// `keep` others under their own pid, the rest added up under [`profile::MERGED_PID`]
/// (as the BPF path does), so that a program that keeps starting short children costs
/// the recorder its distinct stacks, not its processes.
struct Exited {
    keep: usize,
    kept: usize,
    merged: u64,
    last: Option<Instant>,
    /// The allocators counted in the processes kept apart: (pid, executable, allocators,
    /// why some calls were not counted), told when they were retired.
    kept_allocators: Vec<KeptAllocators>,
    /// The allocators counted in the processes added up under pid 0, and the first
    /// reason some of their calls were not counted, with how many processes missed any.
    merged_allocators: BTreeSet<AllocatorCounted>,
    merged_missed: Option<(String, u64)>,
}

type KeptAllocators = (
    u32,
    Option<String>,
    BTreeSet<AllocatorCounted>,
    Option<String>,
);

impl InProcessCollector {
    /// Makes the library's directory and socket and starts serving it.
    pub fn start_serving(
        heap: &HeapSettings,
        probe: usize,
        named: Option<Named>,
        tables: SharedTables,
        report_cost: bool,
        keep_exited: usize,
    ) -> Result<InProcessCollector> {
        let server = Server::new().context("starting the in-process heap recorder")?;
        let environment = server.environment(std::env::var_os("LD_PRELOAD"));
        let wrappers_pass = named.as_ref().is_some_and(|named| !named.wrappers_count());
        let recorder = Recorder::new(preload::Options {
            wrappers_pass,
            ..recorder_options(heap)
        });
        let state = Arc::new(Mutex::new(State {
            server: Some(server),
            recorder,
            store: LibraryTables::default(),
            planner: Planner::new(named),
            hooks: Vec::new(),
        }));
        let done = Arc::new(AtomicBool::new(false));
        let thread = {
            let state = Arc::clone(&state);
            let done = Arc::clone(&done);
            let tables = tables.clone();
            std::thread::Builder::new()
                .name("heap-recorder".into())
                .spawn(move || serve(&state, &tables, &done))
                .context("starting the in-process heap recorder's thread")?
        };
        Ok(InProcessCollector {
            state,
            environment,
            serving: Some((thread, done)),
            probe,
            heap: heap.clone(),
            target: None,
            report_cost,
            execs: ExecWatch::start(),
            tables,
            target_executable: None,
            exited: Exited {
                keep: keep_exited,
                kept: 0,
                merged: 0,
                last: None,
                kept_allocators: Vec::new(),
                merged_allocators: BTreeSet::new(),
                merged_missed: None,
            },
        })
    }

    /// Retires the processes that exited since the last pass (at most one pass a
    /// [`RETIRE_INTERVAL`], or `now`): their live blocks let go, counted as leaked,
    /// their statistics under their own pid or pid 0's, their mappings forgotten.
    fn retire_exited(&mut self, now: bool) {
        if !now
            && self
                .exited
                .last
                .is_some_and(|last| last.elapsed() < RETIRE_INTERVAL)
        {
            return;
        }
        self.exited.last = Some(Instant::now());
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut retired = Vec::new();
        for pid in state.recorder.quiet_processes() {
            // Alive: it exec'd and its new image has not connected yet, or it runs on
            // without the library.
            if crate::process::alive(pid) {
                continue;
            }
            let into = if Some(pid) == self.target {
                None
            } else if self.exited.kept < self.exited.keep {
                self.exited.kept += 1;
                None
            } else {
                self.exited.merged += 1;
                Some(profile::MERGED_PID)
            };
            state.recorder.retire(pid, into);
            retired.push((pid, into.is_none()));
        }
        let hooks = std::mem::take(&mut state.hooks);
        let mut tables = self.tables.lock();
        for &(pid, apart) in &retired {
            // What was counted in it, while its mappings are known.
            let wrapped = state.store.wrapped.remove(&pid);
            let named = state.planner.named();
            let (allocators, missed) = counted_in(pid, wrapped.as_deref(), &hooks, named);
            if apart {
                let executable = self.executable_of(pid);
                self.exited
                    .kept_allocators
                    .push((pid, executable, allocators, missed));
            } else {
                self.exited.merged_allocators.extend(allocators);
                if let Some(reason) = missed {
                    let missed = self.exited.merged_missed.get_or_insert((reason, 0));
                    missed.1 += 1;
                }
            }
            tables.forget(StoreId::InProcess, pid);
            tables.release(pid, apart);
        }
        drop(tables);
        state.hooks = hooks;
    }

    /// The executable process `pid` last exec'd, as its command line names it.
    fn executable_of(&self, pid: u32) -> Option<String> {
        let execs = self
            .execs
            .as_ref()
            .map(ExecWatch::execs)
            .unwrap_or_default();
        match execs.iter().rev().find(|exec| exec.pid == pid) {
            Some(exec) => exec.command.split(' ').next().map(|command| {
                std::fs::canonicalize(command)
                    .map_or_else(|_| command.to_string(), |path| path.display().to_string())
            }),
            // the target, exec'd before it was followed
            None => self
                .target_executable
                .clone()
                .filter(|_| Some(pid) == self.target),
        }
    }

    /// Which allocators were counted in which process, and what was missed (`totals`:
    /// each process's, whose unknown frees are the count a process missed).
    fn allocators(
        &self,
        state: &State,
        totals: &[preload::ProcessTotals],
    ) -> Vec<ProcessAllocators> {
        let unknown = |pid: u32| {
            totals
                .iter()
                .find(|p| p.pid == pid)
                .map_or(0, |p| p.unknown_frees)
        };
        let missed = |pid: u32, reason: Option<String>| {
            reason.map(|reason| AllocatorsMissed {
                reason,
                count: unknown(pid),
            })
        };
        let mut entries: Vec<ProcessAllocators> = totals
            .iter()
            .map(|p| p.pid)
            .filter(|&pid| {
                pid != profile::MERGED_PID
                    && !self.exited.kept_allocators.iter().any(|kept| kept.0 == pid)
            })
            .map(|pid| {
                let wrapped = state.store.wrapped.get(&pid);
                let wrapped = wrapped.map(|p| p.as_path());
                let named = state.planner.named();
                let (allocators, reason) = counted_in(pid, wrapped, &state.hooks, named);
                (pid, self.executable_of(pid), allocators, reason)
            })
            .chain(self.exited.kept_allocators.iter().cloned())
            .map(|(pid, executable, allocators, reason)| ProcessAllocators {
                pid,
                executable,
                processes: 1,
                allocators: allocators.into_iter().collect(),
                missed: missed(pid, reason),
            })
            .collect();
        entries.sort_by_key(|entry| entry.pid);
        if self.exited.merged > 0 {
            entries.push(ProcessAllocators {
                pid: profile::MERGED_PID,
                executable: None,
                processes: self.exited.merged,
                allocators: self.exited.merged_allocators.iter().cloned().collect(),
                missed: self
                    .exited
                    .merged_missed
                    .as_ref()
                    .map(|(reason, n)| AllocatorsMissed {
                        reason: format!("{n} of them: {reason}"),
                        count: unknown(profile::MERGED_PID),
                    }),
            });
        }
        entries
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stops the serving thread, which reads the regions one last time.
    fn stop_serving(&mut self) {
        if let Some((thread, done)) = self.serving.take() {
            done.store(true, Ordering::Release);
            let _ = thread.join();
        }
    }
}

/// The serving thread: answers the libraries and reads their regions until `done`. The
/// rings are read as fast as they fill (a full ring makes its thread wait): while events
/// come, it turns again at once, looking at the socket without waiting; idle, it waits
/// for a message up to [`IDLE_WAIT`] before reading the rings again.
fn serve(state: &Mutex<State>, tables: &SharedTables, done: &AtomicBool) {
    let mut idle = false;
    loop {
        let finishing = done.load(Ordering::Acquire);
        let handled = {
            let mut state = state
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let State {
                server,
                recorder,
                store,
                planner,
                hooks,
            } = &mut *state;
            if let Some(server) = server {
                let mut source = Source {
                    tables,
                    store,
                    planner,
                };
                let wait = if idle && !finishing {
                    IDLE_WAIT
                } else {
                    Duration::ZERO
                };
                if let Err(error) = server.serve(&mut source, recorder, wait) {
                    eprintln!("cargo-trace: warning: in-process heap recording: {error}");
                }
                if server.hooks().len() != hooks.len() || finishing {
                    *hooks = server.hooks().to_vec();
                }
            }
            recorder.poll()
        };
        if finishing {
            return;
        }
        idle = handled == 0;
        if !idle {
            // Lets the session take the state between two turns.
            std::thread::yield_now();
        }
    }
}

impl Collector for InProcessCollector {
    fn environment(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        self.environment.clone()
    }

    fn attach(&mut self, target: Target) -> Result<()> {
        // An allocator named and not found in the target is the session's error, as on
        // the BPF path.
        if let Some(named) = self.state().planner.named() {
            named.resolve(target.pid)?;
        }
        self.target = Some(target.pid);
        self.target_executable = std::fs::read_link(format!("/proc/{}/exe", target.pid))
            .ok()
            .map(|path| path.display().to_string());
        if let Some(execs) = &self.execs {
            execs.follow(target.pid);
        }
        Ok(())
    }

    fn start(&mut self) -> Result<()> {
        Ok(())
    }

    fn poll(&mut self) {
        // The serving thread reads the regions; the processes that exited are retired
        // here, off its path.
        self.retire_exited(false);
    }

    fn stop(&mut self) {
        self.stop_serving();
        if let Some(warning) = self.without_library() {
            eprintln!("cargo-trace: warning: {warning}");
        }
        if let Some(warning) = unhooked_warning(&self.state().hooks) {
            eprintln!("cargo-trace: warning: {warning}");
        }
        // Closed: a process still running finds its connection gone and records no more.
        self.state().server = None;
    }

    fn collected(&mut self, when: When) -> Result<Collected> {
        if when == When::Final {
            self.retire_exited(true);
        }
        let state = self.state();
        let recorder = &state.recorder;
        let counters = recorder.counters();
        let count_mmap = self.heap.count_mmap;
        let stacks = heap_counts(recorder, self.probe, count_mmap);
        // Without `--mmap`, the recorder keeps the mappings out of the processes' totals
        // and peaks (`count_mapped`): they are apart, in `mapped`.
        let totals = recorder.processes();
        let processes = totals
            .iter()
            .map(|p| profile::HeapProcess {
                probe: self.probe,
                pid: p.pid,
                allocs: p.allocs,
                bytes: p.bytes,
                frees: p.frees,
                freed_bytes: p.freed_bytes,
                live_bytes: p.live_bytes,
                peak_bytes: p.peak_bytes,
                unknown_frees: p.unknown_frees,
            })
            .collect();
        let mapped = profile::MappedMemory {
            counted: count_mmap,
            processes: totals
                .iter()
                .map(|p| profile::MappedProcess {
                    pid: p.pid,
                    maps: p.mapped.allocs,
                    bytes: p.mapped.bytes,
                    unmaps: p.mapped.frees,
                    unmapped_bytes: p.mapped.freed_bytes,
                    live_bytes: p.mapped.live_bytes,
                })
                .collect(),
        };
        let heap_counters: limits::Counts = [
            (
                Limit::Heap(bpf_prog::AllocCounter::UnknownFrees),
                counters.unknown_frees,
            ),
            (Limit::Heap(bpf_prog::AllocCounter::Failed), counters.failed),
            (
                Limit::Heap(bpf_prog::AllocCounter::LiveMapFull),
                counters.live_map_full,
            ),
            (Limit::Heap(bpf_prog::AllocCounter::Reused), counters.reused),
        ]
        .into_iter()
        .collect();
        let mut stacks = stacks;
        if !self.heap.sampling() {
            for count in &mut stacks {
                count.stats.estimated = None;
            }
        }
        let _ = when;
        let allocators = self.allocators(&state, &totals);
        Ok(Collected {
            heap: Some(HeapCollected {
                stacks,
                processes,
                lost: limits::reported(&heap_counters),
                now_ns: bpf_prog::monotonic_ns(),
                mapped: Some(mapped),
                in_process: recorder_memory(recorder),
            }),
            walks: walks(&counters),
            merged_processes: self.exited.merged,
            allocators,
            ..Collected::default()
        })
    }

    fn walks_so_far(&self) -> Option<(u64, u64)> {
        let counters = self.state().recorder.counters();
        let walks = walks(&counters);
        Some((walks.total, walks.failures.iter().map(|(_, n)| n).sum()))
    }

    fn processes(&self) -> usize {
        self.state().recorder.regions()
    }

    fn still_running(&self, _target: u32) -> Vec<u32> {
        Vec::new()
    }

    fn heap_now(&self) -> Option<HeapNow> {
        let state = self.state();
        let processes = state.recorder.processes();
        Some(HeapNow {
            live_bytes: processes.iter().map(|p| p.live_bytes).sum(),
            allocs: processes.iter().map(|p| p.allocs).sum(),
            frees: processes.iter().map(|p| p.frees).sum(),
            pids: processes.iter().map(|p| p.pid).collect(),
        })
    }

    fn heap_live(&self) -> Result<Vec<HeapCount>> {
        Ok(heap_counts(
            &self.state().recorder,
            self.probe,
            self.heap.count_mmap,
        ))
    }

    fn cost_report(&self) -> Result<Vec<String>> {
        if !self.report_cost {
            return Ok(Vec::new());
        }
        let state = self.state();
        let counters = state.recorder.counters();
        let mut lines = vec![format!(
            "in-process: {} walks, {} answered by the memo, {} frames walked in the others \
             ({} ns per frame), {} waits for a full ring, {} mappings asked for",
            counters.walks,
            counters.memo_hits,
            counters.walked_frames,
            counters
                .walk_ns
                .checked_div(counters.walked_frames)
                .unwrap_or(0),
            counters.waits,
            counters.lookups,
        )];
        lines.push(hooks_line(&state.hooks));
        for memory in state.recorder.library_memory() {
            lines.push(format!(
                "in-process: process {}: shared region {} KiB used of {} KiB, other {} KiB \
                 (at most {} KiB)",
                memory.pid,
                memory.region_used >> 10,
                memory.region_bound >> 10,
                memory.private_bytes >> 10,
                memory.private_bound >> 10,
            ));
        }
        Ok(lines)
    }
}

impl Drop for InProcessCollector {
    fn drop(&mut self) {
        self.stop_serving();
    }
}

impl InProcessCollector {
    /// The one line that names the processes that ran without the library, if any did:
    /// the dynamically linked images the target's tree exec'd, past those of each pid
    /// that connected.
    fn without_library(&self) -> Option<String> {
        let execs = self.execs.as_ref()?.execs();
        let mut connected: HashMap<u32, usize> = HashMap::new();
        for pid in self.state().recorder.images() {
            *connected.entry(pid).or_default() += 1;
        }
        let mut seen: HashMap<u32, usize> = HashMap::new();
        let missing: Vec<&Exec> = execs
            .iter()
            .filter(|exec| {
                let nth = seen.entry(exec.pid).or_default();
                *nth += 1;
                // One gone before it could be read never connected either: most likely
                // dynamic, and its heap is not counted whatever it was.
                exec.dynamic != Some(false) && *nth > connected.get(&exec.pid).copied().unwrap_or(0)
            })
            .collect();
        let first = missing.first()?;
        let processes = match missing.len() {
            1 => "1 process".to_string(),
            n => format!("{n} processes, the first"),
        };
        let command = if first.command.is_empty() {
            "exited before its command line was read"
        } else {
            &first.command
        };
        Some(format!(
            "{processes} (pid {}: {command}) ran without cargo-trace's preloaded library (its \
             environment dropped LD_PRELOAD, or it is setuid): its heap is not counted; \
             --no-preload probes libc itself in every process",
            first.pid
        ))
    }
}

/// The library's memory in the processes it recorded in: the most any one used.
fn recorder_memory(recorder: &Recorder) -> Option<profile::RecorderMemory> {
    let (processes, most) = recorder.library_memory_most();
    (processes > 0).then(|| profile::RecorderMemory {
        processes: u32::try_from(processes).unwrap_or(u32::MAX),
        region_used: most.region_used,
        region_bound: most.region_bound,
        private_bytes: most.private_bytes,
        private_bound: most.private_bound,
    })
}

/// What the library is told of the session's heap settings.
fn recorder_options(heap: &HeapSettings) -> preload::Options {
    preload::Options {
        temporary_ns: u64::try_from(heap.temporary.as_nanos()).unwrap_or(u64::MAX),
        sample_every: heap.sample_every,
        sample_bytes: heap.sample_bytes,
        min_size: heap.min_size,
        max_size: heap.max_size,
        max_live_blocks: heap
            .max_live_blocks
            .map_or(preload::Options::default().max_live_blocks, |n| n as usize),
        count_mapped: heap.count_mmap,
        ..preload::Options::default()
    }
}

/// Every stack's heap statistics, typed; `count_mmap`: the stacks of mappings too.
fn heap_counts(recorder: &Recorder, probe: usize, count_mmap: bool) -> Vec<HeapCount> {
    recorder
        .stats()
        .into_iter()
        .filter(|(_, _, stats)| count_mmap || !stats.mapped)
        .map(|(pid, stack, stats)| HeapCount {
            probe,
            pid,
            user: user_stack(recorder.stack_of(stack)),
            stats: HeapStats {
                allocs: stats.allocs,
                bytes: stats.bytes,
                frees: stats.frees,
                freed_bytes: stats.freed_bytes,
                temporaries: stats.temporaries,
                untracked: stats.untracked,
                live_blocks: (stats.allocs - stats.untracked).saturating_sub(stats.frees),
                live_bytes: stats.live_bytes,
                live_birth_us: stats.live_birth_us,
                peak_bytes: stats.peak_bytes,
                size_hist: stats.size_hist.to_vec(),
                life_hist: stats.life_hist.to_vec(),
                estimated: Some(Estimated {
                    allocs: stats.estimated.allocs,
                    bytes: stats.estimated.bytes,
                    frees: stats.estimated.frees,
                    freed_bytes: stats.estimated.freed_bytes,
                }),
            },
        })
        .collect()
}

/// A stack the library walked, typed as the seam's.
fn user_stack(stack: &preload::Stack) -> UserStack {
    UserStack {
        frames: stack
            .frames
            .iter()
            .map(|frame| match *frame {
                preload::Frame::InObject { object, address } => match ObjectId::new(object) {
                    Some(object) => UserFrame::InObject { object, address },
                    None => UserFrame::Runtime(address),
                },
                preload::Frame::Runtime(address) => UserFrame::Runtime(address),
            })
            .collect(),
        truncated: (stack.end != WalkEnd::Complete).then(|| stack.end.to_string()),
    }
}

/// The walk ends, in the walker's order (`enum ct_walk_end`).
const WALK_ENDS: [&str; 8] = [
    "complete",
    "no process",
    "no mapping",
    "no row",
    "unsupported rule",
    "read fault",
    "depth cap",
    "bad return address",
];

/// How the library's walks ended.
fn walks(counters: &preload::Counters) -> Walks {
    Walks {
        failures: WALK_ENDS
            .iter()
            .zip(counters.walk_ends)
            .skip(1)
            .filter(|(_, count)| *count > 0)
            .map(|(name, count)| (name.to_string(), count))
            .collect(),
        total: counters.walks,
        memo_hits: counters.memo_hits,
    }
}
