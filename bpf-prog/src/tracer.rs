//! [`Tracer`]: the loaded BPF object, the tables and mappings it walks with,
//! and readers of what it counted.

use std::collections::{BTreeSet, HashMap};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{AsRawLibbpf, Link, MapCore, MapFlags, MapMut, OpenObject, ProgramMut};
use unwind_tables::{CompactTable, Rule};

use crate::error::{Error, Result, TableMap};
use crate::heap::{self, AllocOptions};
use crate::layout::{
    self, bytes_of, from_bytes, CtCount, CtCountKey, CtMapping, CtPage, CtProc, CtRow, CtRule,
    CtTable, MAX_MAPPINGS, ROWS_PER_CHUNK,
};
use crate::mappings::{FileMapping, Mapping, TableId};
use crate::programs::{self, EventProgram};
use crate::records::{Count, CountKey, Loss, Record, Stack, WalkCounters};
use crate::retired_heap::RetiredHeap;
use crate::skel::{TraceSkel, TraceSkelBuilder};
use crate::spill::{CountFile, StackFile};
use crate::sys::{self, MappedArray, ProgramStats};

/// Bytes kept of the verifier log of a failed load (the kernel keeps the tail).
const VERIFIER_LOG_SIZE: usize = 1 << 20;

/// Settings fixed at load time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Uprobes and uretprobes count only processes added with [`Tracer::filter_pid`].
    /// Off by default: a uprobe is usually attached to one pid already.
    pub filter_uprobes: bool,
    /// Perf events and tracepoints count only processes added with
    /// [`Tracer::filter_pid`]. On by default: they fire for every process.
    pub filter_events: bool,
    /// Record the kernel stack of perf samples taken in kernel mode and of tracepoints.
    pub kernel_stacks: bool,
    /// Let the walk memo answer a walk that would repeat one remembered (see
    /// [`Tracer::memo_hits`]). On by default; off, every event walks (what the walk
    /// benchmark measures the walker by).
    pub walk_memo: bool,
    /// Capacity of the table maps, summed over all loaded tables.
    pub max_rows: u32,
    pub max_pages: u32,
    pub max_rules: u32,
    pub max_tables: u32,
    /// Processes with registered mappings.
    pub max_procs: u32,
    /// File mappings the walker knows before a process's own mappings are registered
    /// ([`Tracer::add_file_mapping`], which says when there is no room).
    pub max_files: u32,
    /// Distinct user and kernel stacks the kernel remembers having sent (16 bytes of key
    /// and check each, allocated as they appear). Past it, a stack is sent again each time
    /// it is met ([`Loss::KnownStacksFull`]).
    pub max_stacks: u32,
    /// Distinct (probe, pid, user stack, kernel stack) counters in the kernel (allocated as
    /// they appear). Past it, events go through the ring buffer ([`Loss::CountMapFull`]).
    pub max_counts: u32,
    /// Bytes of the ring buffer that carries new stacks (once each, header and frames) and
    /// overflowing counts to userspace between two [`Tracer::drain_records`]: a power of 2,
    /// a multiple of the page size. Full, it delays stacks ([`Loss::StackRingFull`]).
    /// Its memory counts twice in cargo-trace's resident memory (userspace maps the
    /// kernel's pages whole, and the data twice over for records that wrap around): 8 MiB
    /// hold ~200 ms of the storage benchmark's new stacks, the drains come every 20 ms.
    pub record_ring_bytes: u32,
    /// Processes in the pid filter.
    pub max_filtered_pids: u32,
    /// Heap profiling: map sizes and the temporary threshold.
    pub alloc: AllocOptions,
    /// The event programs to load. Each carries its own copy of the walker, and the
    /// verifier's time at load goes by program: a session loads those its probes use. The
    /// programs that follow children always load.
    pub programs: BTreeSet<EventProgram>,
    /// [`EventProgram::OffCpu`] counts a stay off the CPU only if it lasted this long.
    pub off_cpu_min_block_ns: u64,
    /// Threads of the traced processes off the CPU at once that [`EventProgram::OffCpu`]
    /// follows. Past it, a stay is not counted ([`Loss::OffCpuFull`]).
    pub max_off_cpu_threads: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            filter_uprobes: false,
            filter_events: true,
            kernel_stacks: true,
            walk_memo: true,
            max_rows: 8 << 20,
            max_pages: 256 << 10,
            max_rules: 256 << 10,
            max_tables: 4096,
            max_procs: 4096,
            max_files: 16384,
            max_stacks: 1 << 20,
            max_counts: 1 << 20,
            record_ring_bytes: 8 << 20,
            max_filtered_pids: 4096,
            alloc: AllocOptions::default(),
            // sched_prepare_exec's program only where the kernel has the tracepoint
            programs: EventProgram::ALL
                .iter()
                .copied()
                .filter(|&program| {
                    program != EventProgram::ThreadExec
                        || programs::kernel_has_btf_tracepoint("sched_prepare_exec")
                })
                .collect(),
            off_cpu_min_block_ns: 0,
            max_off_cpu_threads: 65536,
        }
    }
}

/// What a table occupies in the table maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableUsage {
    pub rows: usize,
    pub pages: usize,
    pub rules: usize,
    pub tables: usize,
}

/// The loaded BPF programs and maps.
///
/// Dropping it detaches nothing by itself: links returned by attaching the
/// programs keep them running until the links are dropped.
pub struct Tracer {
    skel: TraceSkel<'static>,
    rows: MappedArray<CtRow>,
    pages: MappedArray<CtPage>,
    rules: MappedArray<CtRule>,
    used: TableUsage,
    max_tables: usize,
    /// The generation of the last set of mappings registered (`ct_proc.generation`).
    generation: AtomicU32,
    /// Reads the records ring buffer into `received`.
    records: libbpf_rs::RingBuffer<'static>,
    received: Arc<Mutex<Received>>,
    /// The heap statistics of processes that exited ([`Tracer::retire_heap`]).
    pub(crate) retired_heap: Mutex<RetiredHeap>,
    load_times: LoadTimes,
}

/// How long [`Tracer::load`] took, in two parts.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadTimes {
    /// Opening the object (ELF, BTF), creating its maps, relocating.
    pub prepare: std::time::Duration,
    /// Loading the programs: the kernel's verifier, most of it.
    pub verify: std::time::Duration,
}

/// What the records ring buffer brought, and the counters of exited processes: the
/// userspace half of the stack storage, mostly in files ([`crate::spill`]).
#[derive(Debug)]
struct Received {
    /// Every stack sent, in a file.
    stacks: StackFile,
    /// Events of running processes the counts map had no room for.
    counts: HashMap<CountKey, Count>,
    /// The counters of processes that exited ([`Tracer::retire_processes`]), in a file.
    retired: CountFile,
    /// Records that could not be read.
    malformed: u64,
}

impl Received {
    fn new() -> std::io::Result<Received> {
        Ok(Received {
            stacks: StackFile::new()?,
            counts: HashMap::new(),
            retired: CountFile::new()?,
            malformed: 0,
        })
    }

    fn add(&mut self, data: &[u8]) {
        // A stack goes to its file as it came, its frames unread.
        if let Some(header) = Record::stack_header(data) {
            self.stacks.add(&data[..header.bytes]);
            return;
        }
        match Record::parse(data) {
            Some(Record::Count(key, count)) => {
                let total = self.counts.entry(key).or_default();
                total.events += count.events;
                total.amount += count.amount;
            }
            _ => self.malformed += 1,
        }
    }
}

/// What the stack storage holds, for reports and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackStorage {
    /// Distinct stacks received (user and kernel).
    pub stacks: usize,
    /// Frames in them.
    pub frames: usize,
    /// Bytes of the file they are kept in (see [`Tracer::stack`]).
    pub file_bytes: u64,
    /// Bytes of the file the counters of exited processes are kept in (see
    /// [`Tracer::retire_processes`]).
    pub retired_bytes: u64,
    /// Stacks received more than once (see [`Loss::KnownStacksFull`]).
    pub repeats: u64,
    /// Stacks that arrived under a key another stack held (their events are counted
    /// under the first one's).
    pub conflicts: u64,
    /// Records that could not be read.
    pub malformed: u64,
    /// Kernel memory of the set of known stacks, as the kernel accounts it.
    pub kernel_bytes: u64,
}

impl Tracer {
    /// Opens the embedded object, applies `options` and loads it: the
    /// verifier checks every program here. Needs CAP_BPF and CAP_PERFMON (or root).
    pub fn load(options: &Options) -> Result<Tracer> {
        // The skeleton borrows the storage of its `OpenObject` for its whole
        // life. Leaking the few bytes of that storage gives the Tracer a
        // 'static skeleton without a self-referential struct; the object
        // itself is still closed when the skeleton drops.
        let opened = std::time::Instant::now();
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));

        // libbpf writes the verifier log of a failed program here (it asks
        // the kernel for a log only after a failure). It reads these pointers
        // during `load` only, and `log` outlives that call.
        let mut log = vec![0u8; VERIFIER_LOG_SIZE];
        let open_opts = libbpf_rs::libbpf_sys::bpf_object_open_opts {
            sz: size_of::<libbpf_rs::libbpf_sys::bpf_object_open_opts>() as _,
            kernel_log_buf: log.as_mut_ptr().cast(),
            kernel_log_size: log.len() as _,
            kernel_log_level: 0,
            ..Default::default()
        };
        let mut open = TraceSkelBuilder::default()
            .open_opts(open_opts, storage)
            .map_err(Error::Open)?;

        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .expect("the object has a .rodata section");
        rodata.filter_uprobes = options.filter_uprobes.into();
        rodata.filter_events = options.filter_events.into();
        rodata.kernel_stacks = options.kernel_stacks.into();
        rodata.use_walk_memo = options.walk_memo.into();
        rodata.off_cpu_min_block_ns = options.off_cpu_min_block_ns;
        heap::configure(
            &mut open,
            &options.alloc,
            options.programs.contains(&EventProgram::AllocEntry)
                || options.programs.contains(&EventProgram::ResizeEntry),
        )?;

        for &kind in EventProgram::ALL {
            kind.of_open(&mut open.progs)
                .set_autoload(options.programs.contains(&kind));
        }

        let cpus = libbpf_rs::num_possible_cpus().map_err(|source| Error::Configure {
            map: "page_cache",
            source,
        })?;
        let per_cpu = |slots: usize| u32::try_from(cpus * slots).unwrap_or(u32::MAX);
        let maps = &mut open.maps;
        let chunks = options.max_rows.div_ceil(ROWS_PER_CHUNK as u32);
        for (map, name, entries) in [
            (&mut maps.rows, "rows", chunks),
            (&mut maps.pages, "pages", options.max_pages),
            (&mut maps.rules, "rules", options.max_rules),
            (&mut maps.tables, "tables", options.max_tables),
            (&mut maps.procs, "procs", options.max_procs),
            (&mut maps.file_objects, "file_objects", options.max_files),
            (&mut maps.known_stacks, "known_stacks", options.max_stacks),
            (&mut maps.records, "records", options.record_ring_bytes),
            (&mut maps.counts, "counts", options.max_counts),
            (
                &mut maps.pid_filter,
                "pid_filter",
                options.max_filtered_pids,
            ),
            (&mut maps.loading, "loading", options.max_filtered_pids),
            (
                &mut maps.new_images,
                "new_images",
                layout::new_images_ring_bytes(options.max_filtered_pids),
            ),
            (
                &mut maps.off_cpu_starts,
                "off_cpu_starts",
                if options.programs.contains(&EventProgram::OffCpu) {
                    options.max_off_cpu_threads
                } else {
                    1
                },
            ),
            (
                &mut maps.page_cache,
                "page_cache",
                per_cpu(layout::NEST_LEVELS),
            ),
            (&mut maps.rule_cache, "rule_cache", per_cpu(1)),
            (&mut maps.known_cache, "known_cache", per_cpu(1)),
            (&mut maps.walk_memo, "walk_memo", per_cpu(1)),
        ] {
            map.set_max_entries(entries.max(1))
                .map_err(|source| Error::Configure { map: name, source })?;
        }

        // Maps created and programs relocated first (libbpf's prepare step), so that
        // the programs' load, the verifier's work, is timed apart.
        // SAFETY: the object pointer is the open skeleton's own, valid while it lives;
        // the load below goes on from the prepared state.
        let prepared = unsafe {
            libbpf_rs::libbpf_sys::bpf_object__prepare(
                open.open_object_mut().as_libbpf_object().as_ptr(),
            )
        };
        if prepared != 0 {
            return Err(Error::Load {
                source: libbpf_rs::Error::from_raw_os_error(-prepared),
                verifier_log: log_text(&log),
            });
        }
        let prepare = opened.elapsed();
        let skel = open.load().map_err(|source| Error::Load {
            source,
            verifier_log: log_text(&log),
        })?;
        let load_times = LoadTimes {
            prepare,
            verify: opened.elapsed() - prepare,
        };
        drop(log);

        let rows = map_array(&skel.maps.rows, "rows")?;
        let pages = map_array(&skel.maps.pages, "pages")?;
        let rules = map_array(&skel.maps.rules, "rules")?;
        let max_tables = skel.maps.tables.max_entries() as usize;
        let received = Arc::new(Mutex::new(
            Received::new().map_err(Error::spill("creating"))?,
        ));
        let records = record_reader(&skel.maps.records, Arc::clone(&received))?;
        Ok(Tracer {
            skel,
            rows,
            pages,
            rules,
            used: TableUsage::default(),
            generation: AtomicU32::new(0),
            max_tables,
            records,
            received,
            retired_heap: Mutex::default(),
            load_times,
        })
    }

    /// How long [`Tracer::load`] took.
    pub fn load_times(&self) -> LoadTimes {
        self.load_times
    }

    /// Copies `table` into the table maps and returns its id.
    ///
    /// Tables are never removed: a session loads each object's table once
    /// and shares it between the processes that map the object.
    pub fn add_table(&mut self, table: &CompactTable) -> Result<TableId> {
        // The invariants the BPF lookup relies on (sorted rows, pages that
        // partition them in order, rule indexes in range) and more.
        table.check().map_err(Error::BadTable)?;
        let free = |used: usize, capacity: usize| capacity.saturating_sub(used);
        for (map, needed, free) in [
            (
                TableMap::Rows,
                table.rows.len(),
                free(self.used.rows, self.rows.len()),
            ),
            (
                TableMap::Pages,
                table.pages.len(),
                free(self.used.pages, self.pages.len()),
            ),
            (
                TableMap::Rules,
                table.rules.len(),
                free(self.used.rules, self.rules.len()),
            ),
            (TableMap::Tables, 1, free(self.used.tables, self.max_tables)),
        ] {
            if needed > free {
                return Err(Error::MapFull { map, needed, free });
            }
        }

        let base = self.used;
        let rows: Vec<CtRow> = table
            .rows
            .iter()
            .map(|row| CtRow {
                addr_lo: row.addr_lo,
                rule: row.rule,
            })
            .collect();
        let pages: Vec<CtPage> = table
            .pages
            .iter()
            .map(|span| CtPage {
                first_row: (base.rows + span.first_row as usize) as u32,
                nrows: span.nrows,
            })
            .collect();
        let rules: Vec<CtRule> = table.rules.iter().map(|&rule| CtRule::from(rule)).collect();
        let mapped = |map: &'static str| move |source| Error::Mmap { map, source };
        self.rows.write(base.rows, &rows).map_err(mapped("rows"))?;
        self.pages
            .write(base.pages, &pages)
            .map_err(mapped("pages"))?;
        self.rules
            .write(base.rules, &rules)
            .map_err(mapped("rules"))?;

        // The capacities checked above are u32 map sizes, so these fit.
        let entry = CtTable {
            first_page: table.first_page,
            pages_base: base.pages as u32,
            npages: pages.len() as u32,
            rows_base: base.rows as u32,
            nrows: rows.len() as u32,
            rules_base: base.rules as u32,
            nrules: rules.len() as u32,
        };
        let id = base.tables as u32;
        // Published last: until a mapping names this id, no walk reads the rows.
        update(&self.skel.maps.tables, "tables", &id, &entry, MapFlags::ANY)?;
        self.used = TableUsage {
            rows: base.rows + rows.len(),
            pages: base.pages + pages.len(),
            rules: base.rules + rules.len(),
            tables: base.tables + 1,
        };
        Ok(TableId::new(id))
    }

    /// The loaded object, for the readers of other modules.
    pub(crate) fn skel(&self) -> &TraceSkel<'static> {
        &self.skel
    }

    /// What the tables loaded so far occupy.
    pub fn table_usage(&self) -> TableUsage {
        self.used
    }

    /// Registers (or replaces) the executable mappings of process `pid`.
    /// They need not be sorted; they must be non-empty and disjoint.
    pub fn set_mappings(&self, pid: u32, mappings: &[Mapping]) -> Result<()> {
        if mappings.len() > MAX_MAPPINGS {
            return Err(Error::TooManyMappings {
                pid,
                count: mappings.len(),
                max: MAX_MAPPINGS,
            });
        }
        let mut sorted = mappings.to_vec();
        sorted.sort_by_key(|m| m.start);
        for (index, m) in sorted.iter().enumerate() {
            let overlaps_next = sorted.get(index + 1).is_some_and(|next| next.start < m.end);
            // The program's mapping search compares addresses as signed
            // differences: every mapping must lie in the user half.
            if m.start >= m.end || overlaps_next || m.end > 1 << 63 {
                return Err(Error::BadMapping {
                    pid,
                    start: m.start,
                    end: m.end,
                });
            }
            if let Some(table) = m.table {
                if table.index() as usize >= self.used.tables {
                    return Err(Error::UnknownTable(table));
                }
            }
        }
        // Every set gets its own generation, the key of the program's rule cache: entries
        // found in the mappings a pid had before can never answer for these.
        // 0 marks an empty cache entry: skipped when the counter wraps.
        let generation = loop {
            let next = self
                .generation
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1);
            if next != 0 {
                break next;
            }
        };
        let mut proc = Box::new(CtProc {
            nmappings: sorted.len() as u32,
            generation,
            mappings: [CtMapping::default(); MAX_MAPPINGS],
        });
        for (slot, m) in proc.mappings.iter_mut().zip(&sorted) {
            *slot = m.to_raw();
        }
        update(&self.skel.maps.procs, "procs", &pid, &*proc, MapFlags::ANY)
    }

    /// Tells the walker what `mapping` of `file` is, for any process that maps the file
    /// at that offset before its own mappings are registered (ld.so runs a library's
    /// code before the library is in the link map): a pc there is then walked with the
    /// object's table and stored as its address, wherever the process placed it.
    /// False if the map of files has no room (such pcs end the walk with
    /// [`WalkEnd::NoMapping`](unwind_tables::walk::WalkEnd::NoMapping), as before).
    pub fn add_file_mapping(&self, file: FileMapping, mapping: &Mapping) -> Result<bool> {
        let key = layout::CtFileKey {
            dev: file.dev,
            inode: file.inode,
            pgoff: file.offset / 4096,
        };
        let raw = mapping.to_raw();
        let value = layout::CtFileObject {
            bias_from_start: raw.bias.wrapping_sub(raw.start),
            table_id: raw.table_id,
            flags: raw.flags,
            object: raw.object,
            pad: 0,
        };
        match self
            .skel
            .maps
            .file_objects
            .update(bytes_of(&key), bytes_of(&value), MapFlags::ANY)
        {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == libbpf_rs::ErrorKind::TooBig => Ok(false),
            Err(source) => Err(Error::Map {
                map: "file_objects",
                op: "update",
                source,
            }),
        }
    }

    /// Forgets the mappings of `pid` (e.g. when it exits); its events then
    /// walk no further than [`WalkEnd::NoProcess`](unwind_tables::walk::WalkEnd::NoProcess).
    pub fn remove_process(&self, pid: u32) -> Result<()> {
        delete(&self.skel.maps.procs, "procs", &pid)?;
        // An exec into a program that never reaches the stop hooks (a static one)
        // leaves its mark in `loading`, sized like the pid filter: gone with the process.
        delete(&self.skel.maps.loading, "loading", &pid)
    }

    /// Lets perf events and tracepoints (and uprobes, with
    /// [`Options::filter_uprobes`]) count events of process `pid`.
    pub fn filter_pid(&self, pid: u32) -> Result<()> {
        update(
            &self.skel.maps.pid_filter,
            "pid_filter",
            &pid,
            &1u8,
            MapFlags::ANY,
        )
    }

    /// The process [`EventProgram::Interval`] counts a firing for when no traced process
    /// runs on its CPU. The program counts nothing while there is none: set it when the
    /// target is let run and clear it when tracing ends, and the firings are those of
    /// that span, whenever the timer was attached and detached.
    pub fn set_interval_target(&mut self, pid: Option<u32>) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.interval_target = pid.unwrap_or(0);
        }
    }

    /// Marks the attach of the heap probes as done, now: the frees a thread of the
    /// preloaded library logged before (its constructors', before the target's entry,
    /// where it waited for the probes) are of blocks allocated unseen, and are not
    /// counted, not even as unknown. Call it before a launched target runs on.
    pub fn start_free_logs(&mut self) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.alloc_logged_since = monotonic_ns();
        }
    }

    /// Ends following children: from now on no process is stopped for its new mappings
    /// (`on_exec`, `on_start_main`), even while the links of the programs that stop
    /// them are still being released.
    pub fn end_following(&mut self) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.following_ended = 1;
        }
    }

    /// The pid filter map (keys: the tgids traced, `u32`), for a process that
    /// must find the traced processes after this one is gone.
    pub fn pid_filter_fd(&self) -> BorrowedFd<'_> {
        self.skel.maps.pid_filter.as_fd()
    }

    pub fn unfilter_pid(&self, pid: u32) -> Result<()> {
        delete(&self.skel.maps.pid_filter, "pid_filter", &pid)
    }

    /// The event program of `kind`, to attach (the attach cookie becomes the probe id of
    /// its counts). One that [`Options::programs`] left out was not loaded and cannot attach.
    pub fn program(&self, kind: EventProgram) -> &ProgramMut<'_> {
        kind.of(&self.skel.progs)
    }

    /// Makes the children of filtered processes filtered too: a fork copies the
    /// parent's mappings to the child; an exec drops the process's mappings and
    /// stops it, reported through [`Tracer::new_images`], until
    /// [`Tracer::set_mappings`] registers the new image's and the caller sends
    /// it SIGCONT. Tracing follows forks while the returned links live.
    pub fn follow_forks(&self) -> Result<Vec<Link>> {
        [
            (&self.skel.progs.on_fork, "sched_process_fork"),
            (&self.skel.progs.on_exec, "sched_process_exec"),
        ]
        .into_iter()
        .map(|(program, tracepoint)| {
            program
                .attach_raw_tracepoint(tracepoint)
                .map_err(|source| Error::Attach { tracepoint, source })
        })
        .collect()
    }

    /// The program to attach (in every process) as a uprobe on libc's
    /// `__libc_start_main`. With [`Tracer::follow_forks`], a followed process
    /// that exec'd stops right after the exec and again there (its libraries
    /// loaded, `main` not yet run), each time reported through
    /// [`Tracer::new_images`] so its mappings can be registered before it
    /// goes on (the caller sends it SIGCONT).
    pub fn start_main_program(&self) -> &ProgramMut<'_> {
        &self.skel.progs.on_start_main
    }

    /// Calls `on_stopped(tgid)` for each process [`Tracer::start_main_program`]
    /// stopped, when the returned buffer is polled.
    pub fn new_images<'cb>(
        &self,
        mut on_stopped: impl FnMut(u32) + 'cb,
    ) -> Result<libbpf_rs::RingBuffer<'cb>> {
        let mut builder = libbpf_rs::RingBufferBuilder::new();
        builder
            .add(&self.skel.maps.new_images, move |data: &[u8]| {
                if let Ok(bytes) = data.try_into() {
                    on_stopped(u32::from_ne_bytes(bytes));
                }
                0
            })
            .map_err(|source| Error::Map {
                map: "new_images",
                op: "ring buffer",
                source,
            })?;
        builder.build().map_err(|source| Error::Map {
            map: "new_images",
            op: "ring buffer",
            source,
        })
    }

    /// The processes in the pid filter: those added with [`Tracer::filter_pid`]
    /// and, with [`Tracer::follow_forks`], their descendants.
    pub fn filtered_pids(&self) -> Vec<u32> {
        self.skel
            .maps
            .pid_filter
            .keys()
            .filter_map(|key| Some(u32::from_ne_bytes(key.try_into().ok()?)))
            .collect()
    }

    /// The parent of every child followed so far ([`Tracer::follow_forks`]), by pid; kept
    /// after the child exits (the oldest entries go first once the map is full).
    pub fn parents(&self) -> HashMap<u32, u32> {
        let map = &self.skel.maps.parents;
        map.keys()
            .filter_map(|key| {
                let value = map.lookup(&key, MapFlags::ANY).ok()??;
                Some((
                    u32::from_ne_bytes(key.as_slice().try_into().ok()?),
                    u32::from_ne_bytes(value.as_slice().try_into().ok()?),
                ))
            })
            .collect()
    }

    /// Whether `pid` has registered mappings (an exec followed with
    /// [`Tracer::follow_forks`] drops them).
    pub fn has_mappings(&self, pid: u32) -> bool {
        self.skel
            .maps
            .procs
            .lookup(&pid.to_ne_bytes(), MapFlags::ANY)
            .is_ok_and(|value| value.is_some())
    }

    /// Whether process `pid` exec'd and ld.so has not yet told that its link map is
    /// consistent (its libraries not all mapped yet; see `on_exec`).
    pub fn loading(&self, pid: u32) -> bool {
        self.skel
            .maps
            .loading
            .lookup(&pid.to_ne_bytes(), MapFlags::ANY)
            .is_ok_and(|value| value.is_some())
    }

    /// Moves what the BPF programs sent since the last call (new stacks, overflowing
    /// counts) from the records ring buffer into this tracer's store; returns how many
    /// records. Call it every few tens of milliseconds while events flow: a ring buffer
    /// left full delays new stacks ([`Loss::StackRingFull`]).
    pub fn drain_records(&self) -> Result<usize> {
        let consumed = self.records.consume_raw();
        if consumed < 0 {
            return Err(Error::Map {
                map: "records",
                op: "consume",
                source: libbpf_rs::Error::from_raw_os_error(-consumed),
            });
        }
        Ok(consumed as usize)
    }

    fn received(&self) -> std::sync::MutexGuard<'_, Received> {
        self.received
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Moves the counters of the processes in `retired`, which exited, out of the
    /// kernel's map into this tracer's file of counters, each under the pid `retired` gives
    /// (its own, or one that stands for many: counters of one stack then add up), so
    /// that the map holds the processes still running and [`Tracer::counts`] still
    /// gives every event. Returns how many kernel counters moved.
    ///
    /// One pass over the map: call it for many processes at once, not for each. A
    /// process must be gone: an event counted under its pid between the pass's read and
    /// its delete would be lost (a pid reused that soon by a traced process).
    pub fn retire_processes(&self, retired: &HashMap<u32, u32>) -> Result<usize> {
        if retired.is_empty() {
            return Ok(0);
        }
        self.drain_records()?;
        let map = &self.skel.maps.counts;
        let map_error = |op: &'static str| {
            move |source| Error::Map {
                map: "counts",
                op,
                source,
            }
        };
        let batch = map
            .lookup_batch(4096, MapFlags::ANY, MapFlags::ANY)
            .map_err(map_error("lookup batch"))?;
        let keys: Vec<Vec<u8>> = batch
            .map(|(key, _)| key)
            .filter(|key| {
                from_bytes::<CtCountKey>(key).is_some_and(|key| retired.contains_key(&key.pid))
            })
            .collect();
        let mut moved = HashMap::<CountKey, Count>::new();
        let mut value = [0u8; size_of::<CtCount>()];
        for key in &keys {
            if !map
                .lookup_into_and_delete(key, &mut value)
                .map_err(map_error("lookup and delete"))?
            {
                continue;
            }
            let (Some(key), Some(value)) =
                (from_bytes::<CtCountKey>(key), from_bytes::<CtCount>(&value))
            else {
                continue;
            };
            let total = moved.entry(CountKey::from_raw(&key)).or_default();
            total.events += value.events;
            total.amount += value.amount;
        }
        let mut received = self.received();
        // Those that came through the ring buffer leave memory too.
        let overflowed: Vec<CountKey> = received
            .counts
            .keys()
            .filter(|key| retired.contains_key(&key.pid))
            .copied()
            .collect();
        for key in overflowed {
            if let Some(count) = received.counts.remove(&key) {
                let total = moved.entry(key).or_default();
                total.events += count.events;
                total.amount += count.amount;
            }
        }
        for (mut key, count) in moved {
            key.pid = retired[&key.pid];
            received.retired.add(&key, count);
        }
        Ok(keys.len())
    }

    /// Every counter, in no particular order: the kernel's and those kept here (the ring
    /// buffer drained first).
    pub fn counts(&self) -> Result<Vec<(CountKey, Count)>> {
        self.drain_records()?;
        let map = &self.skel.maps.counts;
        let mut counts: HashMap<CountKey, Count> = {
            let mut received = self.received();
            let mut counts = received.counts.clone();
            received
                .retired
                .sum_into(&mut counts)
                .map_err(Error::spill("reading"))?;
            counts
        };
        let mut value = [0u8; size_of::<CtCount>()];
        for key in map.keys() {
            let found = map
                .lookup_into(&key, &mut value, MapFlags::ANY)
                .map_err(|source| Error::Map {
                    map: "counts",
                    op: "lookup",
                    source,
                })?;
            // A key deleted between `keys` and `lookup` is simply gone.
            if !found {
                continue;
            }
            let (Some(key), Some(value)) = (
                from_bytes::<CtCountKey>(&key),
                from_bytes::<CtCount>(&value),
            ) else {
                continue;
            };
            let total = counts.entry(CountKey::from_raw(&key)).or_default();
            total.events += value.events;
            total.amount += value.amount;
        }
        Ok(counts.into_iter().collect())
    }

    /// The user stack stored under `key` (a [`StackRef::Hash`](crate::StackRef::Hash)),
    /// after draining the ring buffer; `None` if it never arrived (see
    /// [`Loss::StackRingFull`]).
    pub fn stack(&self, key: u64) -> Result<Option<Stack>> {
        self.drain_records()?;
        self.received()
            .stacks
            .get(key)
            .map_err(Error::spill("reading"))
    }

    /// The kernel stack stored under `key` (a [`CountKey::kernel_stack`]), innermost first
    /// (empty if unknown).
    pub fn kernel_stack(&self, key: u64) -> Result<Vec<u64>> {
        Ok(self.stack(key)?.map(|stack| stack.pcs).unwrap_or_default())
    }

    /// What the stack storage holds (after draining the ring buffer).
    pub fn stack_storage(&self) -> Result<StackStorage> {
        self.drain_records()?;
        let kernel_bytes =
            sys::map_memory(self.skel.maps.known_stacks.as_fd()).map_err(|source| {
                Error::MapInfo {
                    map: "known_stacks",
                    source,
                }
            })?;
        let mut received = self.received();
        let stacks = received.stacks.figures().map_err(Error::spill("reading"))?;
        Ok(StackStorage {
            stacks: stacks.stacks,
            frames: stacks.frames,
            file_bytes: stacks.bytes,
            retired_bytes: received.retired.len(),
            repeats: stacks.repeats,
            conflicts: stacks.conflicts,
            malformed: received.malformed + stacks.malformed,
            kernel_bytes,
        })
    }

    /// Stacks and counters that could not be written to the stack storage's files (the
    /// disk full, say), and the first failure: their events are counted, but a stack
    /// lost so shows as never arrived, and a counter lost so is missing.
    pub fn storage_failure(&self) -> Option<(u64, String)> {
        let received = self.received();
        let stacks = received.stacks.lost();
        let counts = received.retired.lost();
        let lost = stacks.map_or(0, |(lost, _)| lost) + counts.map_or(0, |(lost, _)| lost);
        let error = stacks.or(counts)?.1;
        Some((lost, error.to_string()))
    }

    /// How many walks ended each way, summed over CPUs.
    pub fn walk_ends(&self) -> Result<WalkCounters> {
        let mut counters = WalkCounters::default();
        sum_per_cpu(&self.skel.maps.walk_ends, "walk_ends", &mut counters.0)?;
        Ok(counters)
    }

    /// How many of the walks counted in [`Tracer::walk_ends`] the walk memo answered:
    /// the thread's stack started where a walk remembered had, and every word of
    /// memory that walk read was unchanged, so the key it gave was taken again
    /// without a walk.
    pub fn memo_hits(&self) -> Result<u64> {
        let mut hits = [0u64; 1];
        sum_per_cpu(&self.skel.maps.memo_hits, "memo_hits", &mut hits)?;
        Ok(hits[0])
    }

    /// The loss counters summed over CPUs, indexed by [`Loss`]
    /// (`losses[Loss::TooNested as usize]`).
    pub fn losses(&self) -> Result<[u64; Loss::COUNT]> {
        let mut totals = [0u64; Loss::COUNT];
        sum_per_cpu(&self.skel.maps.losses, "losses", &mut totals)?;
        Ok(totals)
    }

    /// Run time and run count of each program (name → stats), from the
    /// kernel's BPF statistics; both stay 0 unless statistics are enabled
    /// (see [`enable_run_time_stats`](crate::enable_run_time_stats)).
    pub fn program_stats(&self) -> Result<HashMap<&'static str, ProgramStats>> {
        let progs = &self.skel.progs;
        let events = EventProgram::ALL
            .iter()
            .map(|&kind| (kind.name(), kind.of(progs)));
        let mut stats = HashMap::new();
        for (name, prog) in events.chain(programs::child_programs(progs)) {
            if !prog.autoload() {
                continue;
            }
            let info = sys::program_stats(prog.as_fd()).map_err(|source| Error::ProgramInfo {
                program: name,
                source,
            })?;
            stats.insert(name, info);
        }
        Ok(stats)
    }
}

impl From<Rule> for CtRule {
    fn from(rule: Rule) -> CtRule {
        let e = rule.encode();
        CtRule {
            kind: e.kind,
            cfa_reg: e.cfa_reg,
            rbp_kind: e.rbp_kind,
            reason: e.reason,
            cfa_off: e.cfa_off,
            rbp_off: e.rbp_off,
            cfa_arg: e.cfa_arg,
        }
    }
}

/// Each entry of a per-CPU array of u64 counters, summed over CPUs, into `totals`.
pub(crate) fn sum_per_cpu(map: &MapMut<'_>, name: &'static str, totals: &mut [u64]) -> Result<()> {
    for (index, total) in totals.iter_mut().enumerate() {
        let per_cpu = map
            .lookup_percpu(bytes_of(&(index as u32)), MapFlags::ANY)
            .map_err(|source| Error::Map {
                map: name,
                op: "lookup",
                source,
            })?
            .unwrap_or_default();
        // Wrapping: a count one CPU takes back from another's (see tell_frees) leaves that
        // CPU's below 0.
        *total = per_cpu
            .iter()
            .filter_map(|bytes| from_bytes::<u64>(bytes))
            .fold(0, u64::wrapping_add);
    }
    Ok(())
}

/// A reader of the records ring buffer that adds each record to `received`.
fn record_reader(
    map: &MapMut<'_>,
    received: Arc<Mutex<Received>>,
) -> Result<libbpf_rs::RingBuffer<'static>> {
    let error = |source| Error::Map {
        map: "records",
        op: "ring buffer",
        source,
    };
    let mut builder = libbpf_rs::RingBufferBuilder::new();
    builder
        .add(map, move |data: &[u8]| {
            received
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .add(data);
            0
        })
        .map_err(error)?;
    builder.build().map_err(error)
}

fn map_array<T: layout::Pod>(map: &MapMut<'_>, name: &'static str) -> Result<MappedArray<T>> {
    MappedArray::new(map.as_fd(), map.value_size(), map.max_entries())
        .map_err(|source| Error::Mmap { map: name, source })
}

fn update<K: layout::Pod, V: layout::Pod>(
    map: &MapMut<'_>,
    name: &'static str,
    key: &K,
    value: &V,
    flags: MapFlags,
) -> Result<()> {
    map.update(bytes_of(key), bytes_of(value), flags)
        .map_err(|source| Error::Map {
            map: name,
            op: "update",
            source,
        })
}

fn delete<K: layout::Pod>(map: &MapMut<'_>, name: &'static str, key: &K) -> Result<()> {
    match map.delete(bytes_of(key)) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Map {
            map: name,
            op: "delete",
            source,
        }),
    }
}

/// The NUL-terminated text libbpf left in the log buffer.
fn log_text(log: &[u8]) -> String {
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    String::from_utf8_lossy(&log[..end]).into_owned()
}

/// `CLOCK_MONOTONIC` in nanoseconds: the programs' clock (`bpf_ktime_get_ns`).
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use unwind_tables::{Cfa, RbpRule, Reg, UnsupportedReason};

    use crate::layout::{rbp_kind, reg, rule_kind};

    use super::*;

    fn frame(cfa: Cfa, rbp: RbpRule) -> Rule {
        Rule::Frame { cfa, rbp }
    }

    #[test]
    fn rules_convert_to_the_kernel_layout() {
        let ct = |kind, cfa_reg, rbp_kind, reason, cfa_off, rbp_off, cfa_arg: i32| CtRule {
            kind,
            cfa_reg,
            rbp_kind,
            reason,
            cfa_off,
            rbp_off,
            cfa_arg: cfa_arg as u32,
        };
        let cases = [
            (Rule::Gap, ct(rule_kind::GAP, 0, 0, 0, 0, 0, 0)),
            (Rule::End, ct(rule_kind::END, 0, 0, 0, 0, 0, 0)),
            (Rule::Signal, ct(rule_kind::SIGNAL, 0, 0, 0, 0, 0, 0)),
            (
                Rule::ReturnInRdi(8),
                ct(rule_kind::RETURN_IN_RDI, 0, 0, 0, 8, 0, 0),
            ),
            (
                Rule::Unsupported(UnsupportedReason::OffsetOverflow),
                ct(rule_kind::UNSUPPORTED, 0, 0, 3, 0, 0, 0),
            ),
            (
                frame(Cfa::Rsp(49_856), RbpRule::Same),
                ct(rule_kind::CFA_RSP, 0, rbp_kind::SAME, 0, 49_856, 0, 0),
            ),
            (
                frame(
                    Cfa::RspSteps {
                        offset: 8,
                        pushes: 0b1010,
                        pops: 0x8001,
                    },
                    RbpRule::AtCfa(-16),
                ),
                ct(
                    rule_kind::CFA_RSP_STEPS,
                    0,
                    rbp_kind::AT_CFA,
                    0,
                    8,
                    -16,
                    0x8001_000a_u32 as i32,
                ),
            ),
            (
                frame(Cfa::Rbp(16), RbpRule::AtCfa(-16)),
                ct(rule_kind::CFA_RBP, 0, rbp_kind::AT_CFA, 0, 16, -16, 0),
            ),
            (
                frame(Cfa::Plt { threshold: 11 }, RbpRule::Same),
                ct(rule_kind::PLT, 0, rbp_kind::SAME, 0, 11, 0, 0),
            ),
            (
                frame(
                    Cfa::Deref {
                        reg: Reg::Rbp,
                        offset: -8,
                        add: 24,
                    },
                    RbpRule::AtRbp(0),
                ),
                ct(
                    rule_kind::CFA_DEREF,
                    reg::RBP,
                    rbp_kind::AT_RBP,
                    0,
                    -8,
                    0,
                    24,
                ),
            ),
            (
                frame(
                    Cfa::Deref {
                        reg: Reg::Rsp,
                        offset: 40,
                        add: -4,
                    },
                    RbpRule::Same,
                ),
                ct(rule_kind::CFA_DEREF, reg::RSP, rbp_kind::SAME, 0, 40, 0, -4),
            ),
        ];
        for (rule, expected) in cases {
            assert_eq!(CtRule::from(rule), expected, "{rule:?}");
        }
    }

    #[test]
    fn unsupported_reasons_keep_their_numbers() {
        for reason in UnsupportedReason::ALL {
            let ct = CtRule::from(Rule::Unsupported(reason));
            assert_eq!(UnsupportedReason::from_u8(ct.reason), Some(reason));
        }
    }

    #[test]
    fn default_options_filter_events_but_not_uprobes() {
        let options = Options::default();
        assert!(options.filter_events && !options.filter_uprobes && options.kernel_stacks);
    }
}
