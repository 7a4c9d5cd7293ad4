//! Where the library's tables and mappings come from: [`TableSource`], which the session
//! implements with its own tables (object ids shared with the BPF side), and
//! [`PlainTables`], the crate's own (process-image and unwind_tables' cache), for its
//! tests. Also the one encoding of a [`CompactTable`] into the tables memfd.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use process_image::{MappedObject, MapsEntry};
use unwind_tables::cache::Cache;
use unwind_tables::{CompactTable, Rule};

use crate::layout::{self, bytes_of, bytes_of_slice};

/// One executable mapping of a process, as the session registers it for the BPF walker.
#[derive(Clone, Debug)]
pub struct SourceMapping {
    /// Runtime address range `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// Runtime address minus ELF virtual address.
    pub bias: u64,
    /// The mapped object's id, under which frames in it are stored (as the BPF walker
    /// stores them: the same ids); `None`: frames stored as runtime addresses.
    pub object: Option<u32>,
    /// Its unwind table; `None` (anonymous code, an object without one): a pc in it ends
    /// the walk with "no row".
    pub table: Option<Arc<CompactTable>>,
}

/// Why a process's mappings could not be given.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("reading the mappings of process {pid}: {source}")]
    Maps { pid: u32, source: std::io::Error },
}

/// How a hooked function's arguments read (`enum ctp_hook_kind`): the shapes of the
/// allocator functions' calls, whatever their names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookKind {
    /// `malloc(size)`, `mallocx(size, flags)`, `mi_malloc_aligned(size, align)`.
    SizeArg0,
    /// `aligned_alloc(align, size)`, `memalign(align, size)`.
    SizeArg1,
    /// `calloc(n, size)`.
    Calloc,
    /// `realloc(p, size)`, `rallocx(p, size, flags)`.
    Realloc,
    /// `reallocarray(p, n, size)`.
    ReallocArray,
    /// `posix_memalign(&p, align, size)`.
    PosixMemalign,
    /// `free(p)`, `sdallocx(p, size, flags)`, `mi_free(p)`.
    Free,
    /// `xallocx(p, size, extra, flags)`: resized in place, or not at all.
    Xallocx,
    /// The dynamic linker's `_dl_debug_state()`, which it calls when the objects mapped
    /// are consistent again: after a dlopen mapped what it loads, before their
    /// constructors run (the library hooks what they bring then).
    DebugState,
}

impl HookKind {
    /// Its value in `enum ctp_hook_kind`.
    pub fn code(self) -> u32 {
        use layout::hook_kind as k;
        match self {
            HookKind::SizeArg0 => k::SIZE_ARG0,
            HookKind::SizeArg1 => k::SIZE_ARG1,
            HookKind::Calloc => k::CALLOC,
            HookKind::Realloc => k::REALLOC,
            HookKind::ReallocArray => k::REALLOC_ARRAY,
            HookKind::PosixMemalign => k::POSIX_MEMALIGN,
            HookKind::Free => k::FREE,
            HookKind::Xallocx => k::XALLOCX,
            HookKind::DebugState => k::DEBUG_STATE,
        }
    }
}

/// An allocator function of a process that the library's wrappers do not reach: the
/// library hooks its entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookTarget {
    /// Its entry's runtime address.
    pub entry: u64,
    /// Where the walk of a hooked call starts (runtime address): where the BPF path probes
    /// the function, its entry or the first instruction after moves that change neither
    /// rsp, rbp nor memory, so that both paths walk the same stack.
    pub leaf: u64,
    pub kind: HookKind,
    /// Its symbol's name, and the object that defines it.
    pub name: String,
    pub object: PathBuf,
}

/// What a hook writes: the entry's jump to the stub, and the trampoline (the displaced
/// instructions relocated, then a jump back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookCode {
    pub patch: Vec<u8>,
    pub code: Vec<u8>,
}

/// The tables and mappings the library walks with, and the hooks it places.
pub trait TableSource {
    /// The executable mappings of process `pid` now, sorted by start, disjoint: read the
    /// process's maps again (a library it dlopened since the last call is among them).
    fn mappings(&mut self, pid: u32) -> Result<Vec<SourceMapping>, TableError>;

    /// The allocator functions of the objects process `pid` maps now that its library's
    /// wrappers do not reach. None by default: nothing is hooked.
    fn hook_targets(&mut self, pid: u32) -> Vec<HookTarget> {
        let _ = pid;
        Vec::new()
    }

    /// The bytes that hook `target` of process `pid` with a jump to `stub`, its displaced instructions
    /// relocated to `trampoline` (at most `room` bytes); `Err`: why it cannot be hooked.
    fn plan_hook(
        &mut self,
        pid: u32,
        target: &HookTarget,
        stub: u64,
        trampoline: u64,
        room: usize,
    ) -> Result<HookCode, String> {
        let _ = (pid, target, stub, trampoline, room);
        Err("no hook planner".to_string())
    }
}

/// An object loaded once: its id and table.
struct Loaded {
    id: u32,
    path: PathBuf,
    table: Option<Arc<CompactTable>>,
    segments: Vec<process_image::LoadSegment>,
}

/// A [`TableSource`] of its own: objects by (device, inode) (the vDSO by content), tables
/// from `unwind_tables`' cache (compiled on a miss), ids numbered from 1.
pub struct PlainTables {
    cache: Option<Cache>,
    objects: HashMap<(String, u64, Vec<u8>), Loaded>,
    next_id: u32,
}

impl Default for PlainTables {
    fn default() -> Self {
        PlainTables::new()
    }
}

impl PlainTables {
    pub fn new() -> PlainTables {
        PlainTables {
            cache: Cache::default_dir().map(Cache::new),
            objects: HashMap::new(),
            next_id: 1,
        }
    }

    /// The file of object `id` (`[vdso]` for the vDSO), to symbolize its frames.
    pub fn object_path(&self, id: u32) -> Option<&std::path::Path> {
        self.objects
            .values()
            .find(|loaded| loaded.id == id)
            .map(|loaded| loaded.path.as_path())
    }

    fn load(&mut self, pid: u32, entry: &MapsEntry) -> Option<&Loaded> {
        let (data, path) = match entry.object() {
            MappedObject::File(path) => (None, path),
            MappedObject::Vdso => {
                let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
                let mut bytes = vec![0; (entry.end - entry.start) as usize];
                std::os::unix::fs::FileExt::read_exact_at(&mem, &mut bytes, entry.start).ok()?;
                (Some(bytes), PathBuf::from("[vdso]"))
            }
            MappedObject::Anonymous(_) => return None,
        };
        let key = (
            entry.dev.clone(),
            entry.inode,
            data.clone().unwrap_or_default(),
        );
        if !self.objects.contains_key(&key) {
            let bytes = match &data {
                Some(bytes) => bytes.clone(),
                None => std::fs::read(&path).ok()?,
            };
            let file = object::File::parse(&*bytes).ok()?;
            let segments = process_image::load_segments(&file);
            let compiled = match (&data, &self.cache) {
                (Some(bytes), _) => unwind_tables::compile(bytes).ok(),
                (None, Some(cache)) => cache.load_or_compile(&path).ok().map(|l| l.object),
                (None, None) => unwind_tables::compile_file(&path).ok(),
            };
            let id = self.next_id;
            self.next_id += 1;
            self.objects.insert(
                key.clone(),
                Loaded {
                    id,
                    path: path.clone(),
                    table: compiled.map(|c| Arc::new(c.table)),
                    segments,
                },
            );
        }
        self.objects.get(&key)
    }
}

impl TableSource for PlainTables {
    fn mappings(&mut self, pid: u32) -> Result<Vec<SourceMapping>, TableError> {
        let entries = process_image::executable_mappings(pid)
            .map_err(|source| TableError::Maps { pid, source })?;
        let mut out = Vec::with_capacity(entries.len());
        for entry in &entries {
            let mapping = match self.load(pid, entry) {
                Some(loaded) => {
                    match process_image::load_bias(&loaded.segments, entry.start, entry.offset) {
                        Some(bias) => SourceMapping {
                            start: entry.start,
                            end: entry.end,
                            bias,
                            object: Some(loaded.id),
                            table: loaded.table.clone(),
                        },
                        None => SourceMapping {
                            start: entry.start,
                            end: entry.end,
                            bias: 0,
                            object: None,
                            table: None,
                        },
                    }
                }
                None => SourceMapping {
                    start: entry.start,
                    end: entry.end,
                    bias: 0,
                    object: None,
                    table: None,
                },
            };
            out.push(mapping);
        }
        out.sort_by_key(|m| m.start);
        Ok(out)
    }
}

/// The rule as `struct ctp_rule` holds it (its numbers are the encoding's, checked in
/// `layout.rs`).
pub(crate) fn encode_rule(rule: Rule) -> layout::Rule {
    let e = rule.encode();
    layout::Rule {
        kind: e.kind,
        cfa_reg: e.cfa_reg,
        rbp_kind: e.rbp_kind,
        reason: e.reason,
        cfa_off: e.cfa_off,
        rbp_off: e.rbp_off,
        cfa_arg: e.cfa_arg,
    }
}

/// A table as the tables memfd holds it: `struct ctp_table`, then its pages, rows and
/// rules, each part 8-aligned. The length is a multiple of 8.
pub fn encode_table(table: &CompactTable) -> Vec<u8> {
    let align = |n: usize| (n + 7) & !7;
    let header = size_of::<layout::Table>();
    let pages_at = header;
    let rows_at = align(pages_at + table.pages.len() * size_of::<layout::Page>());
    let rules_at = align(rows_at + table.rows.len() * size_of::<layout::Row>());
    let end = align(rules_at + table.rules.len() * size_of::<layout::Rule>());
    let head = layout::Table {
        first_page: table.first_page,
        npages: table.pages.len() as u32,
        nrows: table.rows.len() as u32,
        nrules: table.rules.len() as u32,
        pages_at: pages_at as u32,
        rows_at: rows_at as u32,
        rules_at: rules_at as u32,
    };
    let pages: Vec<layout::Page> = table
        .pages
        .iter()
        .map(|p| layout::Page {
            first_row: p.first_row,
            nrows: p.nrows,
        })
        .collect();
    let rows: Vec<layout::Row> = table
        .rows
        .iter()
        .map(|r| layout::Row {
            addr_lo: r.addr_lo,
            rule: r.rule,
        })
        .collect();
    let rules: Vec<layout::Rule> = table.rules.iter().map(|&r| encode_rule(r)).collect();
    let mut out = vec![0u8; end];
    out[..header].copy_from_slice(bytes_of(&head));
    let put = |out: &mut Vec<u8>, at: usize, bytes: &[u8]| {
        out[at..at + bytes.len()].copy_from_slice(bytes);
    };
    put(&mut out, pages_at, bytes_of_slice(&pages));
    put(&mut out, rows_at, bytes_of_slice(&rows));
    put(&mut out, rules_at, bytes_of_slice(&rules));
    out
}
