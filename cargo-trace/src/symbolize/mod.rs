//! Addresses → function names: addr2line with inline frames and demangling,
//! the ELF symbol table where there is no DWARF, /proc/kallsyms for the kernel.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::Object;
use process_image::demangle;

use crate::elf_symbols::{ElfSymbols, SymbolHit};
use crate::frame::ObjectId;
use crate::frame::UserFrame;
use process_image::{MappedObject, MapsEntry};
use profile::{Frame, Mapping};

mod build;

pub use build::{ProfileBuilder, RawSample};

/// What the symbolizer knows of a user mapping, for [`profile::Profile::mappings`].
#[derive(Clone, Debug)]
pub struct MappingSource {
    pub mapping: Mapping,
    /// The file to read its build id from, if any.
    pub object: Option<PathBuf>,
}

/// A mapping as it was when the process ran, with the object it came from.
#[derive(Clone, Debug)]
pub struct SymbolMapping {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    /// File offset of `start`.
    pub file_offset: u64,
    /// The object's names, one copy shared by every mapping of it: a long run keeps
    /// the mappings of many processes.
    pub names: Arc<MappedNames>,
}

/// What names a mapped object.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MappedNames {
    /// File to read symbols from (for the vDSO, a copy of its image).
    pub path: Option<PathBuf>,
    /// Short name for unsymbolized frames (`libc.so.6`, `[vdso]`).
    pub label: String,
    /// The object as the process mapped it: its path, `[vdso]`, or `[anon]`.
    pub name: String,
}

impl SymbolMapping {
    #[cfg(test)]
    pub fn new(mapping: &MapsEntry, bias: u64, path: Option<PathBuf>) -> Self {
        Self::with_names(mapping, bias, Arc::new(MappedNames::of(mapping, path)))
    }

    /// `mapping` of the object named by `names` ([`MappedNames::of`] the mapping).
    pub fn with_names(mapping: &MapsEntry, bias: u64, names: Arc<MappedNames>) -> Self {
        SymbolMapping {
            start: mapping.start,
            end: mapping.end,
            bias,
            file_offset: mapping.offset,
            names,
        }
    }
}

impl MappedNames {
    /// The names of `mapping`'s object; `path`: the file to read its symbols from.
    pub fn of(mapping: &MapsEntry, path: Option<PathBuf>) -> Self {
        let (label, name) = match mapping.object() {
            MappedObject::File(file) => (
                file.file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                file.display().to_string(),
            ),
            MappedObject::Vdso => ("[vdso]".to_string(), "[vdso]".to_string()),
            MappedObject::Anonymous(name) if name.is_empty() => {
                ("[anon]".to_string(), "[anon]".to_string())
            }
            MappedObject::Anonymous(name) => (name.clone(), name),
        };
        MappedNames { path, label, name }
    }
}

/// Where a stored user frame's address lies: in a process (a runtime address), or in an
/// object (an ELF address, the same in every process: see [`bpf_prog::Frame`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Place {
    Process(u32),
    Object(ObjectId),
}

impl Place {
    /// The place and address of `frame` of process `pid`.
    fn of(pid: u32, frame: UserFrame) -> (Place, u64) {
        match frame {
            UserFrame::InObject { object, address } => (Place::Object(object), address),
            UserFrame::Runtime(address) => (Place::Process(pid), address),
        }
    }
}

/// Symbolizes the user frames of the traced processes and kernel addresses.
pub struct Symbolizer {
    mappings: HashMap<u32, Vec<SymbolMapping>>,
    /// Each object's mappings in one process, for the frames stored as its addresses.
    object_mappings: HashMap<ObjectId, Vec<SymbolMapping>>,
    objects: HashMap<PathBuf, ObjectInfo>,
    cache: HashMap<(Place, u64, bool), Vec<Frame>>,
    kernel: Option<KernelSymbols>,
    /// The process whose mappings stand in for a process without its own.
    fallback: Option<u32>,
    /// Each followed child's parent.
    parents: HashMap<u32, u32>,
}

impl Symbolizer {
    pub fn new() -> Self {
        Symbolizer {
            mappings: HashMap::new(),
            object_mappings: HashMap::new(),
            objects: HashMap::new(),
            cache: HashMap::new(),
            kernel: None,
            fallback: None,
            parents: HashMap::new(),
        }
    }

    /// Each followed child's parent, whose mappings name what the child ran before
    /// its own were read (see [`Symbolizer::user`]).
    pub fn set_parents(&mut self, parents: HashMap<u32, u32>) {
        self.parents = parents;
    }

    /// Symbolize processes whose mappings were never recorded with those of `pid`.
    pub fn set_fallback(&mut self, pid: u32) {
        self.fallback = Some(pid);
    }

    /// Record the mappings of `pid` (sorted or not).
    pub fn add_process(&mut self, pid: u32, mut mappings: Vec<SymbolMapping>) {
        mappings.sort_by_key(|m| m.start);
        self.mappings.insert(pid, mappings);
    }

    /// Record the mappings that symbolize the frames stored as objects' addresses.
    pub fn add_objects(&mut self, objects: HashMap<ObjectId, Vec<SymbolMapping>>) {
        self.object_mappings.extend(objects);
    }

    /// Frames for user frame `frame` of `pid`, outermost inline frame first. `is_return_address`: the
    /// address was read from the stack, so the call is at the address - 1.
    pub fn user(&mut self, pid: u32, frame: UserFrame, is_return_address: bool) -> Vec<Frame> {
        let (place, pc) = Place::of(pid, frame);
        let key = (place, pc, is_return_address);
        if let Some(frames) = self.cache.get(&key) {
            return frames.clone();
        }
        let frames = self.resolve_user(place, pc, is_return_address);
        self.cache.insert(key, frames.clone());
        frames
    }

    /// Whether user frame `frame` names the same code in
    /// every process: a frame stored as an object's address does.
    pub fn is_process_independent(frame: UserFrame) -> bool {
        matches!(frame, UserFrame::InObject { .. })
    }

    /// The runtime address of user frame `frame` of `pid`: a frame stored as an
    /// object's address is placed in the mappings that symbolize it.
    pub fn runtime_address(&self, pid: u32, frame: UserFrame) -> u64 {
        let (place, address) = Place::of(pid, frame);
        match place {
            Place::Process(_) => address,
            Place::Object(object) => self
                .in_object(object, address)
                .map_or(address, |(_, runtime)| runtime),
        }
    }

    fn resolve_user(&mut self, place: Place, pc: u64, is_return_address: bool) -> Vec<Frame> {
        if is_return_address {
            if let Ok(frames) = self.lookup(place, pc.saturating_sub(1)) {
                return frames;
            }
            // Nothing is known before this address, so it was not pushed by a call:
            // it is a signal trampoline's start (the kernel makes __restore_rt the
            // handler's return address) or an interrupted pc. Take it as exact.
        }
        self.lookup(place, pc)
            .unwrap_or_else(|unknown| vec![unknown])
    }

    /// The mapping holding user frame `frame` of `pid`, for a profile's mappings.
    pub fn mapping_source(&self, pid: u32, frame: UserFrame) -> Option<MappingSource> {
        let (place, address) = Place::of(pid, frame);
        let (mapping, _) = self.mapping_at(place, address)?;
        Some(MappingSource {
            mapping: Mapping {
                start: mapping.start,
                end: mapping.end,
                file_offset: mapping.file_offset,
                path: mapping.names.name.clone(),
                build_id: None,
            },
            object: mapping.names.path.clone(),
        })
    }

    /// The mapping holding `address` in `pid`: among its own mappings, else its parent's
    /// (a child that exec'd ran its parent's image before: fork copies it), and so up;
    /// a process never seen uses the fallback's.
    fn mapping_of(&self, pid: u32, address: u64) -> Option<&SymbolMapping> {
        let mut process = pid;
        // A bounded climb: parents form a tree, but pids are reused.
        for _ in 0..64 {
            if let Some(mapping) = self
                .mappings
                .get(&process)
                .and_then(|maps| holding(maps, address))
            {
                return Some(mapping);
            }
            match self.parents.get(&process) {
                Some(&parent) if parent != process => process = parent,
                _ => break,
            }
        }
        if self.mappings.contains_key(&pid) {
            return None;
        }
        self.fallback
            .and_then(|fallback| self.mappings.get(&fallback))
            .and_then(|maps| holding(maps, address))
    }

    /// The mapping of `object` holding its ELF address `address`, and the address
    /// there.
    fn in_object(&self, object: ObjectId, address: u64) -> Option<(&SymbolMapping, u64)> {
        self.object_mappings.get(&object)?.iter().find_map(|m| {
            let runtime = address.wrapping_add(m.bias);
            (m.start <= runtime && runtime < m.end).then_some((m, runtime))
        })
    }

    /// The mapping holding `address` at `place`, and the runtime address there.
    fn mapping_at(&self, place: Place, address: u64) -> Option<(&SymbolMapping, u64)> {
        match place {
            Place::Process(pid) => self.mapping_of(pid, address).map(|m| (m, address)),
            Place::Object(object) => self.in_object(object, address),
        }
    }

    /// Frames for `address` at `place`, or a frame naming the object and offset when
    /// neither DWARF nor the symbol table knows it.
    fn lookup(&mut self, place: Place, address: u64) -> Result<Vec<Frame>, Frame> {
        let Some((mapping, runtime)) = self.mapping_at(place, address) else {
            return Err(Frame::named(match place {
                Place::Process(_) => format!("[unknown] {address:#x}"),
                Place::Object(object) => {
                    format!("[unknown object {}+{address:#x}]", object.index())
                }
            }));
        };
        let elf_address = runtime.wrapping_sub(mapping.bias);
        let label = mapping.names.label.clone();
        let Some(path) = mapping.names.path.clone() else {
            return Err(Frame::named(format!("[{label}]")));
        };
        let object = self
            .objects
            .entry(path.clone())
            .or_insert_with(|| ObjectInfo::load(&path));
        let symbol = |address| match object.symbols.as_ref()?.lookup(address)? {
            SymbolHit::Function(name) => Some(demangle(name)),
            SymbolHit::Plt => Some(format!("[{label}`plt]")),
        };
        let mut frames = object
            .dwarf
            .as_ref()
            .map(|dwarf| dwarf_frames(dwarf, elf_address))
            .unwrap_or_default();
        if let Some(outermost) = frames.first_mut() {
            // Line-tables-only DWARF names a function without its path (`parse`
            // for `myprog::parse`); the symbol table has the full name.
            if !outermost.function.contains("::") {
                if let Some(name) = symbol(elf_address).filter(|name| name.contains("::")) {
                    outermost.function = name;
                }
            }
            return Ok(frames);
        }
        match symbol(elf_address) {
            Some(name) => Ok(vec![Frame::named(name)]),
            None => Err(Frame::named(format!("[{label}+{elf_address:#x}]"))),
        }
    }

    /// The kernel function containing `address`.
    pub fn kernel(&mut self, address: u64) -> Frame {
        let kernel = self.kernel.get_or_insert_with(KernelSymbols::load);
        Frame::named(kernel.lookup(address))
    }
}

/// The mapping of `maps` (sorted by start) holding `address`.
fn holding(maps: &[SymbolMapping], address: u64) -> Option<&SymbolMapping> {
    let index = maps.partition_point(|m| m.start <= address);
    index
        .checked_sub(1)
        .map(|i| &maps[i])
        .filter(|m| address < m.end)
}

/// What one object file offers the symbolizer.
struct ObjectInfo {
    dwarf: Option<addr2line::Loader>,
    symbols: Option<ElfSymbols>,
}

impl ObjectInfo {
    fn load(path: &Path) -> ObjectInfo {
        let source = debug_info_source(path);
        // A separate debug file's .symtab names static functions too; the file's
        // own .dynsym is the fallback.
        let symbols = ElfSymbols::load(&source).or_else(|| ElfSymbols::load(path));
        ObjectInfo {
            dwarf: addr2line::Loader::new(&source).ok(),
            symbols,
        }
    }
}

/// The file to read symbols from for `path`: itself if it has DWARF, else its separate
/// debug file (e.g. libc6-dbg's, by build-id), whose DWARF and full symbol table name the
/// static functions the dynamic symbol table lacks.
fn debug_info_source(path: &Path) -> PathBuf {
    let has_dwarf = || -> Option<bool> {
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: read-only private map of a file we only read.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let elf = object::File::parse(&*map).ok()?;
        Some(elf.section_by_name(".debug_info").is_some())
    };
    if has_dwarf().unwrap_or(true) {
        return path.to_path_buf();
    }
    unwind_tables::find_debug_file_path(path, &unwind_tables::DebugSearch::default())
        .unwrap_or_else(|| path.to_path_buf())
}

/// Frames from DWARF, outermost inline frame first. Empty when there is no DWARF
/// for the address (the caller then falls back to the symbol table).
fn dwarf_frames(loader: &addr2line::Loader, address: u64) -> Vec<Frame> {
    let mut frames = Vec::new();
    let Ok(mut iter) = loader.find_frames(address) else {
        return frames;
    };
    while let Ok(Some(frame)) = iter.next() {
        let Some(function) = frame.function.as_ref() else {
            continue;
        };
        let name = match function.raw_name() {
            Ok(raw) => demangle(&raw),
            Err(_) => continue,
        };
        let (file, line) = frame
            .location
            .as_ref()
            .map(|loc| (loc.file.map(shorten_path), loc.line))
            .unwrap_or((None, None));
        frames.push(Frame {
            function: name,
            file,
            line,
        });
    }
    // addr2line yields the innermost inline frame first.
    frames.reverse();
    frames
}

fn shorten_path(path: &str) -> String {
    // Keep paths readable in the flamegraph: the registry/rustlib prefixes carry no information.
    for marker in ["/library/", "/src/"] {
        if let Some(index) = path.rfind(marker) {
            if path.contains("/rustc/") || path.contains("/.cargo/registry/") {
                return path[index + 1..].to_string();
            }
        }
    }
    path.to_string()
}

struct KernelSymbols {
    symbols: Vec<(u64, String)>,
}

impl KernelSymbols {
    fn load() -> Self {
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        let mut symbols: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let address = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?;
                let name = fields.next()?;
                (address != 0 && matches!(kind, "t" | "T" | "w" | "W"))
                    .then(|| (address, name.to_string()))
            })
            .collect();
        symbols.sort_unstable();
        KernelSymbols { symbols }
    }

    fn lookup(&self, address: u64) -> String {
        let index = self.symbols.partition_point(|(start, _)| *start <= address);
        match index.checked_sub(1) {
            Some(i) => self.symbols[i].1.clone(),
            None => format!("[kernel] {address:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_known_function() -> u64 {
        std::hint::black_box(7)
    }

    /// This test binary's executable mappings, as the session keeps them.
    fn own_mappings() -> Vec<SymbolMapping> {
        let maps = process_image::executable_mappings(std::process::id()).unwrap();
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        maps.iter()
            .filter(|m| m.object() == MappedObject::File(exe.clone()))
            .map(|m| {
                let bias = process_image::load_bias_of(&elf, m.start, m.offset).unwrap();
                SymbolMapping::new(m, bias, Some(exe.clone()))
            })
            .collect()
    }

    fn assert_names_the_known_function(frames: &[Frame]) {
        let last = frames.last().expect("a frame");
        assert!(
            last.function
                .ends_with("symbolize::tests::a_known_function"),
            "{frames:?}"
        );
        assert!(last
            .file
            .as_deref()
            .unwrap_or("")
            .ends_with("symbolize/mod.rs"));
    }

    #[test]
    fn symbolizes_a_function_of_this_binary() {
        let pid = std::process::id();
        let mut symbolizer = Symbolizer::new();
        symbolizer.add_process(pid, own_mappings());
        assert_eq!(a_known_function(), 7);
        let frames = symbolizer.user(
            pid,
            UserFrame::Runtime(a_known_function as *const () as u64),
            false,
        );
        assert_names_the_known_function(&frames);
    }

    /// A frame stored as the object's address names the same function for any process,
    /// one the symbolizer has no mappings of included, at the object's runtime address.
    #[test]
    fn symbolizes_a_frame_stored_as_an_object_address() {
        let mappings = own_mappings();
        let runtime = a_known_function as *const () as u64;
        let bias = mappings
            .iter()
            .find(|m| m.start <= runtime && runtime < m.end)
            .unwrap()
            .bias;
        let object = ObjectId::new(3).unwrap();
        let frame = UserFrame::InObject {
            object,
            address: runtime - bias,
        };
        let mut symbolizer = Symbolizer::new();
        symbolizer.add_objects(HashMap::from([(object, mappings)]));
        assert_names_the_known_function(&symbolizer.user(12345, frame, false));
        assert_eq!(symbolizer.runtime_address(12345, frame), runtime);
        let other = UserFrame::InObject {
            object: ObjectId::new(4).unwrap(),
            address: 0x1234,
        };
        assert_eq!(
            symbolizer.user(1, other, false)[0].function,
            "[unknown object 4+0x1234]"
        );
    }

    #[test]
    fn unknown_addresses_say_so() {
        let mut symbolizer = Symbolizer::new();
        let frames = symbolizer.user(1, UserFrame::Runtime(0x1234), true);
        assert_eq!(frames[0].function, "[unknown] 0x1234");
    }
}
