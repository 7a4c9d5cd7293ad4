//! Keeps a collector's view of a process's code in step with the process: one unwind
//! table per distinct object (compiled once, or read from the build-id cache), the pid's
//! executable mappings with their load biases, and the same mappings for the symbolizer,
//! which runs after the process is gone.
//!
//! Where the tables go is a [`TableStore`]'s business (the BPF maps; the memory the
//! preloaded library walks with): this module decides what is registered, and gives
//! every object the id under which frames in it are kept ([`ObjectId`]), the same
//! for every collector.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context, Result};
use unwind_tables::cache::{Cache, Outcome};
use unwind_tables::CompactTable;

use crate::frame::ObjectId;
use crate::limits::{self, Limit};
use crate::symbolize::{MappedNames, SymbolMapping, Symbolizer};
use process_image::{MappedObject, MapsEntry};

/// Which store: the session has one of each kind at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreId {
    /// The BPF maps.
    Kernel,
    /// The memory the preloaded library walks with.
    InProcess,
}

/// A store's handle of a table it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableRef(pub u32);

/// A mapping as registered with a store: where it is, its load bias, the object's
/// table and id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    /// `None`: executable with no table (a pc there ends a walk with "no row").
    pub table: Option<TableRef>,
    pub object: Option<ObjectId>,
}

/// A file mapped at an offset, as the kernel names it: (device as the kernel numbers
/// it, inode, file offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u64,
    pub inode: u64,
    pub offset: u64,
}

/// Why a store did not take something.
#[derive(Debug)]
pub enum StoreError {
    /// No room: `limit` says which and what raises it; `message` explains.
    Full {
        limit: Limit,
        message: String,
    },
    Other(anyhow::Error),
}

/// Where tables and mappings go: the BPF maps, or the memory the preloaded library
/// walks with. The session keeps, per store, which tables it holds and what it
/// registered for each process.
pub trait TableStore {
    /// Tells this store apart from the session's others.
    fn store_id(&self) -> StoreId;
    /// Takes the table of a newly seen object.
    fn add_table(&mut self, table: &Arc<CompactTable>) -> Result<TableRef, StoreError>;
    /// Registers `pid`'s mappings, replacing what was registered for it.
    fn set_mappings(&mut self, pid: u32, mappings: &[Registered]) -> Result<(), StoreError>;
    /// Says where a file is mapped, so code a process runs there before its own
    /// mappings are registered can be walked; `Ok(false)`: no room (counted).
    fn add_file_mapping(&mut self, file: FileKey, mapping: &Registered) -> Result<bool>;
}

/// What the process's objects are, as far as the unwinder is concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Objects with an unwind table.
    pub objects: usize,
    /// Of those, read from the cache rather than compiled.
    pub cached: usize,
    /// Objects without a table (no CFI, unreadable, anonymous code), by name and reason:
    /// a pc in them ends the walk with "no row".
    pub without_table: Vec<(String, String)>,
    /// What did not fit in the maps filled here: objects whose table did not, file
    /// mappings the walker was not told of, processes whose mappings were not registered.
    pub limits: limits::Counts,
}

/// An object as loaded once: its table (if it has one) and the file to symbolize it from
/// (`/proc/self/fd/N` of a descriptor the session holds, for files).
#[derive(Clone, Debug)]
struct LoadedObject {
    /// Its index among the objects loaded, where the stores' handles of its table are
    /// kept.
    index: usize,
    /// Its name in notes.
    name: String,
    table: Option<Arc<CompactTable>>,
    symbols: Option<PathBuf>,
    /// Its id, under which the walker stores the frames in it (none past
    /// [`ObjectId::MAX`] objects: their frames are stored as runtime addresses).
    id: Option<ObjectId>,
}

/// The session's tables, shared by its collectors (one may serve a process's library
/// from a thread of its own) and read by the symbolizer at the end.
#[derive(Clone)]
pub struct SharedTables(Arc<Mutex<ProcessTables>>);

impl SharedTables {
    pub fn new() -> SharedTables {
        SharedTables(Arc::new(Mutex::new(ProcessTables::new())))
    }

    /// The tables, for as long as the guard lives (a panic elsewhere while they were
    /// held leaves them as they were).
    pub fn lock(&self) -> MutexGuard<'_, ProcessTables> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The tables and mappings of the traced processes.
pub struct ProcessTables {
    cache: Option<Cache>,
    /// By (device, inode) for files, by content for the vDSO.
    objects: HashMap<ObjectKey, LoadedObject>,
    /// Load bias minus mapping start (see [`process_image::load_bias`]) by file and file
    /// offset: the same for every process that maps the file there, so a file is
    /// read once rather than at every registration (twice per exec).
    bias_offsets: HashMap<(ObjectKey, u64), Option<u64>>,
    /// The last mappings registered per store and pid, to skip unchanged refreshes.
    registered: HashMap<(StoreId, u32), Vec<MapsEntry>>,
    /// Each store's handle of each object's table (`None`: it had no room).
    store_tables: HashMap<(StoreId, usize), Option<TableRef>>,
    /// Objects loaded so far.
    loaded: usize,
    /// Every mapping seen per pid, for symbolizing the frames stored as runtime
    /// addresses (those the walker found in no object with an id).
    symbol_mappings: HashMap<u32, Vec<SymbolMapping>>,
    /// Each object's mappings in the first process seen mapping each part of it: where
    /// frames stored as the object's addresses are symbolized, whichever process they
    /// came from.
    object_mappings: HashMap<ObjectId, Vec<SymbolMapping>>,
    /// Objects given an id so far.
    object_ids: u32,
    /// The files told to the walker: (kernel device, inode, offset, object id: one
    /// per version of a file).
    announced: HashSet<(u64, u64, u64, ObjectId)>,
    /// Whether telling the walker of a file failed otherwise than for room (said once).
    announce_failed: bool,
    /// The limits each process met, counted once a process however often it is synced.
    met: HashSet<(Limit, u32)>,
    /// The objects' names, one copy each for all the mappings of the object.
    names: HashSet<Arc<MappedNames>>,
    /// Every object file loaded, open until the session ends (see `symbols`), and the
    /// in-memory copies of vDSO images.
    held_files: Vec<File>,
    pub coverage: Coverage,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ObjectKey {
    /// A file by device and inode, and by size and change time: a file deleted
    /// during the session can leave its inode number to the next file created
    /// (ext4 reuses it at once), which must not get the deleted file's table.
    File {
        dev: String,
        inode: u64,
        version: Option<FileVersion>,
    },
    Vdso(Vec<u8>),
}

impl ProcessTables {
    pub fn new() -> Self {
        ProcessTables {
            cache: crate::invoker::unwind_cache(),
            objects: HashMap::new(),
            bias_offsets: HashMap::new(),
            held_files: Vec::new(),
            registered: HashMap::new(),
            store_tables: HashMap::new(),
            loaded: 0,
            symbol_mappings: HashMap::new(),
            object_mappings: HashMap::new(),
            object_ids: 0,
            announced: HashSet::new(),
            announce_failed: false,
            met: HashSet::new(),
            names: HashSet::new(),
            coverage: Coverage::default(),
        }
    }

    /// Reads `pid`'s executable mappings and, if they changed since the last call,
    /// loads tables for new objects and registers the mappings with `store`.
    pub fn sync(&mut self, store: &mut dyn TableStore, pid: u32) -> Result<()> {
        let mut mappings = process_image::executable_mappings(pid)
            .with_context(|| format!("reading the mappings of process {pid}"))?;
        let store_id = store.store_id();
        if self.registered.get(&(store_id, pid)) == Some(&mappings) {
            return Ok(());
        }
        // The program holds a bounded number of mappings; anonymous code has no table
        // anyway, so it is the first to go when a process has too many.
        if mappings.len() > MAX_MAPPINGS {
            mappings.retain(|m| !matches!(m.object(), MappedObject::Anonymous(_)));
            mappings.truncate(MAX_MAPPINGS);
            self.count_once(Limit::MappingsPerProcess, pid);
        }
        let mut registered = Vec::with_capacity(mappings.len());
        for mapping in &mappings {
            let (object, bias) = self.load(pid, mapping);
            let id = bias.and(object.id);
            let table = match bias {
                Some(_) => self.table_in(store, &object),
                None => None,
            };
            let registering = Registered {
                start: mapping.start,
                end: mapping.end,
                bias: bias.unwrap_or(0),
                table,
                object: id,
            };
            self.announce_file(store, mapping, &registering);
            registered.push(registering);
            let names = self.intern(MappedNames::of(mapping, object.symbols));
            let symbol_mapping = SymbolMapping::with_names(mapping, bias.unwrap_or(0), names);
            if let Some(id) = id {
                self.remember_object(id, &symbol_mapping);
            }
            self.remember(pid, symbol_mapping);
        }
        match store.set_mappings(pid, &registered) {
            Ok(()) => {}
            // Tried again at the next sync, once another process gave its entry back.
            Err(StoreError::Full { limit, message }) => {
                self.count_once(limit, pid);
                anyhow::bail!("registering the mappings of process {pid}: {message}");
            }
            Err(StoreError::Other(error)) => {
                return Err(error)
                    .with_context(|| format!("registering the mappings of process {pid}"))
            }
        }
        self.registered.insert((store_id, pid), mappings);
        Ok(())
    }

    /// `store`'s handle of `object`'s table, given to it on first sight; a table that
    /// does not fit is counted by limit, and the object noted without one.
    fn table_in(&mut self, store: &mut dyn TableStore, object: &LoadedObject) -> Option<TableRef> {
        let table = object.table.as_ref()?;
        let key = (store.store_id(), object.index);
        if let Some(known) = self.store_tables.get(&key) {
            return *known;
        }
        let given = match store.add_table(table) {
            Ok(table) => Some(table),
            Err(StoreError::Full { limit, message }) => {
                limits::count(&mut self.coverage.limits, limit);
                self.note_without_table(&object.name, &message);
                None
            }
            Err(StoreError::Other(error)) => {
                self.note_without_table(&object.name, &format!("{error:#}"));
                None
            }
        };
        self.store_tables.insert(key, given);
        given
    }

    /// Counts `limit` for `pid`, unless it was counted for it already.
    fn count_once(&mut self, limit: Limit, pid: u32) {
        if self.met.insert((limit, pid)) {
            limits::count(&mut self.coverage.limits, limit);
        }
    }

    /// Whether `pid`'s mappings were registered with `store`.
    pub fn knows(&self, store: StoreId, pid: u32) -> bool {
        self.registered.contains_key(&(store, pid))
    }

    /// Forgets what was registered for `pid`, so the next [`ProcessTables::sync`]
    /// registers its mappings again (after an exec).
    pub fn forget(&mut self, store: StoreId, pid: u32) {
        self.registered.remove(&(store, pid));
    }

    /// The mappings of every process seen so far, for a symbolizer while tracing.
    pub fn symbol_mappings(&self) -> &HashMap<u32, Vec<SymbolMapping>> {
        &self.symbol_mappings
    }

    /// Releases what is kept for `pid`, which exited, to compare its next mappings
    /// with; with `keep_mappings`, its mappings stay for the symbolizer (for the
    /// frames stored as runtime addresses of a process whose counts stay apart: a child
    /// with its parent's stacks is symbolized through its own mappings or its
    /// ancestors'). The objects, their tables and the mappings that symbolize their
    /// frames stay, shared by every process mapping them.
    pub fn release(&mut self, pid: u32, keep_mappings: bool) {
        self.registered
            .retain(|(_, registered), _| *registered != pid);
        if !keep_mappings {
            self.symbol_mappings.remove(&pid);
        }
    }

    /// Each object's mappings, to symbolize the frames stored as its addresses.
    pub fn object_mappings(&self) -> &HashMap<ObjectId, Vec<SymbolMapping>> {
        &self.object_mappings
    }

    /// A symbolizer for the stacks of the processes as of now.
    pub fn symbolizer(&self) -> Symbolizer {
        let mut symbolizer = Symbolizer::new();
        for (pid, mappings) in &self.symbol_mappings {
            symbolizer.add_process(*pid, mappings.clone());
        }
        symbolizer.add_objects(self.object_mappings.clone());
        symbolizer
    }

    /// Tells the walker what the file behind `mapping` is, once per file version and
    /// offset: another process mapping it there is walked through it even before its
    /// own mappings are registered (ld.so runs a library's code before that). A map of
    /// files with no room leaves such code unwalked ("no mapping"), and is counted.
    fn announce_file(
        &mut self,
        store: &mut dyn TableStore,
        mapping: &MapsEntry,
        registering: &Registered,
    ) {
        let (Some(id), MappedObject::File(path), Some(dev)) =
            (registering.object, mapping.object(), mapping.kernel_dev())
        else {
            return;
        };
        if self
            .announced
            .insert((dev, mapping.inode, mapping.offset, id))
        {
            let file = FileKey {
                dev,
                inode: mapping.inode,
                offset: mapping.offset,
            };
            match store.add_file_mapping(file, registering) {
                Ok(true) => {}
                Ok(false) => limits::count(&mut self.coverage.limits, Limit::FileMap),
                Err(error) if !self.announce_failed => {
                    self.announce_failed = true;
                    eprintln!(
                        "cargo-trace: warning: the walker was not told where {} is mapped \
                         ({:#}): code a process runs there before its mappings are \
                         registered ends walks",
                        path.display(),
                        error
                    );
                }
                Err(_) => {}
            }
        }
    }

    /// The next object id, `None` once they are all given.
    fn new_object_id(&mut self) -> Option<ObjectId> {
        let id = ObjectId::new(self.object_ids + 1)?;
        self.object_ids += 1;
        Some(id)
    }

    /// The mappings of every process seen, for the symbolizer.
    pub fn take_symbol_mappings(&mut self) -> HashMap<u32, Vec<SymbolMapping>> {
        std::mem::take(&mut self.symbol_mappings)
    }

    /// The shared copy of `names`.
    fn intern(&mut self, names: MappedNames) -> Arc<MappedNames> {
        if let Some(known) = self.names.get(&names) {
            return Arc::clone(known);
        }
        let names = Arc::new(names);
        self.names.insert(Arc::clone(&names));
        names
    }

    /// Keeps `mapping` of object `id` to symbolize the frames stored as the object's
    /// addresses, unless one kept already holds its first address: the first process
    /// seen mapping each part of the object names it for all.
    fn remember_object(&mut self, id: ObjectId, mapping: &SymbolMapping) {
        let kept = self.object_mappings.entry(id).or_default();
        let first = mapping.start.wrapping_sub(mapping.bias);
        let held = |m: &SymbolMapping| {
            let start = m.start.wrapping_sub(m.bias);
            start <= first && first < start + (m.end - m.start)
        };
        if !kept.iter().any(held) {
            kept.push(mapping.clone());
        }
    }

    /// Keeps `mapping` for symbolization, replacing what it overlaps (the process
    /// unmapped and remapped that range).
    fn remember(&mut self, pid: u32, mapping: SymbolMapping) {
        let known = self.symbol_mappings.entry(pid).or_default();
        known.retain(|m| m.end <= mapping.start || mapping.end <= m.start);
        known.push(mapping);
    }

    /// The object behind `mapping` (loading its table on first sight) and the
    /// mapping's load bias, if the object is an ELF file we could read.
    fn load(&mut self, pid: u32, mapping: &MapsEntry) -> (LoadedObject, Option<u64>) {
        let none = LoadedObject {
            index: usize::MAX,
            name: String::new(),
            table: None,
            symbols: None,
            id: None,
        };
        match &mapping.object() {
            MappedObject::Anonymous(name) => {
                let label = if name.is_empty() { "[anon]" } else { name };
                self.note_without_table(label, "anonymous memory (JIT code has no .eh_frame)");
                (none, None)
            }
            MappedObject::Vdso => match self.load_vdso(pid, mapping) {
                Ok(loaded) => loaded,
                Err(error) => {
                    self.note_without_table("[vdso]", &format!("{error:#}"));
                    (none, None)
                }
            },
            MappedObject::File(path) => {
                // The file mapped, whatever its path names now (another file, or
                // none: it was deleted or replaced).
                let mapped = PathBuf::from(format!(
                    "/proc/{pid}/map_files/{:x}-{:x}",
                    mapping.start, mapping.end
                ));
                let version = file_version(&mapped)
                    .or_else(|| file_version(path))
                    .filter(|version| version.inode == mapping.inode);
                let key = ObjectKey::File {
                    dev: mapping.dev.clone(),
                    inode: mapping.inode,
                    version,
                };
                let at = |offset: &Option<u64>| offset.map(|o| mapping.start.wrapping_add(o));
                if let (Some(object), Some(offset)) = (
                    self.objects.get(&key),
                    self.bias_offsets.get(&(key.clone(), mapping.offset)),
                ) {
                    return (object.clone(), at(offset));
                }
                // A deleted or replaced file is still readable through map_files.
                let same_file = version.is_some() && file_version(path) == version;
                let readable = if same_file { path.clone() } else { mapped };
                let offset = file_bias_offset(&readable, mapping.offset);
                self.bias_offsets
                    .insert((key.clone(), mapping.offset), offset);
                let bias = at(&offset);
                if let Some(object) = self.objects.get(&key) {
                    return (object.clone(), bias);
                }
                let table = match self.compile_file(&readable) {
                    Ok(table) => Some(table),
                    Err(error) => {
                        self.note_without_table(&path.display().to_string(), &format!("{error:#}"));
                        None
                    }
                };
                // Held open, the file can be symbolized at the end even if it is
                // deleted or replaced by then.
                let symbols = match File::open(&readable) {
                    Ok(file) => {
                        let held = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                        self.held_files.push(file);
                        held
                    }
                    Err(_) => readable,
                };
                let object = LoadedObject {
                    index: self.next_index(),
                    name: path.display().to_string(),
                    table,
                    symbols: Some(symbols),
                    id: self.new_object_id(),
                };
                self.objects.insert(key, object.clone());
                (object, bias)
            }
        }
    }

    fn compile_file(&mut self, path: &Path) -> Result<Arc<CompactTable>> {
        let object = match &self.cache {
            Some(cache) => {
                let loaded = cache.load_or_compile(path)?;
                match &loaded.outcome {
                    Outcome::Hit => self.coverage.cached += 1,
                    // The cache's directory is not safe to use (another user's, a link):
                    // said once, and the run goes on without it.
                    Outcome::Compiled {
                        store_error: Some(error),
                        ..
                    } if error.kind() == std::io::ErrorKind::PermissionDenied => {
                        eprintln!("cargo-trace: note: the unwind cache is not used: {error}");
                        self.cache = None;
                    }
                    Outcome::Compiled { .. } => {}
                }
                loaded.object
            }
            None => unwind_tables::compile_file(path)?,
        };
        self.coverage.objects += 1;
        Ok(Arc::new(object.table))
    }

    /// The next object's index.
    fn next_index(&mut self) -> usize {
        self.loaded += 1;
        self.loaded - 1
    }

    /// The vDSO has no file: read its image from the process, compile it, and keep a
    /// copy in memory (a memfd) for the symbolizer, which reads files: nothing on disk,
    /// so nothing anyone could plant a link for, and nothing left behind.
    fn load_vdso(&mut self, pid: u32, mapping: &MapsEntry) -> Result<(LoadedObject, Option<u64>)> {
        let image = read_process_memory(pid, mapping.start, mapping.end - mapping.start)
            .context("reading the vDSO image")?;
        let elf = object::File::parse(&*image).context("parsing the vDSO image")?;
        let bias = process_image::load_bias_of(&elf, mapping.start, 0);
        let key = ObjectKey::Vdso(image.clone());
        if let Some(object) = self.objects.get(&key) {
            return Ok((object.clone(), bias));
        }
        let compiled = unwind_tables::compile(&image)?;
        self.coverage.objects += 1;
        let symbols = match in_memory_file(&image) {
            Ok(file) => {
                let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                self.held_files.push(file);
                Some(path)
            }
            Err(_) => None,
        };
        let object = LoadedObject {
            index: self.next_index(),
            name: "[vdso]".to_string(),
            table: Some(Arc::new(compiled.table)),
            symbols,
            id: self.new_object_id(),
        };
        self.objects.insert(key, object.clone());
        Ok((object, bias))
    }

    fn note_without_table(&mut self, name: &str, reason: &str) {
        if !self.coverage.without_table.iter().any(|(n, _)| n == name) {
            self.coverage
                .without_table
                .push((name.to_string(), reason.to_string()));
        }
    }
}

/// Executable mappings a process can have registered (the BPF walker's `CT_MAX_MAPPINGS`):
/// past it, anonymous code goes first, then the highest.
pub const MAX_MAPPINGS: usize = 512;

/// What tells a file apart from others that had its inode number before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileVersion {
    inode: u64,
    size: u64,
    ctime: (i64, i64),
}

/// The version of the file at `path` (following links: map_files gives the file
/// mapped), if it can be read.
fn file_version(path: &Path) -> Option<FileVersion> {
    let metadata = std::fs::metadata(path).ok()?;
    Some(FileVersion {
        inode: metadata.ino(),
        size: metadata.size(),
        ctime: (metadata.ctime(), metadata.ctime_nsec()),
    })
}

/// The load bias of the ELF file at `path` mapped at file offset `offset`, minus
/// the mapping's start address (wrapping).
fn file_bias_offset(path: &Path, offset: u64) -> Option<u64> {
    let file = File::open(path).ok()?;
    // SAFETY: the map is read-only and private; a file truncated under us makes
    // reads fault, which for executables being traced does not happen in practice
    // (the kernel refuses to write an executing image: ETXTBSY).
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    process_image::load_bias_of(&elf, 0, offset)
}

/// A file in memory holding `bytes`, gone when it is closed.
fn in_memory_file(bytes: &[u8]) -> std::io::Result<File> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let mut file = File::from(memfd_create(c"cargo-trace-vdso", MFdFlags::MFD_CLOEXEC)?);
    file.write_all(bytes)?;
    Ok(file)
}

fn read_process_memory(pid: u32, address: u64, len: u64) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mem = File::open(format!("/proc/{pid}/mem"))?;
    let mut buffer = vec![0; len as usize];
    mem.read_exact_at(&mut buffer, address)?;
    Ok(buffer)
}
